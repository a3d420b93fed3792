"""Records -> the Python text of a definition (`repr(fd)`), which rebuilds the same fusion."""
from __future__ import annotations

from typing import Any

from .dtypes import DataType
from .records import Record, Ref


def format_value(v: Any) -> str:
    if isinstance(v, Ref):
        return str(v)
    if isinstance(v, DataType):
        return repr(v)
    if isinstance(v, tuple):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    if isinstance(v, float):
        if v != v:
            return 'float("nan")'
        if v in (float("inf"), float("-inf")):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    return repr(v)


def _call(fn: str, args: tuple = (), kwargs: tuple = ()) -> str:
    parts = [format_value(a) for a in args]
    parts += [f"{k}={format_value(v)}" for k, v in kwargs]
    return f"{fn}({', '.join(parts)})"


# ops whose Python call returns a list of outputs
LIST_RESULTS = frozenset({"tensor_sizes"})
# ops that return more values than they record, as None (scaled_mm's block scale and gamma)
_UNUSED_RESULTS = {"scaled_mm": 2}


def format_record(r: Record) -> str | None:
    lhs = ", ".join(str(o) for o in r.outputs)
    if r.kind == "tensor":
        kw = [(k, v) for k, v in r.kwargs if not (k == "stride_order" and not v)]
        return f"{lhs} = {_call('fd.define_tensor', (), tuple(kw))}"
    if r.kind == "scalar":
        value = r.kw("value", None)
        if r.kw("is_input"):
            return f"{lhs} = {_call('fd.define_scalar', (), (('dtype', r.kw('dtype')),))}"
        return f"{lhs} = {_call('fd.define_scalar', (value,), (('dtype', r.kw('dtype')),))}"
    if r.kind == "vector":
        if r.kw("is_input"):
            return f"{lhs} = fd.define_vector({r.kw('size')}, dtype={r.kw('dtype')!r})"
        return f"{lhs} = {_call('fd.define_vector', (r.kw('elements'),), (('dtype', r.kw('dtype')),))}"
    if r.kind == "op":
        lhs += ", _" * _UNUSED_RESULTS.get(r.name, 0)
        if r.kw("output_mask") is not None:  # convolution_backward: None where not asked
            names = iter(str(o) for o in r.outputs)
            lhs = ", ".join(next(names) if m else "_" for m in r.kw("output_mask"))
        call = _call("fd.ops." + r.name, r.args, r.kwargs)
        if r.name in LIST_RESULTS:  # returns a list, even of one or none
            return f"{lhs}, = {call}" if len(r.outputs) == 1 else (f"{lhs} = {call}" if lhs else call)
        return f"{lhs} = {call}"
    if r.kind == "output":
        args = r.args + ((r.kw("alias_input"),) if r.kw("alias_input") is not None else ())
        kw = (("stride_order", r.kw("stride_order")),) if r.kw("stride_order") else ()
        return _call("fd.add_output", args, kw)
    return None  # the end record prints nothing


def python_definition(records: tuple[Record, ...] | list[Record], fid: int | None) -> str:
    name = f"nvfuser_fusion_id{'' if fid is None else fid}"
    lines = [f"def {name}(fd : FusionDefinition) -> None :"]
    for r in records:
        text = format_record(r)
        if text is not None:
            lines.append("    " + text)
    if len(lines) == 1:
        lines.append("    pass")
    return "\n".join(lines) + "\n"
