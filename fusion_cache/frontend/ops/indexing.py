"""Ops that read or write by position: select, index_select, gather, take_along_axis, scatter,
index_put_accumulate, embedding_fwd (triu: masks.py).

Index tensors may be integers or floats (nvFuser converts an index to an integer where it
is used, and Thunder's cross-entropy passes a float one: a `where` of int labels with a float
zero); a float index is truncated toward zero. Bool and complex indices are errors.
"""
from __future__ import annotations

from .. import shapes
from ..dtypes import DataType, is_complex, is_float
from ..records import Record, Ref
from ..values import ScalarInfo, TensorInfo
from .base import OpsBase

_SYM = shapes.SYMBOLIC


def _fits(op: str, what: str, have: int, most: int, d: int) -> None:
    """A static extent of an index tensor that must not exceed the indexed one."""
    if _SYM not in (have, most) and have > most:
        raise ValueError(f"{op}: {what} has size {have} at dim {d}, more than {most}")


class IndexingOps(OpsBase):
    def _index(self, value, op: str, arg: str = "index") -> Ref:
        ref = self._tensor(value, op, arg)
        dt = self._info(ref).dtype
        if dt is DataType.Bool or is_complex(dt):
            raise TypeError(f"{op}: argument '{arg}' must hold integer indices, got {dt!r}")
        return ref

    def _dim(self, dim, rank: int, op: str) -> int:
        if rank == 0:
            raise ValueError(f"{op}: argument 'arg' is a 0-dim tensor; there is no dim to index")
        return shapes.normalize_dim(dim, rank, op)

    def select(self, arg, index, dim):
        op = "select"
        ref = self._tensor(arg, op)
        idx = self._ref(index, op, "index", "S")
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(f"{op}: dim must be an int, got {dim!r}")

        def infer() -> list:
            info, sinfo = self._info(ref), self._info(idx)
            d = self._dim(dim, info.ndim, op)
            if sinfo.dtype not in (DataType.Int, DataType.Int32):
                raise TypeError(f"{op}: argument 'index' must be an Int scalar, got {sinfo.dtype!r}")
            const = self._const_int(idx)
            if const is not None and info.shape[d] != _SYM:
                shapes.normalize_index(op, "index", const, info.shape[d])
            return [TensorInfo(info.dtype, info.shape[:d] + info.shape[d + 1:])]

        return self._apply(Record("op", op, (ref, idx), (("dim", dim),), self._out("T")), infer)

    def index_select(self, arg, index, dim):
        op = "index_select"
        ref = self._tensor(arg, op)
        idx = self._index(index, op)

        def infer() -> list:
            info, iinfo = self._info(ref), self._info(idx)
            d = self._dim(dim, info.ndim, op)
            if iinfo.ndim > 1:
                raise ValueError(f"{op}: argument 'index' must be a 0-dim or 1-dim tensor, "
                                 f"got rank {iinfo.ndim}")  # fmt: skip
            n = iinfo.shape[0] if iinfo.ndim else 1
            return [TensorInfo(info.dtype, info.shape[:d] + (n,) + info.shape[d + 1:])]

        return self._apply(Record("op", op, (ref, idx), (("dim", dim),), self._out("T")), infer)

    def gather(self, arg1, index, dim):
        op = "gather"
        ref = self._tensor(arg1, op, "arg1")
        idx = self._index(index, op)

        def infer() -> list:
            info, iinfo = self._info(ref), self._info(idx)
            self._same_rank(op, info, iinfo)
            d = self._dim(dim, info.ndim, op)
            for k in range(info.ndim):
                if k != d:
                    _fits(op, "index", iinfo.shape[k], info.shape[k], k)
            return [TensorInfo(info.dtype, iinfo.shape)]

        return self._apply(Record("op", op, (ref, idx), (("dim", dim),), self._out("T")), infer)

    def take_along_axis(self, arg1, index, dim):
        op = "take_along_axis"
        ref = self._tensor(arg1, op, "arg1")
        idx = self._index(index, op)

        def infer() -> list:
            info, iinfo = self._info(ref), self._info(idx)
            self._same_rank(op, info, iinfo)
            d = self._dim(dim, info.ndim, op)
            out = []
            for k, (a, b) in enumerate(zip(info.shape, iinfo.shape)):
                if k == d:
                    out.append(b)
                else:  # the other dims broadcast against each other
                    out.append(shapes.broadcast_shapes(f"{op}: arg1 and index", [(a,), (b,)])[0])
            return [TensorInfo(info.dtype, tuple(out))]

        return self._apply(Record("op", op, (ref, idx), (("dim", dim),), self._out("T")), infer)

    def scatter(self, arg1, index, src, dim):
        op = "scatter"
        ref = self._tensor(arg1, op, "arg1")
        idx = self._index(index, op)
        sref = self._tensor(src, op, "src")

        def infer() -> list:
            info, iinfo, sinfo = self._info(ref), self._info(idx), self._info(sref)
            self._same_rank(op, info, iinfo)
            if sinfo.ndim != info.ndim:
                raise ValueError(f"{op}: argument 'src' has rank {sinfo.ndim}, arg1 {info.ndim}")
            if sinfo.dtype is not info.dtype:
                raise TypeError(f"{op}: argument 'src' has dtype {sinfo.dtype!r}, arg1 "
                                f"{info.dtype!r}; they must match")  # fmt: skip
            d = self._dim(dim, info.ndim, op)
            for k in range(info.ndim):
                _fits(op, "index", iinfo.shape[k], sinfo.shape[k], k)
                if k != d:
                    _fits(op, "index", iinfo.shape[k], info.shape[k], k)
            return [TensorInfo(info.dtype, info.shape)]

        record = Record("op", op, (ref, idx, sref), (("dim", dim),), self._out("T"))
        return self._apply(record, infer)

    def index_put_accumulate(self, acc, index, value):
        op = "index_put_accumulate"
        ref = self._tensor(acc, op, "acc")
        idx = self._index(index, op)
        vref = self._tensor(value, op, "value")

        def infer() -> list:
            info, iinfo, vinfo = self._info(ref), self._info(idx), self._info(vref)
            if iinfo.ndim != 1:
                raise ValueError(f"{op}: argument 'index' must be 1-dim (rows of acc), got rank "
                                 f"{iinfo.ndim}")  # fmt: skip
            if info.ndim == 0 or vinfo.ndim != info.ndim:
                raise ValueError(f"{op}: argument 'value' has rank {vinfo.ndim}, acc {info.ndim}; "
                                 "value is [len(index), *acc.shape[1:]]")  # fmt: skip
            if vinfo.dtype is not info.dtype:
                raise TypeError(f"{op}: argument 'value' has dtype {vinfo.dtype!r}, acc "
                                f"{info.dtype!r}; they must match")  # fmt: skip
            want = (iinfo.shape[0],) + info.shape[1:]
            shapes.broadcast_shapes(f"{op}: value against [len(index), *acc.shape[1:]]",
                                    [vinfo.shape, want])  # fmt: skip
            for k, (v, w) in enumerate(zip(vinfo.shape, want)):
                if v == 1 and w not in (1, _SYM):
                    raise ValueError(f"{op}: argument 'value' has size 1 at dim {k}, where "
                                     f"[len(index), *acc.shape[1:]] has {w}")  # fmt: skip
            return [TensorInfo(info.dtype, info.shape)]

        record = Record("op", op, (ref, idx, vref), (), self._out("T"))
        return self._apply(record, infer)

    def embedding_fwd(self, input, weight, padding_idx=None, max_norm=None, norm_type=None,
                      scale_grad_by_freq=None, sparse=None):  # fmt: skip
        op = "embedding_fwd"
        iref = self._index(input, op, "input")
        wref = self._tensor(weight, op, "weight")
        opts = {}
        for name, v in (("padding_idx", padding_idx), ("max_norm", max_norm),
                        ("norm_type", norm_type), ("scale_grad_by_freq", scale_grad_by_freq),
                        ("sparse", sparse)):  # fmt: skip
            opts[name] = None if v is None else self._ref(v, op, name, "S")

        def infer() -> list:
            iinfo, winfo = self._info(iref), self._info(wref)
            if winfo.ndim != 2:
                raise ValueError(f"{op}: argument 'weight' must be 2-dim [num_embeddings, dim], "
                                 f"got rank {winfo.ndim}")  # fmt: skip
            if is_float(iinfo.dtype):
                raise TypeError(f"{op}: argument 'input' must hold integer indices, got "
                                f"{iinfo.dtype!r}")  # fmt: skip
            for name in ("max_norm", "norm_type"):
                if opts[name] is not None and not isinstance(self._info(opts[name]), ScalarInfo):
                    raise TypeError(f"{op}: argument '{name}' must be a scalar")
            return [TensorInfo(winfo.dtype, iinfo.shape + (winfo.shape[1],))]

        record = Record("op", op, (iref, wref), tuple(opts.items()), self._out("T"))
        return self._apply(record, infer)

    def _same_rank(self, op: str, info: TensorInfo, iinfo: TensorInfo) -> None:
        if iinfo.ndim != info.ndim:
            raise ValueError(f"{op}: argument 'index' has rank {iinfo.ndim}, the indexed tensor "
                             f"{info.ndim}; they must match")  # fmt: skip
