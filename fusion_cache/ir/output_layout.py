"""The memory order each output of a fusion is returned in.

Note [Output layouts]: an output is row-major unless it asks otherwise, in one of two ways
nvFuser offers: `fd.add_output(t, stride_order=[...])` (also positional), or `t` made by
`fd.ops.stride_order(x, [...])`. stride_order[i] is dim i's rank by stride, 0 for the
innermost. The schedulers write such an output through its strides in the kernel (the
pointwise and reduction output paths store through per-dim strides), the executor allocates
it with those strides, and the reference evaluator lays its result out the same way; the
layout is never a copy after the kernel. Where the op's result is not an output, it is the
same values, and it costs nothing (it lowers to `set`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fusion_cache.frontend.layout import is_default_stride_order


def normalized_order(order: Sequence[int], ndim: int) -> tuple[int, ...]:
    """A stride order with negative entries made positive; () for row-major."""
    norm = tuple(d % ndim for d in order) if ndim else ()
    return () if is_default_stride_order(norm) else norm


def output_stride_orders(fd: Any) -> list[tuple[int, ...]]:
    """Per output record of `fd`, in order: the stride order its tensor is returned in."""
    cached = fd.__dict__.get("_output_orders_cache")
    if cached is not None and cached[0] == len(fd._records):
        return cached[1]
    result = _orders(fd)
    fd.__dict__["_output_orders_cache"] = (len(fd._records), result)  # records only grow
    return result


def _orders(fd: Any) -> list[tuple[int, ...]]:
    orders_made = {}
    for r in fd._records:
        if r.kind == "op" and r.name == "stride_order":
            orders_made[r.outputs[0].index] = r.kw("stride_order")
    result = []
    for r in fd.output_records():
        idx = r.args[0].index
        order = r.kw("stride_order") or orders_made.get(idx, ())
        info = fd._infos[idx]
        result.append(normalized_order(order, getattr(info, "ndim", 0)) if order else ())
    return result


def strides_for(shape: Sequence[int], order: Sequence[int]) -> list[int]:
    """Dense strides of `shape` laid out in `order` (row-major for ())."""
    n = len(shape)
    if not order:
        order = tuple(range(n - 1, -1, -1))
    strides = [0] * n
    acc = 1
    for d in sorted(range(n), key=lambda d: order[d]):
        strides[d] = acc
        acc *= max(shape[d], 1)
    return strides


def channels_last_order(ndim: int) -> tuple[int, ...]:
    """The stride order of torch's channels-last formats: dim 1 (channels) innermost, then
    the spatial dims, the batch dim outermost ((3, 0, 2, 1) for NCHW)."""
    return (ndim - 1, 0, *range(ndim - 2, 0, -1))


def channels_last_format(ndim: int) -> Any:
    """torch's channels-last memory format for a tensor of rank `ndim` (None: it has none)."""
    import torch

    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(ndim)


def prefers_channels_last(fd: Any) -> bool:
    """Note [Channels-last convolutions]: a fusion with a channels-last convolution, or with
    a 4-D or 5-D input declared in channels-last order (an earlier convolution's result)
    writes its fresh 4-D and 5-D tensors channels-last too, so the layout flows from one
    convolution to the next without a conversion."""
    cached = fd.__dict__.get("_prefers_cl_cache")
    if cached is not None and cached[0] == len(fd._records):
        return cached[1]
    found = any(r.kind == "op" and r.kw("channels_last", False) for r in fd._records)
    for ref in () if found else fd.input_refs():
        info = fd._infos[ref.index]
        order = getattr(info, "stride_order", ())
        if getattr(info, "ndim", 0) in (4, 5) and tuple(order) == channels_last_order(info.ndim):
            found = True
            break
    fd.__dict__["_prefers_cl_cache"] = (len(fd._records), found)
    return found


def preferred_order(fd: Any, ndim: int) -> tuple[int, ...]:
    """The stride order a fresh tensor of rank `ndim` of `fd` is written in where nothing
    asks for one: channels-last in a fusion that prefers it, else row-major (())."""
    if ndim in (4, 5) and prefers_channels_last(fd):
        return channels_last_order(ndim)
    return ()
