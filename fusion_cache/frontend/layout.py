"""Sizes and strides -> contiguity and stride order, in nvFuser's conventions.

contiguity[i] is None for a broadcast (size-1) dim; True when dim i's stride equals
size*stride of the next inner non-broadcast dim (1 for the innermost); False otherwise.
stride_order[i] is dim i's rank by stride: 0 for the innermost, ndim-1 for the outermost.
"""
from __future__ import annotations

from collections.abc import Sequence


def _order_inner_to_outer(sizes: Sequence[int], strides: Sequence[int]) -> list[int]:
    # ties keep the logical order: the later dim counts as the inner one
    return sorted(range(len(sizes)), key=lambda d: (strides[d], -d))


def compute_tensor_descriptor(
    sizes: Sequence[int], strides: Sequence[int]
) -> tuple[list[bool | None], list[int]]:
    if len(sizes) != len(strides):
        raise ValueError(f"sizes {list(sizes)} and strides {list(strides)} differ in length")
    order = _order_inner_to_outer(sizes, strides)
    stride_order = [0] * len(sizes)
    for rank, d in enumerate(order):
        stride_order[d] = rank
    contiguity: list[bool | None] = [None] * len(sizes)
    expected = 1
    for d in order:
        if sizes[d] == 1:
            continue
        contiguity[d] = strides[d] == expected
        expected = strides[d] * sizes[d]
    return contiguity, stride_order


def compute_contiguity(sizes: Sequence[int], strides: Sequence[int]) -> list[bool | None]:
    return compute_tensor_descriptor(sizes, strides)[0]


def is_default_stride_order(stride_order: Sequence[int]) -> bool:
    n = len(stride_order)
    return list(stride_order) == list(range(n - 1, -1, -1))
