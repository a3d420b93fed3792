"""Where a compiled forward's host time goes, ours beside inductor's, forward calls alone.

    python -m benchmarks.forward_host [--models llama,gpt2] [--reps 40] [--top 30] [--backward]

Issue 30: on the H100 the Llama-style step's gap to inductor sat in its forward graph (Note
[Graph host] in benchmarks/ab_steps.py: 2.48 against 1.73 ms at 03:35 UTC, 2026-11-28).
Per model, each contender (inductor, fusion_cache) is compiled and warmed up with training
steps; then its forward alone (the model called under the step's autocast, the loss dropped:
no backward) is timed `--reps` times, host time to the call's return (nothing waits), with a
synchronize between calls so each issues onto an idle GPU. For fusion_cache the time inside
the region calls (RegionCall.__call__), their launch sequences (LaunchSequence.run) and
their guards is summed as well, per forward. With `--backward` each forward's loss is also
taken back (its gradients dropped first), the backward's host time to `backward()`'s return
timed and split the same way (its region calls run on autograd's device thread). Then
`--profile` forwards of each run under
cProfile, the heaviest functions by own time (cProfile inflates Python calls: read shares
within a contender).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import models
from benchmarks.model_defs import model_cases


class _Timer:
    """Sums perf_counter time inside wrapped methods, per name."""

    def __init__(self) -> None:
        self.total: dict[str, float] = {}

    def wrap(self, owner: type, attr: str, name: str) -> Callable[[], None]:
        original = getattr(owner, attr)
        total = self.total
        total.setdefault(name, 0.0)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                total[name] += time.perf_counter() - start

        setattr(owner, attr, timed)
        return lambda: setattr(owner, attr, original)


def _forward(fn: Callable, case: Any, batch: tuple) -> torch.Tensor:
    with torch.autocast("cuda", dtype=case.autocast or torch.bfloat16,
                        enabled=case.autocast is not None):  # fmt: skip
        return fn(*batch)


def _timed(fn: Callable, case: Any, batch: tuple, reps: int, timer: _Timer | None,
           params: list | None) -> dict[str, tuple[list[float], dict[str, float]]]:  # fmt: skip
    """Per phase (forward, and backward where `params` are given: the loss's backward, its
    gradients dropped before each), the host times of `reps` calls and the time a call spent
    inside the timer's methods."""
    phases: dict[str, tuple[list[float], dict[str, float]]] = {}

    def phase(name: str, call: Callable[[], Any]) -> Any:
        times, inside = phases.setdefault(name, ([], {}))
        before = dict(timer.total) if timer is not None else {}
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - start)
        if timer is not None:
            for k, v in timer.total.items():
                inside[k] = inside.get(k, 0.0) + (v - before.get(k, 0.0)) / reps
        return out

    for _ in range(reps):
        loss = phase("forward", lambda: _forward(fn, case, batch))
        if params is not None:
            for p in params:
                p.grad = None
            phase("backward", loss.backward)
        del loss
    torch.cuda.synchronize()
    return phases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.forward_host",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--models", default="llama,gpt2")
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", type=int, default=10)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--backward", action="store_true",
                        help="time each forward's backward as well (gradients dropped first)")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    from fusion_cache.frontends.fx_region import RegionCall
    from fusion_cache.runtime.sequence import Guard, LaunchSequence

    timer = _Timer()
    undo = [timer.wrap(RegionCall, "__call__", "region calls"),
            timer.wrap(LaunchSequence, "run", "sequences"),
            timer.wrap(Guard, "matches", "guards")]  # fmt: skip
    try:
        for name in args.models.split(","):
            case = next(c for c in model_cases(False) if c.name == name)
            contenders = {}
            for contender in ("inductor", "fusion_cache"):
                model = models.initial_model(case, "cuda")
                fn = models.compiled(contender, model)
                batches = models.batches_for(case, 4, "cuda")
                params = list(model.parameters())
                models.train(fn, params, case, batches[:3], "cuda")
                contenders[contender] = (fn, batches[3], params if args.backward else None)
            medians: dict[tuple[str, str], list[float]] = {}
            inside: dict[str, dict[str, float]] = {}
            for _ in range(args.rounds):  # interleaved, so a slow stretch falls on both
                for contender, (fn, batch, params) in contenders.items():
                    ours = contender == "fusion_cache"
                    phases = _timed(fn, case, batch, args.reps, timer if ours else None, params)
                    for phase, (times, per) in phases.items():
                        medians.setdefault((contender, phase), []).append(
                            statistics.median(times) * 1e3)  # fmt: skip
                        if ours:
                            mine = inside.setdefault(phase, {})
                            for k, v in per.items():
                                mine[k] = mine.get(k, 0.0) + v * 1e3 / args.rounds
            for (contender, phase), ms in medians.items():
                print(f"{name} {phase}: {contender} host ms, median of {args.reps} a round, "
                      f"rounds {' '.join(f'{m:.2f}' for m in ms)} (median "
                      f"{statistics.median(ms):.2f})")  # fmt: skip
            for phase, per in inside.items():
                print(f"{name} {phase}: fusion_cache, ms a call inside: "
                      + ", ".join(f"{k} {v:.3f}" for k, v in per.items()))
            for contender, (fn, batch, _) in contenders.items() if args.profile else ():
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(args.profile):
                    _forward(fn, case, batch)
                profile.disable()
                torch.cuda.synchronize()
                out = io.StringIO()
                pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.top)
                print(f"== {name} {contender}: cProfile of {args.profile} forwards, by own time")
                print("\n".join(line for line in out.getvalue().splitlines()[6:] if line.strip()))
            del contenders
            models.release_memory("cuda")
    finally:
        for u in undo:
            u()
    return 0


if __name__ == "__main__":
    sys.exit(main())
