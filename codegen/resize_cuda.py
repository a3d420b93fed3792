"""CUDA for reads through windows and by index (Note [Resize frames], Note [Gather loads] in
schedulers/resize.py): the kernel arguments they add, the window tests, and the statements
'guard', 'position' and 'index'. Renderers call these only for programs that have them, so
other kernels' sources do not change.

A window test compares a coordinate with a [lo, hi) pair of arguments. Inside a thread's
vector loop (j) the innermost loop dim's coordinate is `c{R-1} + j`; once per vector (the
loads before the loop) it is the vector's first, which the planner allows only where the
test is the same for the whole vector.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .cuda_ops import MEMORY_TYPE
from .stmt_cuda import decl


@dataclass(frozen=True)
class Interval:
    target: int | str  # a collapsed loop dim, or the name of an index value
    uniform: bool  # the same answer for every element of a thread's vector


@dataclass(frozen=True)
class ResizeVariant:
    offsets: tuple[bool, ...]  # per access: an element offset argument a{i}_o
    gathers: tuple[tuple[str, ...], ...]  # per access: index values with a stride a{i}_g{k}
    windows: tuple[tuple[Interval, ...] | None, ...]  # None: no position is inside
    preds: tuple[tuple[int, ...], ...]  # per access: the windows it is read inside
    positions: tuple[int | str | None, ...]  # per position: its target (None: constant)
    checks: int  # index checks, one extent argument e{k} each
    store_gathers: tuple[tuple[str, ...], ...] = ()  # per store: index values, o{i}_g{k}

    def describe(self) -> str:
        parts = []
        if any(self.offsets):
            parts.append(f"offsets={sum(self.offsets)}")
        if any(self.gathers):
            parts.append(f"gathers={sum(len(g) for g in self.gathers)}")
        if self.windows:
            shown = ["never" if w is None else "+".join(
                f"{iv.target}{'' if iv.uniform else '~'}" for iv in w) or "all" for w in self.windows]
            parts.append(f"windows={','.join(shown)}")
        if self.positions:
            parts.append(f"positions={','.join(str(p) for p in self.positions)}")
        return " " + " ".join(parts) if parts else ""


def resize_params(rv: ResizeVariant) -> list[str]:
    params = [f"idx_t a{i}_o" for i, on in enumerate(rv.offsets) if on]
    params += [f"idx_t a{i}_g{k}" for i, g in enumerate(rv.gathers) for k in range(len(g))]
    params += [f"idx_t o{i}_g{k}" for i, g in enumerate(rv.store_gathers) for k in range(len(g))]
    for w, ivs in enumerate(rv.windows):
        for m in range(len(ivs or ())):
            params += [f"long long w{w}_{m}_lo", f"long long w{w}_{m}_hi"]
    for k in range(len(rv.positions)):
        params += [f"long long q{k}_a", f"long long q{k}_b"]
    params += [f"long long e{k}" for k in range(rv.checks)]
    return params


def resize_arg_types(rv: ResizeVariant, idx: str) -> tuple[str, ...]:
    types = [idx] * (sum(rv.offsets) + sum(len(g) for g in rv.gathers)
                     + sum(len(g) for g in rv.store_gathers))
    types += ["i64"] * (2 * sum(len(w or ()) for w in rv.windows) + 2 * len(rv.positions) + rv.checks)
    return tuple(types)


def loop_coords(rank: int, per_element: bool) -> Callable[[Any], str]:
    """A pointwise kernel's coordinates: loop dims c{d} (the innermost + j inside the vector
    loop), index values by name."""

    def coord(target: Any) -> str:
        if isinstance(target, str):
            return f"(long long){target}"
        if per_element and target == rank - 1:
            return f"(c{target} + j)"
        return f"c{target}"

    return coord


def window_test(rv: ResizeVariant, w: int, coord: Callable[[Any], str]) -> str:
    ivs = rv.windows[w]
    if ivs is None:
        return "false"
    tests = []
    for m, iv in enumerate(ivs):
        x = coord(iv.target)
        tests.append(f"(w{w}_{m}_lo <= {x} && {x} < w{w}_{m}_hi)")
    return " && ".join(tests) or "true"


def pred_test(rv: ResizeVariant, i: int, coord: Callable[[Any], str]) -> str | None:
    """The test access i is read under (None: always read)."""
    if not rv.preds[i]:
        return None
    return " && ".join(f"({window_test(rv, w, coord)})" for w in rv.preds[i])


def vector_load(rv: ResizeVariant, i: int, rank: int, dtype, hint: int, alias: bool) -> str | None:
    """Once per vector: access i's load in mode 'vec' under its window (None: no window)."""
    test = pred_test(rv, i, loop_coords(rank, False))
    if test is None:
        return None
    if alias:
        return f"fc_load_vec_or_zero<FC_VEC>(a{i} + a{i}_off[u], {test})"
    return f"fc_load_vec_if<FC_VEC, {hint}>(a{i} + a{i}_off[u], {test})"


def gathered(rv: ResizeVariant, i: int) -> str:
    """The index values' part of access i's address."""
    return "".join(f" + (idx_t){v} * a{i}_g{k}" for k, v in enumerate(rv.gathers[i]))


def scalar_load(rv: ResizeVariant, i: int, rank: int, dtype, mode: str) -> str:
    """Access i's element in modes 'bcast' (once per vector), 'strided' and 'gather'."""
    mt = MEMORY_TYPE[dtype]
    addr = f"a{i}_off[u]"
    if mode != "bcast":
        addr += f" + j * a{i}_s{rank - 1}"
    addr += gathered(rv, i)
    test = pred_test(rv, i, loop_coords(rank, mode != "bcast"))
    raw = f"a{i}[{addr}]"
    return raw if test is None else f"(({test}) ? {raw} : fc_zero<{mt}>())"


def gathered_vector(rv: ResizeVariant, i: int, rank: int, hint: int, alias: bool) -> str:
    """Mode 'vgather': the vector read at the loop's first element, where the index values
    (the same for the whole vector) are known."""
    addr = f"a{i} + a{i}_off[u]" + gathered(rv, i)
    test = pred_test(rv, i, loop_coords(rank, True)) or "true"
    load = (f"fc_load_vec_or_zero<FC_VEC>({addr}, {test})" if alias
            else f"fc_load_vec_if<FC_VEC, {hint}>({addr}, {test})")  # fmt: skip
    return f"if (j == 0) a{i}_v[u] = {load};"


def scatter_store(rv: ResizeVariant, i: int, rank: int, value: str, accumulate: bool) -> str:
    """Store i of a scatter (Note [Scatter kernels]): the element's address takes its index
    values; an accumulating store adds atomically (indices may repeat)."""
    addr = f"o{i}_off[u] + j * o{i}_s{rank - 1}" + "".join(
        f" + (idx_t){v} * o{i}_g{k}" for k, v in enumerate(rv.store_gathers[i]))
    if accumulate:
        return f"fc_atomic_add(&o{i}[{addr}], {value});"
    return f"o{i}[{addr}] = {value};"


def resize_stmt(rv: ResizeVariant, stmt, coord: Callable[[Any], str], checks: tuple) -> str | None:
    """The 'guard', 'position' and 'index' statements (None for any other)."""
    attrs = dict(stmt.attrs)
    if stmt.op == "guard":
        return decl("bool", stmt.var, window_test(rv, attrs["guard"], coord))
    if stmt.op == "position":
        k = attrs["position"]
        target = rv.positions[k]
        if target is None:
            return decl("long long", stmt.var, f"q{k}_b")
        return decl("long long", stmt.var, f"q{k}_a * {coord(target)} + q{k}_b")
    if stmt.op == "index":
        k = attrs["check"]
        what = checks[k].what.replace('"', "'")
        return decl("long long", stmt.var,
                    f'fc_check_index((long long){stmt.operands[0]}, e{k}, "{what}")')  # fmt: skip
    return None
