"""What a stored fusion does, read from its records' JSON (the store's canonical form, see
fusion_cache/frontend/records.py) without the frontend, which imports torch: input dtypes
and shapes, ops and outputs, for `ls`."""
from __future__ import annotations

import json
from dataclasses import dataclass

_SHORT = {"Double": "f64", "Float": "f32", "Half": "f16", "BFloat16": "bf16", "Int": "i64",
          "Int32": "i32", "UInt64": "u64", "Bool": "bool", "ComplexFloat": "c64",
          "ComplexDouble": "c128"}  # fmt: skip


@dataclass(frozen=True)
class FusionSummary:
    inputs: str  # 'bf16[?,?], f32[?], f64': dtype and shape (? symbolic) of each input
    ops: int
    op_names: str  # the distinct op names, in order
    outputs: int


def _dtype(value: object) -> str:
    name = value.get("$dtype", "?") if isinstance(value, dict) else "?"
    return _SHORT.get(name, str(name).lower())


def _shape(kwargs: dict) -> str:
    for key in ("shape", "symbolic_sizes", "sizes"):
        dims = kwargs.get(key)
        if isinstance(dims, list):
            return "[" + ",".join("?" if d == -1 else str(d) for d in dims) + "]"
    ndims = kwargs.get("ndims")
    return "[" + ",".join("?" * int(ndims)) + "]" if isinstance(ndims, int) else "[...]"


def summarize(records_json: str) -> FusionSummary:
    try:
        records = json.loads(records_json)
    except ValueError:
        return FusionSummary("?", 0, "?", 0)
    inputs, names, ops, outputs = [], [], 0, 0
    for r in records if isinstance(records, list) else ():
        if not isinstance(r, dict):
            continue
        kind = r.get("kind")
        kwargs = {k: v for k, v in r.get("kwargs", ()) if isinstance(k, str)}
        if kind == "tensor":
            inputs.append(_dtype(kwargs.get("dtype")) + _shape(kwargs))
        elif kind == "scalar" and kwargs.get("is_input"):
            inputs.append(_dtype(kwargs.get("dtype")))
        elif kind == "vector" and kwargs.get("is_input"):
            inputs.append(f"vector[{kwargs.get('size', '?')}]")
        elif kind == "op":
            ops += 1
            if r.get("name") not in names:
                names.append(r.get("name"))
        elif kind == "output":
            outputs += 1
    return FusionSummary(", ".join(inputs) or "-", ops, ", ".join(map(str, names)), outputs)
