"""Rules of the ops that make tensors from scalars: full, iota."""
from __future__ import annotations

import torch

from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.frontend.records import Record

from .core import Interpreter, rule


@rule('full')
def _full(run: Interpreter, r: Record) -> list:
    shape = run.sizes(r.kw("shape"))
    if any(n < 0 for n in shape):
        raise ValueError(f"full ({r.outputs[0]}): shape {shape} has a negative size")
    return [torch.full(shape, run.get(r.kw("fill_value")), dtype=to_torch(r.kw("dtype")), device=run.device)]


@rule('iota')
def _iota(run: Interpreter, r: Record) -> list:
    n, start, step = (run.get(a) for a in r.args)
    if int(n) < 0:
        raise ValueError(f"iota ({r.outputs[0]}): length must be >= 0, got {int(n)}")
    dt = to_torch(r.kw("dtype"))
    base = torch.arange(int(n), dtype=torch.float64 if dt.is_floating_point else torch.int64,
                        device=run.device)  # fmt: skip
    return [(base * step + start).to(dt)]
