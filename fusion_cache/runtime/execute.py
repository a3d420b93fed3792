"""execute(): inputs -> checked values -> the GPU path (kernels) or the reference evaluator."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from fusion_cache.frontend.trie import FusionCache
from fusion_cache.frontend.validate import validate_inputs

from .executor import try_cached_launch
from .reference import run_reference

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition


def _on_gpu(values: Sequence[Any]) -> bool:
    return any(isinstance(v, torch.Tensor) and v.is_cuda for v in values)


def run_fusion(fd: FusionDefinition, inputs: Sequence[Any], device: Any = None) -> list[Any]:
    if device is not None:
        return _run_on(fd, inputs, device)
    if fd._cache.executors and isinstance(inputs, (list, tuple)):
        outs = try_cached_launch(fd, inputs)
        if outs is not None:
            return outs
    values = validate_inputs(fd, inputs)
    if _on_gpu(values):
        from .executor import run_on_gpu

        return run_on_gpu(fd, values)
    FusionCache.get()._count("reference_runs")
    return run_reference(fd, values)


def _run_on(fd: FusionDefinition, inputs: Sequence[Any], device: Any) -> list[Any]:
    """execute(device=...): the tensors read must already be on `device` (0-dim CPU tensors,
    scalars, may stay on the CPU), as nvFuser asks; outputs of a fusion that reads no tensor
    there (only scalars) are placed on it."""
    try:
        dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"execute: device={device!r} is not a device: {err}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"execute: device={device!r} but no CUDA GPU is available")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    for i, v in enumerate(inputs if isinstance(inputs, (list, tuple)) else ()):
        if isinstance(v, torch.Tensor) and v.device != dev and not (v.device.type == "cpu" and v.dim() == 0):
            raise ValueError(f"execute: input {i} is on {v.device}, but device={device!r} asks for "
                             f"{dev}; move the input there or leave device out")  # fmt: skip
    if dev.type == "cuda" and isinstance(inputs, (list, tuple)) and not _on_gpu(inputs):
        # nothing to tell the device but the argument: the GPU path, on that device
        from .executor import run_on_gpu

        outs = run_on_gpu(fd, validate_inputs(fd, inputs), device=dev.index)
    else:
        outs = run_fusion(fd, inputs)
    return [o.to(dev) if isinstance(o, torch.Tensor) and o.device != dev else o for o in outs]
