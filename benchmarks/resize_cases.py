"""The resize family (issue #27): RoPE forward and backward, a KV cache's append (pad + cat),
embedding forward and backward, cross-entropy forward and backward, cat of three, pad. Each
fusion is written as Thunder sends such work to nvFuser (16-bit inputs cast up, math in
f32, one cast down), beside its eager twin as a user would write it. The CPU tests
(tests/resize_patterns.py) run the same definitions at small sizes."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

Shape = tuple[int, ...]


def _dt(dtype: torch.dtype) -> Any:
    from fusion_cache import DataType

    return {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16,
            torch.float16: DataType.Half, torch.int64: DataType.Int}[dtype]  # fmt: skip


def _t(fd: Any, rank: int, dtype: torch.dtype) -> Any:
    return fd.define_tensor(shape=[-1] * rank, contiguity=[True] * rank, dtype=_dt(dtype))


def _up(fd: Any, x: Any) -> Any:
    from fusion_cache import DataType

    return fd.ops.cast(x, DataType.Float) if x.dtype in (DataType.Half, DataType.BFloat16) else x


def _down(fd: Any, x: Any, dtype: torch.dtype) -> Any:
    return fd.ops.cast(x, _dt(dtype)) if x.dtype is not _dt(dtype) else x


def _randn(shape: Shape, dtype: torch.dtype, device: Any) -> torch.Tensor:
    return torch.randn(shape, device=device, dtype=torch.float32).to(dtype)


def _ids(shape: Shape, high: int, device: Any) -> torch.Tensor:
    return torch.randint(0, high, shape, device=device)


# ---- RoPE: x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2])


def define_rope(fd: Any, dtype: torch.dtype, shape: Shape,
                tables: torch.dtype = torch.float32) -> None:  # fmt: skip
    """`tables`: the cos/sin tables' dtype (16-bit ones are cast up)."""
    x, cos, sin = _t(fd, 4, dtype), _t(fd, 2, tables), _t(fd, 2, tables)
    b, h, s, d = fd.ops.tensor_sizes(x)
    half = fd.ops.div(d, 2)
    xf = _up(fd, x)
    x1 = fd.ops.slice(xf, [0, 0, 0, 0], [b, h, s, half])
    x2 = fd.ops.slice(xf, [0, 0, 0, half], [b, h, s, d])
    rot = fd.ops.cat([fd.ops.neg(x2), x1], -1)
    c = fd.ops.broadcast_in_dim(_up(fd, cos), [b, h, s, d], [2, 3])
    si = fd.ops.broadcast_in_dim(_up(fd, sin), [b, h, s, d], [2, 3])
    fd.add_output(_down(fd, fd.ops.add(fd.ops.mul(xf, c), fd.ops.mul(rot, si)), dtype))


def rope_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    return [_randn(shape, dtype, device), _randn(shape[2:], torch.float32, device),
            _randn(shape[2:], torch.float32, device)]  # fmt: skip


def eager_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    xf = x.float()
    rot = torch.cat([-xf[..., d // 2:], xf[..., :d // 2]], -1)
    return (xf * cos + rot * sin).to(x.dtype)


def define_rope_bwd(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    """The gradient of RoPE forward as autograd writes it: slices of g * sin padded back."""
    from fusion_cache import DataType

    g, cos, sin = _t(fd, 4, dtype), _t(fd, 2, torch.float32), _t(fd, 2, torch.float32)
    b, h, s, d = fd.ops.tensor_sizes(g)
    half = fd.ops.div(d, 2)
    gf = _up(fd, g)
    c = fd.ops.broadcast_in_dim(cos, [b, h, s, d], [2, 3])
    si = fd.ops.broadcast_in_dim(sin, [b, h, s, d], [2, 3])
    gs = fd.ops.mul(gf, si)
    to_x1 = fd.ops.slice(gs, [0, 0, 0, half], [b, h, s, d])  # rot[..., d/2:] is x1
    to_x2 = fd.ops.neg(fd.ops.slice(gs, [0, 0, 0, 0], [b, h, s, half]))  # rot[..., :d/2] is -x2
    zero = fd.define_scalar(0, dtype=DataType.Int)
    padded = fd.ops.add(fd.ops.pad(to_x1, [zero, half]), fd.ops.pad(to_x2, [half, zero]))
    fd.add_output(_down(fd, fd.ops.add(fd.ops.mul(gf, c), padded), dtype))


def eager_rope_bwd(g: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    d = g.shape[-1]
    gf = g.float()
    gs = gf * sin
    return (gf * cos + torch.cat([gs[..., d // 2:], -gs[..., :d // 2]], -1)).to(g.dtype)


# ---- KV cache: the new step's keys and values appended along the sequence -------------------


def define_kv_append(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    k_cache, v_cache, k, v = (_t(fd, 4, dtype) for _ in range(4))
    fd.add_output(fd.ops.cat([k_cache, k], 2))
    fd.add_output(fd.ops.cat([v_cache, v], 2))


def kv_append_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    b, h, s, d = shape
    return [_randn((b, h, s, d), dtype, device), _randn((b, h, s, d), dtype, device),
            _randn((b, h, 1, d), dtype, device), _randn((b, h, 1, d), dtype, device)]  # fmt: skip


def eager_kv_append(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return torch.cat([k_cache, k], 2), torch.cat([v_cache, v], 2)


def define_kv_pad_cat(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    """A cache grown by one position (pad), then its prefix and the new values cat: the
    static cache's prefill-then-decode step."""
    from fusion_cache import DataType

    cache, new = _t(fd, 4, dtype), _t(fd, 4, dtype)
    b, h, s, d = fd.ops.tensor_sizes(cache)
    zero = fd.define_scalar(0, dtype=DataType.Int)
    one = fd.define_scalar(1, dtype=DataType.Int)
    grown = fd.ops.pad(cache, [zero, zero, zero, one])
    fd.add_output(fd.ops.cat([fd.ops.slice(grown, [0, 0, 0, 0], [b, h, s, d]), new], 2))


def kv_pad_cat_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    b, h, s, d = shape
    return [_randn((b, h, s, d), dtype, device), _randn((b, h, 1, d), dtype, device)]


def eager_kv_pad_cat(cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    grown = F.pad(cache, [0, 0, 0, 1])
    return torch.cat([grown[:, :, :cache.shape[2]], new], 2)


# ---- cat of three, pad ----------------------------------------------------------------------


def define_cat3(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    a, b, c = (_t(fd, 2, dtype) for _ in range(3))
    fd.add_output(fd.ops.cat([a, b, c], 1))


def cat3_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    n, m = shape  # the output is [n, m]: parts of a quarter, a half and a quarter
    q = max(1, m // 4)
    return [_randn((n, q), dtype, device), _randn((n, m - 2 * q), dtype, device),
            _randn((n, q), dtype, device)]  # fmt: skip


def eager_cat3(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return torch.cat([a, b, c], 1)


def define_pad(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    x = _t(fd, 2, dtype)
    fd.add_output(fd.ops.pad(x, [0, 64, 0, 0], fd.define_scalar(0.0)))


def pad_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    return [_randn(shape, dtype, device)]


def eager_pad(x: torch.Tensor) -> torch.Tensor:
    return F.pad(x, [0, 64, 0, 0])


# ---- embedding --------------------------------------------------------------------------------


def define_embedding(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    from fusion_cache import DataType

    idx = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Int)
    fd.add_output(fd.ops.embedding_fwd(idx, _t(fd, 2, dtype)))


def embedding_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    vocab, dim, batch, seq = shape
    return [_ids((batch, seq), vocab, device), _randn((vocab, dim), dtype, device)]


def eager_embedding(idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.embedding(idx, weight)


def define_embedding_bwd(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    """The weight's gradient: each token's row of the output's gradient added at its id,
    in f32, then cast down (as torch's embedding_dense_backward does for 16-bit weights)."""
    from fusion_cache import DataType

    idx = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Int)
    grad, weight = _t(fd, 3, dtype), _t(fd, 2, dtype)
    vocab, dim = fd.ops.tensor_sizes(weight)
    flat = fd.ops.reshape(idx, [-1])
    rows = fd.ops.reshape(_up(fd, grad), [-1, dim])
    zeros = fd.ops.full([vocab, dim], fd.define_scalar(0.0), DataType.Float)
    fd.add_output(_down(fd, fd.ops.index_put_accumulate(zeros, flat, rows), dtype))


def embedding_bwd_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    vocab, dim, batch, seq = shape
    return [_ids((batch, seq), vocab, device), _randn((batch, seq, dim), dtype, device),
            _randn((vocab, dim), dtype, device)]  # fmt: skip


def embedding_bwd_padded_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    """As embedding_bwd_inputs, with the last quarter of each sequence on row 0 (padding): a
    hot row of 2048 of the 8192 tokens, as a padded batch sends (Note [Row chains])."""
    idx, grad, weight = embedding_bwd_inputs(shape, dtype, device)
    idx[:, idx.shape[1] - idx.shape[1] // 4:] = 0
    return [idx, grad, weight]


def eager_embedding_bwd(idx: torch.Tensor, grad: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.embedding_dense_backward(grad, idx, weight.shape[0], -1, False)


# ---- cross-entropy: log-softmax + take_along_axis, and its gradient --------------------------


def define_ce(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    """Per-row losses and log-sum-exps (which the backward reads) of [n, v] logits."""
    from fusion_cache import DataType

    logits = _t(fd, 2, dtype)
    labels = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
    n, v = fd.ops.tensor_sizes(logits)
    x = _up(fd, logits)
    m = fd.ops.max(x, [1])
    shifted = fd.ops.sub(x, fd.ops.broadcast_in_dim(m, [n, v], [0]))
    lse = fd.ops.log(fd.ops.sum(fd.ops.exp(shifted), [1]))
    logp = fd.ops.sub(shifted, fd.ops.broadcast_in_dim(lse, [n, v], [0]))
    picked = fd.ops.take_along_axis(logp, fd.ops.broadcast_in_dim(labels, [n, 1], [0]), 1)
    fd.add_output(fd.ops.neg(fd.ops.squeeze(picked, [1])))
    fd.add_output(fd.ops.add(lse, m))


def ce_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    n, v = shape
    return [_randn((n, v), dtype, device) * 3, _ids((n,), v, device)]


def eager_ce(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = logits.float()
    return F.cross_entropy(x, labels, reduction="none"), torch.logsumexp(x, 1)


def define_ce_bwd(fd: Any, dtype: torch.dtype, shape: Shape) -> None:
    """d loss / d logits = (softmax - one_hot(label)) * grad, from the forward's lse."""
    from fusion_cache import DataType

    logits = _t(fd, 2, dtype)
    labels = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
    lse, grad = _t(fd, 1, torch.float32), _t(fd, 1, torch.float32)
    n, v = fd.ops.tensor_sizes(logits)
    x = _up(fd, logits)
    p = fd.ops.exp(fd.ops.sub(x, fd.ops.broadcast_in_dim(lse, [n, v], [0])))
    cols = fd.ops.broadcast_in_dim(fd.ops.iota(v), [n, v], [1])
    hot = fd.ops.eq(cols, fd.ops.broadcast_in_dim(labels, [n, v], [0]))
    d = fd.ops.sub(p, fd.ops.cast(hot, DataType.Float))
    fd.add_output(_down(fd, fd.ops.mul(d, fd.ops.broadcast_in_dim(grad, [n, v], [0])), dtype))


def ce_bwd_inputs(shape: Shape, dtype: torch.dtype, device: Any) -> list[torch.Tensor]:
    logits, labels = ce_inputs(shape, dtype, device)
    lse = torch.logsumexp(logits.float(), 1)
    return [logits, labels, lse, _randn((shape[0],), torch.float32, device)]


def eager_ce_bwd(logits: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor,
                 grad: torch.Tensor) -> torch.Tensor:  # fmt: skip
    p = torch.exp(logits.float() - lse[:, None])
    hot = F.one_hot(labels, logits.shape[1]).float()
    return ((p - hot) * grad[:, None]).to(logits.dtype)


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def embedding_moved(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    """The index read, each token's row of the table read and the output written: a
    gather reads only the rows it picks (8192 of 50304 here), not the whole table."""
    idx, _weight = inputs
    (out,) = outputs
    return _nbytes(idx, out, out)


def embedding_bwd_moved(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    """The index and the output's gradient read, the weight's gradient written; the weight
    itself only gives the vocabulary's size and is never read."""
    idx, grad, _weight = inputs
    (out,) = outputs
    return _nbytes(idx, grad, out)


# bytes a case must move where that is not every input and output once (Case.moved)
MOVED = {"embedding_fwd": embedding_moved, "embedding_bwd": embedding_bwd_moved,
         "embedding_bwd_padded": embedding_bwd_moved}
# cases small enough that launch, ramp, tail and the flush's dirty lines weigh: timed beside
# a device-to-device copy of their own bytes too (Case.size_matched, benchmarks.run)
SIZE_MATCHED = {"embedding_fwd", "embedding_bwd", "embedding_bwd_padded"}

# name: (define, eager, inputs, shape of the benchmark, a small odd shape for the tests)
RESIZE = {
    "rope_fwd": (define_rope, eager_rope, rope_inputs, (8, 32, 2048, 128), (2, 3, 5, 16)),
    "rope_bwd": (define_rope_bwd, eager_rope_bwd, rope_inputs, (8, 32, 2048, 128), (2, 3, 5, 16)),
    "kv_append": (define_kv_append, eager_kv_append, kv_append_inputs, (8, 32, 2047, 128),
                  (2, 3, 7, 16)),
    "kv_pad_cat": (define_kv_pad_cat, eager_kv_pad_cat, kv_pad_cat_inputs, (8, 32, 2047, 128),
                   (2, 3, 7, 16)),
    "embedding_fwd": (define_embedding, eager_embedding, embedding_inputs, (50304, 768, 8, 1024),
                      (37, 24, 3, 5)),
    "embedding_bwd": (define_embedding_bwd, eager_embedding_bwd, embedding_bwd_inputs,
                      (50304, 768, 8, 1024), (37, 24, 3, 5)),
    "embedding_bwd_padded": (define_embedding_bwd, eager_embedding_bwd,
                             embedding_bwd_padded_inputs, (50304, 768, 8, 1024), (37, 24, 3, 8)),
    "ce_fwd": (define_ce, eager_ce, ce_inputs, (8192, 50304), (6, 37)),
    "ce_bwd": (define_ce_bwd, eager_ce_bwd, ce_bwd_inputs, (8192, 50304), (6, 37)),
    "cat3": (define_cat3, eager_cat3, cat3_inputs, (8192, 4096), (5, 12)),
    "pad": (define_pad, eager_pad, pad_inputs, (8192, 4096), (5, 7)),
}  # fmt: skip
