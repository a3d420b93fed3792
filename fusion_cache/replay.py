"""Records -> frontend calls: rebuilds a definition (for `FusionDefinition(fid)`) exactly as
exec'ing its printed Python would, without running any stored text."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .records import Record, Ref
from .values import HANDLE_TYPES

if TYPE_CHECKING:
    from .definition import FusionDefinition


def _live(fd: FusionDefinition, value: Any) -> Any:
    if isinstance(value, Ref):
        return HANDLE_TYPES[value.kind](fd, value)
    if isinstance(value, tuple):
        return [_live(fd, v) for v in value]
    return value


def replay_records(fd: FusionDefinition, records: Sequence[Record]) -> None:
    for r in records:
        kwargs = {k: _live(fd, v) for k, v in r.kwargs}
        args = [_live(fd, a) for a in r.args]
        if r.kind == "tensor":
            fd.define_tensor(**kwargs)
        elif r.kind == "scalar":
            if kwargs.get("is_input"):
                fd.define_scalar(dtype=kwargs["dtype"])
            else:
                fd.define_scalar(kwargs["value"], dtype=kwargs["dtype"])
        elif r.kind == "vector":
            if kwargs.get("is_input"):
                fd.define_vector(kwargs["size"], dtype=kwargs["dtype"])
            else:
                fd.define_vector(kwargs["elements"], dtype=kwargs["dtype"])
        elif r.kind == "op":
            getattr(fd.ops, r.name)(*args, **kwargs)
        elif r.kind == "output":
            fd.add_output(args[0], kwargs["alias_input"], kwargs["stride_order"] or None)
        elif r.kind != "end":
            raise ValueError(f"unknown record kind {r.kind!r}")
