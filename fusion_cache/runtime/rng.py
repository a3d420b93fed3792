"""The seed and offset of one execute's random ops without an explicit seed (Note [Random
seeds] in fusion_cache/ir/random_seeds.py), taken from torch's generator of the inputs'
device."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from fusion_cache.ir.interpret.random import generator_state
from fusion_cache.ir.random_seeds import SEED_INPUTS

_LOCK = threading.Lock()  # get_offset and set_offset are two calls: one caller at a time


def device_of(values: Sequence[Any]) -> torch.device:
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_cuda:
            return v.device
    return torch.device("cpu")


def run_seeds(values: Sequence[Any], ops: int) -> tuple[int, int]:
    """(seed, offset) as Int inputs (the seed's 64 bits in a signed int), for a run of `ops`
    unseeded random ops; torch's CUDA generator moves on by 4 per 4 of them."""
    device = device_of(values)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "a fusion with random ops that have no rng_seed cannot be captured in a CUDA graph: "
            "its seed and offset are read from torch's generator when it runs; pass rng_seed and "
            "rng_offset as inputs of the fusion instead")  # fmt: skip
    with _LOCK:
        seed, offset = generator_state(device, 4 * -(-ops // 4))
    return (seed - 2**64 if seed >= 2**63 else seed), offset


def with_seeds(values: Sequence[Any], seeds: tuple[int, int]) -> list[Any]:
    """The seeded definition's inputs: the run's seed and offset, then the user's."""
    assert len(seeds) == SEED_INPUTS
    return [*seeds, *values]
