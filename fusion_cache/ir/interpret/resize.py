"""Rules of the resize ops: slice, pad, cat."""
from __future__ import annotations

import torch

from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.frontend.records import Record
from fusion_cache.frontend.shapes import normalize_slice

from .core import Interpreter, rule


def slice_bounds(r: Record, shape: tuple, sizes) -> list[tuple[int, int, int]]:
    """(start, extent, step) per dim of a slice record for an input of `shape`; `sizes`
    turns a shape argument into ints (Note: shared by the interpreter and the shape
    evaluator, so both normalize as nvFuser does)."""
    starts, ends = sizes(r.kw("start_indices")), sizes(r.kw("end_indices"))
    steps = [1] * len(shape) if r.kw("strides") is None else sizes(r.kw("strides"))
    where = f"slice ({r.outputs[0]})"
    manual = bool(r.kw("manual_normalization", False))
    out = []
    for d, (n, a, b, k) in enumerate(zip(shape, starts, ends, steps)):
        start, extent = normalize_slice(where, d, n, a, b, k, manual)
        out.append((start, extent, k))
    return out


@rule('slice')
def _slice(run: Interpreter, r: Record) -> list:
    x = run.get(r.args[0])
    bounds = slice_bounds(r, tuple(x.shape), run.sizes)
    return [x[tuple(slice(a, a + n * k, k) for a, n, k in bounds)]]


def pad_value(value, dtype: torch.dtype):
    if dtype == torch.bool:
        return bool(value)
    return value


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
    return [torch.nn.functional.pad(x, widths, mode="constant", value=pad_value(value, x.dtype))]


@rule('cat')
def _cat(run: Interpreter, r: Record) -> list:
    tensors = [run.get(a) for a in r.args[0]]
    dtype = to_torch(run.infos[r.outputs[0].index].dtype)
    dim = r.kw("dim")
    if r.kw("manual_padding", False):
        return [_cat_padded(run, r, tensors, dim, dtype)]
    rank = tensors[0].dim()
    d = dim % rank
    shape = []
    for k in range(rank):
        sizes = {t.shape[k] for a, t in zip(r.args[0], tensors) if run.infos[a.index].shape[k] != 1}
        if k != d and len(sizes) > 1:
            raise ValueError(f"cat ({r.outputs[0]}): tensors have sizes {sorted(sizes)} at dim {k}; "
                             "only the cat dim may differ")  # fmt: skip
        shape.append(sizes.pop() if sizes else 1)
    parts = [t.to(dtype).expand([t.shape[k] if k == d else n for k, n in enumerate(shape)])
             for t in tensors]  # fmt: skip
    return [torch.cat(parts, dim=d)]


def _cat_padded(run: Interpreter, r: Record, tensors: list, dim: int, dtype) -> torch.Tensor:
    """manual_padding=True: every operand is already padded to the output's shape; each
    position takes the operand whose unpadded part covers it (the last one otherwise)."""
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    d = dim % len(shape)
    pos = torch.arange(shape[d], device=run.device).view([-1 if k == d else 1 for k in range(len(shape))])
    out = tensors[-1].to(dtype).expand(shape)
    for ref, t in reversed(list(zip(r.args[0][:-1], tensors[:-1]))):
        lo, hi = padded_range(run, ref.index, d)
        out = torch.where((pos >= lo) & (pos < hi), t.to(dtype), out)
    return out.contiguous()


def padded_range(run: Interpreter, state: int, d: int) -> tuple[int, int]:
    """[lo, hi) of dim d of a pad's output that its source fills."""
    pad = next(rec for rec in run.records if rec.kind == "op" and rec.name == "pad"
               and rec.outputs[0].index == state)  # fmt: skip
    widths = run.sizes(pad.kw("pad_widths"))
    src = run.get(pad.args[0])
    rank = src.dim()
    k = rank - 1 - d
    lo = widths[2 * k] if 2 * k < len(widths) else 0
    return lo, lo + src.shape[d]
