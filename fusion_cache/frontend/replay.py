"""Records -> frontend calls: rebuilds a definition (for `FusionDefinition(fid)`) exactly as
exec'ing its printed Python would, without running any stored text."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .records import Record, Ref

if TYPE_CHECKING:
    from .definition import FusionDefinition

# given the new definition, a record and its arguments as live handles: the handles that
# stand for the record's outputs, or None to replay the record as it is
Rewrite = Callable[[Any, Record, list, dict], Any]


def replay_records(fd: FusionDefinition, records: Sequence[Record],
                   rewrite: Rewrite | None = None) -> None:  # fmt: skip
    handles: dict[int, Any] = {}  # original state index -> handle in `fd`

    def live(value: Any) -> Any:
        if isinstance(value, Ref):
            return handles[value.index]
        if isinstance(value, tuple):
            return [live(v) for v in value]
        return value

    for r in records:
        kwargs = {k: live(v) for k, v in r.kwargs}
        args = [live(a) for a in r.args]
        made = rewrite(fd, r, args, kwargs) if rewrite is not None else None
        if made is None:
            made = _call(fd, r, args, kwargs)
        if r.outputs:
            made = made if isinstance(made, (tuple, list)) else (made,)
            if len(made) > len(r.outputs):  # the Nones of results not recorded (scaled_mm's)
                made = [h for h in made if h is not None]
            handles.update((ref.index, h) for ref, h in zip(r.outputs, made))


def _call(fd: FusionDefinition, r: Record, args: list, kwargs: dict) -> Any:
    if r.kind == "tensor":
        return fd.define_tensor(**kwargs)
    if r.kind == "scalar":
        if kwargs.get("is_input"):
            return fd.define_scalar(dtype=kwargs["dtype"])
        return fd.define_scalar(kwargs["value"], dtype=kwargs["dtype"])
    if r.kind == "vector":
        if kwargs.get("is_input"):
            return fd.define_vector(kwargs["size"], dtype=kwargs["dtype"])
        return fd.define_vector(kwargs["elements"], dtype=kwargs["dtype"])
    if r.kind == "op":
        return getattr(fd.ops, r.name)(*args, **kwargs)
    if r.kind == "output":
        return fd.add_output(args[0], kwargs["alias_input"], kwargs["stride_order"] or None)
    if r.kind != "end":
        raise ValueError(f"unknown record kind {r.kind!r}")
    return None
