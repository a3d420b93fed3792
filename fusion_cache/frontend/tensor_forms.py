"""Every spelling of `define_tensor` -> one canonical (shape, contiguity, dtype, is_cpu, stride_order)."""
from __future__ import annotations

from typing import Any

from .dtypes import DataType, check_dtype
from .layout import allocation_order, compute_tensor_descriptor, is_default_stride_order

_KNOWN = {
    "shape", "contiguity", "dtype", "is_cpu", "stride_order", "symbolic_sizes", "contiguous",
    "sizes", "strides", "static_sizes", "ndims",
}  # fmt: skip


def _int_list(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) and type(value).__name__ != "Size":
        raise TypeError(f"define_tensor: {what} must be a list of ints, got {value!r}")
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"define_tensor: {what}[{i}] must be an int, got {v!r}")
        out.append(v)
    return tuple(out)


def _contiguity(value: Any, shape: tuple[int, ...], what: str,
                order: tuple[int, ...] = ()) -> tuple[bool | None, ...]:  # fmt: skip
    """Contiguity flags in allocation order (Note [Contiguity in allocation order]); None
    for a size-1 dim, and None on a dim of another size marks an expanded broadcast (read
    with stride 0)."""
    n = len(shape)
    if value is None:
        flags: list = [False] * n
    elif isinstance(value, bool):
        flags = [value] * n
    elif isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(
                f"define_tensor: {what} has {len(value)} entries but shape {list(shape)} has {n} dims"
            )
        flags = list(value)
    else:
        raise TypeError(f"define_tensor: {what} must be a bool or a list, got {value!r}")
    alloc = allocation_order(order, n)
    out: list[bool | None] = []
    for pos, flag in enumerate(flags):
        if shape[alloc[pos]] == 1 or (flag is None and not isinstance(value, bool)):
            out.append(None)  # a broadcast dim has no contiguity
        elif not isinstance(flag, bool):
            raise TypeError(f"define_tensor: {what}[{pos}] must be True, False or None, got {flag!r}")
        else:
            out.append(flag)
    return tuple(out)


def logical_contiguity(contiguity: tuple, order: tuple[int, ...]) -> tuple[bool | None, ...]:
    """Contiguity in allocation order -> per logical dim."""
    n = len(contiguity)
    out: list[bool | None] = [None] * n
    for pos, d in enumerate(allocation_order(order, n)):
        out[d] = contiguity[pos]
    return tuple(out)


def _stride_order(value: Any, ndim: int) -> tuple[int, ...]:
    if not value:
        return ()
    order = _int_list(value, "stride_order")
    if sorted(order) != list(range(ndim)):
        raise ValueError(f"define_tensor: stride_order {list(order)} is not a permutation of {ndim} dims")
    return () if is_default_stride_order(order) else order


def canonical_tensor(args: tuple, kwargs: dict) -> tuple:
    unknown = set(kwargs) - _KNOWN
    if unknown:
        raise TypeError(f"define_tensor: unexpected keyword argument '{sorted(unknown)[0]}'")
    kw = dict(kwargs)
    if args:
        first = args[0]
        if isinstance(first, int) and not isinstance(first, bool):
            kw["ndims"] = first
            if len(args) > 1:
                kw["dtype"] = args[1]
        else:  # define_tensor(shape, contiguity, dtype, is_cpu, stride_order)
            for name, v in zip(("shape", "contiguity", "dtype", "is_cpu", "stride_order"), args):
                kw[name] = v
    dtype = check_dtype(kw.get("dtype", DataType.Float), "define_tensor: dtype")
    if dtype is DataType.Null:
        raise TypeError("define_tensor: dtype must not be DataType.Null")
    is_cpu = bool(kw.get("is_cpu", False))

    if "ndims" in kw:
        n = kw["ndims"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"define_tensor: ndims must be a non-negative int, got {n!r}")
        shape = (-1,) * n
        return shape, (False,) * n, dtype, is_cpu, ()
    if "sizes" in kw:
        sizes = _int_list(kw["sizes"], "sizes")
        strides = _int_list(kw.get("strides", _row_major(sizes)), "strides")
        if len(strides) != len(sizes):
            raise ValueError(
                f"define_tensor: strides {list(strides)} and sizes {list(sizes)} differ in length"
            )
        if any(s < 0 for s in sizes):
            raise ValueError(f"define_tensor: sizes {list(sizes)} has a negative size")
        static = bool(kw.get("static_sizes", False))
        shape = tuple(s if (s == 1 or static) else -1 for s in sizes)
        contiguity, order = compute_tensor_descriptor(sizes, strides)
        order = _stride_order(order, len(shape))
        return shape, _contiguity(contiguity, shape, "contiguity", order), dtype, is_cpu, order
    if "symbolic_sizes" in kw:
        shape = _int_list(kw["symbolic_sizes"], "symbolic_sizes")
        what, flags = "contiguous", kw.get("contiguous")
    elif "shape" in kw:
        shape = _int_list(kw["shape"], "shape")
        what, flags = "contiguity", kw.get("contiguity")
    else:
        raise TypeError("define_tensor: give ndims, shape (+contiguity), symbolic_sizes or sizes")
    for d, s in enumerate(shape):
        if s < -1:
            raise ValueError(f"define_tensor: shape[{d}] = {s}; use -1 for a symbolic size")
    order = _stride_order(kw.get("stride_order"), len(shape))
    return shape, _contiguity(flags, shape, what, order), dtype, is_cpu, order


def _row_major(sizes: tuple[int, ...]) -> list[int]:
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= max(s, 1)
    return strides[::-1]
