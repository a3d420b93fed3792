"""Sizes and strides -> contiguity and stride order, in nvFuser's conventions.

stride_order[i] is dim i's rank by stride: 0 for the innermost, ndim-1 for the outermost.
A dim is a broadcast one when its size is 1 or its stride 0 (an expanded broadcast); its
contiguity is None. Otherwise contiguity says whether its stride equals size*stride of the
next inner non-broadcast dim (1 for the innermost).

Note [Contiguity in allocation order]: `compute_tensor_descriptor` (and `define_tensor`
with a stride_order) give contiguity in allocation order, outermost dim first, as nvFuser
does; `compute_contiguity` gives it per logical dim. TensorInfo keeps it per logical dim.
"""
from __future__ import annotations

from collections.abc import Sequence


def _check(sizes: Sequence[int], strides: Sequence[int], what: str) -> None:
    if len(sizes) != len(strides):
        raise ValueError(f"{what}: Sizes and strides must have the same number of dimensions "
                         f"(sizes {list(sizes)}, strides {list(strides)})")  # fmt: skip
    for i, s in enumerate(strides):
        if s < 0:
            raise ValueError(f"{what}: negative stride on tensor is not supported: "
                             f"strides[{i}]={s}")  # fmt: skip


def compute_tensor_descriptor(
    sizes: Sequence[int], strides: Sequence[int]
) -> tuple[list[bool | None], list[int]]:
    """(contiguity in allocation order, stride order). Dims with stride 0 keep their logical
    position in the order, so an unsqueeze or expand adds no permutation."""
    _check(sizes, strides, "compute_tensor_descriptor")
    n = len(sizes)
    moving = sorted((d for d in range(n) if strides[d] != 0), key=lambda d: -strides[d])
    alloc = list(moving)
    for d in range(n):  # in increasing d, as nvFuser inserts them
        if strides[d] == 0:
            alloc.insert(d, d)
    stride_order = [0] * n
    contiguity: list[bool | None] = [None] * n
    for pos, d in enumerate(alloc):
        stride_order[d] = n - 1 - pos
        if strides[d] == 0 or sizes[d] == 1:
            continue
        expected = 1
        for e in alloc[pos + 1:]:
            if strides[e] != 0 and sizes[e] != 1:
                expected = strides[e] * sizes[e]
                break
        contiguity[pos] = strides[d] == expected
    return contiguity, stride_order


def compute_contiguity(sizes: Sequence[int], strides: Sequence[int]) -> list[bool | None]:
    """Contiguity per logical dim (dims in their logical order, broadcast ones skipped)."""
    _check(sizes, strides, "compute_contiguity")
    moving = [d for d in range(len(sizes)) if strides[d] != 0 and sizes[d] != 1]
    contiguity: list[bool | None] = [None] * len(sizes)
    for k, d in enumerate(moving):
        inner = moving[k + 1] if k + 1 < len(moving) else None
        expected = 1 if inner is None else strides[inner] * sizes[inner]
        contiguity[d] = strides[d] == expected
    return contiguity


def allocation_order(stride_order: Sequence[int], ndim: int) -> list[int]:
    """Logical dims from the outermost in memory to the innermost."""
    if not stride_order:
        return list(range(ndim))
    return sorted(range(ndim), key=lambda d: -stride_order[d])


def is_default_stride_order(stride_order: Sequence[int]) -> bool:
    n = len(stride_order)
    return list(stride_order) == list(range(n - 1, -1, -1))
