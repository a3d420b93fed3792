"""DataType: the dtypes a fusion speaks, their torch names, and torch's promotion rules.

Note [Storage-only dtypes]: the float8 and float4 members are formats to store and move
values in, not to compute in: torch promotes none of them with any other dtype and has
almost no arithmetic kernels for them. A fusion casts them to a computing dtype (Float)
and back; arithmetic on them is refused when the definition is built, naming the op.
Float4_e2m1fn has no torch dtype at all (torch keeps e2m1 values only packed two a byte,
as float4_e2m1fn_x2), so no execute can take or return it.
"""
from __future__ import annotations

import enum
import functools

import torch


class DataType(enum.Enum):
    Double = "Double"
    Float = "Float"
    Half = "Half"
    BFloat16 = "BFloat16"
    Int = "Int"
    Int32 = "Int32"
    UInt64 = "UInt64"
    Bool = "Bool"
    ComplexFloat = "ComplexFloat"
    ComplexDouble = "ComplexDouble"
    Float8_e4m3fn = "Float8_e4m3fn"
    Float8_e5m2 = "Float8_e5m2"
    Float8_e8m0fnu = "Float8_e8m0fnu"
    Float4_e2m1fn = "Float4_e2m1fn"
    Float4_e2m1fn_x2 = "Float4_e2m1fn_x2"
    Null = "Null"

    def __repr__(self) -> str:
        return f"DataType.{self.value}"

    __str__ = __repr__


_TO_TORCH = {
    DataType.Double: torch.float64,
    DataType.Float: torch.float32,
    DataType.Half: torch.float16,
    DataType.BFloat16: torch.bfloat16,
    DataType.Int: torch.int64,
    DataType.Int32: torch.int32,
    DataType.UInt64: torch.uint64,
    DataType.Bool: torch.bool,
    DataType.ComplexFloat: torch.complex64,
    DataType.ComplexDouble: torch.complex128,
    DataType.Float8_e4m3fn: torch.float8_e4m3fn,
    DataType.Float8_e5m2: torch.float8_e5m2,
    DataType.Float8_e8m0fnu: torch.float8_e8m0fnu,
    DataType.Float4_e2m1fn_x2: torch.float4_e2m1fn_x2,
}
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}

FLOATS = frozenset({DataType.Double, DataType.Float, DataType.Half, DataType.BFloat16})
INTS = frozenset({DataType.Int, DataType.Int32, DataType.UInt64})
COMPLEX = frozenset({DataType.ComplexFloat, DataType.ComplexDouble})
FLOAT8 = frozenset({DataType.Float8_e4m3fn, DataType.Float8_e5m2, DataType.Float8_e8m0fnu})
FLOAT4 = frozenset({DataType.Float4_e2m1fn, DataType.Float4_e2m1fn_x2})
STORAGE_ONLY = FLOAT8 | FLOAT4  # Note [Storage-only dtypes]


def to_torch(dtype: DataType) -> torch.dtype:
    try:
        return _TO_TORCH[dtype]
    except KeyError:
        if dtype is DataType.Float4_e2m1fn:
            raise TypeError("DataType.Float4_e2m1fn has no torch dtype: torch stores e2m1 values "
                            "only packed two a byte (DataType.Float4_e2m1fn_x2)") from None
        raise TypeError(f"DataType {dtype!r} has no torch dtype") from None


def from_torch(dtype: torch.dtype) -> DataType:
    try:
        return _FROM_TORCH[dtype]
    except KeyError:
        raise TypeError(f"torch dtype {dtype} is not supported by fusion_cache") from None


def check_dtype(dtype: object, argument: str) -> DataType:
    """Accept a DataType (or a torch dtype, for convenience); name the argument otherwise."""
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, torch.dtype):
        return from_torch(dtype)
    raise TypeError(f"{argument} must be a DataType, got {dtype!r}")


def is_float(dtype: DataType) -> bool:
    return dtype in FLOATS


def is_integral(dtype: DataType) -> bool:
    """Integers and Bool: the dtypes torch's bitwise ops accept."""
    return dtype in INTS or dtype is DataType.Bool


def is_complex(dtype: DataType) -> bool:
    return dtype in COMPLEX


def is_storage_only(dtype: DataType) -> bool:
    """Float8 and float4 formats: cast to and from, never computed in."""
    return dtype in STORAGE_ONLY


def is_signed_int(dtype: DataType) -> bool:
    return dtype in (DataType.Int, DataType.Int32)


def scalar_dtype_of(value: object) -> DataType:
    """The DataType a Python constant gets: bool -> Bool, int -> Int, float -> Double."""
    if isinstance(value, bool):
        return DataType.Bool
    if isinstance(value, int):
        return DataType.Int
    if isinstance(value, float):
        return DataType.Double
    if isinstance(value, complex):
        return DataType.ComplexDouble
    raise TypeError(f"a scalar must be a bool, int, float or complex, got {type(value).__name__}")


# Note [Promotion]: operands come in three priority classes, as in torch: tensors with
# dims, zero-dim tensors, and scalars. We let torch decide by promoting meta proxies, so
# every corner (weak scalars, category jumps) is exactly torch's.
_SCALAR_PROXY = {"bool": True, "int": 1, "float": 1.0, "complex": 1j}


def _category(dtype: DataType) -> str:
    if dtype is DataType.Bool:
        return "bool"
    if dtype in INTS:
        return "int"
    if dtype in COMPLEX:
        return "complex"
    return "float"


@functools.lru_cache(maxsize=4096)
def promote(operands: tuple[tuple[int, DataType], ...]) -> DataType:
    """Promote (priority class, dtype) pairs: class 2 = tensor with dims, 1 = zero-dim, 0 = scalar.

    Raises TypeError where torch refuses (a storage-only dtype, or UInt64 with another
    integer type)."""
    narrow = next((dt for _, dt in operands if dt in STORAGE_ONLY), None)
    if narrow is not None:
        raise TypeError(f"{narrow!r} values take part in no arithmetic (Note [Storage-only "
                        "dtypes]): cast them to DataType.Float first")
    if all(cls == 0 for cls, _ in operands):
        order = ["bool", "int", "float", "complex"]
        top = max((_category(dt) for _, dt in operands), key=order.index)
        return {
            "bool": DataType.Bool,
            "int": DataType.Int,
            "float": DataType.Double,
            "complex": DataType.ComplexDouble,
        }[top]
    proxies = []
    for cls, dt in operands:
        if cls == 0:
            proxies.append(_SCALAR_PROXY[_category(dt)])
        else:
            proxies.append(torch.empty((1,) if cls == 2 else (), dtype=to_torch(dt), device="meta"))
    acc = next(p for p in proxies if isinstance(p, torch.Tensor))
    for p in proxies:
        if p is acc:
            continue
        try:
            dt = torch.result_type(acc, p)
        except RuntimeError as err:  # torch promotes UInt64 with no other integer type
            other = p.dtype if isinstance(p, torch.Tensor) else type(p).__name__
            raise TypeError(f"no type promotion between {acc.dtype} and {other}: {err}") from None
        shape = (1,) if (acc.dim() or (isinstance(p, torch.Tensor) and p.dim())) else ()
        acc = torch.empty(shape, dtype=dt, device="meta")
    if acc.dtype == torch.complex32:  # no ComplexHalf here: widen as nvFuser does
        return DataType.ComplexFloat
    return from_torch(acc.dtype)


def float_result(dtype: DataType) -> DataType:
    """The result of a float-valued op (sin, truediv, ...): ints and bools become Float."""
    return DataType.Float if is_integral(dtype) else dtype


def real_part(dtype: DataType) -> DataType:
    return {DataType.ComplexFloat: DataType.Float, DataType.ComplexDouble: DataType.Double}.get(
        dtype, dtype
    )
