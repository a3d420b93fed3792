"""Reductions and statistics: sum, prod, max, min (with `axes`, their early keyword), var, var_mean, welford."""
from __future__ import annotations

from typing import Any

from .. import shapes
from ..dtypes import DataType, check_dtype, is_complex, is_float, is_integral
from ..records import Record
from ..values import Tensor, TensorInfo
from .base import OpsBase, reduced_shape


class ReductionOps(OpsBase):
    def _reduction(self, name: str, arg: Any, dims: Any, keepdim: bool, dtype: Any) -> Tensor:
        ref = self._tensor(arg, name)
        dtype = check_dtype(dtype, f"{name}: dtype") if dtype is not None else DataType.Null
        if dims is None:
            dims = list(range(self._info(ref).ndim))
        dims = tuple(dims) if isinstance(dims, (list, tuple)) else (dims,)
        kwargs = (("dims", dims), ("keepdim", bool(keepdim)), ("dtype", dtype))

        def infer() -> list:
            info = self._info(ref)
            axes = shapes.normalize_dims(dims, info.ndim, name)
            if dtype is not DataType.Null:
                out = dtype
            elif name in ("sum", "prod") and is_integral(info.dtype):
                out = DataType.Int
            else:
                out = info.dtype
            return [TensorInfo(out, reduced_shape(info.shape, axes, keepdim))]

        return self._apply(Record("op", name, (ref,), kwargs, self._out("T")), infer)

    # nvFuser's overloads: (arg, dtype), (arg, dim: int, keepdim, dtype), (arg, dims: list,
    # keepdim, dtype); `dim=` and the early `axes=` name the dims too
    def sum(self, arg, dims=None, keepdim=False, dtype=DataType.Null, *, dim=None, axes=None):
        return self._reduction("sum", arg, *_overload("sum", dims, dim, axes, keepdim, dtype))

    def prod(self, arg, dims=None, keepdim=False, dtype=DataType.Null, *, dim=None, axes=None):
        return self._reduction("prod", arg, *_overload("prod", dims, dim, axes, keepdim, dtype))

    def max(self, arg, dims=None, keepdim=False, dtype=DataType.Null, *, dim=None, axes=None):
        return self._reduction("max", arg, *_overload("max", dims, dim, axes, keepdim, dtype))

    def min(self, arg, dims=None, keepdim=False, dtype=DataType.Null, *, dim=None, axes=None):
        return self._reduction("min", arg, *_overload("min", dims, dim, axes, keepdim, dtype))

    def _stats(self, name: str, arg: Any, dims: Any, kwargs: tuple, outs: int) -> Any:
        ref = self._tensor(arg, name)
        dims = tuple(dims) if isinstance(dims, (list, tuple)) else dims
        keepdim = dict(kwargs).get("keepdim", False)

        def infer() -> list:
            info = self._info(ref)
            if not (is_float(info.dtype) or is_complex(info.dtype)):
                raise TypeError(f"{name}: arg must be a floating-point tensor, got {info.dtype!r}")
            axes = shapes.normalize_dims(dims, info.ndim, name)
            shape = reduced_shape(info.shape, axes, keepdim)
            result = [TensorInfo(info.dtype, shape) for _ in range(outs)]
            if name == "welford":
                result[2] = TensorInfo(DataType.Int, shape)
            return result

        record = Record("op", name, (ref,), (("dims", dims),) + kwargs, self._out("T" * outs))
        return self._apply(record, infer)

    def var(self, arg, dims, correction=1, keepdim=False, *, axes=None):
        kwargs = (("correction", _correction("var", correction)), ("keepdim", bool(keepdim)))
        return self._stats("var", arg, dims if axes is None else axes, kwargs, 1)

    def var_mean(self, arg, dims, correction=1, keepdim=False, *, axes=None):
        kwargs = (("correction", _correction("var_mean", correction)), ("keepdim", bool(keepdim)))
        return self._stats("var_mean", arg, dims if axes is None else axes, kwargs, 2)

    def welford(self, arg, dims=None, *, axes=None):
        return self._stats("welford", arg, dims if axes is None else axes, (), 3)


def _overload(op: str, dims: Any, dim: Any, axes: Any, keepdim: Any, dtype: Any) -> tuple:
    """(dims, keepdim, dtype) from any of nvFuser's spellings of a reduction's arguments."""
    if isinstance(dims, DataType):  # sum(t, DataType.Float): every dim, in that dtype
        if dtype is not DataType.Null:
            raise TypeError(f"{op}: dtype given twice ({dims!r} and {dtype!r})")
        dims, dtype = None, dims
    given = [d for d in (dims, dim, axes) if d is not None]
    if len(given) > 1:
        raise TypeError(f"{op}: give the reduced dims once (dims, dim or axes)")
    dims = given[0] if given else None
    if isinstance(dims, bool) or not (dims is None or isinstance(dims, (int, list, tuple))):
        raise TypeError(f"{op}: dims must be an int or a list of ints, got {dims!r}")
    if not isinstance(keepdim, bool):
        raise TypeError(f"{op}: keepdim must be a bool, got {keepdim!r}")
    return dims, keepdim, dtype


def _correction(op: str, correction: Any) -> int:
    if isinstance(correction, bool) or not isinstance(correction, int):
        raise TypeError(f"{op}: correction must be an int (1 for the unbiased estimate), "
                        f"got {correction!r}")  # fmt: skip
    if correction < 0:
        raise ValueError(f"{op}: correction must be >= 0, got {correction}")
    return correction
