"""Ops whose value depends on an element's position: triu."""
from __future__ import annotations

from ..records import Record
from ..values import TensorInfo
from .base import OpsBase


class MaskOps(OpsBase):
    def triu(self, input, diagonal=0):
        """The upper triangle of the last two dims (elements with col - row >= diagonal kept,
        the rest zero), as torch.triu."""
        op = "triu"
        ref = self._tensor(input, op, "input")
        if isinstance(diagonal, bool) or not isinstance(diagonal, int):
            raise TypeError(f"{op}: diagonal must be an int, got {diagonal!r}")

        def infer() -> list:
            info = self._info(ref)
            if info.ndim < 2:
                raise ValueError(f"{op}: input must have at least 2 dims, got rank {info.ndim}")
            return [TensorInfo(info.dtype, info.shape)]

        return self._apply(Record("op", op, (ref,), (("diagonal", diagonal),), self._out("T")), infer)
