"""What the definition knows about each state, and the handles users hold (Tensor, Scalar, Vector).

Shape codes follow nvFuser: -1 a symbolic extent, 1 a broadcast extent, 0 or >1 a static one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .dtypes import DataType
from .records import Ref

if TYPE_CHECKING:
    from .definition import FusionDefinition


@dataclass(frozen=True)
class TensorInfo:
    dtype: DataType
    shape: tuple[int, ...]
    # input tensors only: what execute checks against
    contiguity: tuple[bool | None, ...] | None = None
    stride_order: tuple[int, ...] = ()
    is_cpu: bool = False
    is_input: bool = False

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class ScalarInfo:
    dtype: DataType
    value: Any = None  # a constant's value; None for an input scalar or a computed one
    is_input: bool = False
    is_const: bool = False


@dataclass(frozen=True)
class VectorInfo:
    dtype: DataType
    elements: tuple  # ints or Refs to Int scalars
    is_input: bool = False

    @property
    def size(self) -> int:
        return len(self.elements)


Info = TensorInfo | ScalarInfo | VectorInfo


class _Handle:
    """A value of one definition: a Ref plus the definition that owns it."""

    __slots__ = ("fd", "ref")

    def __init__(self, fd: FusionDefinition, ref: Ref) -> None:
        self.fd = fd
        self.ref = ref

    @property
    def index(self) -> int:
        return self.ref.index

    def __repr__(self) -> str:
        return str(self.ref)

    __str__ = __repr__
    __hash__ = object.__hash__

    def _info(self) -> Info:
        return self.fd._infos[self.ref.index]

    def __neg__(self) -> Any:
        return self.fd.ops.neg(self)

    def __abs__(self) -> Any:
        return self.fd.ops.abs(self)

    def __invert__(self) -> Any:
        if self._info().dtype is DataType.Bool:
            return self.fd.ops.logical_not(self)
        return self.fd.ops.bitwise_not(self)

    def __bool__(self) -> bool:
        raise TypeError(
            f"{self.ref} is a symbolic value of a fusion definition; it has no truth value "
            "until the fusion executes"
        )


# Python operator -> op name, for Tensor and Scalar handles
BINARY_OPERATORS = {
    "__add__": "add", "__sub__": "sub", "__mul__": "mul", "__truediv__": "truediv",
    "__mod__": "remainder", "__pow__": "pow", "__and__": "bitwise_and",
    "__or__": "bitwise_or", "__xor__": "bitwise_xor", "__lshift__": "bitwise_left_shift",
    "__rshift__": "bitwise_right_shift", "__eq__": "eq", "__ne__": "ne", "__lt__": "lt",
    "__le__": "le", "__gt__": "gt", "__ge__": "ge",
}  # fmt: skip
REFLECTED_OPERATORS = {
    "__radd__": "add", "__rsub__": "sub", "__rmul__": "mul", "__rtruediv__": "truediv",
    "__rmod__": "remainder", "__rpow__": "pow", "__rand__": "bitwise_and",
    "__ror__": "bitwise_or", "__rxor__": "bitwise_xor",
}  # fmt: skip



def _binary(op: str):
    def method(self: _Handle, other: Any) -> Any:
        return getattr(self.fd.ops, op)(self, other)

    method.__name__ = op
    return method


def _reflected(op: str):
    def method(self: _Handle, other: Any) -> Any:
        return getattr(self.fd.ops, op)(other, self)

    method.__name__ = op
    return method


for _dunder, _op in BINARY_OPERATORS.items():
    setattr(_Handle, _dunder, _binary(_op))
for _dunder, _op in REFLECTED_OPERATORS.items():
    setattr(_Handle, _dunder, _reflected(_op))


class Tensor(_Handle):
    __slots__ = ()

    @property
    def ndim(self) -> int:
        return self._info().ndim

    @property
    def dtype(self) -> DataType:
        return self._info().dtype

    def shape(self) -> Vector:
        return self.fd.ops.shape(self)

    def size(self, dim: int) -> Scalar:
        return self.fd.ops.size(self, dim)


class Scalar(_Handle):
    __slots__ = ()

    @property
    def dtype(self) -> DataType:
        return self._info().dtype


class Vector(_Handle):
    __slots__ = ()

    @property
    def size(self) -> int:
        return self._info().size

    def __len__(self) -> int:
        return self._info().size

    def __getitem__(self, index: int) -> Scalar:
        return self.fd.ops.at(self, index)

    def at(self, index: int) -> Scalar:
        return self.fd.ops.at(self, index)


HANDLE_TYPES = {"T": Tensor, "S": Scalar, "V": Vector}
