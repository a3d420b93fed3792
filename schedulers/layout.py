"""Shared plan-time helpers: per-tensor strides over a loop space, collapsing contiguous
dims, alignment and index-type choice."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from codegen.cuda_ops import ELEMENT_BYTES


def access_strides(tensor: Any, dim_map: Sequence[int | None], rank: int) -> list[int]:
    """Strides of `tensor` over the loop dims (summed where several dims map to one; size-1
    and broadcast dims contribute nothing)."""
    eff = [0] * rank
    for i, m in enumerate(dim_map):
        if m is not None and tensor.shape[i] != 1:
            eff[m] += tensor.stride(i)
    return eff


def row_major(shape: Sequence[int]) -> list[int]:
    strides, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = acc if shape[d] != 1 else 0
        acc *= max(shape[d], 1)
    return strides


def collapse(sizes: Sequence[int], strides: Sequence[Sequence[int]],
             dims: Sequence[int] | None = None, keep: frozenset[int] = frozenset(),
             dim_of: list | None = None) -> tuple[list[int], list[list[int]]]:  # fmt: skip
    """Drop size-1 dims and merge neighbours (among `dims`, outer to inner) that are
    contiguous for every tensor; dims in `keep` stay dims of their own. `dim_of`, where
    given, gets each dim's collapsed dim (None for a dropped one)."""
    dims = [d for d in (range(len(sizes)) if dims is None else dims) if sizes[d] != 1]
    out_sizes: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    last_kept = False
    for d in dims:
        if out_sizes and not last_kept and d not in keep and all(
                s[-1] == t[d] * sizes[d] for s, t in zip(out_strides, strides)):  # fmt: skip
            out_sizes[-1] *= sizes[d]
            for s, t in zip(out_strides, strides):
                s[-1] = t[d]
        else:
            out_sizes.append(sizes[d])
            for s, t in zip(out_strides, strides):
                s.append(t[d])
        last_kept = d in keep
        if dim_of is not None:
            dim_of[d] = len(out_sizes) - 1
    if not out_sizes:
        return [1], [[0] for _ in strides]
    return out_sizes, out_strides


def index_type(sizes: Sequence[int], strides: Sequence[Sequence[int]]) -> str:
    """32-bit index math when every offset and the element count stay below 2^30."""
    numel = math.prod(sizes)
    biggest = max([numel] + [sum((n - 1) * abs(x) for n, x in zip(sizes, s)) for s in strides])
    return "int" if biggest < 2**30 else "long long"


def vector_ok(ptr: int, dtype: Any, vec: int, inner_stride: int, outer: Sequence[int]) -> bool:
    return (inner_stride == 1 and vec > 1 and ptr % (vec * ELEMENT_BYTES[dtype]) == 0
            and all(x % vec == 0 for x in outer))  # fmt: skip
