"""The house's rules, read from the source: imports point down the stages, and no group of the
project's modules imports one another in a circle of more than three (imports inside
functions count; those under `if TYPE_CHECKING:` do not). See docs/architecture.md."""
from __future__ import annotations

import ast
import os
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("fusion_cache", "codegen", "schedulers", "migrations")

# stage -> rank: a module may import its own stage and the stages ranked below it
STAGES = {
    "fusion_cache.store": 0,
    "migrations": 0,  # the store's schema revisions
    "fusion_cache.frontend": 1,
    "fusion_cache.ir": 2,
    "codegen": 3,
    "schedulers": 4,
    "fusion_cache.runtime": 5,
    "fusion_cache.frontends": 6,
    "fusion_cache": 7,  # the package root and the command line
}


def _modules() -> dict[str, str]:
    found = {}
    for pkg in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    found[name.removesuffix(".__init__")] = path
    return found


def _imports(modules: dict[str, str]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        tree = ast.parse(open(path).read())
        is_pkg = path.endswith("__init__.py")
        hidden = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                hidden.update(id(n) for n in ast.walk(node))
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".") if is_pkg else name.split(".")[:-1]
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                subs = [f"{base}.{a.name}" for a in node.names]
                # `from package import submodule` from inside that package
                inside = f"{name}.".startswith(f"{base}.") and all(s in modules for s in subs)
                targets = ([] if inside else [base]) + subs
            for target in targets:
                parts = target.split(".")
                for i in range(len(parts), 0, -1):
                    known = ".".join(parts[:i])
                    if known in modules:
                        if known != name:
                            edges[name].add(known)
                        break
    return edges


def _stage(module: str) -> str:
    return max((s for s in STAGES if module == s or module.startswith(s + ".")), key=len)


def test_imports_point_down_the_stages():
    modules = _modules()
    upward = [f"{m} ({_stage(m)}) imports {t} ({_stage(t)})"
              for m, targets in _imports(modules).items() for t in targets
              if STAGES[_stage(t)] > STAGES[_stage(m)]]  # fmt: skip
    assert not upward, "\n".join(upward)


def test_no_import_circle_longer_than_three():
    modules = _modules()
    edges = _imports(modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            circle = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                circle.append(w)
                if w == v:
                    break
            circles.append(circle)

    for m in modules:
        if m not in index:
            visit(m)
    largest = max(circles, key=len)
    assert len(largest) <= 3, sorted(largest)


def test_the_stage_table_names_every_package():
    assert {_stage(m) for m in _modules()} <= set(STAGES)
