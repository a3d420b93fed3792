"""Ahead-of-time compiles: a fusion scheduled and compiled for given input shapes and a
target profile (the current GPU or a named one such as 'h100'), nothing run. This is what
`fd.precompile` and `fusion-cache warmup` do, also on a machine with no GPU."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fusion_cache.frontend.validate import validate_inputs
from fusion_cache.ir.shape_eval import runtime_shapes
from fusion_cache.ir.subfusion import stand_ins
from schedulers.device import default_target, resolve_target

from .executor import FusionUnsupportedError, executor_for
from .kernel_cache import KernelRef
from .segmented import SegmentedPlan

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition

# called with each precompile call's kernel refs (warmup's progress), nested segments' too
LISTENERS: list[Callable[[list[KernelRef]], None]] = []


def precompile(fd: FusionDefinition, inputs: Sequence[Any], target: Any = None) -> list[KernelRef]:
    """Schedule and compile for `inputs` (meta, CPU or CUDA tensors standing for the real
    ones) for a named target profile or the current GPU, without running anything."""
    if target is None:
        target = default_target()
    profile = resolve_target(target)
    values = validate_inputs(fd, inputs, "precompile")
    ex = executor_for(fd)
    try:
        plan = ex.make_plan(values, profile, load=False)
    except FusionUnsupportedError as err:
        raise FusionUnsupportedError(f"fusion {fd._fid}: {err}") from None
    ex.last_plan = plan
    if isinstance(plan, SegmentedPlan):
        refs = _segments(ex.fd, plan, ex.scheduled_inputs(values), target)
    else:
        refs = plan.refs
    for listener in LISTENERS:
        listener(refs)
    return refs


def _segments(fd: FusionDefinition, plan: SegmentedPlan, values: Sequence[Any],
                        target: Any) -> list:  # fmt: skip
    """Compile every segment's kernels ahead, intermediates standing in as meta tensors."""
    stand = stand_ins(fd, values, runtime_shapes(fd, values))
    refs: list = []
    for seg in plan.segments:
        if seg.scheduler is None:
            continue  # runs on the reference evaluator: nothing to compile
        refs += seg.definition.precompile([stand[v] for v in seg.sub.inputs], target)
    return refs
