"""execute(): inputs -> checked values -> the GPU path (kernels) or the reference evaluator."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from fusion_cache.frontend.options import DUMP_VARS, dump_options
from fusion_cache.frontend.run_options import PLAIN, ExecuteOptions
from fusion_cache.frontend.trie import FusionCache
from fusion_cache.frontend.validate import validate_inputs

from . import run_context
from .executor import try_cached_launch
from .reference import run_reference

if TYPE_CHECKING:
    from fusion_cache.frontend.definition import FusionDefinition


def _on_gpu(values: Sequence[Any]) -> bool:
    return any(isinstance(v, torch.Tensor) and v.is_cuda for v in values)


def _reads_no_tensor(values: Sequence[Any]) -> bool:
    return not any(isinstance(v, torch.Tensor) for v in values)


def run_fusion(fd: FusionDefinition, inputs: Sequence[Any],
               options: ExecuteOptions = PLAIN) -> list[Any]:  # fmt: skip
    if options is not PLAIN:
        if not options.plain:
            with run_context.run_with(options, fd._fid):
                return _run_on(fd, inputs, options.device)
        if options.device is not None:
            return _run_on(fd, inputs, options.device)
    if fd._cache.executors and isinstance(inputs, (list, tuple)):
        outs = try_cached_launch(fd, inputs)
        if outs is not None:
            return outs
    values = validate_inputs(fd, inputs)
    if _on_gpu(values) or (_reads_no_tensor(values) and torch.cuda.is_available()):
        # a fusion that reads no tensor (iota, full, random numbers) runs on the current
        # CUDA device and returns CUDA tensors, as nvFuser does
        from .executor import run_on_gpu

        return run_on_gpu(fd, values)
    FusionCache.get()._count("reference_runs")
    if run_context.ACTIVE and (ctx := run_context.current()) is not None:
        ctx.reference_runs += 1
    if any(var in os.environ for var in DUMP_VARS):  # cheaper than parsing them every run
        _dump_reference_run(fd, values, dump_options())
    return run_reference(fd, values)


def _dump_reference_run(fd: FusionDefinition, values: Sequence[Any], dumps: frozenset) -> None:
    """The dump knobs that mean something for a run without kernels."""
    if "scheduler" in dumps:
        print(f"fusion {fd._fid}: reference evaluator (no CUDA input)")
    if "print_args" in dumps:
        print(f"fusion {fd._fid} inputs:", [(tuple(v.shape), v.stride(), v.dtype)
              if isinstance(v, torch.Tensor) else v for v in values])  # fmt: skip


def _run_on(fd: FusionDefinition, inputs: Sequence[Any], device: Any) -> list[Any]:
    """execute(device=...): the tensors read must already be on `device` (0-dim CPU tensors,
    scalars, may stay on the CPU), as nvFuser asks; outputs of a fusion that reads no tensor
    there (only scalars) are placed on it."""
    if device is None:
        return run_fusion(fd, inputs)
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
    with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
        outs = run_fusion(fd, inputs)  # a fusion that reads no tensor goes to `dev`
    return [o.to(dev) if isinstance(o, torch.Tensor) and o.device != dev else o for o in outs]
