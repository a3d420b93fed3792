"""Rules of the ATen ops (fusion_cache/frontend/ops/aten.py): each is the torch call an ATen
segment makes (schedulers/aten.py), so the reference and the GPU run the same function.
Where torch's CUDA kernel has no CPU twin (flash, cuDNN and memory-efficient attention), the
CPU takes torch's CPU kernel of the same op; its dropout cannot be replayed by a backward, so
it is refused."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.frontend.ops.aten import efficient_lse_length
from fusion_cache.frontend.records import Record

from ..output_layout import channels_last_format
from .core import Interpreter, rule


@rule("matmul")
def _matmul(run: Interpreter, r: Record) -> list:
    a, b = (run.get(x) for x in r.args)
    return [torch.matmul(a, b)]


@rule("bmm")
def _bmm(run: Interpreter, r: Record) -> list:
    a, b = (run.get(x) for x in r.args)
    return [torch.bmm(a, b)]


@rule("linear")
def _linear(run: Interpreter, r: Record) -> list:
    x, w, bias = (run.get(a) for a in r.args)
    return [F.linear(x, w, bias)]


def _attention_flags(run: Interpreter, p, causal, scale) -> tuple[float, bool, float | None]:
    p = 0.0 if p is None else float(run.get(p))
    causal = False if causal is None else bool(run.get(causal))
    scale = None if scale is None else float(run.get(scale))
    return p, causal, scale


def _flash(q: torch.Tensor) -> bool:
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


def _host(t: torch.Tensor) -> torch.Tensor:
    """A tensor for torch's CPU kernel; meta tensors (shape analysis) stay meta."""
    return t if t.is_meta else t.cpu()


@rule("sdpfa_fwd")
def _sdpfa_fwd(run: Interpreter, r: Record) -> list:
    q, k, v = (run.get(a) for a in r.args[:3])
    p, causal, scale = _attention_flags(run, *r.args[3:])
    if _flash(q):
        out, lse, *_, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, p, causal, False, scale=scale)
        return [out, lse, seed, offset]
    if p > 0:
        raise ValueError(f"sdpfa_fwd ({r.outputs[0]}): dropout_p={p} needs flash attention "
                         "(half or bfloat16 CUDA tensors): sdpfa_bwd could not replay the "
                         "dropout mask of another kernel")  # fmt: skip
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _host(q), _host(k), _host(v), 0.0, causal, scale=scale)
    seed = torch.zeros(2, dtype=torch.uint64, device=q.device)
    offset = torch.zeros((), dtype=torch.uint64, device=q.device)
    return [out.to(q.device), lse.to(q.device), seed, offset]


def sdpfa_output_only(run: Interpreter, r: Record) -> list:
    """sdpfa_fwd where nothing reads its logsumexp or seeds (no sdpfa_bwd replays them; Note
    [Prepared ATen calls]): on CUDA without dropout, torch's own dispatcher, which picks the
    fastest backend of the GPU, as eager and torch.compile do (cuDNN on the H100: 51 us against
    flash's 81 us at [8, 12, 1024, 64] causal bf16). Otherwise the op's rule."""
    q, k, v = (run.get(a) for a in r.args[:3])
    p, causal, scale = _attention_flags(run, *r.args[3:])
    if not q.is_cuda or p > 0:
        return _sdpfa_fwd(run, r)
    return [F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale),
            None, None, None]


@rule("sdpfa_bwd")
def _sdpfa_bwd(run: Interpreter, r: Record) -> list:
    go, q, k, v, out, lse = (run.get(a) for a in r.args[:6])
    p_ref, causal_ref, seed_ref, offset_ref, scale_ref = r.args[6:]
    p, causal, scale = _attention_flags(run, p_ref, causal_ref, scale_ref)
    if _flash(q):
        seed, offset = run.get(seed_ref), run.get(offset_ref)
        return list(torch.ops.aten._scaled_dot_product_flash_attention_backward(
            go, q, k, v, out, lse, None, None, q.shape[2], k.shape[2], p, causal, seed, offset,
            scale=scale))  # fmt: skip
    if p > 0:
        raise ValueError(f"sdpfa_bwd ({r.outputs[0]}): dropout_p={p} needs flash attention "
                         "(half or bfloat16 CUDA tensors)")  # fmt: skip
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        *(_host(t) for t in (go, q, k, v, out, lse)), 0.0, causal, scale=scale)
    return [g.to(q.device) for g in grads]


def _cudnn(q: torch.Tensor) -> bool:
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


@rule("sdpa_cudnn_fwd")
def _sdpa_cudnn_fwd(run: Interpreter, r: Record) -> list:
    """cuDNN's attention on CUDA; elsewhere torch's CPU kernel, its log-sum-exp given the
    trailing unit dim cuDNN's has (the CPU backward below takes it off again)."""
    q, k, v = (run.get(a) for a in r.args[:3])
    p, causal, scale = _attention_flags(run, *r.args[3:])
    if _cudnn(q):
        out, lse, *_, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, p, causal, False, scale=scale)
        return [out, lse, seed, offset]
    if p > 0:
        raise ValueError(f"sdpa_cudnn_fwd ({r.outputs[0]}): dropout_p={p} needs cuDNN "
                         "(half or bfloat16 CUDA tensors)")  # fmt: skip
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _host(q), _host(k), _host(v), 0.0, causal, scale=scale)
    seed = torch.zeros((), dtype=torch.int64, device=q.device)
    offset = torch.zeros((), dtype=torch.int64, device=q.device)
    return [out.to(q.device), lse.unsqueeze(-1).to(q.device), seed, offset]


@rule("sdpa_cudnn_bwd")
def _sdpa_cudnn_bwd(run: Interpreter, r: Record) -> list:
    go, q, k, v, out, lse, seed, offset = (run.get(a) for a in r.args[:8])
    p, causal, scale = _attention_flags(run, *r.args[8:])
    if _cudnn(q):
        return list(torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            go, q, k, v, out, lse, seed, offset, None, None, None, q.shape[2], k.shape[2], p,
            causal, scale=scale))  # fmt: skip
    if p > 0:
        raise ValueError(f"sdpa_cudnn_bwd ({r.outputs[0]}): dropout_p={p} needs cuDNN")
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        *(_host(t) for t in (go, q, k, v, out, lse.squeeze(-1))), 0.0, causal, scale=scale)
    return [g.to(q.device) for g in grads]


@rule("sdpa_efficient_fwd")
def _sdpa_efficient_fwd(run: Interpreter, r: Record) -> list:
    """Memory-efficient attention on CUDA; elsewhere torch's CPU kernel, its log-sum-exp
    padded with zeros to the CUDA kernel's length (the CPU backward below cuts it again)."""
    q, k, v, bias = (run.get(a) for a in r.args[:4])
    p, causal, scale = _attention_flags(run, *r.args[4:])
    if q.is_cuda:
        out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, True, p, causal, scale=scale)
        return [out, lse, seed, offset]
    if p > 0:
        raise ValueError(f"sdpa_efficient_fwd ({r.outputs[0]}): dropout_p={p} needs CUDA "
                         "tensors")  # fmt: skip
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _host(q), _host(k), _host(v), 0.0, causal, attn_mask=None if bias is None else
        _host(bias), scale=scale)  # fmt: skip
    lse = F.pad(lse, (0, efficient_lse_length(lse.shape[2]) - lse.shape[2]))
    zero = torch.zeros((), dtype=torch.int64, device=q.device)
    return [out.to(q.device), lse.to(q.device), zero, zero.clone()]


@rule("sdpa_efficient_bwd")
def _sdpa_efficient_bwd(run: Interpreter, r: Record) -> list:
    go, q, k, v, bias, out, lse, seed, offset = (run.get(a) for a in r.args[:9])
    p, causal, scale = _attention_flags(run, *r.args[9:])
    if q.is_cuda:
        return list(torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            go, q, k, v, bias, out, lse, seed, offset, p, [True, True, True, False], causal,
            scale=scale)[:3])  # fmt: skip
    if p > 0:
        raise ValueError(f"sdpa_efficient_bwd ({r.outputs[0]}): dropout_p={p} needs CUDA")
    lse = lse[..., : q.shape[2]].contiguous()
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        *(_host(t) for t in (go, q, k, v, out, lse)), 0.0, causal,
        attn_mask=None if bias is None else _host(bias), scale=scale)  # fmt: skip
    return [g.to(q.device) for g in grads]


@rule("grouped_mm")
def _grouped_mm(run: Interpreter, r: Record) -> list:
    a, b, offsets = (run.get(x) for x in r.args)
    return [torch._grouped_mm(a, b, offs=offsets.to(torch.int32))]


@rule("scaled_mm")
def _scaled_mm(run: Interpreter, r: Record) -> list:
    a, b, sa, sb, alpha, bias, beta = (run.get(x) for x in r.args)
    dt = to_torch(r.kw("dtype"))
    if a.is_cuda:  # cuBLASLt's float8 GEMM wants its second operand column-major
        b = b if b.stride(0) == 1 else b.t().contiguous().t()
        if alpha is None and beta is None and (bias is None or bias.dtype == dt):
            return [torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=dt)]
        out = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
    else:
        out = torch.matmul(a.float() * sa.float(), b.float() * sb.float())
    if alpha is not None:
        out = out * alpha.float()
    if bias is not None:
        out = out + (bias.float() if beta is None else bias.float() * beta.float())
    return [out.to(dt)]


@rule("cumsum")
def _cumsum(run: Interpreter, r: Record) -> list:
    x = run.get(r.args[0])
    return [torch.cumsum(x, r.kw("dim")).to(to_torch(run.infos[r.outputs[0].index].dtype))]


@rule("argsort")
def _argsort(run: Interpreter, r: Record) -> list:
    x = run.get(r.args[0])
    return [torch.argsort(x, dim=r.kw("dim"), descending=r.kw("descending"), stable=r.kw("stable"))]


@rule("topk")
def _topk(run: Interpreter, r: Record) -> list:
    x, k = run.get(r.args[0]), int(run.get(r.args[1]))
    values, indices = torch.topk(x, k, dim=r.kw("dim"), largest=r.kw("largest"),
                                 sorted=r.kw("sorted"))  # fmt: skip
    return [values, indices]


def _conv_layout(r: Record) -> tuple:
    return tuple(r.kw(name) for name in ("stride", "padding", "dilation", "transposed",
                                         "output_padding", "groups"))  # fmt: skip


def _activation(r: Record, t: torch.Tensor) -> torch.Tensor:
    """An activation as the call takes it: channels-last where the record asks (Note
    [Channels-last convolutions]; a no-op for a tensor already so), else as it comes."""
    if not r.kw("channels_last", False):
        return t
    return t.contiguous(memory_format=channels_last_format(t.dim()))


@rule("convolution")
def _convolution(run: Interpreter, r: Record) -> list:
    x, w, bias = (run.get(a) for a in r.args)
    return [torch.ops.aten.convolution(_activation(r, x), w, bias, *_conv_layout(r))]


@rule("convolution_backward")
def _convolution_backward(run: Interpreter, r: Record) -> list:
    """The gradients output_mask asks for, in order (torch's None for the others dropped);
    the bias's size is grad_output's channel count."""
    go, x, w = (run.get(a) for a in r.args)
    go, x = _activation(r, go), _activation(r, x)
    mask = list(r.kw("output_mask"))
    grads = torch.ops.aten.convolution_backward(go, x, w, [go.shape[1]], *_conv_layout(r), mask)
    return [g for g, m in zip(grads, mask) if m]
