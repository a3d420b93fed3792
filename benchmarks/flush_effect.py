"""How much of a case's time is the L2 flush's write-back, not the kernel.

    python -m benchmarks.flush_effect [CASE ...]

`triton.testing.do_bench` empties L2 before each call by zeroing a 256 MiB buffer, which
leaves L2 full of dirty lines; the call then pays for writing them back to DRAM. A 1 GiB
copy (the suite's ceiling) spreads that cost over four times the bytes of a 256 MiB case.
This times the copy and each case twice in one process: with do_bench, and with L2 emptied
by reading 256 MiB instead (no dirty lines), and prints GB/s and % of that timer's ceiling.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.cases import CASES
from benchmarks.run import CEILING_BYTES, call_times_ms, compiled_for, seed_for

DEFAULT_CASES = ["rms_norm_bwd_bf16_16384x4096", "layer_norm_bwd_bf16_16384x4096",
                 "layer_norm_bwd_bf16_4096x16384", "sum_outer_f32_4096x16384",
                 "sum_inner_bf16_16384x4096", "softmax_f32_4096x16384"]  # fmt: skip


def read_flush_timer(reps: int = 100, warmup: int = 10) -> Callable[[Callable[[], Any]], float]:
    """Median ms of `fn`, each call after a 256 MiB read that evicts L2 without dirtying it."""
    buffer = torch.randn(256 * 2**20 // 4, device="cuda")
    sink = torch.empty(1, device="cuda")

    def timer(fn: Callable[[], Any]) -> float:
        for _ in range(warmup):
            fn()
        return statistics.median(call_times_ms(fn, reps, lambda: torch.sum(buffer, dim=0, out=sink[0])))

    return timer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flush_effect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", default=DEFAULT_CASES, metavar="CASE")
    parser.add_argument("--baselines", action="store_true",
                        help="also time each case's eager function and its torch.compile")
    args = parser.parse_args(argv)
    from triton.testing import do_bench

    timers = {"do_bench (write flush)": lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median"),
              "read flush": read_flush_timer()}  # fmt: skip
    src = torch.randn(CEILING_BYTES // 4, device="cuda")
    dst = torch.empty_like(src)
    fusions = []
    for name in args.cases:
        case = next(c for c in CASES if c.name == name)
        torch.manual_seed(seed_for(name))
        inputs = case.inputs("cuda")
        fd = case.build()
        fd.execute(inputs)  # compile before timing
        runs = {"fusion": lambda fd=fd, inputs=inputs: fd.execute(inputs)}
        if args.baselines:
            runs["eager"] = lambda case=case, inputs=inputs: case.eager(*inputs)
            runs["compile"] = compiled_for(case, inputs)
        fusions.append((case, runs))
    print(f"{torch.cuda.get_device_name()}: GB/s (% of the copy ceiling of the same timer)")
    for label, timer in timers.items():
        ceiling = 2 * CEILING_BYTES / timer(lambda: dst.copy_(src)) / 1e6
        print(f"{label}: copy of 1 GiB {ceiling:.0f} GB/s")
        for case, runs in fusions:
            for kind, fn in runs.items():
                rate = case.bytes_moved / timer(fn) / 1e6
                name = case.name if kind == "fusion" else f"  {kind}"
                print(f"  {name:36s} {rate:6.0f} ({100 * rate / ceiling:.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
