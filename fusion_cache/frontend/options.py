"""Dump knobs: FUSION_CACHE_DUMP (aliases NVFUSER_DUMP, PYTORCH_NVFUSER_DUMP) and fallback."""
from __future__ import annotations

import os
import warnings

DUMP_VARS = ("FUSION_CACHE_DUMP", "NVFUSER_DUMP", "PYTORCH_NVFUSER_DUMP")
DUMP_OPTIONS = frozenset({
    "python_definition", "fusion_ir", "cuda_kernel", "launch_param", "eff_bandwidth",
    "print_args", "segments", "scheduler", "graph",
})  # fmt: skip
_warned: set[tuple[str, str]] = set()  # (variable, value) pairs already warned about


OFF_WORDS = frozenset({"0", "false", "off", "no"})


def env_flag(variable: str, default: bool) -> bool:
    """An on/off environment variable: unset or empty gives `default`; 0, false, off or no
    (any case) turn it off; anything else on. Every on/off variable of the project is read
    here (the store's, below this stage, reads the same words), so FUSION_CACHE_DETERMINISTIC=
    false means what FUSION_CACHE_MIN_CUT=false does."""
    value = os.environ.get(variable, "").strip().lower()
    return default if not value else value not in OFF_WORDS


def dump_options() -> frozenset[str]:
    """The known dump options asked for; an unknown one warns once, naming the valid ones
    (and is dropped: any option at all sends launches down the slower general path)."""
    found: set[str] = set()
    for var in DUMP_VARS:
        asked = {x.strip() for x in os.environ.get(var, "").split(",") if x.strip()}
        unknown = sorted(v for v in asked - DUMP_OPTIONS if (var, v) not in _warned)
        if unknown:
            _warned.update((var, v) for v in unknown)
            warnings.warn(f"fusion_cache: {var}: unknown option{'s' * (len(unknown) > 1)} "
                          f"{', '.join(unknown)} ignored; valid: {', '.join(sorted(DUMP_OPTIONS))}",
                          stacklevel=2)  # fmt: skip
        found |= asked & DUMP_OPTIONS
    return frozenset(found)


def dump_enabled(option: str) -> bool:
    return option in dump_options()


def fallback_disabled() -> bool:
    return any(env_flag(var, False)
               for var in ("FUSION_CACHE_DISABLE_FALLBACK", "PYTORCH_NVFUSER_DISABLE_FALLBACK"))
