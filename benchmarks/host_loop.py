"""Host time of `execute` for a benchmark case at a tiny shape, where the GPU waits on
the host: what a cache hit of that plan costs the CPU, kernels and launches included.

    python -m benchmarks.host_loop CASE [--shape 8 64] [--calls 2000] [--rounds 3] [--profile]

Per round: `--calls` calls of execute back to back, then one synchronize, in microseconds
a call; `--profile` adds cProfile's busiest functions over one more round.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import torch

from benchmarks.cases import CASES
from fusion_cache.runtime.executor import executor_for


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_loop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=[c.name for c in CASES], metavar="CASE")
    parser.add_argument("--shape", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    case = next(c for c in CASES if c.name == args.case)
    shape = tuple(args.shape)
    fd, inputs = case.build(shape), case.inputs("cuda", shape)

    def round_us() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.calls):
            fd.execute(inputs)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / args.calls * 1e6

    round_us()  # compile, plan and warm up
    times = [round_us() for _ in range(args.rounds)]
    plan = executor_for(fd).last_plan
    print(f"{case.name} at {list(shape)}: {getattr(plan, 'description', '') or plan.spec.description}")
    print("us a call, per round: " + ", ".join(f"{t:.1f}" for t in times))
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        round_us()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
