"""The scheduler registry: schedulers tried in a fixed priority order; every refusal is kept
with its reason so a user can see why a fusion ran where it did."""
from __future__ import annotations

from typing import Any

from .aten import NAME as ATEN
from .aten import lower_aten, plan_aten
from .base import LaunchSpec, Reject, SchedulerRefused
from .inner_outer import NAME as INNER_OUTER
from .inner_outer import lower_inner_outer, plan_inner_outer
from .pointwise import NAME as POINTWISE
from .pointwise import lower_pointwise, plan_pointwise
from .reduction import NAME as REDUCTION
from .reduction import lower_reduction, plan_reduction
from .scatter import NAME as SCATTER
from .scatter import lower_scatter, plan_scatter
from .transpose import NAME as TRANSPOSE
from .transpose import lower_transpose, plan_transpose

# priority order: the first scheduler whose lowering accepts the fusion takes it
SCHEDULERS: list[tuple[str, Any, Any]] = [
    (TRANSPOSE, lower_transpose, plan_transpose),  # pointwise fusions across layouts
    (POINTWISE, lower_pointwise, plan_pointwise),
    (REDUCTION, lower_reduction, plan_reduction),
    (INNER_OUTER, lower_inner_outer, plan_inner_outer),
    (ATEN, lower_aten, plan_aten),  # Note [ATen segments]
    (SCATTER, lower_scatter, plan_scatter),
]


def register(name: str, lower: Any, plan: Any, before: str | None = None) -> None:
    entry = (name, lower, plan)
    names = [n for n, _, _ in SCHEDULERS]
    if name in names:
        SCHEDULERS[names.index(name)] = entry
    elif before in names:
        SCHEDULERS.insert(names.index(before), entry)
    else:
        SCHEDULERS.append(entry)


def schedule(fd: Any) -> tuple[str | None, Any, list[Reject]]:
    """(scheduler name, program, refusals); name is None when every scheduler refused."""
    refusals: list[Reject] = []
    boundary = _segment_boundary(fd)
    if boundary is not None:
        return None, None, [Reject("segmenter", boundary)]
    for name, lower, _ in SCHEDULERS:
        try:
            return name, lower(fd), refusals
        except SchedulerRefused as why:
            refusals.append(Reject(name, str(why)))
    return None, None, refusals


def _segment_boundary(fd: Any) -> str | None:
    """A segment_set whose value is read inside the fusion asks for a kernel boundary."""
    marked = {r.outputs[0].index: r for r in fd._records if r.kind == "op" and r.name == "segment_set"}
    if not marked:
        return None
    for r in fd._records:
        if r.kind == "op":
            for ref in r.refs():
                if ref.index in marked:
                    return f"segment_set ({ref}) asks for a segment boundary before {r.name}"
    return None


def plan_for(name: str, program: Any, values: Any, env: dict, profile: Any) -> LaunchSpec:
    for n, _, plan in SCHEDULERS:
        if n == name:
            return plan(program, values, env, profile)
    raise KeyError(name)
