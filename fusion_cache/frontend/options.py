"""Dump knobs: FUSION_CACHE_DUMP (aliases NVFUSER_DUMP, PYTORCH_NVFUSER_DUMP) and fallback."""
from __future__ import annotations

import os

DUMP_VARS = ("FUSION_CACHE_DUMP", "NVFUSER_DUMP", "PYTORCH_NVFUSER_DUMP")
DUMP_OPTIONS = frozenset({
    "python_definition", "fusion_ir", "cuda_kernel", "launch_param", "eff_bandwidth",
    "print_args", "segments", "scheduler", "kernel_cache", "graph",
})  # fmt: skip


def dump_options() -> frozenset[str]:
    found: set[str] = set()
    for var in DUMP_VARS:
        found.update(x.strip() for x in os.environ.get(var, "").split(",") if x.strip())
    return frozenset(found)


def dump_enabled(option: str) -> bool:
    return option in dump_options()


def fallback_disabled() -> bool:
    for var in ("FUSION_CACHE_DISABLE_FALLBACK", "PYTORCH_NVFUSER_DISABLE_FALLBACK"):
        if os.environ.get(var, "").strip() not in ("", "0", "false", "False"):
            return True
    return False
