"""Definition-time shape rules: broadcasting, axes, and element counts on nvFuser shape codes."""
from __future__ import annotations

import math
from collections.abc import Sequence

SYMBOLIC = -1


def is_static(extent: int) -> bool:
    return extent != SYMBOLIC


def broadcast_shapes(op: str, shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """Right-aligned broadcasting on shape codes; static sizes must agree."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for pos in range(rank):
        codes = [s[pos - rank + len(s)] for s in shapes if pos - rank + len(s) >= 0]
        static = {c for c in codes if c != 1 and c != SYMBOLIC}
        if len(static) > 1:
            a, b = sorted(static)[:2]
            raise ValueError(
                f"{op}: incompatible sizes {a} and {b} at dim {pos} of the broadcast result "
                f"(operand shapes {', '.join(str(list(s)) for s in shapes)})"
            )
        if static:
            out.append(static.pop())
        elif SYMBOLIC in codes:
            out.append(SYMBOLIC)
        else:
            out.append(1)
    return tuple(out)


def normalize_dim(dim: object, ndim: int, op: str, what: str = "dim") -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{op}: {what} must be an int, got {dim!r}")
    if not -ndim <= dim < ndim and not (ndim == 0 and dim in (0, -1)):
        raise ValueError(
            f"{op}: {what} {dim} is out of range for a tensor of rank {ndim} "
            f"(valid: {-ndim}..{ndim - 1})"
        )
    return dim % ndim if ndim else 0


def normalize_dims(dims: object, ndim: int, op: str, what: str = "dims") -> tuple[int, ...]:
    if isinstance(dims, int) and not isinstance(dims, bool):
        dims = [dims]
    if not isinstance(dims, (list, tuple)):
        raise TypeError(f"{op}: {what} must be a list of ints, got {dims!r}")
    out = tuple(normalize_dim(d, ndim, op, what.removesuffix("s")) for d in dims)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: {what} {list(dims)} repeats a dimension")
    return out


def static_numel(shape: Sequence[int]) -> int | None:
    if any(not is_static(e) for e in shape):
        return None
    return math.prod(shape)


def infer_reshape(op: str, old: tuple[int, ...], new: Sequence[int | None]) -> tuple[int, ...]:
    """new: ints (one -1 allowed) or None for a size only known at execute time. `op` names
    the reshape in errors (e.g. "reshape (T3)"), which also name both shapes."""

    def error(why: str) -> ValueError:
        shapes = f"{format_shape(old, codes=True)} to {format_shape(new)}"
        return ValueError(f"{op}: cannot reshape {shapes}: {why}")

    if sum(1 for e in new if e == -1) > 1:
        raise error("more than one -1")
    for e in new:
        if e is not None and e < -1:
            raise error(f"negative size {e} (only -1, for 'infer', is allowed)")
    old_numel = static_numel(old)
    known = [e for e in new if e is not None and e != -1]
    if -1 in new:
        if old_numel is not None and None not in new:
            rest = math.prod(known)
            if rest == 0:
                raise error("-1 is ambiguous because the other sizes multiply to 0")
            if old_numel % rest:
                raise error(f"{old_numel} elements do not divide into parts of {rest}")
            return tuple(old_numel // rest if e == -1 else e for e in new)
        return tuple(SYMBOLIC if e is None else e for e in new)
    if old_numel is not None and None not in new and math.prod(known) != old_numel:
        raise error(f"{old_numel} elements, but the new shape holds {math.prod(known)}")
    return tuple(SYMBOLIC if e is None else e for e in new)


def format_shape(shape: Sequence, codes: bool = False) -> str:
    """A shape for messages, '?' for a size known only at execute time: None in a size list,
    or SYMBOLIC in shape codes (where -1 is not 'infer')."""
    unknown = (lambda e: e == SYMBOLIC) if codes else (lambda e: e is None)
    return "[" + ", ".join("?" if unknown(e) else str(e) for e in shape) + "]"


def normalize_slice(where: str, dim: int, size: int, start: int, stop: int, step: int,
                    manual: bool = False) -> tuple[int, int]:  # fmt: skip
    """(start, extent) of one dim of a slice of a dim of `size`, as nvFuser computes it:
    negative bounds count from the end and both clamp to [0, size] (Python's slice
    semantics), unless `manual` (manual_normalization=True), where the caller promised
    0 <= start <= stop <= size and anything else is an error here, not garbage later."""
    if step <= 0:
        raise ValueError(f"{where}: strides[{dim}] must be positive, got {step}")
    if manual:
        if not 0 <= start <= stop <= size:
            raise ValueError(
                f"{where}: manual_normalization=True needs 0 <= start_indices[{dim}] <= "
                f"end_indices[{dim}] <= {size} (the size of dim {dim}), got {start}:{stop}"
            )
    else:
        start = min(max(start + size if start < 0 else start, 0), size)
        stop = min(max(stop + size if stop < 0 else stop, start), size)
    return start, (stop - start + step - 1) // step


def normalize_index(where: str, what: str, index: int, size: int) -> int:
    """An index into a dim of `size` (negative counts from the end), checked."""
    if not -size <= index < size:
        raise IndexError(f"{where}: {what} {index} is out of range for a dim of size {size}")
    return index + size if index < 0 else index
