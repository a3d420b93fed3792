"""Each kernel's time in a case's fusion, after the same dirty 256 MiB flush as do_bench.

    python -m benchmarks.kernel_times CASE [--knobs JSON ...] [--reps N]

Runs the fusion with execute(profile=True) (CUDA events around every launch, so dependent
launches run one after another here) and prints the median ms of each kernel and of their
sum, once per --knobs setting (Note [Tuning knobs]), in one process: which kernel of a
multi-kernel plan holds the time. The events cost time of their own: on the H100 a two-kernel
plan of 61 us under do_bench read 89 us here, so compare kernels, not totals with do_bench.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from benchmarks.cases import CASES
from benchmarks.run import seed_for


def kernel_times(case_name: str, knobs: dict, reps: int) -> list[tuple[str, float]]:
    from benchmarks.sweep import _forget_plans
    from schedulers.tuning import overriding

    case = next(c for c in CASES if c.name == case_name)
    torch.manual_seed(seed_for(case.name))
    inputs = case.inputs("cuda")
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    with overriding(knobs):
        fd = case.build()
        _forget_plans(fd)  # the same definition is the same fusion: plan it under these knobs
        fd.execute(inputs)
        runs = []
        for _ in range(reps):
            flush.zero_()
            fd.execute(inputs, profile=True)
            runs.append([(k.name, k.time_ms) for k in fd.profile().kernel_profiles])
    names = [n for n, _ in runs[0]]
    return [(n, statistics.median(r[i][1] for r in runs)) for i, n in enumerate(names)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernel_times", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=[c.name for c in CASES], metavar="CASE")
    parser.add_argument("--knobs", type=json.loads, action="append", default=None,
                        help="tuning knobs as JSON, repeatable (default: the heuristics' own)")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args(argv)
    print(f"{torch.cuda.get_device_name()}: {args.case}, median of {args.reps} runs")
    for knobs in args.knobs or [{}]:
        times = kernel_times(args.case, knobs, args.reps)
        total = sum(ms for _, ms in times)
        print(f"{json.dumps(knobs)}: {total * 1e3:.1f} us = "
              + " + ".join(f"{n} {ms * 1e3:.1f}" for n, ms in times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
