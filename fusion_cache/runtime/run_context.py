"""One execute with options beyond the plain path (Note [Run options] in
fusion_cache/frontend/run_options.py): what it asked for, and the kernel launches it made,
seen by every executor it reaches (segments' too) without threading it through their calls.

The plain path never looks here but for one module flag (`ACTIVE`), so a cache hit pays
nothing for options it did not pass.
"""
from __future__ import annotations

import contextlib
import contextvars
import io
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from fusion_cache.frontend.options import fallback_disabled
from fusion_cache.frontend.run_options import ExecuteOptions, FusionProfile, KernelProfile

ACTIVE = 0  # runs with options in flight, in any thread: executors take the general launch
_CURRENT: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar("fc_run", default=None)


@dataclass
class _Launch:
    name: str
    scheduler: str
    segment: int
    device: int
    grid: tuple
    block: tuple
    shared_mem: int
    input_bytes: int
    output_bytes: int
    start: Any
    end: Any


@dataclass
class RunContext:
    options: ExecuteOptions
    fusion_id: int
    segment: int = 0
    launches: list[_Launch] = field(default_factory=list)
    reference_runs: int = 0

    def record_launch(self, launch: Any, scheduler: str, device: int, input_bytes: int,
                      output_bytes: int) -> tuple[Any, Any]:  # fmt: skip
        """CUDA events to record around one kernel launch (profiling only)."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.launches.append(_Launch(launch.name, scheduler, self.segment, device, launch.grid,
                                     launch.block, launch.shared_mem, input_bytes,
                                     output_bytes, start, end))  # fmt: skip
        return start, end

    def profile(self, host_ms: float) -> FusionProfile:
        if self.launches:
            torch.cuda.synchronize()
        kernels = tuple(
            KernelProfile(k.name, k.segment, k.device, k.scheduler, k.start.elapsed_time(k.end),
                          k.input_bytes, k.output_bytes, str(k.grid), str(k.block),
                          f"{k.shared_mem} B")  # fmt: skip
            for k in self.launches
        )
        ran = "kernels" if kernels else "reference evaluator"
        if kernels and self.reference_runs:
            ran = "kernels and reference evaluator"
        return FusionProfile(self.fusion_id, kernels, host_ms, ran)


def current() -> RunContext | None:
    return _CURRENT.get()


def no_fallback() -> bool:
    """Fallback to the reference evaluator is off: by the environment, or for this call."""
    ctx = _CURRENT.get()
    return fallback_disabled() or (ctx is not None and ctx.options.no_fallback)


@contextlib.contextmanager
def run_with(options: ExecuteOptions, fusion_id: int) -> Iterator[RunContext]:
    """The scope of one execute with options; files its report when the scope ends."""
    global ACTIVE
    outer = _CURRENT.get()
    ctx = RunContext(options, fusion_id)
    token = _CURRENT.set(ctx)
    ACTIVE += 1
    captured = io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(captured) if options.capture_debug_output else (
                contextlib.nullcontext()):  # fmt: skip
            yield ctx
    finally:
        host_ms = (time.perf_counter() - start) * 1e3
        ACTIVE -= 1
        _CURRENT.reset(token)
        report = options.report
        if report is not None:
            if options.capture_debug_output:
                report.debug_output = captured.getvalue()
            if options.profile:
                report.profile = ctx.profile(host_ms)
        if outer is not None and outer.options.profile:
            outer.launches += ctx.launches  # a nested profiled execute counts in the outer one
