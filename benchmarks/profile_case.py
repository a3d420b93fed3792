"""Run one benchmark case a few times, for a profiler to watch (ncu, nsys).

    ncu --clock-control none -k regex:fc_ python -m benchmarks.profile_case CASE
    ncu --clock-control none -k regex:triton --launch-skip 10 --launch-count 1 \\
        python -m benchmarks.profile_case CASE --compile

The fusion (or, with --compile, torch.compile's kernels) runs `--calls` times after one
warm-up call, on fresh random inputs; `--knobs` sets tuning knobs (Note [Tuning knobs]).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from benchmarks.cases import CASES
from benchmarks.run import seed_for


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_case", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=[c.name for c in CASES], metavar="CASE")
    parser.add_argument("--compile", action="store_true", help="torch.compile's kernels instead")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--knobs", type=json.loads, default={},
                        help='tuning knobs of the fusion, as JSON: \'{"inner.pipeline": true}\'')
    args = parser.parse_args(argv)
    case = next(c for c in CASES if c.name == args.case)
    torch.manual_seed(seed_for(case.name))
    inputs = case.inputs("cuda")
    if args.compile:
        compiled = torch.compile(case.eager, dynamic=False)
        run = lambda: compiled(*inputs)  # noqa: E731
    else:
        fd = case.build()
        run = lambda: fd.execute(inputs)  # noqa: E731
    from schedulers.tuning import overriding

    with overriding(args.knobs):
        run()  # the warm-up call: compiles (and autotunes torch.compile's kernels)
        torch.cuda.synchronize()
        # the calls after it in an NVTX range, for `ncu --nvtx --nvtx-include calls/`, which
        # skips the autotuning launches whatever their number
        torch.cuda.nvtx.range_push("calls")
        for _ in range(args.calls):
            run()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
