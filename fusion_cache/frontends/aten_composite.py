"""Lowerings of composite aten ops (softmax, norms, gelu, dropout in eval) and of the
backward ops AOTAutograd emits for them, composed from fd.ops primitives.

Half and BFloat16 inputs are computed in Float and cast back, as torch's kernels accumulate
in Float; the results then match torch within the usual reduced-precision tolerance.
"""
from __future__ import annotations

import math
from typing import Any

from fusion_cache.frontend.dtypes import DataType

from .lowering import (
    Args,
    LoweringContext,
    UnsupportedOpError,
    as_datatype,
    dims_of,
    is_handle,
    lowers,
)

_REDUCED = (DataType.Half, DataType.BFloat16)


def _wide(ctx: LoweringContext, x: Any) -> Any:
    return ctx.ops.cast(x, DataType.Float) if x.dtype in _REDUCED else x


def _to(ctx: LoweringContext, x: Any, dtype: DataType) -> Any:
    return x if x.dtype is dtype else ctx.ops.cast(x, dtype)


# ---- softmax --------------------------------------------------------------------------------


def _softmax_of(ctx: LoweringContext, x: Any, dim: int, out: DataType, log: bool) -> Any:
    ops = ctx.ops
    d = dims_of(dim, x.ndim)
    wide = _wide(ctx, x)
    shifted = ops.sub(wide, ops.max(wide, d, True))  # subtract the max: exp cannot overflow
    e = ops.exp(shifted)
    total = ops.sum(e, d, True)
    y = ops.sub(shifted, ops.log(total)) if log else ops.truediv(e, total)
    return _to(ctx, y, out)


@lowers("softmax", "log_softmax", "special_softmax", "special_log_softmax")
def _softmax(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    if a.get("dtype") is not None:
        x = _to(ctx, x, as_datatype(a.get("dtype")))
    return _softmax_of(ctx, x, a[1], x.dtype, "log_softmax" in a.op)


@lowers("_softmax", "_log_softmax")
def _softmax_internal(ctx: LoweringContext, a: Args) -> Any:
    x = a[0]
    out = DataType.Float if a[2] and x.dtype in _REDUCED else x.dtype
    return _softmax_of(ctx, x, a[1], out, a.op == "aten::_log_softmax")


@lowers("_softmax_backward_data")
def _softmax_backward(ctx: LoweringContext, a: Args) -> Any:
    ops = ctx.ops
    grad, out, d = _wide(ctx, a[0]), _wide(ctx, a[1]), dims_of(a[2], a[0].ndim)
    dot = ops.sum(ops.mul(grad, out), d, True)
    return _to(ctx, ops.mul(out, ops.sub(grad, dot)), as_datatype(a[3]))


@lowers("_log_softmax_backward_data")
def _log_softmax_backward(ctx: LoweringContext, a: Args) -> Any:
    ops = ctx.ops
    grad, out, d = _wide(ctx, a[0]), _wide(ctx, a[1]), dims_of(a[2], a[0].ndim)
    y = ops.sub(grad, ops.mul(ops.exp(out), ops.sum(grad, d, True)))
    return _to(ctx, y, as_datatype(a[3]))


# ---- layer norm -----------------------------------------------------------------------------


def _norm_dims(x: Any, normalized_shape: Any) -> tuple[list[int], list[int]]:
    n = len(normalized_shape)
    if n == 0 or n > x.ndim:
        raise UnsupportedOpError(f"layer_norm over {n} dims of a rank-{x.ndim} tensor")
    return list(range(x.ndim - n)), list(range(x.ndim - n, x.ndim))


def _layer_norm_of(ctx: LoweringContext, a: Args) -> tuple[Any, Any, Any]:
    ops = ctx.ops
    x, w, b, eps = a[0], a.get("weight"), a.get("bias"), a.get("eps", 1e-5)
    _, inner = _norm_dims(x, a[1])
    wide = _wide(ctx, x)
    var, mean = ops.var_mean(wide, inner, 0, True)
    rstd = ops.rsqrt(ops.add(var, eps))
    y = ops.mul(ops.sub(wide, mean), rstd)
    if w is not None:
        y = ops.mul(y, w)  # weight and bias broadcast from the right, like torch
    if b is not None:
        y = ops.add(y, b)
    return _to(ctx, y, x.dtype), mean, rstd


@lowers("layer_norm")
def _layer_norm(ctx: LoweringContext, a: Args) -> Any:
    return _layer_norm_of(ctx, a)[0]


@lowers("native_layer_norm")
def _native_layer_norm(ctx: LoweringContext, a: Args) -> Any:
    return _layer_norm_of(ctx, a)


@lowers("native_layer_norm_backward")
def _native_layer_norm_backward(ctx: LoweringContext, a: Args) -> Any:
    ops = ctx.ops
    grad_out, x, shape, mean, rstd = a[0], a[1], a[2], a[3], a[4]
    w, b, mask = a.get("weight"), a.get("bias"), list(a.get("output_mask", [True] * 3))
    outer, inner = _norm_dims(x, shape)
    grad, wide = _wide(ctx, grad_out), _wide(ctx, x)
    x_hat = ops.mul(ops.sub(wide, mean), rstd)
    grad_in = grad_w = grad_b = None
    if mask[0]:
        g = ops.mul(grad, w) if w is not None else grad
        n = ctx.numel(x, inner)
        mean_g = ops.truediv(ops.sum(g, inner, True), n)
        mean_gx = ops.truediv(ops.sum(ops.mul(g, x_hat), inner, True), n)
        grad_in = ops.mul(rstd, ops.sub(ops.sub(g, mean_g), ops.mul(x_hat, mean_gx)))
        grad_in = _to(ctx, grad_in, x.dtype)
    if mask[1] and w is not None:
        grad_w = _to(ctx, ops.sum(ops.mul(grad, x_hat), outer, False), w.dtype)
    if mask[2] and b is not None:
        grad_b = _to(ctx, ops.sum(grad, outer, False), b.dtype)
    return grad_in, grad_w, grad_b


# ---- batch norm -----------------------------------------------------------------------------


def _batch_norm_eval(ctx: LoweringContext, x: Any, w: Any, b: Any, rm: Any, rv: Any,
                     eps: Any) -> Any:  # fmt: skip
    """out = x * scale + shift with scale = w * rsqrt(var + eps), shift = b - mean * scale:
    the per-channel terms are computed once, then broadcast over the other dims."""
    ops = ctx.ops
    if rm is None or rv is None:
        raise UnsupportedOpError("batch_norm in eval mode without running statistics")
    if x.ndim < 2:
        raise UnsupportedOpError(f"batch_norm of a rank-{x.ndim} tensor")
    scale = ops.rsqrt(ops.add(_wide(ctx, rv), eps))
    if w is not None:
        scale = ops.mul(scale, w)
    shift = ops.neg(ops.mul(_wide(ctx, rm), scale))
    if b is not None:
        shift = ops.add(shift, b)
    flags = [d != 1 for d in range(x.ndim)]
    y = ops.add(ops.mul(_wide(ctx, x), ops.broadcast(scale, flags)), ops.broadcast(shift, flags))
    return _to(ctx, y, x.dtype)


def _training(a: Args, name: str = "training") -> bool:
    training = a.get(name, False)
    if is_handle(training):
        raise UnsupportedOpError("batch_norm whose training flag is only known at run time")
    return bool(training)


@lowers("batch_norm", "native_batch_norm")
def _batch_norm(ctx: LoweringContext, a: Args) -> Any:
    x, w, b = a[0], a.get("weight"), a.get("bias")
    rm, rv = a.get("running_mean"), a.get("running_var")
    if _training(a):
        # batch statistics, and the running statistics updated in place (fd.ops.batch_norm)
        out = ctx.ops.batch_norm(x, w, b, rm, rv, a.get("momentum", 0.1), a.get("eps", 1e-5),
                                 True)  # fmt: skip
        return out[0] if a.op == "aten::batch_norm" else out
    y = _batch_norm_eval(ctx, x, w, b, rm, rv, a.get("eps", 1e-5))
    # native_batch_norm's saved statistics are empty tensors in eval mode: not lowered
    return y if a.op == "aten::batch_norm" else (y, None, None)


@lowers("_native_batch_norm_legit_no_training")
def _batch_norm_no_training(ctx: LoweringContext, a: Args) -> Any:
    y = _batch_norm_eval(ctx, a[0], a[1], a[2], a[3], a[4], a.get("eps", 1e-5))
    return y, None, None


def _per_channel(ctx: LoweringContext, t: Any, ndim: int) -> Any:
    """A [C] tensor broadcast against [N, C, *] (channels in dim 1)."""
    return ctx.ops.broadcast(t, [d != 1 for d in range(ndim)])


def _channel_dims(x: Any, what: str) -> list[int]:
    if x.ndim < 2:
        raise UnsupportedOpError(f"{what} of a rank-{x.ndim} tensor")
    return [d for d in range(x.ndim) if d != 1]


@lowers("_native_batch_norm_legit_functional")
def _batch_norm_training(ctx: LoweringContext, a: Args) -> Any:
    """Batch statistics; the running statistics come back updated (the functional form
    AOTAutograd writes: the graph copies them into the buffers itself)."""
    ops = ctx.ops
    x, w, b, rm, rv = a[0], a.get("weight"), a.get("bias"), a[3], a[4]
    if not _training(a):
        raise UnsupportedOpError("_native_batch_norm_legit_functional in eval mode")
    momentum, eps = a.get("momentum", 0.1), a.get("eps", 1e-5)
    dims = _channel_dims(x, "batch_norm")
    wide = _wide(ctx, x)
    var, mean = ops.var_mean(wide, dims, 0, False)
    rstd = ops.rsqrt(ops.add(var, eps))
    y = ops.mul(ops.sub(wide, _per_channel(ctx, mean, x.ndim)), _per_channel(ctx, rstd, x.ndim))
    if w is not None:
        y = ops.mul(y, _per_channel(ctx, w, x.ndim))
    if b is not None:
        y = ops.add(y, _per_channel(ctx, b, x.ndim))
    n = ctx.numel(x, dims)
    unbiased = ops.mul(var, ops.truediv(n, ops.sub(n, 1)) if is_handle(n) else n / max(n - 1, 1))
    keep = 1.0 - momentum
    new_rm = ops.add(ops.mul(_wide(ctx, rm), keep), ops.mul(mean, momentum))
    new_rv = ops.add(ops.mul(_wide(ctx, rv), keep), ops.mul(unbiased, momentum))
    return (_to(ctx, y, x.dtype), mean, rstd, _to(ctx, new_rm, rm.dtype),
            _to(ctx, new_rv, rv.dtype))  # fmt: skip


@lowers("native_batch_norm_backward")
def _batch_norm_backward(ctx: LoweringContext, a: Args) -> Any:
    ops = ctx.ops
    dy, x, w = a[0], a[1], a.get("weight")
    train, eps = _training(a, "train"), a.get("eps", 1e-5)
    mask = list(a.get("output_mask", [True] * 3))
    dims = _channel_dims(x, "batch_norm backward")
    if train:
        mean, invstd = a.get("save_mean"), a.get("save_invstd")
    else:
        mean, rv = a.get("running_mean"), a.get("running_var")
        invstd = None if rv is None else ops.rsqrt(ops.add(_wide(ctx, rv), eps))
    if mean is None or invstd is None:
        raise UnsupportedOpError("batch_norm backward without saved or running statistics")
    g, wide = _wide(ctx, dy), _wide(ctx, x)
    mean, invstd = _wide(ctx, mean), _wide(ctx, invstd)
    x_hat = ops.mul(ops.sub(wide, _per_channel(ctx, mean, x.ndim)),
                    _per_channel(ctx, invstd, x.ndim))  # fmt: skip
    sum_dy = ops.sum(g, dims, False) if (mask[2] or (mask[0] and train)) else None
    sum_dy_xhat = ops.sum(ops.mul(g, x_hat), dims, False) if (mask[1] or (mask[0] and train)) else None
    grad_in = grad_w = grad_b = None
    if mask[0]:
        scale = invstd if w is None else ops.mul(invstd, _wide(ctx, w))
        if train:
            n = ctx.numel(x, dims)
            mean_dy = _per_channel(ctx, ops.truediv(sum_dy, n), x.ndim)
            mean_dy_xhat = _per_channel(ctx, ops.truediv(sum_dy_xhat, n), x.ndim)
            g = ops.sub(ops.sub(g, mean_dy), ops.mul(x_hat, mean_dy_xhat))
        grad_in = _to(ctx, ops.mul(g, _per_channel(ctx, scale, x.ndim)), x.dtype)
    if mask[1] and w is not None:
        grad_w = _to(ctx, sum_dy_xhat, w.dtype)
    if mask[2] and w is not None:
        grad_b = _to(ctx, sum_dy, w.dtype)
    return grad_in, grad_w, grad_b


# ---- nll_loss -------------------------------------------------------------------------------
# The class a target picks is found by comparing it with an iota over the classes, not by a
# gather: the compare fuses into the reduction over the classes (and into log_softmax).

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _picked(ctx: LoweringContext, x: Any, target: Any, weight: Any,
            ignore_index: Any) -> tuple[Any, Any]:  # fmt: skip
    """(where(target == class), the weight of each row's target, 0 where ignored) of
    log-probabilities x [N, C] and targets [N]."""
    ops = ctx.ops
    if x.ndim != 2 or target.ndim != 1:
        raise UnsupportedOpError(f"nll_loss of a rank-{x.ndim} input (rank 2 is lowered)")
    classes = ops.broadcast(ops.iota(ctx.extent(x, 1), 0, 1, DataType.Int), [True, False])
    hit = ops.eq(classes, ops.broadcast(target, [False, True]))
    valid = ops.ne(target, ignore_index)
    if weight is None:
        w_t = ops.cast(valid, DataType.Float)
    else:
        w_row = ops.broadcast(_wide(ctx, weight), [True, False])
        w_t = ops.where(valid, ops.sum(ops.where(hit, w_row, 0.0), [1], False), 0.0)
    return hit, w_t


def _reduction(a: Args, index: int) -> str:
    reduction = a.get("reduction", a.get(index))
    if is_handle(reduction) or reduction not in _REDUCTIONS:
        raise UnsupportedOpError(f"nll_loss reduction {reduction!r}")
    return _REDUCTIONS[reduction]


@lowers("nll_loss_forward")
def _nll_loss_forward(ctx: LoweringContext, a: Args) -> Any:
    ops = ctx.ops
    x, target, weight, ignore = a[0], a[1], a.get("weight"), a.get("ignore_index", -100)
    reduction = _reduction(a, 3)
    hit, w_t = _picked(ctx, x, target, weight, ignore)
    picked = ops.sum(ops.where(hit, _wide(ctx, x), 0.0), [1], False)
    loss = ops.neg(ops.mul(picked, w_t))
    total = ops.sum(w_t, [0], False)
    if reduction == "none":
        return _to(ctx, loss, x.dtype), ops.full([], 0.0, DataType.Float)
    out = ops.sum(loss, [0], False)
    if reduction == "mean":
        out = ops.truediv(out, total)
    return _to(ctx, out, x.dtype), _to(ctx, total, x.dtype)


@lowers("nll_loss_backward")
def _nll_loss_backward(ctx: LoweringContext, a: Args) -> Any:
    ops = ctx.ops
    grad, x, target, weight = a[0], a[1], a[2], a.get("weight")
    reduction, ignore, total = _reduction(a, 4), a.get("ignore_index", -100), a[6]
    hit, w_t = _picked(ctx, x, target, weight, ignore)
    scale = ops.neg(ops.mul(_wide(ctx, grad), w_t))  # grad: 0-dim, or [N] for 'none'
    if reduction == "mean":
        scale = ops.truediv(scale, _wide(ctx, total))
    g = ops.where(hit, ops.broadcast(scale, [False, True]), 0.0)
    return _to(ctx, g, x.dtype)


# ---- activations and their backward --------------------------------------------------------

_SQRT1_2 = math.sqrt(0.5)
_TANH_BETA = math.sqrt(2.0 / math.pi)
_TANH_KAPPA = 0.044715
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _approximate(a: Args, index: int) -> str:
    mode = a.get("approximate", "none") if a.names else a.get(index, "none")
    if mode not in ("none", "tanh"):
        raise UnsupportedOpError(f"gelu approximate={mode!r}")
    return mode


@lowers("gelu")
def _gelu(ctx: LoweringContext, a: Args) -> Any:
    ops = ctx.ops
    x = _wide(ctx, a[0])
    if _approximate(a, 1) == "tanh":
        inner = ops.mul(_TANH_BETA, ops.add(x, ops.mul(_TANH_KAPPA, ops.mul(ops.mul(x, x), x))))
        y = ops.mul(ops.mul(0.5, x), ops.add(1.0, ops.tanh(inner)))
    else:
        y = ops.mul(ops.mul(x, 0.5), ops.add(1.0, ops.erf(ops.mul(x, _SQRT1_2))))
    return _to(ctx, y, a[0].dtype)


@lowers("gelu_backward")
def _gelu_backward(ctx: LoweringContext, a: Args) -> Any:
    ops = ctx.ops
    grad, x = _wide(ctx, a[0]), _wide(ctx, a[1])
    if _approximate(a, 2) == "tanh":
        x_sq = ops.mul(x, x)
        inner = ops.mul(_TANH_BETA, ops.add(x, ops.mul(_TANH_KAPPA, ops.mul(x_sq, x))))
        t = ops.tanh(inner)
        left = ops.mul(0.5, ops.add(1.0, t))
        d_inner = ops.mul(_TANH_BETA, ops.add(1.0, ops.mul(3.0 * _TANH_KAPPA, x_sq)))
        right = ops.mul(ops.mul(ops.mul(0.5, x), ops.sub(1.0, ops.mul(t, t))), d_inner)
        dy = ops.add(left, right)
    else:
        cdf = ops.mul(0.5, ops.add(1.0, ops.erf(ops.mul(x, _SQRT1_2))))
        pdf = ops.mul(_INV_SQRT_2PI, ops.exp(ops.mul(-0.5, ops.mul(x, x))))
        dy = ops.add(cdf, ops.mul(x, pdf))
    return _to(ctx, ops.mul(grad, dy), a[0].dtype)


@lowers("threshold_backward")
def _threshold_backward(ctx: LoweringContext, a: Args) -> Any:
    grad, x, threshold = a[0], a[1], a[2]
    return ctx.ops.where(ctx.ops.le(x, threshold), 0, grad)


@lowers("sigmoid_backward")
def _sigmoid_backward(ctx: LoweringContext, a: Args) -> Any:
    ops = ctx.ops
    grad, y = a[0], a[1]
    return ops.mul(grad, ops.mul(ops.sub(1, y), y))


@lowers("tanh_backward")
def _tanh_backward(ctx: LoweringContext, a: Args) -> Any:
    ops = ctx.ops
    grad, y = a[0], a[1]
    return ops.mul(grad, ops.sub(1, ops.mul(y, y)))


@lowers("silu_backward")
def _silu_backward(ctx: LoweringContext, a: Args) -> Any:
    ops = ctx.ops
    grad, x = _wide(ctx, a[0]), _wide(ctx, a[1])
    s = ops.sigmoid(x)
    y = ops.mul(grad, ops.mul(s, ops.add(1.0, ops.mul(x, ops.sub(1.0, s)))))
    return _to(ctx, y, a[0].dtype)


@lowers("native_dropout_backward")
def _dropout_backward(ctx: LoweringContext, a: Args) -> Any:
    grad, mask, scale = a[0], a[1], a[2]  # the mask was drawn in eager: this part is exact
    return _to(ctx, ctx.ops.mul(ctx.ops.mul(grad, ctx.ops.cast(mask, grad.dtype)), scale),
               grad.dtype)  # fmt: skip


@lowers("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout")
def _dropout(ctx: LoweringContext, a: Args) -> Any:
    p, train = a[1], a[2]
    if is_handle(p) or is_handle(train):
        raise UnsupportedOpError(f"{a.op} whose p or train is only known at run time")
    if train and p != 0:
        raise UnsupportedOpError(f"{a.op} in training mode (random masks are not lowered)")
    return a[0]
