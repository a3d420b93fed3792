"""CUDA C++ helpers pasted at the top of generated kernels.

NVRTC runs without include paths, so there is no <cstdint>, <cuda_fp16.h> or <cuda_bf16.h>:
the prelude supplies fixed-width ints, 16-bit float storage types and conversions, vector
loads, torch-semantics math, and warp/block/Welford reductions. Each feature is one .cuh file
in codegen/prelude/; the text is part of the kernel source, so it is part of the kernel key.
"""

from __future__ import annotations

import functools
from pathlib import Path

PRELUDE_DIR = Path(__file__).with_name("prelude")

# Paste order; each feature lists what it needs (which comes earlier in this order).
_REQUIRES: dict[str, tuple[str, ...]] = {
    "core": (),
    "math": ("core",),
    "reduce": ("core", "math"),
    "complex": ("core", "math"),
    "float8": ("core",),
    "philox": ("core",),
    "tile": ("core",),
}
FEATURES: tuple[str, ...] = tuple(_REQUIRES)


@functools.cache
def _feature_text(feature: str) -> str:
    return (PRELUDE_DIR / f"{feature}.cuh").read_text(encoding="utf-8")


def _closure(features: tuple[str, ...]) -> tuple[str, ...]:
    wanted = {"core"}
    for feature in features:
        if feature not in _REQUIRES:
            raise ValueError(
                f"unknown prelude feature {feature!r}; known: {', '.join(FEATURES)}"
            )
        wanted.add(feature)
        wanted.update(_REQUIRES[feature])
    return tuple(f for f in FEATURES if f in wanted)


@functools.lru_cache(maxsize=64)
def prelude_source(*features: str) -> str:
    """The prelude text for `features` ("core" always included, dependencies added).

    The result depends only on the set of features, not their order or repetition, so equal
    requests give equal kernel sources (and equal kernel keys).
    """
    chosen = _closure(features)
    header = f"// ---- fusion-cache prelude: {', '.join(chosen)} ----\n"
    return header + "\n".join(_feature_text(f) for f in chosen) + "// ---- end prelude ----\n"
