"""Transformer pieces written with fd.ops, shared by the CPU plan tests, the GPU tests and the
benchmarks: linear + bias + GELU, the GPT MLP block, an attention block on sdpfa_fwd, and
dropout + residual + layer norm (forward and backward)."""
from __future__ import annotations

from fusion_cache import DataType, FusionDefinition

BF16 = DataType.BFloat16
F32 = DataType.Float


def _in(fd, rank: int, dtype=BF16):
    return fd.define_tensor(shape=[-1] * rank, contiguity=True, dtype=dtype)


def _gelu(fd, z):
    """gelu(z) = z/2 (1 + erf(z / sqrt(2))), in the float z is in."""
    return fd.ops.mul(fd.ops.mul(z, 0.5), fd.ops.add(fd.ops.erf(fd.ops.mul(z, 0.7071067811865476)),
                                                     1.0))  # fmt: skip


def _bias(fd, y, b):
    bf = fd.ops.broadcast_in_dim(fd.ops.cast(b, F32), shape=fd.ops.shape(y),
                                 broadcast_dims=[y.ndim - 1])  # fmt: skip
    return fd.ops.add(fd.ops.cast(y, F32), bf)


def linear_bias_gelu() -> FusionDefinition:
    """gelu(x @ w.T + b) in bf16, the bias and GELU after the GEMM."""
    with FusionDefinition() as fd:
        x, w, b = _in(fd, 2), _in(fd, 2), _in(fd, 1)
        fd.add_output(fd.ops.cast(_gelu(fd, _bias(fd, fd.ops.linear(x, w), b)), BF16))
    return fd


def mlp_block() -> FusionDefinition:
    """GPT's MLP: linear (bias in the GEMM), GELU, linear: x [T, C] -> [T, C] via 4C."""
    with FusionDefinition() as fd:
        x, w1, b1, w2, b2 = _in(fd, 2), _in(fd, 2), _in(fd, 1), _in(fd, 2), _in(fd, 1)
        h = fd.ops.linear(x, w1, b1)
        h = fd.ops.cast(_gelu(fd, fd.ops.cast(h, F32)), BF16)
        fd.add_output(fd.ops.linear(h, w2, b2))
    return fd


def _layer_norm(fd, x, w, b, eps: float = 1e-5):
    """layer norm over the last dim of x (float), affine with bf16 w and b; float result."""
    var, mean = fd.ops.var_mean(x, [x.ndim - 1], correction=0, keepdim=True)
    n = fd.ops.mul(fd.ops.sub(x, mean), fd.ops.rsqrt(fd.ops.add(var, eps)))
    return fd.ops.add(fd.ops.mul(n, fd.ops.cast(w, F32)), fd.ops.cast(b, F32))


def attention_block(batch: int, seq: int, heads: int, head_dim: int) -> FusionDefinition:
    """layer norm, QKV linear, causal sdpfa_fwd, output linear: x [B, T, C] -> [B, T, C]."""
    c = heads * head_dim
    with FusionDefinition() as fd:
        x, lw, lb = _in(fd, 3), _in(fd, 1), _in(fd, 1)
        wqkv, bqkv, wo, bo = _in(fd, 2), _in(fd, 1), _in(fd, 2), _in(fd, 1)
        n = fd.ops.cast(_layer_norm(fd, fd.ops.cast(x, F32), lw, lb), BF16)
        qkv = fd.ops.reshape(fd.ops.linear(n, wqkv, bqkv), [batch, seq, 3, heads, head_dim])
        qkv = fd.ops.permute(qkv, [2, 0, 3, 1, 4])  # [3, B, H, T, D]
        q, k, v = (fd.ops.squeeze(fd.ops.slice(qkv, [i, 0, 0, 0, 0],
                                               [i + 1, batch, heads, seq, head_dim]), [0])
                   for i in range(3))  # fmt: skip
        o, _, _, _ = fd.ops.sdpfa_fwd(q, k, v, 0.0, True, None)
        o = fd.ops.reshape(fd.ops.permute(o, [0, 2, 1, 3]), [batch, seq, c])
        fd.add_output(fd.ops.linear(o, wo, bo))
    return fd


def dropout_residual_layer_norm(p: float) -> FusionDefinition:
    """y = layer_norm(x + dropout(h, p)) in bf16 [N, C]; returns y, the mask (Bool) and the
    per-row mean and inverse std (float), which the backward reads. The dropout's random
    numbers come from torch's CUDA generator (no explicit seed)."""
    with FusionDefinition() as fd:
        x, h, w, b = _in(fd, 2), _in(fd, 2), _in(fd, 1), _in(fd, 1)
        hf = fd.ops.cast(h, F32)
        keep = fd.ops.lt(fd.ops.rand_like(hf), 1.0 - p)
        dropped = fd.ops.mul(fd.ops.where(keep, hf, 0.0), 1.0 / (1.0 - p))
        r = fd.ops.add(fd.ops.cast(x, F32), dropped)
        var, mean = fd.ops.var_mean(r, [1], correction=0, keepdim=True)
        invstd = fd.ops.rsqrt(fd.ops.add(var, 1e-5))
        n = fd.ops.mul(fd.ops.sub(r, mean), invstd)
        y = fd.ops.add(fd.ops.mul(n, fd.ops.cast(w, F32)), fd.ops.cast(b, F32))
        fd.add_output(fd.ops.cast(y, BF16))
        fd.add_output(keep)
        fd.add_output(mean)
        fd.add_output(invstd)
    return fd


def dropout_residual_layer_norm_backward(p: float) -> FusionDefinition:
    """The backward of dropout_residual_layer_norm: from dy, x, h, the mask, mean, invstd
    and w: grad of x (and of the residual branch h through the mask), grad of w and b."""
    with FusionDefinition() as fd:
        dy, x, h, keep = _in(fd, 2), _in(fd, 2), _in(fd, 2), _in(fd, 2, DataType.Bool)
        mean, invstd, w = _in(fd, 2, F32), _in(fd, 2, F32), _in(fd, 1)
        hf = fd.ops.mul(fd.ops.where(keep, fd.ops.cast(h, F32), 0.0), 1.0 / (1.0 - p))
        r = fd.ops.add(fd.ops.cast(x, F32), hf)
        n = fd.ops.mul(fd.ops.sub(r, mean), invstd)
        g = fd.ops.cast(dy, F32)
        gw = fd.ops.mul(g, fd.ops.broadcast_in_dim(fd.ops.cast(w, F32), shape=fd.ops.shape(g),
                                                   broadcast_dims=[1]))  # fmt: skip
        c = fd.ops.size(g, 1)
        s1 = fd.ops.sum(gw, [1], keepdim=True)
        s2 = fd.ops.sum(fd.ops.mul(gw, n), [1], keepdim=True)
        dr = fd.ops.mul(fd.ops.div(invstd, fd.ops.cast(c, F32)),
                        fd.ops.sub(fd.ops.sub(fd.ops.mul(gw, fd.ops.cast(c, F32)), s1),
                                   fd.ops.mul(n, s2)))  # fmt: skip
        fd.add_output(fd.ops.cast(dr, BF16))
        dh = fd.ops.mul(fd.ops.where(keep, dr, 0.0), 1.0 / (1.0 - p))
        fd.add_output(fd.ops.cast(dh, BF16))
        fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.mul(g, n), [0]), BF16))
        fd.add_output(fd.ops.cast(fd.ops.sum(g, [0]), BF16))
    return fd
