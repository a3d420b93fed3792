"""Resize and indexing fusions with their torch references, shared by the CPU tests (plans
compiled for h100 and run on the host) and the GPU tests. Each pattern is (build, make,
reference, kernels): `build(fd, dtype)` defines the fusion, `make(dtype, device, shape)`
its inputs, `reference(*inputs)` the eager result, `kernels` the launches one run takes."""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from fusion_cache import DataType, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch


class Pattern(NamedTuple):
    build: Callable
    make: Callable
    reference: Callable
    kernels: int
    shape: tuple  # a small default shape (odd sizes); the GPU tests also use large ones


def _t(fd, rank, dtype, contiguity=True):
    return fd.define_tensor(shape=[-1] * rank, contiguity=contiguity, dtype=from_torch(dtype))


def _up(fd, x):
    return fd.ops.cast(x, DataType.Float) if x.dtype in (DataType.Half, DataType.BFloat16) else x


def _down(fd, x, dtype):
    dt = from_torch(dtype)
    return fd.ops.cast(x, dt) if x.dtype is not dt else x


def _rand(shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype=dtype, device=device)


def _idx(shape, high, device, seed, dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g).to(dtype=dtype, device=device)


# ---- RoPE: x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2])


def rope_fwd_build(fd, dtype):
    x, cos, sin = _t(fd, 4, dtype), _t(fd, 2, torch.float32), _t(fd, 2, torch.float32)
    b, h, s, d = fd.ops.tensor_sizes(x)
    half = fd.ops.div(d, 2)
    xf = _up(fd, x)
    x1 = fd.ops.slice(xf, [0, 0, 0, 0], [b, h, s, half])
    x2 = fd.ops.slice(xf, [0, 0, 0, half], [b, h, s, d])
    rot = fd.ops.cat([fd.ops.neg(x2), x1], -1)
    c = fd.ops.broadcast_in_dim(cos, [b, h, s, d], [2, 3])
    si = fd.ops.broadcast_in_dim(sin, [b, h, s, d], [2, 3])
    fd.add_output(_down(fd, fd.ops.add(fd.ops.mul(xf, c), fd.ops.mul(rot, si)), dtype))


def rope_make(dtype, device, shape):
    b, h, s, d = shape
    return [_rand(shape, dtype, device, 0), _rand((s, d), torch.float32, device, 1),
            _rand((s, d), torch.float32, device, 2)]  # fmt: skip


def rope_fwd_ref(x, cos, sin):
    d = x.shape[-1]
    xf = x.float()
    rot = torch.cat([-xf[..., d // 2:], xf[..., :d // 2]], -1)
    return (xf * cos + rot * sin).to(x.dtype)


def rope_bwd_build(fd, dtype):
    """The gradient of RoPE forward as autograd writes it: slices of g * sin padded back."""
    g, cos, sin = _t(fd, 4, dtype), _t(fd, 2, torch.float32), _t(fd, 2, torch.float32)
    b, h, s, d = fd.ops.tensor_sizes(g)
    half = fd.ops.div(d, 2)
    gf = _up(fd, g)
    c = fd.ops.broadcast_in_dim(cos, [b, h, s, d], [2, 3])
    si = fd.ops.broadcast_in_dim(sin, [b, h, s, d], [2, 3])
    gs = fd.ops.mul(gf, si)
    to_x1 = fd.ops.slice(gs, [0, 0, 0, half], [b, h, s, d])  # rot[..., d/2:] = x1
    to_x2 = fd.ops.neg(fd.ops.slice(gs, [0, 0, 0, 0], [b, h, s, half]))  # rot[..., :d/2] = -x2
    zero = fd.define_scalar(0, dtype=DataType.Int)
    grad = fd.ops.add(fd.ops.mul(gf, c), fd.ops.add(fd.ops.pad(to_x1, [zero, half]),
                                                    fd.ops.pad(to_x2, [half, zero])))  # fmt: skip
    fd.add_output(_down(fd, grad, dtype))


def rope_bwd_ref(g, cos, sin):
    d = g.shape[-1]
    gf = g.float()
    gs = gf * sin
    return (gf * cos + torch.cat([gs[..., d // 2:], -gs[..., :d // 2]], -1)).to(g.dtype)


# ---- KV cache: the new step's keys and values padded and cat to the cache ------------------


def kv_append_build(fd, dtype):
    k_cache, v_cache, k, v = (_t(fd, 4, dtype) for _ in range(4))
    fd.add_output(fd.ops.cat([k_cache, k], 2))
    fd.add_output(fd.ops.cat([v_cache, v], 2))


def kv_append_make(dtype, device, shape):
    b, h, s, d = shape
    return [_rand((b, h, s, d), dtype, device, 0), _rand((b, h, s, d), dtype, device, 1),
            _rand((b, h, 1, d), dtype, device, 2), _rand((b, h, 1, d), dtype, device, 3)]  # fmt: skip


def kv_append_ref(k_cache, v_cache, k, v):
    return [torch.cat([k_cache, k], 2), torch.cat([v_cache, v], 2)]


def kv_pad_build(fd, dtype):
    """A cache grown by one position (pad), the new position written by a cat of its
    prefix and the new values: the prefill-then-decode pattern of a static cache."""
    cache, new = _t(fd, 4, dtype), _t(fd, 4, dtype)
    b, h, s, d = fd.ops.tensor_sizes(cache)
    zero = fd.define_scalar(0, dtype=DataType.Int)
    one = fd.define_scalar(1, dtype=DataType.Int)
    grown = fd.ops.pad(cache, [zero, zero, zero, one])
    prefix = fd.ops.slice(grown, [0, 0, 0, 0], [b, h, s, d])
    fd.add_output(fd.ops.cat([prefix, new], 2))


def kv_pad_ref(cache, new):
    return torch.cat([cache, new], 2)


def kv_pad_make(dtype, device, shape):
    b, h, s, d = shape
    return [_rand((b, h, s, d), dtype, device, 0), _rand((b, h, 1, d), dtype, device, 1)]


# ---- cat of three, pad ----------------------------------------------------------------------


def cat3_build(fd, dtype):
    a, b, c = (_t(fd, 2, dtype) for _ in range(3))
    fd.add_output(fd.ops.cat([a, b, c], 1))


def cat3_make(dtype, device, shape):
    n, m = shape
    return [_rand((n, m), dtype, device, 0), _rand((n, m // 2 + 1), dtype, device, 1),
            _rand((n, m + 3), dtype, device, 2)]  # fmt: skip


def cat3_ref(a, b, c):
    return torch.cat([a, b, c], 1)


def pad_build(fd, dtype):
    x = _t(fd, 2, dtype)
    fd.add_output(fd.ops.pad(x, [1, 2, 3, 1], fd.define_scalar(0.5)))


def pad_make(dtype, device, shape):
    return [_rand(shape, dtype, device, 0)]


def pad_ref(x):
    return torch.nn.functional.pad(x, [1, 2, 3, 1], value=0.5)


# ---- embedding ----------------------------------------------------------------------------


def embedding_fwd_build(fd, dtype):
    idx = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Int)
    fd.add_output(fd.ops.embedding_fwd(idx, _t(fd, 2, dtype)))


def embedding_make(dtype, device, shape):
    vocab, dim, batch, seq = shape
    return [_idx((batch, seq), vocab, device, 0), _rand((vocab, dim), dtype, device, 1)]


def embedding_fwd_ref(idx, weight):
    return torch.nn.functional.embedding(idx, weight)


def embedding_bwd_build(fd, dtype):
    """The weight's gradient: every token's row of the output gradient added at its id."""
    idx = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Int)
    grad, weight = _t(fd, 3, dtype), _t(fd, 2, dtype)
    vocab, dim = fd.ops.tensor_sizes(weight)
    flat = fd.ops.reshape(idx, [-1])
    rows = fd.ops.reshape(_up(fd, grad), [-1, dim])
    zeros = fd.ops.full([vocab, dim], fd.define_scalar(0.0), DataType.Float)
    fd.add_output(_down(fd, fd.ops.index_put_accumulate(zeros, flat, rows), dtype))


def embedding_bwd_make(dtype, device, shape):
    vocab, dim, batch, seq = shape
    return [_idx((batch, seq), vocab, device, 0), _rand((batch, seq, dim), dtype, device, 1),
            _rand((vocab, dim), dtype, device, 2)]  # fmt: skip


def embedding_bwd_ref(idx, grad, weight):
    out = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    out.index_put_((idx.reshape(-1),), grad.float().reshape(-1, weight.shape[1]), accumulate=True)
    return out.to(weight.dtype)


# ---- cross-entropy: log-softmax + take_along_axis, and its gradient -----------------------------


def ce_fwd_build(fd, dtype):
    logits = _t(fd, 2, dtype)
    labels = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int)
    n, v = fd.ops.tensor_sizes(logits)
    x = _up(fd, logits)
    m = fd.ops.max(x, [1])
    shifted = fd.ops.sub(x, fd.ops.broadcast_in_dim(m, [n, v], [0]))
    lse = fd.ops.log(fd.ops.sum(fd.ops.exp(shifted), [1]))
    logp = fd.ops.sub(shifted, fd.ops.broadcast_in_dim(lse, [n, v], [0]))
    picked = fd.ops.take_along_axis(logp, fd.ops.broadcast_in_dim(labels, [n, 1], [0]), 1)
    fd.add_output(fd.ops.neg(fd.ops.squeeze(picked, [1])))
    fd.add_output(fd.ops.add(lse, m))


def ce_make(dtype, device, shape):
    n, v = shape
    return [_rand((n, v), dtype, device, 0) * 3, _idx((n,), v, device, 1)]


def ce_fwd_ref(logits, labels):
    x = logits.float()
    lse = torch.logsumexp(x, 1)
    return [lse - x.gather(1, labels[:, None])[:, 0], lse]


def ce_bwd_build(fd, dtype):
    """d loss / d logits = (softmax - one_hot(label)) * grad, from the forward's lse."""
    logits = _t(fd, 2, dtype)
    labels = fd.define_tensor(shape=[-1], contiguity=True, dtype=DataType.Int)
    lse, grad = _t(fd, 1, torch.float32), _t(fd, 1, torch.float32)
    n, v = fd.ops.tensor_sizes(logits)
    x = _up(fd, logits)
    p = fd.ops.exp(fd.ops.sub(x, fd.ops.broadcast_in_dim(lse, [n, v], [0])))
    cols = fd.ops.broadcast_in_dim(fd.ops.iota(v), [n, v], [1])
    hot = fd.ops.eq(cols, fd.ops.broadcast_in_dim(labels, [n, v], [0]))
    d = fd.ops.sub(p, fd.ops.cast(hot, DataType.Float))
    fd.add_output(_down(fd, fd.ops.mul(d, fd.ops.broadcast_in_dim(grad, [n, v], [0])), dtype))


def ce_bwd_make(dtype, device, shape):
    logits, labels = ce_make(dtype, device, shape)
    lse = torch.logsumexp(logits.float(), 1)
    return [logits, labels, lse, _rand((shape[0],), torch.float32, device, 5)]


def ce_bwd_ref(logits, labels, lse, grad):
    p = torch.exp(logits.float() - lse[:, None])
    p[torch.arange(len(labels), device=labels.device), labels] -= 1
    return (p * grad[:, None]).to(logits.dtype)


PATTERNS = {
    "rope_fwd": Pattern(rope_fwd_build, rope_make, rope_fwd_ref, 1, (2, 3, 5, 16)),
    "rope_bwd": Pattern(rope_bwd_build, rope_make, rope_bwd_ref, 1, (2, 3, 5, 16)),
    "kv_append": Pattern(kv_append_build, kv_append_make, kv_append_ref, 1, (2, 3, 7, 16)),
    "kv_pad_cat": Pattern(kv_pad_build, kv_pad_make, kv_pad_ref, 1, (2, 3, 7, 16)),
    "cat3": Pattern(cat3_build, cat3_make, cat3_ref, 1, (5, 12)),
    "pad": Pattern(pad_build, pad_make, pad_ref, 1, (5, 7)),
    "embedding_fwd": Pattern(embedding_fwd_build, embedding_make, embedding_fwd_ref, 1,
                             (37, 24, 3, 5)),
    "embedding_bwd": Pattern(embedding_bwd_build, embedding_bwd_make, embedding_bwd_ref, 2,
                             (37, 24, 3, 5)),
    "ce_fwd": Pattern(ce_fwd_build, ce_make, ce_fwd_ref, 1, (6, 37)),
    "ce_bwd": Pattern(ce_bwd_build, ce_bwd_make, ce_bwd_ref, 1, (6, 37)),
}


def define(pattern: Pattern, dtype: torch.dtype) -> FusionDefinition:
    with FusionDefinition() as fd:
        pattern.build(fd, dtype)
    return fd
