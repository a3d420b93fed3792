"""What every family of `fd.ops` shares: turning arguments into references of the definition,
and applying a record with its inferred outputs (TypeError/ValueError naming the argument)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..records import Record, Ref
from ..values import ScalarInfo, Vector, _Handle

if TYPE_CHECKING:
    from ..definition import FusionDefinition

_NUMBER = (bool, int, float, complex)


class OpsBase:
    """Bound to one FusionDefinition as `fd.ops`; the families below add the ops."""

    def __init__(self, fd: FusionDefinition) -> None:
        self._fd = fd

    def _ref(self, value: Any, op: str, arg: str, kinds: str = "TS") -> Ref:
        """A state of this definition; Python numbers become constants."""
        fd = self._fd
        if isinstance(value, _Handle):
            if value.fd is not fd:
                raise ValueError(
                    f"{op}: argument '{arg}' ({value.ref}) belongs to another FusionDefinition"
                )
            if value.ref.kind not in kinds:
                want = {"T": "a tensor", "S": "a scalar", "V": "a vector"}
                raise TypeError(
                    f"{op}: argument '{arg}' must be {' or '.join(want[k] for k in kinds)}, "
                    f"got {value.ref}"
                )
            return value.ref
        if isinstance(value, _NUMBER) and "S" in kinds:
            return fd.define_scalar(value).ref
        raise TypeError(
            f"{op}: argument '{arg}' must be a value of this definition"
            f"{' or a Python number' if 'S' in kinds else ''}, got {type(value).__name__}"
        )

    def _tensor(self, value: Any, op: str, arg: str = "arg") -> Ref:
        return self._ref(value, op, arg, "T")

    def _info(self, ref: Ref):
        return self._fd._infos[ref.index]

    def _producer(self, ref: Ref) -> Record | None:
        """The op record that made `ref` (None for a definition's input or constant)."""
        for r in reversed(self._fd._records):
            if r.kind == "op" and ref in r.outputs:
                return r
        return None

    def _apply(self, record: Record, infer: Callable[[], list]) -> Any:
        return self._fd._apply(record, infer)

    def _out(self, kinds: str) -> tuple[Ref, ...]:
        return self._fd._next_refs(kinds)

    def _size_list(self, value: Any, op: str, arg: str) -> Any:
        """A shape argument: a Vector, or a list of ints and Int scalars."""
        if isinstance(value, Vector):
            return self._ref(value, op, arg, "V")
        if isinstance(value, (list, tuple)) or type(value).__name__ == "Size":
            items = []
            for i, v in enumerate(value):
                if isinstance(v, _Handle):
                    ref = self._ref(v, op, f"{arg}[{i}]", "S")
                    items.append(ref)
                elif isinstance(v, int) and not isinstance(v, bool):
                    items.append(v)
                else:
                    raise TypeError(f"{op}: {arg}[{i}] must be an int or Int scalar, got {v!r}")
            return tuple(items)
        raise TypeError(f"{op}: {arg} must be a list of sizes or a Vector, got {value!r}")

    def _static_sizes(self, sizes: Any) -> list[int | None]:
        """The sizes a shape argument pins at definition time (None: known at execute)."""
        fd = self._fd
        if isinstance(sizes, Ref):
            return [self._const_int(e) for e in fd._infos[sizes.index].elements]
        return [self._const_int(e) for e in sizes]

    def _const_int(self, e: Any) -> int | None:
        if isinstance(e, Ref):
            info = self._fd._infos[e.index]
            return info.value if isinstance(info, ScalarInfo) and info.is_const else None
        return e


def reduced_shape(shape: tuple[int, ...], axes: Sequence[int], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in axes else e for i, e in enumerate(shape))
    return tuple(e for i, e in enumerate(shape) if i not in axes)
