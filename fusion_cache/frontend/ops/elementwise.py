"""Elementwise ops (the op table, fusion_cache/frontend/ops/table.py) and cast."""
from __future__ import annotations

from typing import Any

from ..dtypes import DataType, check_dtype
from ..records import Record
from ..shapes import broadcast_shapes
from ..values import ScalarInfo, TensorInfo
from .base import OpsBase
from .table import OPS, promoted_dtype


class ElementwiseOps(OpsBase):
    def _elementwise(self, name: str, *operands: Any) -> Any:
        spec = OPS[name]
        argnames = ("arg", "other", "third", "fourth")
        refs = tuple(self._ref(v, name, argnames[i]) for i, v in enumerate(operands))

        def infer() -> list:
            infos = [self._info(r) for r in refs]
            tensors = [i for i in infos if isinstance(i, TensorInfo)]
            dtype = spec.result(promoted_dtype(spec, infos))
            if name == "where":
                if infos[0].dtype is not DataType.Bool:
                    raise TypeError(f"where: condition must be Bool, got {infos[0].dtype!r}")
                a, b = infos[1], infos[2]
                if isinstance(a, ScalarInfo) and isinstance(b, ScalarInfo) and a.dtype is b.dtype:
                    # nvFuser: two scalar branches of one dtype keep it (Float stays Float,
                    # Int32 stays Int32) where torch's rule would widen to its defaults
                    dtype = a.dtype
            if not tensors:
                return [ScalarInfo(dtype)]
            return [TensorInfo(dtype, broadcast_shapes(name, [t.shape for t in tensors]))]

        kind = "T" if any(r.kind == "T" for r in refs) else "S"
        return self._apply(Record("op", name, refs, (), self._out(kind)), infer)

    def cast(self, arg, dtype):
        op = "cast"
        ref = self._ref(arg, op, "arg")
        dt = check_dtype(dtype, f"{op}: dtype")

        def infer() -> list:
            info = self._info(ref)
            if isinstance(info, TensorInfo):
                return [TensorInfo(dt, info.shape)]
            return [ScalarInfo(dt)]

        return self._apply(Record("op", op, (ref,), (("dtype", dt),), self._out(ref.kind)), infer)


def _install_elementwise() -> None:
    for name, spec in OPS.items():
        def method(self, *args, _name=name, _arity=spec.arity, **kwargs):
            if kwargs:
                names = ("arg", "other", "third", "fourth")[: _arity]
                extra = [k for k in kwargs if k not in names and k not in ("alpha", "value")]
                if extra:
                    raise TypeError(f"{_name}: unexpected keyword argument '{extra[0]}'")
                args = args + tuple(kwargs.values())
            if len(args) != _arity:
                raise TypeError(f"{_name} takes {_arity} arguments, got {len(args)}")
            return self._elementwise(_name, *args)

        method.__name__ = name
        setattr(ElementwiseOps, name, method)


_install_elementwise()
