"""Ops that make tensors from scalars: full, iota."""
from __future__ import annotations

from .. import shapes
from ..dtypes import DataType, check_dtype
from ..records import Record
from ..values import TensorInfo
from .base import OpsBase


class CreationOps(OpsBase):
    def full(self, shape, fill_value, dtype):
        op = "full"
        sizes = self._size_list(shape, op, "shape")
        fill = self._ref(fill_value, op, "fill_value", "S")
        dt = check_dtype(dtype, f"{op}: dtype")

        def infer() -> list:
            target = self._static_sizes(sizes)
            if any(t is not None and t < 0 for t in target):
                raise ValueError(f"{op}: shape {target} has a negative size")
            return [TensorInfo(dt, tuple(shapes.SYMBOLIC if t is None else t for t in target))]

        kwargs = (("shape", sizes), ("fill_value", fill), ("dtype", dt))
        return self._apply(Record("op", op, (), kwargs, self._out("T")), infer)

    def iota(self, length, start=None, step=None, dtype=DataType.Int):
        op = "iota"
        dt = check_dtype(dtype, f"{op}: dtype")
        n = self._ref(length, op, "length", "S")
        a = self._ref(0 if start is None else start, op, "start", "S")
        b = self._ref(1 if step is None else step, op, "step", "S")

        def infer() -> list:
            const = self._const_int(n)
            if const is not None and const < 0:
                raise ValueError(f"{op}: length must be >= 0, got {const}")
            return [TensorInfo(dt, (shapes.SYMBOLIC if const is None else const,))]

        return self._apply(Record("op", op, (n, a, b), (("dtype", dt),), self._out("T")), infer)
