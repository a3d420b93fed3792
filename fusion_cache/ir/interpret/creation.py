"""Rules of the ops that make tensors from scalars: full, iota."""
from __future__ import annotations

import torch

from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.frontend.records import Record

from .core import Interpreter, rule


@rule('full')
def _full(run: Interpreter, r: Record) -> list:
    shape = run.sizes(r.kw("shape"))
    return [torch.full(shape, run.get(r.kw("fill_value")), dtype=to_torch(r.kw("dtype")), device=run.device)]


@rule('iota')
def _iota(run: Interpreter, r: Record) -> list:
    n, start, step = (run.get(a) for a in r.args)
    dt = to_torch(r.kw("dtype"))
    base = torch.arange(int(n), dtype=torch.float64 if dt.is_floating_point else torch.int64,
                        device=run.device)  # fmt: skip
    return [(base * step + start).to(dt)]
