"""execute's keyword arguments as one value for the runtime, and what a run reports back
(Note [Runtime interface] in engine.py).

Note [Run options]: `execute(..., _enable_options=[...], _disable_options=[...])` takes
nvFuser's option names (NVFUSER_ENABLE / NVFUSER_DISABLE). Those that mean something here
act for that one call; nvFuser's other names are accepted with a warning that they have no
effect here, and a name nvFuser does not know either warns as unknown. Options never enter
a kernel's key: none of them changes generated code.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# name -> what it does here, for the call that passes it
ENABLE_OPTIONS = {
    "kernel_profile": "profile the call's kernels, as execute(profile=True)",
}
DISABLE_OPTIONS = {
    "fallback": "raise instead of running the reference evaluator when no kernel can be made",
}
# nvFuser's option names that have no counterpart here (its own lowering passes and tools)
NVFUSER_ONLY = frozenset({
    "fuse_matmul", "fuse_multiple_matmuls", "id_model", "id_model_extra_validation",
    "io_to_lower_precision", "kernel_db", "kernel_debug", "kernel_lineinfo",
    "memory_promotion", "static_fusion_count", "tma_pointwise", "tma_reduction",
    "tma_inner_persistent", "warn_register_spill", "wait_debugger", "compile_to_sm",
    "contig_indexing", "expr_simplify", "fma", "grouped_grid_welford_outer_opt",
    "index_hoist", "kernel_reuse", "magic_zero", "matmul_expr_eval", "nvrtc_caching",
    "parallel_compile", "parallel_serde", "predicate_elimination",
    "python_inline_definitions", "resize_scheduler", "reuse_mismatched_type_registers",
    "var_name_remapping", "welford_vectorization", "multidevice", "infer_contiguity",
})  # fmt: skip


def _checked(names: Any, known: dict, which: str) -> tuple[str, ...]:
    if names is None:
        return ()
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise TypeError(f"execute: {which} must be a list of option names, got {names!r}")
    kept = []
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"execute: {which} entries must be strings, got {name!r}")
        if name in known:
            kept.append(name)
        elif name in NVFUSER_ONLY:
            warnings.warn(f"execute: {which} {name!r} is an nvFuser option with no effect in "
                          f"fusion-cache; the ones here: {sorted(known)}", stacklevel=4)  # fmt: skip
        else:
            warnings.warn(f"execute: unknown {which} {name!r} is ignored; the ones here: "
                          f"{sorted(known)}", stacklevel=4)  # fmt: skip
    return tuple(kept)


@dataclass(frozen=True)
class KernelProfile:
    """One kernel launch of a profiled execute (nvFuser's KernelProfile fields)."""

    name: str
    segment_id: int
    device: int
    scheduler: str
    time_ms: float  # CUDA events around the launch
    input_bytes: int
    output_bytes: int
    grid_str: str
    block_str: str
    shared_mem_str: str

    @property
    def effective_bandwidth_gbs(self) -> float:
        secs = self.time_ms / 1e3
        return (self.input_bytes + self.output_bytes) / secs / 1e9 if secs > 0 else 0.0


@dataclass(frozen=True)
class FusionProfile:
    """What `fd.profile()` returns after `execute(..., profile=True)`."""

    fusion_id: int
    kernel_profiles: tuple[KernelProfile, ...]
    host_time_ms: float  # the whole execute call, as the host saw it
    ran_on: str  # 'kernels' or 'reference evaluator'

    @property
    def segments(self) -> int:
        return len({k.segment_id for k in self.kernel_profiles})

    @property
    def kernel_time_ms(self) -> float:
        return sum(k.time_ms for k in self.kernel_profiles)

    cuda_evt_time_ms = kernel_time_ms

    @property
    def input_bytes(self) -> int:
        return sum(k.input_bytes for k in self.kernel_profiles)

    @property
    def output_bytes(self) -> int:
        return sum(k.output_bytes for k in self.kernel_profiles)

    @property
    def effective_bandwidth_gbs(self) -> float:
        t = self.kernel_time_ms / 1e3
        return (self.input_bytes + self.output_bytes) / t / 1e9 if t > 0 else 0.0

    def __str__(self) -> str:
        lines = [f"fusion {self.fusion_id}: {len(self.kernel_profiles)} kernels on "
                 f"{self.ran_on}, host {self.host_time_ms:.3f} ms"]  # fmt: skip
        for k in self.kernel_profiles:
            lines.append(f"  {k.name} ({k.scheduler}, segment {k.segment_id}): "
                         f"{k.time_ms * 1e3:.1f} us, {k.input_bytes + k.output_bytes} B, "
                         f"{k.effective_bandwidth_gbs:.1f} GB/s, grid {k.grid_str} "
                         f"block {k.block_str}")  # fmt: skip
        return "\n".join(lines)


@dataclass
class RunReport:
    """Filled by the runtime during one execute that asked for it."""

    debug_output: str | None = None
    profile: FusionProfile | None = None


@dataclass(frozen=True)
class ExecuteOptions:
    """execute's keyword arguments that the runtime acts on (Note [Run options])."""

    device: Any = None
    capture_debug_output: bool = False
    profile: bool = False
    enable: tuple[str, ...] = ()
    disable: tuple[str, ...] = ()
    report: RunReport | None = field(default=None, compare=False)

    @classmethod
    def build(cls, device: Any, capture_debug_output: bool, profile: bool,
              enable: Any, disable: Any) -> ExecuteOptions:  # fmt: skip
        enable = _checked(enable, ENABLE_OPTIONS, "_enable_options")
        disable = _checked(disable, DISABLE_OPTIONS, "_disable_options")
        profile = bool(profile) or "kernel_profile" in enable
        wants_report = bool(capture_debug_output) or profile
        return cls(device, bool(capture_debug_output), profile, enable, disable,
                   RunReport() if wants_report else None)  # fmt: skip

    @property
    def plain(self) -> bool:
        """Nothing beyond a device: the runtime's fast path serves it."""
        return not (self.capture_debug_output or self.profile or self.enable or self.disable)

    @property
    def no_fallback(self) -> bool:
        return "fallback" in self.disable


PLAIN = ExecuteOptions()
