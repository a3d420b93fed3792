"""Rules of the ATen ops (fusion_cache/frontend/ops/aten.py): each is the torch call an ATen
segment makes (schedulers/aten.py), so the reference and the GPU run the same function.
Where torch's CUDA kernel has no CPU twin (flash, cuDNN and memory-efficient attention), the
CPU takes torch's CPU kernel of the same op; its dropout cannot be replayed by a backward, so
it is refused.

Note [ATen calls]: each op is a function of its arguments' values, in the record's argument
order (None where an optional argument is absent), its keyword arguments bound once:
`CALLS[name]` is (make, single), `make(record, infos)` returning that function and `single`
saying it returns its one output itself rather than a list. The interpreter's rule calls it
on the environment's values; a prepared ATen call (Note [Prepared ATen calls]) calls it on
the run's tensors directly, with no environment, Interpreter or record walk on the way.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from fusion_cache.frontend.dtypes import to_torch
from fusion_cache.frontend.ops.aten import efficient_lse_length
from fusion_cache.frontend.records import Record

from ..output_layout import channels_last_format
from .core import Interpreter, rule

Maker = Callable[[Record, list], Callable[..., Any]]
CALLS: dict[str, tuple[Maker, bool]] = {}


def aten_call(name: str, *, single: bool = False, binds: bool = False) -> Callable:
    """Register op `name`'s call (Note [ATen calls]) and the rule that interprets it: the
    decorated function takes the op's argument values, or with `binds` takes (record, infos)
    and returns that function (ops with keyword arguments)."""

    def register(fn: Callable) -> Callable:
        make: Maker = fn if binds else (lambda r, infos: fn)
        CALLS[name] = (make, single)

        def interpreted(run: Interpreter, r: Record) -> list:
            out = make(r, run.infos)(*[run.get(a) for a in r.args])
            return [out] if single else out

        rule(name)(interpreted)
        return fn

    return register


aten_call("matmul", single=True)(torch.matmul)
aten_call("bmm", single=True)(torch.bmm)
aten_call("linear", single=True)(F.linear)


def _flags(p: Any, causal: Any, scale: Any) -> tuple[float, bool, float | None]:
    return (0.0 if p is None else float(p), False if causal is None else bool(causal),
            None if scale is None else float(scale))  # fmt: skip


def _flash(q: torch.Tensor) -> bool:
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


def _host(t: torch.Tensor) -> torch.Tensor:
    """A tensor for torch's CPU kernel; meta tensors (shape analysis) stay meta."""
    return t if t.is_meta else t.cpu()


@aten_call("sdpfa_fwd")
def sdpfa_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Any = None,
              causal: Any = None, scale: Any = None) -> list:  # fmt: skip
    p, causal, scale = _flags(p, causal, scale)
    if _flash(q):
        out, lse, *_, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, p, causal, False, scale=scale)
        return [out, lse, seed, offset]
    if p > 0:
        raise ValueError(f"sdpfa_fwd: dropout_p={p} needs flash attention (half or bfloat16 "
                         "CUDA tensors): sdpfa_bwd could not replay the dropout mask of another "
                         "kernel")  # fmt: skip
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _host(q), _host(k), _host(v), 0.0, causal, scale=scale)
    seed = torch.zeros(2, dtype=torch.uint64, device=q.device)
    offset = torch.zeros((), dtype=torch.uint64, device=q.device)
    return [out.to(q.device), lse.to(q.device), seed, offset]


def sdpfa_output_only(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Any = None,
                      causal: Any = None, scale: Any = None) -> list:  # fmt: skip
    """sdpfa_fwd where nothing reads its logsumexp or seeds (no sdpfa_bwd replays them; Note
    [Prepared ATen calls]): on CUDA without dropout, torch's own dispatcher, which picks the
    fastest backend of the GPU, as eager and torch.compile do (cuDNN on the H100: 51 us against
    flash's 81 us at [8, 12, 1024, 64] causal bf16). Otherwise the op's call."""
    fp, fcausal, fscale = _flags(p, causal, scale)
    if not q.is_cuda or fp > 0:
        return sdpfa_fwd(q, k, v, p, causal, scale)
    return [F.scaled_dot_product_attention(q, k, v, is_causal=fcausal, scale=fscale),
            None, None, None]


@aten_call("sdpfa_bwd")
def sdpfa_bwd(go: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, p: Any, causal: Any, seed: torch.Tensor,
              offset: torch.Tensor, scale: Any) -> list:  # fmt: skip
    p, causal, scale = _flags(p, causal, scale)
    if _flash(q):
        return list(torch.ops.aten._scaled_dot_product_flash_attention_backward(
            go, q, k, v, out, lse, None, None, q.shape[2], k.shape[2], p, causal, seed, offset,
            scale=scale))  # fmt: skip
    if p > 0:
        raise ValueError(f"sdpfa_bwd: dropout_p={p} needs flash attention (half or bfloat16 "
                         "CUDA tensors)")  # fmt: skip
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        *(_host(t) for t in (go, q, k, v, out, lse)), 0.0, causal, scale=scale)
    return [g.to(q.device) for g in grads]


def _cudnn(q: torch.Tensor) -> bool:
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


@aten_call("sdpa_cudnn_fwd")
def sdpa_cudnn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: Any = None,
                   causal: Any = None, scale: Any = None) -> list:  # fmt: skip
    """cuDNN's attention on CUDA; elsewhere torch's CPU kernel, its log-sum-exp given the
    trailing unit dim cuDNN's has (the CPU backward below takes it off again)."""
    p, causal, scale = _flags(p, causal, scale)
    if _cudnn(q):
        out, lse, *_, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, p, causal, False, scale=scale)
        return [out, lse, seed, offset]
    if p > 0:
        raise ValueError(f"sdpa_cudnn_fwd: dropout_p={p} needs cuDNN (half or bfloat16 CUDA "
                         "tensors)")  # fmt: skip
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _host(q), _host(k), _host(v), 0.0, causal, scale=scale)
    seed = torch.zeros((), dtype=torch.int64, device=q.device)
    offset = torch.zeros((), dtype=torch.int64, device=q.device)
    return [out.to(q.device), lse.unsqueeze(-1).to(q.device), seed, offset]


@aten_call("sdpa_cudnn_bwd")
def sdpa_cudnn_bwd(go: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, seed: torch.Tensor,
                   offset: torch.Tensor, p: Any = None, causal: Any = None,
                   scale: Any = None) -> list:  # fmt: skip
    p, causal, scale = _flags(p, causal, scale)
    if _cudnn(q):
        return list(torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            go, q, k, v, out, lse, seed, offset, None, None, None, q.shape[2], k.shape[2], p,
            causal, scale=scale))  # fmt: skip
    if p > 0:
        raise ValueError(f"sdpa_cudnn_bwd: dropout_p={p} needs cuDNN")
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        *(_host(t) for t in (go, q, k, v, out, lse.squeeze(-1))), 0.0, causal, scale=scale)
    return [g.to(q.device) for g in grads]


@aten_call("sdpa_efficient_fwd")
def sdpa_efficient_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Any,
                       p: Any = None, causal: Any = None, scale: Any = None) -> list:  # fmt: skip
    """Memory-efficient attention on CUDA; elsewhere torch's CPU kernel, its log-sum-exp
    padded with zeros to the CUDA kernel's length (the CPU backward below cuts it again)."""
    p, causal, scale = _flags(p, causal, scale)
    if q.is_cuda:
        out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, bias, True, p, causal, scale=scale)
        return [out, lse, seed, offset]
    if p > 0:
        raise ValueError(f"sdpa_efficient_fwd: dropout_p={p} needs CUDA tensors")
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _host(q), _host(k), _host(v), 0.0, causal, attn_mask=None if bias is None else
        _host(bias), scale=scale)  # fmt: skip
    lse = F.pad(lse, (0, efficient_lse_length(lse.shape[2]) - lse.shape[2]))
    zero = torch.zeros((), dtype=torch.int64, device=q.device)
    return [out.to(q.device), lse.to(q.device), zero, zero.clone()]


@aten_call("sdpa_efficient_bwd")
def sdpa_efficient_bwd(go: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       bias: Any, out: torch.Tensor, lse: torch.Tensor, seed: torch.Tensor,
                       offset: torch.Tensor, p: Any = None, causal: Any = None,
                       scale: Any = None) -> list:  # fmt: skip
    p, causal, scale = _flags(p, causal, scale)
    if q.is_cuda:
        return list(torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            go, q, k, v, bias, out, lse, seed, offset, p, [True, True, True, False], causal,
            scale=scale)[:3])  # fmt: skip
    if p > 0:
        raise ValueError(f"sdpa_efficient_bwd: dropout_p={p} needs CUDA")
    lse = lse[..., : q.shape[2]].contiguous()
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        *(_host(t) for t in (go, q, k, v, out, lse)), 0.0, causal,
        attn_mask=None if bias is None else _host(bias), scale=scale)  # fmt: skip
    return [g.to(q.device) for g in grads]


@aten_call("grouped_mm", single=True)
def grouped_mm(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(a, b, offs=offsets.to(torch.int32))


@aten_call("scaled_mm", single=True, binds=True)
def scaled_mm(r: Record, infos: list) -> Callable[..., torch.Tensor]:
    dt = to_torch(r.kw("dtype"))

    def call(a, b, sa, sb, alpha, bias, beta) -> torch.Tensor:
        if a.is_cuda:  # cuBLASLt's float8 GEMM wants its second operand column-major
            b = b if b.stride(0) == 1 else b.t().contiguous().t()
            if alpha is None and beta is None and (bias is None or bias.dtype == dt):
                return torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=dt)
            out = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32)
        else:
            out = torch.matmul(a.float() * sa.float(), b.float() * sb.float())
        if alpha is not None:
            out = out * alpha.float()
        if bias is not None:
            out = out + (bias.float() if beta is None else bias.float() * beta.float())
        return out.to(dt)

    return call


@aten_call("cumsum", single=True, binds=True)
def cumsum(r: Record, infos: list) -> Callable[[torch.Tensor], torch.Tensor]:
    dim, dt = r.kw("dim"), to_torch(infos[r.outputs[0].index].dtype)
    return lambda x: torch.cumsum(x, dim).to(dt)


@aten_call("argsort", single=True, binds=True)
def argsort(r: Record, infos: list) -> Callable[[torch.Tensor], torch.Tensor]:
    kw = dict(dim=r.kw("dim"), descending=r.kw("descending"), stable=r.kw("stable"))
    return lambda x: torch.argsort(x, **kw)


@aten_call("topk", binds=True)
def topk(r: Record, infos: list) -> Callable[[torch.Tensor, Any], list]:
    kw = dict(dim=r.kw("dim"), largest=r.kw("largest"), sorted=r.kw("sorted"))
    return lambda x, k: list(torch.topk(x, int(k), **kw))


def _conv_layout(r: Record) -> tuple:
    return tuple(r.kw(name) for name in ("stride", "padding", "dilation", "transposed",
                                         "output_padding", "groups"))  # fmt: skip


def _activation(r: Record) -> Callable[[torch.Tensor], torch.Tensor]:
    """How the call takes an activation: channels-last where the record asks (Note
    [Channels-last convolutions]; a no-op for a tensor already so), else as it comes."""
    if not r.kw("channels_last", False):
        return lambda t: t
    return lambda t: t.contiguous(memory_format=channels_last_format(t.dim()))


# Note [Convolution calls]: a region's convolutions are called each step (ResNet-18: 16 forward,
# 20 backward), so through torch's Python binding where it has one (`torch.convolution`: its
# arguments parsed in C and the op called unboxed, 3.9 us against the op packet's 8.2 on this
# project's CPU machine for a tiny one, the same aten op), and the backward, which has none,
# through its overload (no overload resolution); an activation taken as it comes goes
# through no call of its own.
_CONVOLUTION_BACKWARD = torch.ops.aten.convolution_backward.default


@aten_call("convolution", single=True, binds=True)
def convolution(r: Record, infos: list) -> Callable[..., torch.Tensor]:
    layout, conv = _conv_layout(r), torch.convolution
    if not r.kw("channels_last", False):
        return lambda x, w, bias: conv(x, w, bias, *layout)
    take = _activation(r)
    return lambda x, w, bias: conv(take(x), w, bias, *layout)


@aten_call("convolution_backward", binds=True)
def convolution_backward(r: Record, infos: list) -> Callable[..., list]:
    """The gradients output_mask asks for, in order (torch's None for the others dropped);
    the bias's size is grad_output's channel count."""
    layout, mask, take = _conv_layout(r), list(r.kw("output_mask")), _activation(r)
    plain = not r.kw("channels_last", False)
    backward = _CONVOLUTION_BACKWARD

    def call(go, x, w) -> list:
        if not plain:
            go, x = take(go), take(x)
        grads = backward(go, x, w, [go.shape[1]], *layout, mask)
        return [g for g, m in zip(grads, mask) if m]

    return call
