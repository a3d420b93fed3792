"""The runtime's side of Note [Runtime interface] (fusion_cache/frontend/engine.py): what a
FusionDefinition's execute, precompile, segment and inspection calls run."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fusion_cache.frontend.definition import FusionDefinitionError
from fusion_cache.ir.fusion_ir import build_fusion, format_fusion

from .execute import run_fusion
from .precompile import precompile
from .segment_query import segment_definition
from .segmented import describe_plan

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition


class RuntimeEngine:
    def execute(self, fd: FusionDefinition, inputs: Sequence[Any], options: Any) -> list:
        return run_fusion(fd, inputs, options)

    def precompile(self, fd: FusionDefinition, inputs: Sequence[Any], target: Any) -> list:
        return precompile(fd, inputs, target)

    def segment(self, fd: FusionDefinition, inputs: Sequence[Any], target: Any) -> tuple:
        return segment_definition(fd, inputs, target)

    def fusion_ir(self, fd: FusionDefinition) -> str:
        return format_fusion(build_fusion(fd))

    def last_cuda_code(self, fd: FusionDefinition) -> str:
        ex = fd._cache.executors.get(fd._fid)
        plan = ex.last_plan if ex is not None else None
        if hasattr(plan, "segments"):  # one kernel (or more) per segment
            return "\n".join(s.definition.last_cuda_code() for s in plan.segments
                             if s.scheduler not in (None, "aten"))  # fmt: skip
        if plan is None or not plan.refs:
            raise FusionDefinitionError("Invalid fusion definition! No kernel has run for this "
                                        "fusion yet: execute it (or precompile) first")  # fmt: skip
        return "\n".join(ref.source for ref in plan.refs)

    def last_scheduled_fusion_ir(self, fd: FusionDefinition) -> str:
        ex = fd._cache.executors.get(fd._fid)
        if ex is None or ex.last_plan is None:
            raise FusionDefinitionError("Invalid fusion definition! Nothing has been scheduled "
                                        "for this fusion yet: execute it, or precompile / "
                                        "scheduled_fusion_ir_for(inputs)")  # fmt: skip
        lines = [self.fusion_ir(fd)]
        if ex.program is not None:
            what = ex.program.describe().removeprefix(f"{ex.scheduler}: ")  # named once
            lines.append(f"scheduler: {ex.scheduler}; {what}")
        for r in ex.refusals:
            lines.append(f"refused by {r}")
        if hasattr(ex.last_plan, "segments"):
            lines.append(describe_plan(fd, ex.last_plan))
        elif ex.last_plan is not None:
            spec = ex.last_plan.spec
            lines.append(f"plan: {spec.description}")
            for k in spec.kernels:
                lines.append(f"kernel {k.name}: grid {k.grid} block {k.block} smem {k.shared_mem}")
        return "\n".join(lines)


ENGINE = RuntimeEngine()
