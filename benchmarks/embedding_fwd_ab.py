"""The embedding forward (8192 tokens x 768 bf16 from a 50304-row table) interleaved with
eager's kernel and a same-size copy, rounds of do_bench (dirty flush), medians:

    python -m benchmarks.embedding_fwd_ab [--rounds N] [--knobs JSON ...]

Each --knobs setting is its own plan of the same definition (Note [Tuning knobs])."""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from benchmarks.cases import CASES
from benchmarks.run import gbps, make_timer, seed_for

CASE = "embedding_fwd_bf16_50304x768x8x1024"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.sweep import _forget_plans
    from schedulers.tuning import overriding

    parser = argparse.ArgumentParser(prog="python -m benchmarks.embedding_fwd_ab")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--knobs", type=json.loads, action="append", default=None)
    args = parser.parse_args(argv)
    case = next(c for c in CASES if c.name == CASE)
    torch.manual_seed(seed_for(CASE))
    inputs = case.inputs("cuda")
    idx, weight = inputs
    src = torch.empty(case.bytes_moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    runs = {"eager": lambda: F.embedding(idx, weight), "copy": lambda: dst.copy_(src)}
    fd = case.build()
    settings = [json.dumps(k) for k in args.knobs or [{}]]
    timer = make_timer(quick=True)
    times: dict[str, list[float]] = {k: [] for k in [*runs, *settings]}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            times[name].append(timer(fn))
        for name in settings:  # planned again under the setting, then timed on that plan
            with overriding(json.loads(name)):
                _forget_plans(fd)
                fd.execute(inputs)
                times[name].append(timer(lambda: fd.execute(inputs)))
    print(f"{torch.cuda.get_device_name()}: {CASE}, {case.bytes_moved / 1e6:.1f} MB, "
          f"median of {args.rounds} interleaved rounds")
    for name, ts in times.items():
        ms = statistics.median(ts)
        print(f"  {gbps(case.bytes_moved, ms):6.0f} GB/s {ms * 1e3:6.2f} us  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
