"""Does a case's fusion run at another speed once torch.compile has compiled that case?

    python -m benchmarks.order_effect [CASE ...]

Seen on the H100: layer norm f32 256x262144 ran 2253 GB/s under do_bench (2358 timed back
to back, no flush) until torch.compile had compiled the same case in the process, and 2564
(2604) after, with the same kernel and the same output address; a trivial torch.compile, or
eager, changed nothing (benchmarks/results/order-effect-*.txt). The cause: Triton's layer
norm loads the weight and bias with eviction_policy="evict_last", and those L2 marks outlive
its kernel, so the fusion's rows stopped pushing the weights out of L2. A Triton kernel that
only loads the weights evict-last had the same effect (benchmarks.l2_marks). Since Note
[Weights kept in L2] the row kernels mark them themselves. This times each
case's fusion both ways, compiles the case with torch.compile, and times again.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.cases import Case, named_on_gpu
from benchmarks.run import compiled_for, make_timer, seed_for

DEFAULT_CASES = ["layer_norm_f32_256x262144", "layer_norm_bf16_256x262144"]


def back_to_back_ms(fn: Callable[[], Any], calls: int = 50, warmup: int = 5) -> float:
    """Mean ms of `calls` calls queued one after another: no flush, L2 warm."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def probe(case: Case) -> str:
    torch.manual_seed(seed_for(case.name))
    inputs = case.inputs("cuda")
    fd = case.build()
    fd.execute(inputs)
    torch.cuda.synchronize()
    timer = make_timer(quick=False)

    def rates() -> str:
        run = lambda: fd.execute(inputs)  # noqa: E731
        flushed = [case.bytes_moved / (timer(run) * 1e-3) / 1e9 for _ in range(2)]
        warm = [case.bytes_moved / (back_to_back_ms(run) * 1e-3) / 1e9 for _ in range(2)]
        return (f"do_bench {' '.join(f'{g:.0f}' for g in flushed)}, "
                f"back to back {' '.join(f'{g:.0f}' for g in warm)} GB/s")  # fmt: skip

    before = rates()
    compiled_for(case, inputs)
    return f"{case.name}\n  before torch.compile of it: {before}\n  after:                      {rates()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.order_effect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", default=DEFAULT_CASES, metavar="CASE")
    args = parser.parse_args(argv)
    chosen = named_on_gpu("benchmarks.order_effect", args.cases)
    if chosen is None:
        return 2
    print(torch.cuda.get_device_name())
    for case in chosen:  # one process a case would be cleaner; this is what the suite does
        print(probe(case), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
