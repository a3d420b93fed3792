"""Normalization ops with statistics of their own: batch_norm."""
from __future__ import annotations

from typing import Any

from .. import shapes
from ..dtypes import DataType, is_float
from ..records import Record
from ..values import TensorInfo, _Handle
from .base import OpsBase


class NormalizationOps(OpsBase):
    def batch_norm(self, arg, weight, bias, running_mean, running_var, momentum, eps,
                   training, channels_last=False):  # fmt: skip
        op = "batch_norm"
        x = self._tensor(arg, op)
        optional = []
        for name, v in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                        ("running_var", running_var)):  # fmt: skip
            optional.append(None if v is None else self._tensor(v, op, name))
        mom = self._ref(momentum, op, "momentum", "S")
        ep = self._ref(eps, op, "eps", "S")
        if isinstance(training, _Handle):
            train: Any = self._ref(training, op, "training", "S")
        elif isinstance(training, bool):
            train = training
        else:
            raise TypeError(f"{op}: training must be a bool or Bool scalar, got {training!r}")
        args = (x, *optional, mom, ep)
        kwargs = (("training", train), ("channels_last", bool(channels_last)))

        def infer() -> list:
            info = self._info(x)
            if info.ndim < 2:
                raise ValueError(f"{op}: arg must have at least 2 dims, got {info.ndim}")
            if not is_float(info.dtype):
                raise TypeError(f"{op}: arg must be floating point, got {info.dtype!r}")
            c = info.shape[-1] if channels_last else info.shape[1]
            for name, r in zip(("weight", "bias", "running_mean", "running_var"), optional):
                if r is None:
                    continue
                t = self._info(r)
                if t.ndim != 1:
                    raise ValueError(f"{op}: {name} must be 1-D, got rank {t.ndim}")
                shapes.broadcast_shapes(f"{op} ({name} vs channels)", [(c,), t.shape])
            stat = DataType.Float if info.dtype in (DataType.Half, DataType.BFloat16) else info.dtype
            return [TensorInfo(info.dtype, info.shape), TensorInfo(stat, (c,)),
                    TensorInfo(stat, (c,))]  # fmt: skip

        return self._apply(Record("op", op, args, kwargs, self._out("TTT")), infer)
