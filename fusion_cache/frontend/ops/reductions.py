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
        dims = tuple(dims) if isinstance(dims, (list, tuple)) else dims
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

    def sum(self, arg, dims=None, keepdim=False, dtype=DataType.Null, *, axes=None):
        return self._reduction("sum", arg, axes if dims is None else dims, keepdim, dtype)

    def prod(self, arg, dims=None, keepdim=False, dtype=DataType.Null, *, axes=None):
        return self._reduction("prod", arg, axes if dims is None else dims, keepdim, dtype)

    def max(self, arg, dims=None, keepdim=False, dtype=DataType.Null, *, axes=None):
        return self._reduction("max", arg, axes if dims is None else dims, keepdim, dtype)

    def min(self, arg, dims=None, keepdim=False, dtype=DataType.Null, *, axes=None):
        return self._reduction("min", arg, axes if dims is None else dims, keepdim, dtype)

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
        kwargs = (("correction", correction), ("keepdim", bool(keepdim)))
        return self._stats("var", arg, dims if axes is None else axes, kwargs, 1)

    def var_mean(self, arg, dims, correction=1, keepdim=False, *, axes=None):
        kwargs = (("correction", correction), ("keepdim", bool(keepdim)))
        return self._stats("var_mean", arg, dims if axes is None else axes, kwargs, 2)

    def welford(self, arg, dims=None, *, axes=None):
        return self._stats("welford", arg, dims if axes is None else axes, (), 3)
