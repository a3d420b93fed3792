"""The scheduler protocol: a scheduler takes a fusion and either refuses with a reason or
returns a program that codegen renders. Refusals are values, so `fusion-cache show` and the
`scheduler` dump can print why each scheduler passed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Reject:
    scheduler: str
    reason: str

    def __str__(self) -> str:
        return f"{self.scheduler}: {self.reason}"


class SchedulerRefused(Exception):
    """Raised inside a scheduler's analysis; turned into a Reject by the registry."""


class Scheduler(Protocol):
    name: str

    def lower(self, fd: Any) -> Any:
        """Shape-independent analysis: a program, or raise SchedulerRefused(reason)."""
