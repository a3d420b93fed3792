"""The scheduler registry: schedulers tried in a fixed priority order; every refusal is kept
with its reason so a user can see why a fusion ran where it did."""
from __future__ import annotations

from typing import Any

from .base import Reject, SchedulerRefused
from .pointwise import NAME as POINTWISE
from .pointwise import lower_pointwise

# priority order: the first scheduler that accepts the fusion takes it
SCHEDULERS: list[tuple[str, Any]] = [(POINTWISE, lower_pointwise)]


def schedule(fd: Any) -> tuple[str | None, Any, list[Reject]]:
    """(scheduler name, program, refusals); name is None when every scheduler refused."""
    refusals: list[Reject] = []
    for name, lower in SCHEDULERS:
        try:
            return name, lower(fd), refusals
        except SchedulerRefused as why:
            refusals.append(Reject(name, str(why)))
    return None, None, refusals
