"""Reduction and normalization fusions with their torch references, shared by the CPU
compile tests and the GPU correctness tests."""
import torch

from fusion_cache import DataType, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch


def _up(fd, x, dt):
    return fd.ops.cast(x, DataType.Float) if dt in (DataType.Half, DataType.BFloat16) else x


def _down(fd, x, dt):
    return fd.ops.cast(x, dt) if dt in (DataType.Half, DataType.BFloat16) else x


def _ref_up(x):
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def reduce_op(op, dims, keepdim=False):
    def build(fd, dt, rank):
        x = fd.define_tensor(shape=[-1] * rank, contiguity=[CONTIGUOUS[0]] * rank, dtype=dt)
        fd.add_output(getattr(fd.ops, op)(x, dims=dims, keepdim=keepdim))

    def ref(x):
        if op == "sum":
            return torch.sum(x, dims, keepdim=keepdim, dtype=torch.int64 if not x.is_floating_point() else None)
        if op == "prod":
            y = x
            for d in sorted([d % x.dim() for d in dims], reverse=True):
                y = torch.prod(y, d, keepdim=keepdim)
            return y
        return (torch.amax if op == "max" else torch.amin)(x, dims, keepdim=keepdim)

    return build, ref


def var_mean(dims, correction=1):
    def build(fd, dt, rank):
        x = fd.define_tensor(shape=[-1] * rank, contiguity=[CONTIGUOUS[0]] * rank, dtype=dt)
        v, m = fd.ops.var_mean(x, dims=dims, correction=correction)
        fd.add_output(v)
        fd.add_output(m)

    def ref(x):
        return torch.var_mean(x, dims, correction=correction)

    return build, ref


def sum_max_min(dims):
    """Sum, max and min of one input over the same dims, and x - max + min: one kernel
    whose three block combines are merged (Note [Merged row reductions]); the element-level
    output keeps it a normalization, which takes clusters for long rows."""
    def build(fd, dt, rank):
        x = fd.define_tensor(shape=[-1] * rank, contiguity=[CONTIGUOUS[0]] * rank, dtype=dt)
        reds = [getattr(fd.ops, op)(x, dims=dims, keepdim=True) for op in ("sum", "max", "min")]
        for r in reds:
            fd.add_output(r)
        up = [_up(fd, t, dt) for t in (x, reds[1], reds[2])]
        fd.add_output(_down(fd, fd.ops.add(fd.ops.sub(up[0], up[1]), up[2]), dt))

    def ref(x):
        mx, mn = torch.amax(x, dims, keepdim=True), torch.amin(x, dims, keepdim=True)
        y = (_ref_up(x) - _ref_up(mx) + _ref_up(mn)).to(x.dtype)
        return [torch.sum(x, dims, keepdim=True), mx, mn, y]

    return build, ref


def softmax(log=False, dim=-1):
    def build(fd, dt, rank):
        x = fd.define_tensor(shape=[-1] * rank, contiguity=[CONTIGUOUS[0]] * rank, dtype=dt)
        xf = _up(fd, x, dt)
        flags = [d == dim % rank for d in range(rank)]
        m = fd.ops.broadcast(fd.ops.max(xf, dims=[dim]), flags)
        e = fd.ops.exp(xf - m)
        s = fd.ops.broadcast(fd.ops.sum(e, dims=[dim]), flags)
        y = (xf - m) - fd.ops.log(s) if log else e / s
        fd.add_output(_down(fd, y, dt))

    def ref(x):
        fn = torch.log_softmax if log else torch.softmax
        return fn(_ref_up(x), dim).to(x.dtype)

    return build, ref


def standardize(dim, eps=1e-5):
    """(x - mean) * rsqrt(var + eps) over `dim`, and the mean: a normalization over any dim."""

    def build(fd, dt, rank):
        x = fd.define_tensor(shape=[-1] * rank, contiguity=[CONTIGUOUS[0]] * rank, dtype=dt)
        xf = _up(fd, x, dt)
        kept = [d for d in range(rank) if d != dim % rank]
        var, mean = fd.ops.var_mean(xf, dims=[dim], correction=0)
        rstd = fd.ops.rsqrt(fd.ops.add(var, fd.define_scalar(eps)))
        y = fd.ops.mul(fd.ops.sub(xf, fd.ops.broadcast_in_dim(mean, fd.ops.shape(xf), kept)),
                       fd.ops.broadcast_in_dim(rstd, fd.ops.shape(xf), kept))  # fmt: skip
        fd.add_output(_down(fd, y, dt))
        fd.add_output(_down(fd, mean, dt))

    def ref(x):
        var, mean = torch.var_mean(_ref_up(x), dim=dim, correction=0, keepdim=True)
        return [((_ref_up(x) - mean) * torch.rsqrt(var + eps)).to(x.dtype),
                mean.squeeze(dim).to(x.dtype)]  # fmt: skip

    return build, ref


def layer_norm(eps=1e-5):
    def build(fd, dt, rank):
        x = fd.define_tensor(shape=[-1] * rank, contiguity=[CONTIGUOUS[0]] * rank, dtype=dt)
        w = fd.define_tensor(shape=[-1], contiguity=[True], dtype=dt)
        b = fd.define_tensor(shape=[-1], contiguity=[True], dtype=dt)
        xf = _up(fd, x, dt)
        flags = [False] * (rank - 1) + [True]
        var, mean = fd.ops.var_mean(xf, dims=[-1], correction=0)
        rstd = fd.ops.rsqrt(var + eps)
        y = (xf - fd.ops.broadcast(mean, flags)) * fd.ops.broadcast(rstd, flags)
        row = [True] * (rank - 1) + [False]
        y = y * fd.ops.broadcast(_up(fd, w, dt), row) + fd.ops.broadcast(_up(fd, b, dt), row)
        fd.add_output(_down(fd, y, dt))
        fd.add_output(mean)
        fd.add_output(rstd)

    def ref(x, w, b):
        xf = _ref_up(x)
        y = torch.nn.functional.layer_norm(xf, (x.shape[-1],), _ref_up(w), _ref_up(b), eps)
        var, mean = torch.var_mean(xf, -1, correction=0)
        return y.to(x.dtype), mean, torch.rsqrt(var + eps)

    return build, ref


def rms_norm(eps=1e-6):
    def build(fd, dt, rank):
        x = fd.define_tensor(shape=[-1] * rank, contiguity=[CONTIGUOUS[0]] * rank, dtype=dt)
        w = fd.define_tensor(shape=[-1], contiguity=[True], dtype=dt)
        xf = _up(fd, x, dt)
        flags = [False] * (rank - 1) + [True]
        ms = fd.ops.sum(xf * xf, dims=[-1]) / fd.ops.cast(fd.ops.size(x, -1), DataType.Double)
        y = xf * fd.ops.broadcast(fd.ops.rsqrt(ms + eps), flags)
        fd.add_output(_down(fd, y * fd.ops.broadcast(_up(fd, w, dt), [True] * (rank - 1) + [False]), dt))

    def ref(x, w):
        xf = _ref_up(x)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (y * _ref_up(w)).to(x.dtype)

    return build, ref


CONTIGUOUS = [True]  # set to [False] to define fusions that accept any strides


def define(builder, dtype, rank, contiguous=True):
    CONTIGUOUS[0] = contiguous
    with FusionDefinition() as fd:
        builder(fd, from_torch(dtype), rank)
    return fd
