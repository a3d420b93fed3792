"""Lowerings of aten's indexing ops onto the fusion's gathers and scatters: embedding onto
fd.ops.embedding_fwd, its dense backward onto fd.ops.index_put_accumulate into zeros.

The backward's sums run in float for half and bfloat16 gradients, as torch's kernel
accumulates, and come back in the gradient's dtype. Where this build's frontend has no
such op, the lowering refuses and the op stays eager.
"""
from __future__ import annotations

from typing import Any

from fusion_cache.frontend.dtypes import DataType

from .lowering import Args, LoweringContext, UnsupportedOpError, is_handle, lowers

_REDUCED = (DataType.Half, DataType.BFloat16)


def _op(ctx: LoweringContext, name: str) -> Any:
    fn = getattr(ctx.ops, name, None)
    if fn is None:
        raise UnsupportedOpError(f"this build's frontend has no fd.ops.{name}")
    return fn


@lowers("embedding")
def _embedding(ctx: LoweringContext, a: Args) -> Any:
    weight, indices = a[0], a[1]
    if a.get("sparse", False):
        raise UnsupportedOpError("sparse embedding")
    # padding_idx and scale_grad_by_freq change the backward only
    return _op(ctx, "embedding_fwd")(indices, weight)


@lowers("embedding_dense_backward")
def _embedding_backward(ctx: LoweringContext, a: Args) -> Any:
    ops = ctx.ops
    grad, indices, rows = a[0], a[1], a[2]
    padding_idx, by_freq = a.get("padding_idx", -1), a.get("scale_grad_by_freq", False)
    if by_freq or is_handle(by_freq):
        raise UnsupportedOpError("embedding backward scaled by frequency")
    if is_handle(rows) or is_handle(padding_idx):
        raise UnsupportedOpError("embedding backward whose sizes are known only at run time")
    accumulate = _op(ctx, "index_put_accumulate")
    width = ctx.extent(grad, grad.ndim - 1)
    flat_index = ops.reshape(indices, [-1])
    values = ops.reshape(grad, [-1, width])
    wide = DataType.Float if grad.dtype in _REDUCED else grad.dtype
    if wide is not grad.dtype:
        values = ops.cast(values, wide)
    if padding_idx >= 0:  # the padding row gets no gradient
        pad = ops.broadcast(ops.eq(flat_index, padding_idx), [False, True])
        values = ops.where(pad, 0.0, values)
    out = accumulate(ops.full([rows, width], 0.0, wide), flat_index, values)
    return out if wide is grad.dtype else ops.cast(out, grad.dtype)
