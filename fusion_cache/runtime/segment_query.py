"""`fd.segment(inputs)`: the segments a fusion splits into for these inputs, as the
definitions that run them and the maps from their states to the original's
(Note [Segment index space] in fusion_cache/ir/subfusion.py). Nothing is compiled or run."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fusion_cache.frontend.validate import validate_inputs
from fusion_cache.ir.shape_eval import runtime_shapes
from schedulers.device import default_target, resolve_target
from schedulers.segmenter import segment, whole_fusion_refusal

from .executor import executor_for
from .segmented import build_plan

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition


# the profile fd.segment() plans against on a machine without a GPU when no target is named
DEFAULT_SEGMENT_TARGET = "h100"


class SegmentMaps(dict):
    """Segment definition -> {segment state index: original state index}; a segment's
    position in `fd.segments` works as a key too."""

    def __init__(self, segments: Sequence[Any], maps: Sequence[dict]) -> None:
        super().__init__(zip(segments, maps))
        self._order = list(segments)

    def __getitem__(self, key: Any) -> dict:
        if isinstance(key, int) and not isinstance(key, bool):
            return super().__getitem__(self._order[key])
        return super().__getitem__(key)


def segment_definition(fd: FusionDefinition, inputs: Sequence[Any],
                       target: Any) -> tuple[list, SegmentMaps]:  # fmt: skip
    values = validate_inputs(fd, inputs, "segment")
    ex = executor_for(fd)
    fd = ex.fd  # composite ops expanded, random ops seeded: the definition the schedulers see
    values = ex.scheduled_inputs(values)
    target = default_target() if target is None else target
    try:
        profile = resolve_target(target)
    except RuntimeError:  # no GPU here and none named: segments hardly depend on the GPU
        profile = resolve_target(DEFAULT_SEGMENT_TARGET)
    env = runtime_shapes(fd, values)
    if whole_fusion_refusal(fd, values, env, profile) is None:
        return [], SegmentMaps([], [])
    plan = build_plan(fd, segment(fd, values, env, profile))
    ex.last_plan = plan
    segments = [s.definition for s in plan.segments]
    return segments, SegmentMaps(segments, [dict(s.sub.index_map) for s in plan.segments])
