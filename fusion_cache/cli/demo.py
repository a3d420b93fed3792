"""`fusion-cache demo`: define a few fusions, print them, run them, check them against torch.
It imports torch: main.py imports it only to run it."""
from __future__ import annotations

import time
from collections.abc import Callable

import torch

from fusion_cache import DataType, FusionCache, FusionDefinition

from .common import USAGE, CliError


def _pointwise(fd: FusionDefinition) -> None:
    a = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    b = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    c = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
    bias = fd.ops.broadcast_in_dim(c, shape=fd.ops.shape(a), broadcast_dims=[1])
    fd.add_output(fd.ops.relu(a * b + bias))


def _reduction_broadcast(fd: FusionDefinition) -> None:
    t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
    t2 = fd.ops.sum(t0, dims=[1], keepdim=False, dtype=DataType.Float)
    t3 = fd.ops.broadcast(t2, is_broadcast_dim=[False, True])
    fd.add_output(fd.ops.add(t1, t3))


def _softmax(fd: FusionDefinition) -> None:
    x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
    xf = fd.ops.cast(x, DataType.Float)
    m = fd.ops.broadcast(fd.ops.max(xf, dims=[1]), [False, True])
    e = fd.ops.exp(xf - m)
    s = fd.ops.broadcast(fd.ops.sum(e, dims=[1]), [False, True])
    fd.add_output(fd.ops.cast(e / s, DataType.BFloat16))


def _cases(device: str) -> list[tuple[str, Callable, list, Callable]]:
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    a, b, c = rnd(64, 128), rnd(64, 128), rnd(128)
    t0, t1 = rnd(2, 32), rnd(2, 32)
    x = rnd(32, 1000, dtype=torch.bfloat16)
    return [
        ("relu(a*b + bias)", _pointwise, [a, b, c], lambda: torch.relu(a * b + c)),
        ("sum + broadcast + add", _reduction_broadcast, [t0, t1],
         lambda: t1 + t0.sum(1, keepdim=True)),
        ("softmax (bf16)", _softmax, [x], lambda: torch.softmax(x.float(), 1).to(torch.bfloat16)),
    ]  # fmt: skip


def run_demo(device: str | None = None) -> int:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device.startswith("cuda") and not torch.cuda.is_available():
        raise CliError(f"--device {device}: no CUDA GPU here (torch {torch.__version__} finds "
                       "none); try --device cpu", USAGE)  # fmt: skip
    elif ":" in device and int(device.split(":")[1]) >= torch.cuda.device_count():
        raise CliError(f"--device {device}: this machine has {torch.cuda.device_count()} "
                       "CUDA devices", USAGE)  # fmt: skip
    failures = 0
    for title, build, inputs, expected in _cases(device):
        with FusionDefinition() as fd:
            build(fd)
        print(f"== {title}: fusion id {fd.id()}")
        print(repr(fd))
        print(fd.fusion_ir())
        start = time.perf_counter()
        out = fd.execute(inputs)[0]
        ms = (time.perf_counter() - start) * 1e3
        ref = expected()
        try:
            torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
            verdict = "matches torch"
        except AssertionError as err:
            failures += 1
            verdict = f"DIFFERS from torch: {err}"
        print(f"executed on {device} in {ms:.1f} ms; output {list(out.shape)} {out.dtype}: "
              f"{verdict}\n")  # fmt: skip
    print("stats:", FusionCache.get().stats())
    print(f"demo: {3 - failures} of 3 fusions match torch")
    return 1 if failures else 0
