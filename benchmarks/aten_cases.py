"""The "aten" family: transformer pieces whose GEMMs and attention run as torch calls between
generated kernels (Note [ATen segments]), and dropout drawn in kernels (Note [Philox
numbers]). Each `define_*` writes the fusion with the public API; `eager_*` is its torch twin.

    python -m benchmarks.run --family aten

The GEMM cases are timed against eager and torch.compile (their GB/s count the tensors read
and written once, not the GEMMs' work); the dropout + residual + layer norm cases are
memory-bound and aim at the copy ceiling. Eager's dropout draws other numbers than ours, so
those cases are checked by replaying eager on the fusion's own mask (`replay_*`).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

Shape = tuple[int, ...]
EPS = 1e-5
P = 0.1  # the dropout probability of the dropout cases
HEAD_DIM = 64  # attention heads of 64, as GPT-2's


def _types() -> tuple[Any, Any, Any]:
    from fusion_cache import DataType  # late, as in cases.py: the registry loads without it

    return DataType.BFloat16, DataType.Float, DataType.Bool


def _input(fd: Any, rank: int, dtype: Any) -> Any:
    return fd.define_tensor(shape=[-1] * rank, contiguity=[True] * rank, dtype=dtype)


def _gelu(fd: Any, z: Any) -> Any:
    """gelu(z) = z/2 (1 + erf(z / sqrt(2))), in z's float."""
    return fd.ops.mul(fd.ops.mul(z, 0.5), fd.ops.add(fd.ops.erf(fd.ops.mul(z, 0.7071067811865476)),
                                                     1.0))  # fmt: skip


def _randn(*shape: int, device: Any, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, device=device) * scale


# --- linear + bias + GELU: [M, K] -> [M, 4K] ----------------------------------------------------


def define_linear_bias_gelu(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    bf16, f32, _ = _types()
    x, w, b = _input(fd, 2, bf16), _input(fd, 2, bf16), _input(fd, 1, bf16)
    y = fd.ops.linear(x, w)
    z = fd.ops.add(fd.ops.cast(y, f32), fd.ops.broadcast_in_dim(
        fd.ops.cast(b, f32), shape=fd.ops.shape(y), broadcast_dims=[1]))  # fmt: skip
    fd.add_output(fd.ops.cast(_gelu(fd, z), bf16))


def eager_linear_bias_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w).float() + b.float()).to(x.dtype)


def linear_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    m, k = shape
    return [t.to(dtype) for t in (_randn(m, k, device=device),
                                  _randn(4 * k, k, device=device, scale=k**-0.5),
                                  _randn(4 * k, device=device))]  # fmt: skip


# --- the GPT MLP block: linear (bias in the GEMM), GELU, linear: [T, C] -> [T, C] ----------------


def define_mlp(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    bf16, f32, _ = _types()
    x, w1, b1, w2, b2 = (_input(fd, r, bf16) for r in (2, 2, 1, 2, 1))
    h = fd.ops.cast(_gelu(fd, fd.ops.cast(fd.ops.linear(x, w1, b1), f32)), bf16)
    fd.add_output(fd.ops.linear(h, w2, b2))


def eager_mlp(x, w1, b1, w2, b2) -> torch.Tensor:
    return F.linear(F.gelu(F.linear(x, w1, b1).float()).to(x.dtype), w2, b2)


def mlp_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    t, c = shape
    return [x.to(dtype) for x in (
        _randn(t, c, device=device), _randn(4 * c, c, device=device, scale=c**-0.5),
        _randn(4 * c, device=device), _randn(c, 4 * c, device=device, scale=(4 * c) ** -0.5),
        _randn(c, device=device))]  # fmt: skip


# --- attention: layer norm, QKV linear, causal sdpfa_fwd, output linear: [B, T, C] -------------


def _layer_norm(fd: Any, x: Any, w: Any, b: Any) -> Any:
    _, f32, _ = _types()
    var, mean = fd.ops.var_mean(x, [x.ndim - 1], correction=0, keepdim=True)
    n = fd.ops.mul(fd.ops.sub(x, mean), fd.ops.rsqrt(fd.ops.add(var, EPS)))
    return fd.ops.add(fd.ops.mul(n, fd.ops.cast(w, f32)), fd.ops.cast(b, f32))


def define_attention(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    """shape = (B, T, C), heads of HEAD_DIM."""
    bf16, f32, _ = _types()
    batch, seq, c = shape
    heads = c // HEAD_DIM
    x, lw, lb, wqkv, bqkv, wo, bo = (_input(fd, r, bf16) for r in (3, 1, 1, 2, 1, 2, 1))
    n = fd.ops.cast(_layer_norm(fd, fd.ops.cast(x, f32), lw, lb), bf16)
    qkv = fd.ops.reshape(fd.ops.linear(n, wqkv, bqkv), [batch, seq, 3, heads, HEAD_DIM])
    qkv = fd.ops.permute(qkv, [2, 0, 3, 1, 4])  # [3, B, H, T, D]
    q, k, v = (fd.ops.squeeze(fd.ops.slice(qkv, [i, 0, 0, 0, 0],
                                           [i + 1, batch, heads, seq, HEAD_DIM]), [0])
               for i in range(3))  # fmt: skip
    o, _, _, _ = fd.ops.sdpfa_fwd(q, k, v, 0.0, True, None)
    o = fd.ops.reshape(fd.ops.permute(o, [0, 2, 1, 3]), [batch, seq, c])
    fd.add_output(fd.ops.linear(o, wo, bo))


def eager_attention(x, lw, lb, wqkv, bqkv, wo, bo) -> torch.Tensor:
    batch, seq, c = x.shape
    heads = c // HEAD_DIM
    n = F.layer_norm(x.float(), (c,), lw.float(), lb.float(), EPS).to(x.dtype)
    qkv = F.linear(n, wqkv, bqkv).reshape(batch, seq, 3, heads, HEAD_DIM).permute(2, 0, 3, 1, 4)
    o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
    return F.linear(o.permute(0, 2, 1, 3).reshape(batch, seq, c), wo, bo)


def attention_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    batch, seq, c = shape
    return [t.to(dtype) for t in (
        _randn(batch, seq, c, device=device), _randn(c, device=device), _randn(c, device=device),
        _randn(3 * c, c, device=device, scale=c**-0.5), _randn(3 * c, device=device),
        _randn(c, c, device=device, scale=c**-0.5), _randn(c, device=device))]  # fmt: skip


# --- dropout + residual + layer norm: y = LN(x + dropout(h)), [N, C] bf16 ------------------------


def define_dropout_ln(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    """Outputs y, the keep mask, and the rows' mean and 1/std: what the backward reads."""
    bf16, f32, _ = _types()
    x, h, w, b = _input(fd, 2, bf16), _input(fd, 2, bf16), _input(fd, 1, bf16), _input(fd, 1, bf16)
    hf = fd.ops.cast(h, f32)
    keep = fd.ops.lt(fd.ops.rand_like(hf), 1.0 - P)
    r = fd.ops.add(fd.ops.cast(x, f32), fd.ops.mul(fd.ops.where(keep, hf, 0.0), 1.0 / (1.0 - P)))
    var, mean = fd.ops.var_mean(r, [1], correction=0, keepdim=True)
    invstd = fd.ops.rsqrt(fd.ops.add(var, EPS))
    n = fd.ops.mul(fd.ops.sub(r, mean), invstd)
    y = fd.ops.add(fd.ops.mul(n, fd.ops.cast(w, f32)), fd.ops.cast(b, f32))
    for out in (fd.ops.cast(y, bf16), keep, mean, invstd):
        fd.add_output(out)


def _ln_from_mask(x, h, w, b, keep) -> list[torch.Tensor]:
    r = x.float() + torch.where(keep, h.float(), 0.0) / (1 - P)
    y, mean, rstd = torch.ops.aten.native_layer_norm(r, (r.shape[1],), w.float(), b.float(), EPS)
    return [y.to(x.dtype), keep, mean, rstd]


def eager_dropout_ln(x, h, w, b) -> list[torch.Tensor]:
    """What eager runs: native_dropout, the residual add, native_layer_norm."""
    dropped, keep = torch.ops.aten.native_dropout(h, P, True)
    r = x.float() + dropped.float()
    y, mean, rstd = torch.ops.aten.native_layer_norm(r, (r.shape[1],), w.float(), b.float(), EPS)
    return [y.to(x.dtype), keep, mean, rstd]


def replay_dropout_ln(inputs, outputs) -> list[torch.Tensor]:
    """Eager on the fusion's own mask (its second output): the check of a random case."""
    return _ln_from_mask(*inputs, outputs[1].bool())


def dropout_ln_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    n, c = shape
    return [t.to(dtype) for t in (_randn(n, c, device=device), _randn(n, c, device=device),
                                  _randn(c, device=device), _randn(c, device=device))]  # fmt: skip


def define_dropout_ln_bwd(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    """From dy, x, h, the mask, the rows' mean and 1/std and w: the gradients of the
    residual input x and of the dropped branch h, and of w and b."""
    bf16, f32, boolean = _types()
    dy, x, h, keep = _input(fd, 2, bf16), _input(fd, 2, bf16), _input(fd, 2, bf16), \
        _input(fd, 2, boolean)
    mean, invstd = (fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=f32)
                    for _ in range(2))  # fmt: skip
    w = _input(fd, 1, bf16)
    r = fd.ops.add(fd.ops.cast(x, f32),
                   fd.ops.mul(fd.ops.where(keep, fd.ops.cast(h, f32), 0.0), 1.0 / (1.0 - P)))
    n = fd.ops.mul(fd.ops.sub(r, mean), invstd)
    g = fd.ops.cast(dy, f32)
    gw = fd.ops.mul(g, fd.ops.broadcast_in_dim(fd.ops.cast(w, f32), shape=fd.ops.shape(g),
                                               broadcast_dims=[1]))  # fmt: skip
    c = fd.ops.cast(fd.ops.size(g, 1), f32)
    s1 = fd.ops.sum(gw, [1], keepdim=True)
    s2 = fd.ops.sum(fd.ops.mul(gw, n), [1], keepdim=True)
    dr = fd.ops.mul(fd.ops.div(invstd, c),
                    fd.ops.sub(fd.ops.sub(fd.ops.mul(gw, c), s1), fd.ops.mul(n, s2)))
    fd.add_output(fd.ops.cast(dr, bf16))
    fd.add_output(fd.ops.cast(fd.ops.mul(fd.ops.where(keep, dr, 0.0), 1.0 / (1.0 - P)), bf16))
    fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(g, n), [0]), bf16))
    fd.add_output(fd.ops.cast(fd.ops.sum(g, [0]), bf16))


def eager_dropout_ln_bwd(dy, x, h, keep, mean, invstd, w) -> list[torch.Tensor]:
    """What eager runs: native_layer_norm_backward, native_dropout_backward."""
    r = x.float() + torch.where(keep, h.float(), 0.0) / (1 - P)
    dr, dw, db = torch.ops.aten.native_layer_norm_backward(
        dy.float(), r, (r.shape[1],), mean, invstd, w.float(), torch.zeros_like(w.float()),
        [True, True, True])
    dh = torch.ops.aten.native_dropout_backward(dr, keep, 1 / (1 - P))
    return [dr.to(x.dtype), dh.to(x.dtype), dw.to(x.dtype), db.to(x.dtype)]


def dropout_ln_bwd_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    n, c = shape
    dy, x, h = (_randn(n, c, device=device).to(dtype) for _ in range(3))
    keep = torch.rand(n, c, device=device) >= P
    w = _randn(c, device=device).to(dtype)
    r = x.float() + torch.where(keep, h.float(), 0.0) / (1 - P)
    var, mean = torch.var_mean(r, 1, correction=0, keepdim=True)
    return [dy, x, h, keep, mean, torch.rsqrt(var + EPS), w]
