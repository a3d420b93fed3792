"""Loss deviation from eager over several seeds: fusion_cache beside inductor, same process.

    python -m benchmarks.loss_spread [--models gpt2,llama,resnet18] [--seeds 5] [--steps 10]
        [--deterministic] [--out DIR] [--tiny --device cpu]

One run of `benchmarks.models` compares one batch sequence, and its largest loss difference
over the steps measures how training amplifies a first ulp more than the arithmetic (Note
[Loss deviation] in benchmarks/models.py): whether fusion_cache's figure lands above or below
inductor's is a coin toss from run to run. Here each contender is compiled once per model and
trained from the same initial weights on `--seeds` batch sequences; per seed the largest loss
difference from eager over the steps and the step-1 gradient difference, then their median
and largest over the seeds, per contender. `eager_again` (eager run twice) is the run-to-run
floor. Writes loss-spread-<device>.json and .md to --out (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks import models
from benchmarks.model_defs import model_cases

CONTENDERS = ("eager", "eager_again", "inductor", "fusion_cache")


def spread(case, contenders, seeds: int, steps: int, device: str) -> dict:
    """Per contender: per seed (losses, step-1 gradients on the CPU)."""
    model = models.initial_model(case, device)
    start_state = copy.deepcopy(model.state_dict())
    params = list(model.parameters())
    out: dict[str, list] = {}
    for contender in contenders:
        fn = models.compiled(contender, model)
        runs = []
        for seed in range(seeds):
            model.load_state_dict(start_state)
            gen = torch.Generator().manual_seed(1000 + seed)
            batches = [case.batch(gen, device) for _ in range(steps)]
            grads: list = []
            losses, _ = models.train(fn, params, case, batches, device, first_grads=grads)
            runs.append((losses, grads))
        out[contender] = runs
        print(f"{case.name} {contender}: {seeds} seeds done", flush=True)
    return out


def summary(runs: dict) -> dict:
    """Per contender against eager: each seed's largest loss difference and step-1 gradient
    difference, with their median and largest over the seeds."""
    eager = runs["eager"]
    rows = {}
    for contender, seeds in runs.items():
        if contender == "eager":
            continue
        loss = [max(abs(a - b) for a, b in zip(mine[0], want[0]))
                for mine, want in zip(seeds, eager)]  # fmt: skip
        grad = [models.grad_deviation(mine[1], want[1]) for mine, want in zip(seeds, eager)]
        rows[contender] = {"max_loss_diff": loss, "grad_diff": grad,
                           "loss_median": statistics.median(loss), "loss_max": max(loss),
                           "grad_median": statistics.median(grad), "grad_max": max(grad)}  # fmt: skip
    return rows


def table(results: dict) -> str:
    lines = [f"# Loss deviation from eager over seeds: {results['device']} ({results['utc']})", "",
             f"torch {results['torch']}; {results['seeds']} batch seeds of {results['steps']} steps "
             f"from the same initial weights; deterministic: {results['deterministic']}. Largest "
             "loss difference over the steps and step-1 gradient difference (Note [Loss deviation] "
             "in benchmarks/models.py), median and largest over the seeds.", "",
             "| model | contender | loss diff median | loss diff max | step-1 grad median | "
             "step-1 grad max | per seed loss diffs |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, rows in results["models"].items():
        for contender, r in rows.items():
            seeds = " ".join(f"{x:.1e}" for x in r["max_loss_diff"])
            lines.append(f"| {name} | {contender} | {r['loss_median']:.2e} | {r['loss_max']:.2e} | "
                         f"{r['grad_median']:.1e} | {r['grad_max']:.1e} | {seeds} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loss_spread", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2,llama,resnet18")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--deterministic", action="store_true",
                        help="cuDNN deterministic, no TF32 (Note [Loss deviation])")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="small models (the CPU test's)")
    parser.add_argument("--out", type=Path, default=models.RESULTS_DIR)
    args = parser.parse_args(argv)
    contenders = args.contenders.split(",")
    if contenders[0] != "eager":
        parser.error("--contenders: eager comes first (the others are compared with it)")
    names = args.models.split(",")
    known = [case.name for case in model_cases(args.tiny)]
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    if args.deterministic:
        models.set_deterministic()
    results = {"device": models.device_slug(args.device), "torch": torch.__version__,
               "utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seeds": args.seeds,
               "steps": args.steps, "deterministic": args.deterministic, "models": {}}  # fmt: skip
    for case in model_cases(args.tiny):
        if case.name in names:
            runs = spread(case, contenders, args.seeds, args.steps, args.device)
            results["models"][case.name] = summary(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"loss-spread-{results['device']}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1))
    text = table(results)
    stem.with_suffix(".md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
