"""Rules of the elementwise ops (the op table's torch functions) and of cast."""
from __future__ import annotations

import torch

from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.frontend.ops.table import OPS, promoted_dtype, scalar_result
from fusion_cache.frontend.records import Record
from fusion_cache.frontend.values import TensorInfo

from .core import Interpreter, rule


def check_same_sizes(r: Record, infos: list, values: list) -> None:
    tensors = [(infos[a.index], v) for a, v in zip(r.args, values) if isinstance(v, torch.Tensor)]
    rank = max((t.dim() for _, t in tensors), default=0)
    for pos in range(rank):
        seen: dict[int, int] = {}
        for info, t in tensors:
            d = pos - rank + t.dim()
            if d < 0 or info.shape[d] == 1:
                continue
            seen.setdefault(t.shape[d], d)
        if len(seen) > 1:
            a, b = list(seen)[:2]
            raise ValueError(
                f"{r.name} ({', '.join(map(str, r.outputs))}): sizes {a} and {b} meet at dim {pos}; "
                "only dims declared broadcast (size 1) in the definition broadcast"
            )


@rule('<elementwise>')
def _elementwise(run: Interpreter, r: Record) -> list:
    spec = OPS[r.name]
    values = [run.get(a) for a in r.args]
    infos = [run.infos[a.index] for a in r.args]
    check_same_sizes(r, run.infos, values)
    compute = promoted_dtype(spec, infos)
    out_info = run.infos[r.outputs[0].index]
    result = spec.torch_fn(*values, dtype=compute)
    if isinstance(out_info, TensorInfo):
        return [result.to(to_torch(out_info.dtype))]
    return [scalar_result(result, out_info.dtype)]


@rule('cast')
def _cast(run: Interpreter, r: Record) -> list:
    x = run.get(r.args[0])
    dt = r.kw("dtype")
    if isinstance(x, torch.Tensor):
        return [x.to(to_torch(dt))]
    return [scalar_result(torch.tensor(x).to(to_torch(dt)), dt)]
