"""What torch.compile chose for the Triton kernels it compiled in this process: each kernel's
autotuned config (block sizes, warps, stages), registers and spills, and optionally its PTX,
so a sweep can set our kernel beside the one it is compared with.

    from benchmarks.inductor_kernels import new_kernels
    seen: set[int] = set()
    ...torch.compile and run a case...
    for k in new_kernels(seen, ptx_dir=None): print(k)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _modules() -> list[Any]:
    from torch._inductor.codecache import PyCodeCache

    mods = getattr(PyCodeCache, "modules", None)
    if isinstance(mods, dict):
        return list(mods.values())
    if mods is None:
        return list(getattr(PyCodeCache, "cache", {}).values())
    return list(mods)


def _autotuners() -> list[Any]:
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    found: dict[int, Any] = {}
    for mod in _modules():
        for value in list(vars(mod).values()):
            if isinstance(value, CachingAutotuner):
                found[id(value)] = value
    return list(found.values())


def _binary(tuner: Any, config: Any) -> Any:
    """The compiled binary of the chosen config (autotuning prunes the others)."""
    results = list(getattr(tuner, "compile_results", ()) or ())
    for result in results:
        if getattr(result, "config", None) is config:
            return getattr(result, "kernel", None)
    return getattr(results[0], "kernel", None) if len(results) == 1 else None


def new_kernels(seen: set[int], ptx_dir: Path | None = None) -> list[dict[str, Any]]:
    """The kernels not in `seen` (ids, updated): name, the chosen config, registers, spills
    (launchers: 1 once autotuning chose); each PTX and Triton source written to
    ptx_dir/<name>.ptx and .py when given."""
    out = []
    for tuner in _autotuners():
        if id(tuner) in seen or not getattr(tuner, "launchers", None):
            continue
        seen.add(id(tuner))
        launcher = tuner.launchers[0]
        config = launcher.config
        name = getattr(getattr(tuner, "fn", None), "__name__", None) or tuner.inductor_meta.get(
            "kernel_name", "?")
        record = {"kernel": name, "config": dict(config.kwargs), "num_warps": config.num_warps,
                  "num_stages": config.num_stages, "regs": getattr(launcher, "n_regs", None),
                  "spills": getattr(launcher, "n_spills", None),
                  "shared": getattr(launcher, "shared", None),
                  "launchers": len(tuner.launchers)}
        out.append(record)
        binary = _binary(tuner, config)
        if ptx_dir is not None and binary is not None:
            ptx_dir.mkdir(parents=True, exist_ok=True)
            asm = getattr(binary, "asm", {}) or {}
            if "ptx" in asm:
                (ptx_dir / f"{name}.ptx").write_text(str(asm["ptx"]))
            src = getattr(getattr(tuner, "fn", None), "src", None)
            if src:
                (ptx_dir / f"{name}.py").write_text(src)
    return out
