"""execute(): inputs -> checked values -> the GPU path (kernels) or the reference evaluator."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from .gpu_runtime import try_cached_launch
from .reference import run_reference
from .trie import FusionCache
from .validate import validate_inputs

if TYPE_CHECKING:
    from .definition import FusionDefinition


def _on_gpu(values: Sequence[Any]) -> bool:
    return any(isinstance(v, torch.Tensor) and v.is_cuda for v in values)


def run_fusion(fd: FusionDefinition, inputs: Sequence[Any], device: Any = None) -> list[Any]:
    if fd._cache.executors and isinstance(inputs, (list, tuple)):
        outs = try_cached_launch(fd, inputs)
        if outs is not None:
            return outs
    values = validate_inputs(fd, inputs)
    if _on_gpu(values):
        from .gpu_runtime import run_on_gpu

        return run_on_gpu(fd, values)
    FusionCache.get()._count("reference_runs")
    return run_reference(fd, values)
