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
    "index": ("core",),
    "tile": ("core",),
}
FEATURES: tuple[str, ...] = tuple(_REQUIRES)


@functools.cache
def _feature_text(feature: str) -> str:
    text = (PRELUDE_DIR / f"{feature}.cuh").read_text(encoding="utf-8")
    if feature == "float8":
        text = f"#define FC_E4M3_SATURATE {int(torch_e4m3_saturates())}\n" + text
    return text


@functools.cache
def torch_e4m3_saturates() -> bool:
    """Note [Float8 overflow]: torch's cast to float8_e4m3fn turns a value past 448 (and
    +-inf) into NaN in torch 2.11 (seen on the H100, CPU and CUDA alike) but saturates it to
    448 in torch 2.13. Kernels must match the torch they run beside, so the prelude asks
    this process's torch once; the answer is in the kernel source, hence in its key, and a
    store filled under one torch does not serve kernels of the other semantics."""
    import torch

    probe = torch.tensor([1000.0, float("inf")]).to(torch.float8_e4m3fn).view(torch.uint8)
    return probe.tolist() == [0x7E, 0x7E]


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
