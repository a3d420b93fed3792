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


@dataclass(frozen=True)
class ArgRef:
    """A kernel argument filled in at each run: an input's or output's data pointer, a
    workspace buffer, or a scalar input's value."""

    kind: str  # 'input', 'output', 'workspace', 'scalar'
    index: int


@dataclass(frozen=True)
class KernelLaunch:
    name: str
    source: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    arg_types: tuple[str, ...]
    args: tuple  # constants, with ArgRef where a run supplies the value
    shared_mem: int = 0
    # launched cooperatively: all its blocks resident at once (Note [Finish in the row kernel])
    cooperative: bool = False
    # launched to start while the kernel before it runs; it waits in fc_wait_prior_grid
    # (Note [Dependent launch] in codegen/prelude/core.cuh)
    dependent: bool = False


@dataclass(frozen=True)
class OutputSpec:
    shape: tuple[int, ...]
    dtype: Any  # DataType
    alias_input: int | None = None
    # a fresh output allocated with these strides (Note [Output layouts]); None: contiguous
    strides: tuple[int, ...] | None = None


@dataclass(frozen=True)
class LaunchSpec:
    """What a run of one fusion on inputs of one signature needs: outputs, scratch buffers
    and the kernels in order. Sizes are in the args, so the kernels serve other sizes too."""

    scheduler: str
    outputs: tuple[OutputSpec, ...]
    workspaces: tuple[tuple[int, Any], ...]  # (numel, DataType) each, written before read
    kernels: tuple[KernelLaunch, ...]
    description: str = ""
    # kernel 0's grid is this many clusters, one resident wave as the profile estimates it
    # (Note [One wave of partials]); 0: the grid does not depend on residency
    wave: int = 0
    # Note [Kept words]: where not empty, each workspace's value when a scratch set is made
    # (None: left as allocated); the kernels then leave it so at the end of every run
    workspace_fills: tuple = ()
