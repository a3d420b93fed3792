"""Composite ops rewritten as the primitives the schedulers know, for scheduling only:
the user's definition, its id and its printed form keep the composite op.

batch_norm (training) becomes var_mean over every dim but the channels, the normalisation
with optional weight and bias, and, when running statistics are given, their update
written into those inputs in place, as torch.native_batch_norm does:
    running_mean <- (1 - momentum) * running_mean + momentum * mean
    running_var  <- (1 - momentum) * running_var + momentum * var * n / (n - 1)
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusion_cache.frontend.dtypes import DataType
from fusion_cache.frontend.records import Record

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition

COMPOSITES = {"batch_norm", "stride_order", "triu"}


def has_composites(fd: FusionDefinition) -> bool:
    return any(r.kind == "op" and r.name in COMPOSITES for r in fd._records)


def expand_composites(fd: FusionDefinition) -> FusionDefinition:
    """A scratch definition computing the same outputs from the same inputs, composite
    ops expanded; `fd` itself when there is nothing to expand."""
    if not has_composites(fd):
        return fd
    from fusion_cache.frontend.replay import replay_records

    from .subfusion import ScratchDefinition

    late_outputs: list = []  # in-place statistics updates, added after the user's outputs
    ordered: dict[int, tuple] = {}  # stride_order results (new state index) -> their order

    def rewrite(new: Any, r: Record, args: list, kwargs: dict) -> Any:
        if r.kind == "op" and r.name == "batch_norm" and kwargs["training"] is True:
            return _batch_norm(new, args, kwargs["channels_last"], late_outputs)
        if r.kind == "op" and r.name == "stride_order":
            # Note [Output layouts]: the same values; the order travels to the output
            made = new.ops.set(args[0])
            ordered[made.index] = tuple(kwargs["stride_order"])
            return made
        if r.kind == "op" and r.name == "triu":
            return _triu(new, args[0], kwargs["diagonal"])
        if r.kind == "output" and not kwargs["stride_order"] and args[0].index in ordered:
            new.add_output(args[0], kwargs["alias_input"], stride_order=ordered[args[0].index])
            return ()
        if r.kind == "end":
            for value, target in late_outputs:
                new.add_output(value, alias_input=target)
        return None

    expanded = ScratchDefinition()
    with expanded:
        replay_records(expanded, list(fd._records) + [Record("end")], rewrite)
    expanded._fid = fd._fid
    return expanded


def _float(fd: Any, t: Any) -> Any:
    return fd.ops.cast(t, DataType.Float) if t.dtype in (DataType.Half, DataType.BFloat16) else t


def _batch_norm(fd: Any, args: list, channels_last: bool, late_outputs: list) -> tuple:
    x, weight, bias, running_mean, running_var, momentum, eps = args
    rank = x.ndim
    channel = rank - 1 if channels_last else 1
    dims = [d for d in range(rank) if d != channel]
    spread = [d != channel for d in range(rank)]  # [C] -> broadcast over the other dims
    xf = _float(fd, x)
    var, mean = fd.ops.var_mean(xf, dims, correction=0)
    invstd = fd.ops.rsqrt(fd.ops.add(var, eps))
    y = fd.ops.mul(fd.ops.sub(xf, fd.ops.broadcast(mean, spread)), fd.ops.broadcast(invstd, spread))
    if weight is not None:
        y = fd.ops.mul(y, fd.ops.broadcast(_float(fd, weight), spread))
    if bias is not None:
        y = fd.ops.add(y, fd.ops.broadcast(_float(fd, bias), spread))
    if y.dtype != x.dtype:
        y = fd.ops.cast(y, x.dtype)
    keep = fd.ops.sub(fd.define_scalar(1.0), momentum)
    if running_mean is not None:
        new = fd.ops.add(fd.ops.mul(_float(fd, running_mean), keep), fd.ops.mul(mean, momentum))
        late_outputs.append((fd.ops.cast(new, running_mean.dtype), running_mean))
    if running_var is not None:
        n = fd.ops.size(x, dims[0])
        for d in dims[1:]:
            n = fd.ops.mul(n, fd.ops.size(x, d))
        unbiased = fd.ops.mul(var, fd.ops.div(fd.ops.cast(n, DataType.Double),
                                              fd.ops.cast(fd.ops.sub(n, 1), DataType.Double)))  # fmt: skip
        new = fd.ops.add(fd.ops.mul(_float(fd, running_var), keep), fd.ops.mul(unbiased, momentum))
        late_outputs.append((fd.ops.cast(new, running_var.dtype), running_var))
    stat_dtype = DataType.Double if x.dtype == DataType.Double else DataType.Float
    return y, _cast_to(fd, mean, stat_dtype), _cast_to(fd, invstd, stat_dtype)


def _triu(fd: Any, x: Any, diagonal: int) -> Any:
    """triu(x, k) = where(col - row >= k, x, 0) over the last two dims, rows and columns
    counted by iotas (index accesses in the pointwise kernel)."""
    rank = x.ndim
    shape = fd.ops.shape(x)
    row = fd.ops.iota(fd.ops.size(x, rank - 2), 0, 1, DataType.Int)
    col = fd.ops.iota(fd.ops.size(x, rank - 1), 0, 1, DataType.Int)
    rows = fd.ops.broadcast_in_dim(row, shape, [rank - 2])
    cols = fd.ops.broadcast_in_dim(col, shape, [rank - 1])
    keep = fd.ops.ge(fd.ops.sub(cols, rows), diagonal)
    zero = fd.define_scalar(False if x.dtype is DataType.Bool else 0, x.dtype)
    return fd.ops.where(keep, x, zero)


def _cast_to(fd: Any, t: Any, dtype: DataType) -> Any:
    return t if t.dtype == dtype else fd.ops.cast(t, dtype)
