"""Resize and indexing fusions with their torch references, shared by the CPU tests (plans
compiled for h100 and run on the host) and the GPU tests: the benchmark's resize family
(benchmarks/resize_cases.py) at small odd sizes, and a few shapes only tests need."""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from benchmarks.resize_cases import RESIZE
from fusion_cache import FusionDefinition


class Pattern(NamedTuple):
    build: Callable  # (fd, dtype)
    make: Callable  # (dtype, device, shape) -> inputs
    reference: Callable  # (*inputs) -> outputs
    kernels: int  # launches a run takes
    shape: tuple  # a small odd shape; `big` the benchmark's
    big: tuple


def _from_case(name: str, kernels: int = 1) -> Pattern:
    define, eager, inputs, big, small = RESIZE[name]

    def build(fd, dtype):
        define(fd, dtype, small)

    def reference(*xs):
        out = eager(*xs)
        return list(out) if isinstance(out, tuple) else out

    return Pattern(build, lambda dtype, device, shape: inputs(shape, dtype, device), reference,
                   kernels, small, big)  # fmt: skip


def _pad_unaligned(fd, dtype):
    from benchmarks.resize_cases import _t

    fd.add_output(fd.ops.pad(_t(fd, 2, dtype), [1, 2, 3, 1], fd.define_scalar(0.5)))


def _cat3_odd(fd, dtype):
    from benchmarks.resize_cases import _t

    a, b, c = (_t(fd, 2, dtype) for _ in range(3))
    fd.add_output(fd.ops.cat([a, b, c], 1))


def _cat3_odd_inputs(dtype, device, shape):
    n, m = shape
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).to(dtype=dtype, device=device)
            for s in ((n, m), (n, m // 2 + 1), (n, m + 3))]  # fmt: skip


# an embedding's gradient: the row chains' link and split walk (Note [Split walk])
PATTERNS = {name: _from_case(name, 2 if name.startswith("embedding_bwd") else 1)
            for name in RESIZE}  # fmt: skip
PATTERNS["pad_unaligned"] = Pattern(
    _pad_unaligned, lambda dtype, device, shape: [torch.randn(shape).to(dtype=dtype, device=device)],
    lambda x: F.pad(x, [1, 2, 3, 1], value=0.5), 1, (5, 7), (8191, 4095))
PATTERNS["cat3_odd"] = Pattern(_cat3_odd, _cat3_odd_inputs, lambda a, b, c: torch.cat([a, b, c], 1),
                               1, (5, 12), (8191, 1000))


def define(pattern: Pattern, dtype: torch.dtype) -> FusionDefinition:
    with FusionDefinition() as fd:
        pattern.build(fd, dtype)
    return fd
