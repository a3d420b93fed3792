"""Rules of the resize ops: slice, pad, cat."""
from __future__ import annotations

import torch

from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.frontend.records import Record

from .core import Interpreter, rule


@rule('slice')
def _slice(run: Interpreter, r: Record) -> list:
    x = run.get(r.args[0])
    starts = run.sizes(r.kw("start_indices"))
    ends = run.sizes(r.kw("end_indices"))
    steps = [1] * x.dim() if r.kw("strides") is None else run.sizes(r.kw("strides"))
    return [x[tuple(slice(a, b, k) for a, b, k in zip(starts, ends, steps))]]


@rule('pad')
def _pad(run: Interpreter, r: Record) -> list:
    x = run.get(r.args[0])
    widths = run.sizes(r.kw("pad_widths"))
    for i in range(len(widths) // 2):
        d = x.dim() - 1 - i
        size = x.shape[d] + widths[2 * i] + widths[2 * i + 1]
        if size < 0:
            raise ValueError(f"pad ({r.outputs[0]}): pad_widths {widths} make dim {d} of size "
                             f"{x.shape[d]} negative ({size})")  # fmt: skip
    value = run.get(r.kw("value")) if r.kw("value") is not None else 0
    if x.dtype == torch.bool:
        value = bool(value)
    return [torch.nn.functional.pad(x, widths, mode="constant", value=value)]


@rule('cat')
def _cat(run: Interpreter, r: Record) -> list:
    tensors = [run.get(a) for a in r.args[0]]
    dtype = to_torch(run.infos[r.outputs[0].index].dtype)
    return [torch.cat([t.to(dtype) for t in tensors], dim=r.kw("dim"))]
