"""Where a training step's host time goes: cProfile over steady steps of one model.

    python -m benchmarks.profile_model [--model gpt2] [--contender fusion_cache]
        [--warmup 4] [--steps 5] [--top 45] [--stub]

The model and steps are benchmarks.models' (same batches, optimizer and autocast); `--warmup`
steps run first (compiles, recording), then `--steps` steps under cProfile, whose busiest
functions (by own time, then by cumulative time) are printed with calls per step. cProfile
inflates each Python call: compare functions with one another, not with step times.
`--stub` (CPU): the GPU path's host side with stub launches (benchmarks.host_region).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sys
import warnings

from benchmarks import models
from benchmarks.model_defs import model_cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_model",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--contender", default="fusion_cache")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--stub", action="store_true", help="CPU, plans for h100, stub launches")
    args = parser.parse_args(argv)
    device = "cpu" if args.stub else "cuda"
    case = next(c for c in model_cases(args.tiny) if c.name == args.model)
    if args.stub:
        from benchmarks.host_region import stub_launches

        context = stub_launches()
    else:
        context = contextlib.nullcontext()
    warnings.simplefilter("ignore")
    with context:
        model = models.initial_model(case, device)
        batches = models.batches_for(case, args.warmup + args.steps, device)
        fn = models.compiled(args.contender, model)
        params = list(model.parameters())
        _, times = models.train(fn, params, case, batches[: args.warmup], device)
        print(f"warm-up steps (s): {', '.join(f'{t:.3f}' for t in times)}")
        profile = cProfile.Profile()
        profile.enable()
        _, times = models.train(fn, params, case, batches[args.warmup :], device)
        profile.disable()
    print(f"profiled steps (ms, under cProfile): {', '.join(f'{t * 1e3:.1f}' for t in times)}")
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out)
        stats.sort_stats(key).print_stats(args.top)
        print(f"== by {key} ({args.steps} steps)")
        print("\n".join(line for line in out.getvalue().splitlines()[6:] if line.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
