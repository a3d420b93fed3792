"""The aten-op lowering shared by the TorchScript and torch.compile frontends.

Both frontends hand an op's qualified name ("aten::add") and its arguments, bound to the op's
schema, to `lower_op` (aten_table.py), which emits `fd.ops` calls on one open FusionDefinition. The table of
lowerings lives in `aten_ops.py` (primitives) and `aten_composite.py` (softmax, norms, gelu
and their backward formulas); this module holds what they share.

Note [Frontend shapes]: tensor inputs are declared with symbolic sizes (-1) except size-1
dims, which are declared broadcast (1), as nvFuser's frontend users do. Where a lowering
needs a size (a mean's count, a flatten), `LoweringContext.extent` returns the static code,
else a size hint (the torch.compile frontend knows every concrete size), else an
`fd.ops.size` scalar, so the definition stays valid for other sizes when no hint is given.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from fusion_cache.frontend.dtypes import DataType, from_torch
from fusion_cache.frontend.records import Record, Ref
from fusion_cache.frontend.values import HANDLE_TYPES, Scalar, Tensor, _Handle

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition


class LoweringError(ValueError):
    """An op could not be lowered; the message names the op and where it came from."""


class UnsupportedOpError(LoweringError, NotImplementedError):
    """The op (or this use of it) has no lowering to fusion ops."""


# c10::ScalarType codes: TorchScript passes dtypes as these ints (a stable enum)
_SCALAR_TYPE_CODES = {
    3: DataType.Int32, 4: DataType.Int, 5: DataType.Half, 6: DataType.Float,
    7: DataType.Double, 9: DataType.ComplexFloat, 10: DataType.ComplexDouble,
    11: DataType.Bool, 15: DataType.BFloat16,
}  # fmt: skip
_CODES_BY_DTYPE = {v: k for k, v in _SCALAR_TYPE_CODES.items()}


def as_datatype(value: Any) -> DataType:
    """A dtype argument as TorchScript (int code) or FX (torch.dtype) spells it."""
    if isinstance(value, DataType):
        return value
    if isinstance(value, torch.dtype):
        return from_torch(value)
    if isinstance(value, int) and not isinstance(value, bool) and value in _SCALAR_TYPE_CODES:
        return _SCALAR_TYPE_CODES[value]
    raise UnsupportedOpError(f"dtype {value!r} has no fusion DataType")


def scalar_type_code(dtype: DataType) -> int:
    return _CODES_BY_DTYPE[dtype]


class Args:
    """An op's arguments bound to its schema: `a[0]` by position, `a["alpha"]` by name."""

    def __init__(self, op: str, names: Sequence[str], values: Sequence[Any]) -> None:
        self.op = op
        self.names = list(names)
        self.values = list(values)

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, int):
            return self.values[key]
        return self.values[self.names.index(key)]

    def get(self, key: int | str, default: Any = None) -> Any:
        if isinstance(key, int):
            value = self.values[key] if key < len(self.values) else None
        elif key in self.names and self.names.index(key) < len(self.values):
            value = self.values[self.names.index(key)]
        else:
            value = None
        return default if value is None else value

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        return f"Args({self.op}, {dict(zip(self.names, self.values)) or self.values})"


def bind_schema(op: str, schema: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Args:
    """Positional then keyword values, defaults filled in, in the schema's argument order."""
    names, values = [], []
    for i, arg in enumerate(schema.arguments):
        names.append(arg.name)
        if i < len(args) and not arg.kwarg_only:
            values.append(args[i])
        elif arg.name in kwargs:
            values.append(kwargs[arg.name])
        else:
            values.append(arg.default_value if arg.has_default_value() else None)
    return Args(op, names, values)


class LoweringContext:
    """One open FusionDefinition plus what the lowerings need to know about its values."""

    def __init__(self, fd: FusionDefinition) -> None:
        self.fd = fd
        self.ops = fd.ops
        # Note [Frontend shapes]: concrete sizes by state index, when the frontend knows them
        self.size_hints: dict[int, tuple[int, ...]] = {}
        self._sizes: dict[tuple[int, int], Scalar] = {}

    def shape(self, t: Tensor) -> tuple[int, ...]:
        return self.fd._infos[t.index].shape

    def known_extent(self, t: Tensor, dim: int) -> int | None:
        """The size of `dim` when known without emitting an op, else None."""
        code = self.shape(t)[dim]
        if code != -1:
            return code
        hint = self.size_hints.get(t.index)
        return None if hint is None else hint[dim]

    def extent(self, t: Tensor, dim: int) -> int | Scalar:
        known = self.known_extent(t, dim)
        if known is not None:
            return known
        if (t.index, dim) not in self._sizes:
            self._sizes[(t.index, dim)] = self.ops.size(t, dim)
        return self._sizes[(t.index, dim)]

    def extents(self, t: Tensor) -> list[int | Scalar]:
        return [self.extent(t, d) for d in range(t.ndim)]

    def numel(self, t: Tensor, dims: Sequence[int]) -> int | Scalar:
        """The element count over `dims`: a Python int when every extent is known."""
        known = math.prod(e for e in (self.extent(t, d) for d in dims) if isinstance(e, int))
        total: int | Scalar = known
        for d in dims:
            e = self.extent(t, d)
            if not isinstance(e, int):
                total = self.ops.mul(total, e)
        return total

    def producer(self, t: Tensor) -> Record | None:
        """The op record that made `t` in this definition (None for an input)."""
        for record in reversed(self.fd._records):
            if any(o.index == t.index for o in record.outputs):
                return record if record.kind == "op" else None
        return None

    def handle(self, ref: Ref) -> Any:
        """The handle of a state of this definition, from a record's reference to it."""
        return HANDLE_TYPES[ref.kind](self.fd, ref)

    def hint(self, value: Any, sizes: Sequence[int] | None) -> None:
        if isinstance(value, Tensor) and sizes is not None:
            self.size_hints[value.index] = tuple(int(s) for s in sizes)


def is_tensor(value: Any) -> bool:
    return isinstance(value, Tensor)


def is_handle(value: Any) -> bool:
    return isinstance(value, _Handle)


def dims_of(dims: Any, ndim: int) -> list[int]:
    """A dim argument (int, list, None or [] for all dims) as sorted non-negative dims."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    if isinstance(dims, int):
        dims = [dims]
    out = []
    for d in dims:
        if not -max(ndim, 1) <= d < max(ndim, 1):
            raise LoweringError(f"dim {d} is out of range for a tensor of rank {ndim}")
        out.append(d % ndim if ndim else 0)
    return sorted(set(out))


Lowering = Callable[[LoweringContext, Args], Any]
LOWERINGS: dict[str, Lowering] = {}


def lowers(*names: str) -> Callable[[Lowering], Lowering]:
    """Register a lowering under qualified op names ("aten::add", "prims::...")."""

    def register(fn: Lowering) -> Lowering:
        for name in names:
            LOWERINGS[name if "::" in name else f"aten::{name}"] = fn
        return fn

    return register
