"""Reads through reshapes, resolved into strides at plan time.

Note [Reshape frames]: lowering a reshape does not index anything new. The reshape's source is
lowered in its own dim space (a *frame*), and an input reached inside that frame is one access
whose `dim_map` points at the frame's source dims; `Access.frames` lists the frames it sits
in, outermost first. When sizes are known, the planner walks the frames from the innermost
out: the input's strides over the source dims, through `apply_view_strides`, become strides
of the reshape's output, which the frame's `out_map` carries into the enclosing space, up to
the loop. That works whenever torch could `view` the reshape's source with those strides; a
reshape that would need a copy (a broadcast dim merged with a real one, a transposed input
split or merged) is refused here, at plan time.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from fusion_cache.ir.view import analyze_view, apply_view_strides

from .base import SchedulerRefused
from .layout import access_strides


class ReshapeFrame(NamedTuple):
    """A reshape being lowered: its output's state, how the enclosing space reads that output
    (output dim -> enclosing dim or None) and its source's state."""

    state: int
    out_map: tuple[int | None, ...]
    source: int


@dataclass(frozen=True)
class ViewedInput:
    """An input's memory seen through reshapes: the outermost reshape output's shape and
    strides over the input's own pointer. Quacks like the tensor the planners read."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    base: Any  # the input tensor

    def stride(self, d: int) -> int:
        return self.strides[d]

    def data_ptr(self) -> int:
        return self.base.data_ptr()

    def numel(self) -> int:
        return self.base.numel()  # the bytes actually read, as for a plain access


def resolve_access(tensor: Any, access: Any, env: dict) -> tuple[Any, tuple[int | None, ...]]:
    """(tensor-like, dim map into the loop) for one access; the input itself when no
    reshape is on the way, so those plans stay exactly as they were."""
    if not access.frames:
        return tensor, access.dim_map
    shape = tuple(tensor.shape)
    strides = tuple(tensor.stride(d) for d in range(len(shape)))
    dim_map = access.dim_map
    for frame in reversed(access.frames):
        src_shape = tuple(env[frame.source])
        here = ViewedInput(shape, strides, tensor)
        src_strides = tuple(access_strides(here, dim_map, len(src_shape)))
        new_shape = tuple(env[frame.state])
        analysis = analyze_view(src_shape, new_shape)
        viewed = apply_view_strides(src_shape, src_strides, analysis)
        if viewed is None:
            raise SchedulerRefused(
                f"reshape (T{frame.state}) of {list(src_shape)} to {list(new_shape)} is not a "
                f"view of its source's strides {list(src_strides)} ({analysis.describe()} "
                "needs a copy)"
            )
        shape, strides, dim_map = new_shape, viewed, frame.out_map
    return ViewedInput(shape, strides, tensor), dim_map


def describe_views(views: Sequence[tuple[int, int]], env: dict) -> str:
    """How each reshape regroups dims for these sizes, for the plan's description: plans of
    one definition that differ only here then read differently."""
    notes = []
    for state, source in views:
        analysis = analyze_view(tuple(env[source]), tuple(env[state]))
        notes.append(f"reshape T{state}: {analysis.describe()}")
    return "".join(f"; {n}" for n in notes)
