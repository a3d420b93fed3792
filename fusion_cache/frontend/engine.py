"""The frontend's one way up: what a FusionDefinition asks of the stages above it.

Note [Runtime interface]: the frontend records definitions; printing their Fusion IR,
scheduling, compiling and running them belong to the IR and runtime stages, which import
the frontend. So that imports point down the stages, the frontend names here the few calls
it makes upward, and the package root (`fusion_cache/__init__.py`) installs a loader that
imports the runtime's implementation on first use. Importing `fusion_cache` therefore
costs no scheduler, codegen or CUDA import until a definition is printed as IR or run.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .definition import FusionDefinition
    from .run_options import ExecuteOptions


class Engine(Protocol):
    def execute(self, fd: FusionDefinition, inputs: Sequence[Any],
                options: ExecuteOptions) -> list:  # fmt: skip
        """Run the fusion on `inputs`: generated kernels for CUDA inputs, the reference
        evaluator for CPU ones. `options` carries execute's keyword arguments; a run that
        asked for a report (debug output, profile) files it in `options.report`."""

    def precompile(self, fd: FusionDefinition, inputs: Sequence[Any], target: Any) -> list:
        """Schedule and compile for `inputs` without running; the kernels' refs."""

    def segment(self, fd: FusionDefinition, inputs: Sequence[Any], target: Any) -> tuple:
        """(segment definitions, their index maps) for these inputs."""

    def fusion_ir(self, fd: FusionDefinition) -> str:
        """The definition's Fusion IR in nvFuser's notation."""

    def last_cuda_code(self, fd: FusionDefinition) -> str:
        """The source of the kernels the last run launched."""

    def last_scheduled_fusion_ir(self, fd: FusionDefinition) -> str:
        """The Fusion IR with the scheduler, plan and kernels of the last run."""


_loader: Callable[[], Engine] | None = None
_engine: Engine | None = None


def install_loader(loader: Callable[[], Engine]) -> None:
    """Called once by the package root: `loader()` imports and returns the runtime's engine."""
    global _loader, _engine
    _loader, _engine = loader, None


def engine() -> Engine:
    global _engine
    if _engine is None:
        if _loader is None:
            raise RuntimeError("fusion_cache's runtime is not installed: import fusion_cache")
        _engine = _loader()
    return _engine
