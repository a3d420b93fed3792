"""Every aten lowering, registered: the primitives (aten_ops.py), slicing and joining
(aten_resize.py), gathers and scatters (aten_indexing.py), the composites
(aten_composite.py) and the library ops (aten_library.py: GEMMs, attention) fill
lowering.LOWERINGS as they are imported here."""
from __future__ import annotations

from typing import Any

from . import (  # noqa: F401  (they register themselves)
    aten_composite,
    aten_indexing,
    aten_library,
    aten_ops,
    aten_resize,
)
from .lowering import LOWERINGS, Args, LoweringContext, UnsupportedOpError


def has_lowering(name: str) -> bool:
    return name in LOWERINGS


def lower_op(ctx: LoweringContext, name: str, args: Args) -> Any:
    """Emit the fusion ops for one aten op; returns a handle, a Python value or a tuple."""
    fn = LOWERINGS.get(name)
    if fn is None:
        raise UnsupportedOpError(f"{name} has no lowering to fusion ops")
    return fn(ctx, args)
