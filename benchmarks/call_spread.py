"""How steady a case's time is from call to call, beyond do_bench's median.

    python -m benchmarks.call_spread CASE [CASE ...] [--rounds 8] [--calls 300]

Per case, in one process: `--rounds` do_bench medians in a row (GB/s), then `--calls` calls
each timed alone after the same 256 MiB L2 flush, with the 10th, 50th and 90th percentile
and the slowest call, and how many calls took over 1.5x the median: a median that one
slow stretch of calls pulled down shows here as a spread of the rounds.
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.cases import CASES
from benchmarks.run import call_times_ms, seed_for
from fusion_cache.runtime.executor import executor_for


def call_times_us(fn, calls: int) -> list[float]:
    """Each call's time alone, after flushing L2 as do_bench does, sorted."""
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    return sorted(1e3 * ms for ms in call_times_ms(fn, calls, flush.zero_))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.call_spread", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="+", choices=[c.name for c in CASES], metavar="CASE")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args(argv)
    from triton.testing import do_bench

    print(f"{torch.cuda.get_device_name()}")
    for name in args.cases:
        case = next(c for c in CASES if c.name == name)
        torch.manual_seed(seed_for(name))
        inputs = case.inputs("cuda")
        fd = case.build()
        fd.execute(inputs)  # compile before timing
        run = lambda: fd.execute(inputs)  # noqa: E731, B023 - called before the loop moves on
        rates = [case.bytes_moved / do_bench(run, warmup=25, rep=100, return_mode="median") / 1e6
                 for _ in range(args.rounds)]  # fmt: skip
        us = call_times_us(run, args.calls)
        median = us[len(us) // 2]
        slow = sum(u > 1.5 * median for u in us)
        quantiles = ", ".join(f"{us[int(q * (len(us) - 1))]:.1f}" for q in (0.1, 0.5, 0.9, 1.0))
        print(f"{name}: do_bench GB/s {[round(r) for r in rates]}")
        print(f"  one call, us (p10, p50, p90, max): {quantiles}; over 1.5x the median: "
              f"{slow} of {len(us)}")
        print(f"  plan: {executor_for(fd).last_plan.spec.description}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
