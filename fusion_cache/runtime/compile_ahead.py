"""Kernels compiled ahead and in parallel, while the regions of a graph are still being lowered.

Note [Compiles ahead]: a cold first step through the torch.compile backend spent most of its
region calls in NVRTC, one kernel after another (H100: 26 to 31 kernels, about 0.2 s each,
5 to 6 s of a 7 to 10 s first step). The backend knows every region's definition and its
inputs' sizes and strides when it lowers a graph, before the graph's first call, so it plans
each region then (`compile_regions`, as precompile does, nothing loaded) with the compiles
deferred: each kernel the plans need and the store lacks goes to a thread pool instead of
being compiled in place. NVRTC releases the GIL, so the compiles run beside each other and
beside the planning of the next regions. The region's first call plans again (the stored
segmentation skips the search) and `cubin_for` takes each kernel from its pending compile,
waiting for it where it is not done yet. A worker runs the store's own `compile_once`, so the
kernel is stored, and compiled once across processes, as any other.

H100 (Llama-style, same run): cold first step 6.16 s against 9.26 s without, its region calls
0.34 s against 6.46 s. What remains is the planning itself, now at lowering (the segmenter's
search: 3.1 s for the Llama-style model's 6 distinct regions, 3.3 s for ResNet-18's 30): its
trials are shared across the process (Note [Shared trials] in schedulers/segmenter.py), and
the regions' searches run side by side in forked children (Note [Searches apart]).

A region whose plan the store already holds for these inputs (a warm store, or a region
that repeats another's definition) is not planned ahead: its kernels are found in the store
at its first call, and planning it twice would only cost host time. Failures ahead of time
are silent: the first call plans, compiles and reports as it would have without this.

Note [Plans kept from ahead]: the region's first call planned again what was planned ahead:
the stored segmentation's groups each tried again, every segment built and registered, every
kernel planned and its source generated, only to find the same plans (a Llama-style model's
first calls on the CPU, stubbed: 1.1 s of planning beside 1.2 s of torch calls). So an
executor keeps what it planned ahead, a region's SegmentedPlan and each kernel plan's spec,
under the plan key of the stand-ins (sizes, strides, alignment, dtype; the device only as
whether a tensor is a CPU scalar) and the profile, and the first call with an equal key takes
it: the executor's plan cache already trusts a plan for every call of an equal key, and the
meta stand-ins give the planners the sizes, strides and pointer alignment (offset times item
size) the CUDA tensors of the first call give. The first call only loads the kernels. A key
that differs (an ATen result's strides, another alignment) plans as before.
FUSION_CACHE_KEEP_AHEAD_PLANS=0 turns it off.

Knobs: FUSION_CACHE_COMPILE_AHEAD=0 turns it off; FUSION_CACHE_COMPILE_THREADS sets the
pool's size (default: the CPUs this process may use, at most 32).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .pending_compiles import deferred, enabled, pending  # noqa: F401 (pending: for callers)
from .searches_apart import SearchNeeded, holding_searches, search_apart

# ---- regions ------------------------------------------------------------------------------------


def profile_for(values: Sequence[Any]) -> Any:
    """The profile the first call will plan for: the GPU of the first CUDA input; None where
    no input is on a GPU (the reference evaluator runs it: nothing to compile)."""
    from schedulers.device import current_profile

    for v in values:
        if isinstance(v, torch.Tensor) and v.is_cuda:
            return current_profile(v.device.index)
    return None


def stand_in(value: Any) -> Any:
    """A meta tensor of `value`'s sizes, strides, offset and dtype (a fake tensor's too); a
    CPU scalar (Note [CPU scalar tensors]) stays a CPU scalar."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.device.type == "cpu" and value.dim() == 0:
        return torch.zeros((), dtype=value.dtype)
    base = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if value.storage_offset():
        return base.as_strided(value.shape, value.stride(), value.storage_offset())
    return base


def compile_regions(regions: Iterable[tuple[Any, Sequence[Any]]]) -> int:
    """Plan each (definition, example inputs) for its first call's profile, with the compiles
    of kernels the store lacks submitted to the pool; returns how many were planned."""
    if not enabled():
        return 0
    from torch.utils._python_dispatch import _disable_current_modes

    from fusion_cache.frontend.trie import FusionCache

    # the forward graph is compiled inside torch's fake and functional modes: the stand-ins
    # and the planning's meta work are plain meta tensors
    with _disable_current_modes(), FusionCache.get().store.writes_together():
        return _compile_regions(regions)  # Note [Writes together] in sql_store.py


def _compile_regions(regions: Iterable[tuple[Any, Sequence[Any]]]) -> int:
    from fusion_cache.frontend.trie import FusionCache
    from fusion_cache.runtime.executor import plan_signature

    planned = 0
    searching = []  # Note [Searches apart]: regions whose plan waits for a search
    for fd, values in regions:
        try:
            profile = profile_for(values)
            if profile is None:
                continue
            inputs = [stand_in(v) for v in values]
            store = FusionCache.get().store
            if store.get_plan(fd.id(), plan_signature(inputs), f"sm_{profile.arch}"):
                continue  # planned before: its kernels are in the store (or being compiled)
            with deferred(), holding_searches():
                fd.precompile(inputs, target=profile)
            planned += 1
        except SearchNeeded as need:
            searching.append((fd, inputs, profile, need))
        except Exception:  # noqa: BLE001 - the first call plans and reports for itself
            continue
    regions_of = {id(need): (fd, inputs, profile) for fd, inputs, profile, need in searching}

    def plan_found(need: SearchNeeded) -> None:  # as its search ends: its compiles go early
        nonlocal planned
        fd, inputs, profile = regions_of[id(need)]
        try:
            with deferred():
                fd.precompile(inputs, target=profile)
            planned += 1
        except Exception:  # noqa: BLE001 - as above
            pass

    search_apart([need for *_, need in searching], plan_found)
    return planned
