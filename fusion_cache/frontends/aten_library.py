"""Lowerings of the aten ops a library does best onto the fusion's ATen ops (Note [ATen
segments] in schedulers/aten.py): mm, addmm, bmm and linear onto fd.ops.matmul/linear,
flash attention and its backward onto fd.ops.sdpfa_fwd/sdpfa_bwd, cuDNN's onto
fd.ops.sdpa_cudnn_fwd/sdpa_cudnn_bwd, memory-efficient attention's onto
fd.ops.sdpa_efficient_fwd/sdpa_efficient_bwd, convolution and its backward onto
fd.ops.convolution/convolution_backward. Inside a region they
become segments of their own, so the casts, bias adds and activations around them fuse
into the generated kernels before and after, in the same region call.

Each attention kernel lowers onto its own op (sdpfa_fwd is torch's flash attention,
sdpa_cudnn_fwd cuDNN's), never onto another kernel's: a region's log-sum-exp and random
state are what eager's backward of the same kernel expects (and the other way round)
whichever side of a forward/backward pair lowers. Where this build's frontend has no such
op, the lowering refuses and the op stays eager.
"""
from __future__ import annotations

import os
from typing import Any

from fusion_cache.frontend.dtypes import DataType

from .lowering import Args, LoweringContext, UnsupportedOpError, is_handle, is_tensor, lowers


def _op(ctx: LoweringContext, name: str) -> Any:
    fn = getattr(ctx.ops, name, None)
    if fn is None:
        raise UnsupportedOpError(f"this build's frontend has no fd.ops.{name}")
    return fn


def _is_one(value: Any) -> bool:
    return not is_handle(value) and value == 1


# ---- GEMMs ----------------------------------------------------------------------------------


@lowers("mm", "bmm", "matmul")
def _mm(ctx: LoweringContext, a: Args) -> Any:
    return _op(ctx, "matmul")(a[0], a[1])


def transposed_weight(ctx: LoweringContext, t: Any) -> Any:
    """W where `t` is this fusion's permute [1, 0] of a 2-D W (aten writes x @ W.t() for a
    linear layer), else None."""
    record = ctx.producer(t)
    if record is None or record.name != "permute" or t.ndim != 2:
        return None
    if tuple(record.kw("dims")) != (1, 0):
        return None
    return ctx.handle(record.args[0])


@lowers("addmm")
def _addmm(ctx: LoweringContext, a: Args) -> Any:
    """beta * bias + alpha * (mat1 @ mat2): a linear layer with the bias in the GEMM's
    epilogue where the bias is one row (x @ mat2 + b is linear(x, mat2.T, b), the transpose
    a view the ATen segment takes along); else a matmul and an add."""
    bias, x, mat2 = a[0], a[1], a[2]
    beta, alpha = a.get("beta", 1), a.get("alpha", 1)
    plain = _is_one(beta) and _is_one(alpha)
    if plain and is_tensor(bias) and bias.ndim == 1 and bias.dtype is x.dtype \
            and hasattr(ctx.ops, "linear"):  # fmt: skip
        weight = transposed_weight(ctx, mat2)
        if weight is None:
            weight = ctx.ops.permute(mat2, [1, 0])
        return ctx.ops.linear(x, weight, bias)
    out = _op(ctx, "matmul")(x, mat2)
    if not _is_one(alpha):
        out = ctx.ops.mul(out, alpha)
    if not _is_one(beta):
        bias = ctx.ops.mul(bias, beta)
    return ctx.ops.add(out, bias)


@lowers("linear")
def _linear(ctx: LoweringContext, a: Args) -> Any:
    return _op(ctx, "linear")(a[0], a[1], a.get("bias"))


# ---- attention ------------------------------------------------------------------------------


def _attention_flags(a: Args, what: str) -> tuple[float, bool, Any]:
    p, causal, scale = a.get("dropout_p", 0.0), a.get("is_causal", False), a.get("scale")
    if any(is_handle(v) for v in (p, causal, scale)):
        raise UnsupportedOpError(f"{what} whose flags are known only at run time")
    if p:
        raise UnsupportedOpError(f"{what} with dropout (its mask is drawn by torch's kernel)")
    return float(p), bool(causal), scale


@lowers("_scaled_dot_product_flash_attention")
def _flash_attention(ctx: LoweringContext, a: Args) -> Any:
    """(output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused,
    debug_attn_mask): the dense form has no cumulative sequences (None), static lengths,
    and an empty debug mask."""
    out, lse, seed, offset, max_q, max_k = _dense_attention(ctx, a, "flash attention",
                                                            "sdpfa_fwd")  # fmt: skip
    empty = ctx.ops.full([0], 0.0, a[0].dtype)
    return out, lse, None, None, max_q, max_k, seed, offset, empty


def _dense_attention(ctx: LoweringContext, a: Args, what: str, op: str) -> tuple:
    """A dense attention forward's (output, logsumexp, seed, offset, max_q, max_k) through
    fd op `op`: no debug mask, sequence lengths known when the region is lowered."""
    q, k, v = a[0], a[1], a[2]
    p, causal, scale = _attention_flags(a, what)
    if a.get("return_debug_mask", False):
        raise UnsupportedOpError(f"{what} returning its debug mask")
    out, lse, seed, offset = _op(ctx, op)(q, k, v, p, causal, scale)
    max_q, max_k = ctx.known_extent(q, 2), ctx.known_extent(k, 2)
    if max_q is None or max_k is None:
        raise UnsupportedOpError(f"{what} over sequence lengths known only at run time")
    return out, lse, seed, offset, max_q, max_k


@lowers("_scaled_dot_product_flash_attention_backward")
def _flash_attention_backward(ctx: LoweringContext, a: Args) -> Any:
    grad, q, k, v, out, lse = (a[i] for i in range(6))
    p, causal, scale = _attention_flags(a, "flash attention backward")
    seed, offset = a.get("philox_seed"), a.get("philox_offset")
    if not (is_tensor(seed) and is_tensor(offset)):
        raise UnsupportedOpError("flash attention backward without its random state tensors")
    return _op(ctx, "sdpfa_bwd")(grad, q, k, v, out, lse, p, causal, seed, offset, scale)


@lowers("_scaled_dot_product_flash_attention_for_cpu")
def _flash_attention_cpu(ctx: LoweringContext, a: Args) -> Any:
    if a.get("attn_mask") is not None:
        raise UnsupportedOpError("attention with a mask")
    p, causal, scale = _attention_flags(a, "flash attention")
    out, lse, _, _ = _op(ctx, "sdpfa_fwd")(a[0], a[1], a[2], p, causal, scale)
    return out, lse


@lowers("_scaled_dot_product_flash_attention_for_cpu_backward")
def _flash_attention_cpu_backward(ctx: LoweringContext, a: Args) -> Any:
    if a.get("attn_mask") is not None:
        raise UnsupportedOpError("attention with a mask")
    p, causal, scale = _attention_flags(a, "flash attention backward")
    backward = _op(ctx, "sdpfa_bwd")
    # the CPU kernel draws no random numbers: a zero state stands for the one it has not
    seed = ctx.ops.full([2], 0, DataType.UInt64)
    offset = ctx.ops.full([], 0, DataType.UInt64)
    grad, q, k, v, out, lse = (a[i] for i in range(6))
    return backward(grad, q, k, v, out, lse, p, causal, seed, offset, scale)


def _no_bias(a: Args, what: str) -> None:
    if a.get("attn_bias") is not None:
        raise UnsupportedOpError(f"{what} with an attention bias (mask)")


@lowers("_scaled_dot_product_cudnn_attention")
def _cudnn_attention(ctx: LoweringContext, a: Args) -> Any:
    """(output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset,
    debug_attn_mask): the dense form has no cumulative sequences and no debug mask (None,
    as torch's own kernel returns them), static lengths."""
    _no_bias(a, "cuDNN attention")
    out, lse, seed, offset, max_q, max_k = _dense_attention(ctx, a, "cuDNN attention",
                                                            "sdpa_cudnn_fwd")  # fmt: skip
    return out, lse, None, None, max_q, max_k, seed, offset, None


@lowers("_scaled_dot_product_cudnn_attention_backward")
def _cudnn_attention_backward(ctx: LoweringContext, a: Args) -> Any:
    grad, q, k, v, out, lse, seed, offset = (a[i] for i in range(8))
    _no_bias(a, "cuDNN attention backward")
    if a.get("cum_seq_q") is not None or a.get("cum_seq_k") is not None:
        raise UnsupportedOpError("cuDNN attention backward over packed (varlen) sequences")
    if not (is_tensor(seed) and is_tensor(offset)):
        raise UnsupportedOpError("cuDNN attention backward without its random state tensors")
    p, causal, scale = _attention_flags(a, "cuDNN attention backward")
    return _op(ctx, "sdpa_cudnn_bwd")(grad, q, k, v, out, lse, seed, offset, p, causal, scale)


@lowers("_scaled_dot_product_efficient_attention")
def _efficient_attention(ctx: LoweringContext, a: Args) -> Any:
    """(output, log_sumexp, philox_seed, philox_offset), the mask (attn_bias) taken along."""
    p, causal, scale = _attention_flags(a, "memory-efficient attention")
    if not a.get("compute_log_sumexp", False):
        raise UnsupportedOpError("memory-efficient attention without its log-sum-exp "
                                 "(torch's is empty then)")  # fmt: skip
    return _op(ctx, "sdpa_efficient_fwd")(a[0], a[1], a[2], a.get("attn_bias"), p, causal,
                                          scale)  # fmt: skip


@lowers("_scaled_dot_product_efficient_attention_backward")
def _efficient_attention_backward(ctx: LoweringContext, a: Args) -> Any:
    """(grad_query, grad_key, grad_value, grad_bias): the three, where those are the ones
    asked for (grad_input_mask); the mask's gradient stays with eager."""
    grad, q, k, v, bias, out, lse, seed, offset = (a[i] for i in range(9))
    mask = tuple(a.get("grad_input_mask", ()))
    if mask[:3] != (True, True, True) or (len(mask) > 3 and mask[3]):
        raise UnsupportedOpError(f"memory-efficient attention backward with grad_input_mask "
                                 f"{list(mask)} (the three gradients, not the mask's)")  # fmt: skip
    if not (is_tensor(seed) and is_tensor(offset)):
        raise UnsupportedOpError("memory-efficient attention backward without its random state")
    p, causal, scale = _attention_flags(a, "memory-efficient attention backward")
    grads = _op(ctx, "sdpa_efficient_bwd")(grad, q, k, v, bias, out, lse, seed, offset, p,
                                           causal, scale)  # fmt: skip
    return (*grads, None)


# ---- convolution ----------------------------------------------------------------------------


def _conv_layout(a: Args, what: str) -> dict[str, Any]:
    names = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")
    layout = {name: a.get(name) for name in names}
    flat = [v for value in layout.values() for v in (value if isinstance(value, (list, tuple))
                                                     else (value,))]  # fmt: skip
    if any(is_handle(v) for v in flat):
        raise UnsupportedOpError(f"{what} whose stride, padding or groups are known only at run "
                                 "time")  # fmt: skip
    return layout


CONV_LAYOUTS = ("channels_last", "as_traced")


def conv_layout_knob() -> str:
    """FUSION_CACHE_CONV_LAYOUT: "channels_last" runs convolutions (forward and backward) on
    channels-last activations, and the fusions around them keep that layout (Note
    [Channels-last convolutions]); "as_traced" hands them the layout they come in."""
    value = os.environ.get("FUSION_CACHE_CONV_LAYOUT", "").strip() or "as_traced"
    if value not in CONV_LAYOUTS:
        raise UnsupportedOpError(f"FUSION_CACHE_CONV_LAYOUT={value!r}: valid are "
                                 f"{', '.join(CONV_LAYOUTS)}")  # fmt: skip
    return value


def _channels_last(x: Any) -> dict[str, Any]:
    """The op's channels_last argument: asked for by the knob, where torch has the format."""
    wanted = conv_layout_knob() == "channels_last" and x.ndim in (4, 5)
    return {"channels_last": True} if wanted else {}


@lowers("convolution")
def _convolution(ctx: LoweringContext, a: Args) -> Any:
    return _op(ctx, "convolution")(a[0], a[1], a.get("bias"), **_conv_layout(a, "convolution"),
                                   **_channels_last(a[0]))  # fmt: skip


@lowers("convolution_backward")
def _convolution_backward(ctx: LoweringContext, a: Args) -> Any:
    """(grad_input, grad_weight, grad_bias), None where output_mask does not ask; the bias's
    size is the output's channel count, as bias_sizes says for a layer with a bias."""
    grad, x, w = a[0], a[1], a[2]
    mask = tuple(bool(m) for m in a.get("output_mask", (True, True, True)))
    sizes = a.get("bias_sizes")
    if mask[2] and sizes is not None:
        channels = ctx.known_extent(grad, 1)
        if len(sizes) != 1 or is_handle(sizes[0]) or channels not in (None, sizes[0]):
            raise UnsupportedOpError(f"convolution backward with bias_sizes {list(sizes)} "
                                     f"for {channels} output channels")  # fmt: skip
    layout = _conv_layout(a, "convolution backward")
    return _op(ctx, "convolution_backward")(grad, x, w, **layout, output_mask=mask,
                                            **_channels_last(x))  # fmt: skip
