"""A row kernel's reads through windows and by index (Note [Resize frames], [Gather loads]
in schedulers/resize.py): which accesses go element by element, and the variant and
arguments of their windows, positions and index values."""
from __future__ import annotations

from typing import Any

from codegen.resize_cuda import Interval, ResizeVariant

from ..resize import assemble
from .problem import Problem


def _target(p: Problem, t: Any) -> Any:
    """A loop dim as the row kernel names it: 'k' along the reduced dim, else its row dim."""
    if isinstance(t, str):
        return t
    return "k" if t in p.program.reduced else p.row_dim_of[t]


def gathered_modes(p: Problem, modes: list[str]) -> tuple[list[str], set[int]]:
    """(modes, the accesses read under a window or by index). An element-level access read
    by index or in a window along K goes element by element ('gather'); one in windows of
    row dims keeps its vectors, tested once a row. None of them is cached or hoisted."""
    layout, program = p.resize, p.program
    element = {s.operands[0] for s in program.stmts
               if s.op == "load" and s.var in program.element_vars}  # fmt: skip
    out = list(modes)
    windowed = set()
    for i, (read, preds) in enumerate(zip(layout.reads, layout.preds)):
        if not read.gathers and not preds:
            continue
        windowed.add(i)
        along_k = any(_target(p, t) == "k" for w in preds for t, _, _ in layout.windows[w] or ())
        if i not in element:  # its index and window hold for the whole row
            out[i] = "row"
        elif read.gathers or along_k:  # its K stride may be 0: its index moves along K
            out[i] = "gather"
    return out, windowed


def row_resize(p: Problem) -> tuple[ResizeVariant, list]:
    """The row kernel's ResizeVariant and its arguments (after the scalars)."""
    layout = p.resize
    windows = tuple(None if w is None else tuple(Interval(_target(p, t), _target(p, t) != "k")
                                                 for t, _, _ in w) for w in layout.windows)  # fmt: skip
    positions = tuple(None if t is None else _target(p, t) for t, _, _ in layout.positions)
    return assemble(p.program, layout, windows, positions)
