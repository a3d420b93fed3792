"""ATen segments at run time (Note [ATen segments] in schedulers/aten.py): a plan that holds
no kernels, and a run that makes the op's torch call on the segment's inputs."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from schedulers.aten import AtenProgram
from schedulers.base import LaunchSpec

from .aten_calls import PreparedCall, interpret_segment

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition


@dataclass
class AtenPlan:
    spec: LaunchSpec  # outputs and description; no kernels
    program: AtenProgram
    refs: list = field(default_factory=list)  # kernels compiled for it: none
    call: PreparedCall | None = None  # Note [Prepared ATen calls]; None: interpreted

    def describe(self) -> str:
        return f"ATen {self.program.describe().removeprefix('aten: ')}"


def run_aten(fd: FusionDefinition, plan: AtenPlan, values: Sequence[Any]) -> list[Any]:
    """The segment's records on its inputs: views and the one op, each the torch call its
    interpreter rule makes, on the inputs' device. Results keep torch's strides (flash
    attention's output is a transposed view): a segment that needs them contiguous gets
    them so (Segment.dense_inputs). A plan with a prepared call runs that (Note [Prepared
    ATen calls])."""
    if plan.call is not None:
        return plan.call(values)
    return interpret_segment(fd, values)
