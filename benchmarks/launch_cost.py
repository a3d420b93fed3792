"""Host time of one kernel launch, by route (Note [Launch through ctypes], [Bound launches]).

    python -m benchmarks.launch_cost [--calls 5000] [--rounds 5] [--json FILE]

An empty kernel with a pointwise kernel's parameters (three pointers, nine ints), launched
back to back on torch's current stream. Two figures a route, in microseconds a launch (the
median of the rounds): `host`, the time to issue a batch of 200 launches (synchronized
before, not timed after: what the CPU pays), and `stream`, `--calls` launches and one
synchronize (at least the GPU's own time per tiny kernel, about 3.6 us on the H100). Routes:

- `cuda_python`: cuda-python's driver.cuLaunchKernel on prepacked parameters (the old route);
- `ctypes`: the driver's cuLaunchKernel through ctypes, on prepacked parameters;
- `ctypes_ex`: cuLaunchKernelEx through ctypes with a config built once;
- `unbound`: LoadedKernel.launch, arguments packed each call (execute()'s route);
- `bound`: a BoundLaunch called on a list of tensors (a launch sequence's route);
- `replay`: the BoundLaunch's driver call alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch

SOURCE = r"""
extern "C" __global__ void empty_pointwise(const float* a, int sa0, int sa1, const float* b,
                                           int sb0, int sb1, float* out, int so0, int so1,
                                           int n0, int n1, int n) {
  if (n < 0) out[threadIdx.x] = a[sa0] + b[sb1] + (float)(so0 + so1 + n0 + n1 + sa1 + sb0);
}
"""
TYPES = ("ptr", "i32", "i32", "ptr", "i32", "i32", "ptr", "i32", "i32", "i32", "i32", "i32")


def per_call_us(fn: Callable[[], object], calls: int, rounds: int) -> float:
    for _ in range(200):
        fn()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def host_us(fn: Callable[[], object], rounds: int, batch: int = 200) -> float:
    """Issue time alone: a batch short enough that the driver's queue never blocks it."""
    times = []
    for _ in range(rounds * 4):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        times.append((time.perf_counter() - start) / batch * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.launch_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from cuda.bindings import driver

    from codegen import launch
    from codegen.nvrtc import compile_cubin

    major, minor = torch.cuda.get_device_capability()
    kernel = launch.load_kernel(compile_cubin(SOURCE, major * 10 + minor), "empty_pointwise")
    env = [torch.randn(64, device="cuda") for _ in range(3)]
    template = [None, 1, 0, None, 0, 1, None, 1, 0, 8, 8, 64]
    pointers = ((0, 0), (3, 1), (6, 2))
    values = list(template)
    for pos, index in pointers:
        values[pos] = env[index].data_ptr()
    grid, block = (1, 1, 1), (64, 1, 1)
    packer = launch._packer(TYPES)
    packer.pack_into(packer.buffer, 0, *values)
    stream = torch.cuda.current_stream().cuda_stream
    handle = launch._stream_handle(stream)
    drv = launch._driver()
    config = launch.launch_config(grid, block, 0, stream, False, False)
    config_ptr = config.getPtr()
    bound = kernel.bind(grid, block, TYPES, template, pointers, ())

    def cuda_python() -> None:
        driver.cuLaunchKernel(kernel._function, 1, 1, 1, 64, 1, 1, 0, handle, packer.params, 0)

    def by_ctypes() -> None:
        drv.launch(kernel._handle, 1, 1, 1, 64, 1, 1, 0, stream, packer.params, None)

    def by_ctypes_ex() -> None:
        drv.launch_ex(config_ptr, kernel._handle, packer.params, None)

    routes = {
        "cuda_python": cuda_python,
        "ctypes": by_ctypes,
        "ctypes_ex": by_ctypes_ex,
        "unbound": lambda: kernel.launch(grid, block, TYPES, values),
        "bound": lambda: bound(env),
        "replay": bound.replay,
    }
    row = {name: {"host": host_us(fn, args.rounds),
                  "stream": per_call_us(fn, args.calls, args.rounds)}
           for name, fn in routes.items()}  # fmt: skip
    for name, r in row.items():
        print(f"{name:<12} host {r['host']:5.2f} us  stream {r['stream']:5.2f} us", flush=True)
    if args.json:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "calls": args.calls, "rounds": args.rounds}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "row": row}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
