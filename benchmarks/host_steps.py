"""Where a compiled training step's region host time goes, step by step of each launch sequence.

    python -m benchmarks.host_steps [--models llama,gpt2,resnet18] [--tiny] [--stub] [--json FILE]
        [--profile N]

Per model (benchmarks/model_defs.py, compiled with backend="fusion_cache"): after warm-up
steps, one step runs with every region call recorded (the RegionCall and its inputs). Each
call's launch sequence (Note [Launch sequence]) is then replayed one step at a time on those
inputs, each step timed alone: issue time, `--reps` runs back to back after a synchronize,
the median of `--rounds` (a host-bound step pays this; the GPU work is not waited for).

Each step is timed as a replay runs it (`LaunchSequence.replay_runs`: on the inline route, the
straight closures of Note [Straight runs]), and again through its checked `step.run` (the
`checked` column; what this benchmark timed before 2026-11-27, evening, and overstated):

- kernel steps: ours against their launches alone (each bound launch's `replay`);
- ATen steps: ours against the torch calls the step makes (caught by a torch function
  mode, called again directly with the same arguments): what eager or inductor's generated
  code pays for the same call;
- each region call as a whole against the sum of its steps (the guard, constants, outputs).

Each call is replayed on the thread it ran on: a CUDA backward's on autograd's device thread
(reached through a backward of its own, `on_thread`), where its launches were bound; replayed
on the main thread they took the unbound route (Note [Bound launches]), which a real step
does not (figures before 2026-11-27, 18:00 UTC, timed the backward's kernel steps so).

Totals are a step's: us in each kind of step, ours and bare, per ATen op as well, and the
Python functions the region calls enter (deterministic, unlike times on a loaded CPU);
`--profile N`: the step's region calls under cProfile, its N heaviest functions by self time.
`--stub` (CPU): the GPU path's host side with stub launches (benchmarks.host_region); the
ATen ops then run on the CPU, so compare their overhead (ours - bare), not their times, and
fusions that read no tensor run through execute() there (their device is the CPU).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from benchmarks import models
from benchmarks.host_region import count_python_calls
from benchmarks.model_defs import model_cases


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def issue_us(fn: Callable[[], Any], device: str, reps: int, rounds: int,
             wait: bool = False) -> float:  # fmt: skip
    """Host time of one `fn()`: `reps` calls after a synchronize, median of `rounds`;
    `wait`: synchronized after the calls too (the GPU's time where it is the longer)."""
    fn()
    times = []
    for _ in range(rounds):
        _sync(device)
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        if wait:
            _sync(device)
        times.append((time.perf_counter() - start) / reps * 1e6)
    _sync(device)
    return statistics.median(times)


class _Calls(TorchFunctionMode):
    """The torch functions a call makes at its top level that return tensors (not stride()
    or storage_offset(): reading those is part of the overhead), with their arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, tuple, dict]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        items = out if isinstance(out, (tuple, list)) else (out,)
        if any(isinstance(t, torch.Tensor) for t in items):
            self.calls.append((func, args, kwargs))
        return out


def bare_calls(run: Callable[[], Any]) -> tuple[list[str], Callable[[], None]]:
    """The torch calls `run()` makes, and a call of them again with the same arguments: what
    eager, or inductor's generated code, pays for the same work."""
    mode = _Calls()
    with mode:
        run()
    calls = mode.calls

    def again() -> None:
        for func, args, kwargs in calls:
            func(*args, **kwargs)

    return [getattr(func, "__name__", str(func)) for func, _, _ in calls], again


def _kind(step: Any) -> str:
    return type(step).__name__.removesuffix("Step").lower()


def _aten_name(step: Any) -> str:
    call = getattr(step, "call", None)
    record = getattr(call, "record", None)
    if record is None:
        plan = getattr(step, "plan", None)
        program = getattr(plan, "program", None)
        return program.describe() if program is not None else "?"
    return record.name


def split_call(region: Any, args: tuple, device: str, reps: int, rounds: int) -> dict[str, Any]:
    """One region call's steps timed alone (see the module's doc)."""
    from fusion_cache.frontends.fx_region import _with_constants
    from fusion_cache.runtime.plans import input_key
    from fusion_cache.runtime.sequence import KernelStep

    guard, seq, constants = region._sequences[input_key(args)]

    def timed(fn: Callable[[], Any], wait: bool = False) -> float:
        return issue_us(fn, device, reps, rounds, wait)

    row: dict[str, Any] = {"region": region.__name__, "fusion": region.fusion_id, "steps": [],
                           "call_us": timed(lambda: region(*args)),
                           "waited_us": timed(lambda: region(*args), wait=True),
                           "guard_us": timed(lambda: guard.matches(args)),
                           "sequence_us": timed(lambda: seq.run(args)),
                           # deterministic where timings are not (a loaded CPU): the Python
                           # functions one call enters
                           "python_calls": count_python_calls(lambda: region(*args))}  # fmt: skip
    outs = seq.run(args)
    row["constants_us"] = timed(lambda: _with_constants(outs, constants, args)) if constants \
        else 0.0  # fmt: skip
    outs.clear()
    # each step's run as a replay makes it now: the straight route's closures on the inline
    # route (Note [Straight runs]), else the checked route's
    runs = seq.replay_runs()
    row["route"] = "straight" if runs is seq._inline_runs else "checked"
    kept = [*args, *seq.pad]  # every step in order, nothing dropped
    row["in_order_us"] = timed(lambda: [run(kept) for run, _ in runs])
    kept.clear()
    env = [*args, *seq.pad]
    for step, drop, (run, _) in zip(seq.steps, seq.drops, runs):
        kind = _kind(step)
        item: dict[str, Any] = {"kind": kind,
                                "us": issue_us(lambda r=run: r(env), device, reps, rounds),
                                # the checked route's step.run, which a replay on the inline
                                # route does not run (benchmarks before 2026-11-27 timed it)
                                "checked_us": issue_us(lambda s=step: s.run(env), device, reps,
                                                       rounds)}  # fmt: skip
        if isinstance(step, KernelStep):
            item["launches"] = step.count
            replays = [launch.replay for launch in step.launches]
            item["bare_us"] = issue_us(lambda r=replays: [f() for f in r], device, reps, rounds)
        elif kind in ("aten", "plan", "tensor", "execute"):
            item["op"] = _aten_name(step) if kind in ("aten", "plan") else kind
            names, again = bare_calls(lambda r=run: r(env))
            item["bare_calls"] = names
            if kind == "execute":
                item["why"] = step.why
            item["bare_us"] = issue_us(again, device, reps, rounds)
        run(env)  # the values later steps read
        for slot in drop:
            env[slot] = None
        row["steps"].append(item)
    row["steps_us"] = sum(s["us"] for s in row["steps"])
    return row


def record_calls(fn: Callable, params: list, case: Any, batch: tuple, device: str) -> list:
    """(region, inputs, thread) of every region call of one training step: the thread it ran
    on (a CUDA backward's, autograd's device thread)."""
    from fusion_cache.frontends.fx_region import RegionCall

    calls: list[tuple[Any, tuple, int]] = []
    original = RegionCall.__call__

    def recording(self, *args):
        calls.append((self, args, threading.get_ident()))
        return original(self, *args)

    RegionCall.__call__ = recording
    try:
        models.train(fn, params, case, [batch], device)
    finally:
        RegionCall.__call__ = original
    return calls


def split_model(name: str, tiny: bool, device: str, warmup: int, reps: int,
                rounds: int, profile: int = 0) -> dict[str, Any]:  # fmt: skip
    case = next(c for c in model_cases(tiny) if c.name == name)
    model = models.initial_model(case, device)
    batches = models.batches_for(case, warmup + 3, device)
    fn = models.compiled("fusion_cache", model)
    params = list(model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models.train(fn, params, case, batches[:warmup], device)
        _, times = models.train(fn, params, case, batches[warmup : warmup + 2], device)
        calls = record_calls(fn, params, case, batches[-1], device)
    out: dict[str, Any] = {"model": name, "step_ms": statistics.median(times) * 1e3,
                           "region_calls": len(calls), "calls": []}  # fmt: skip
    with torch.no_grad():  # as AOTAutograd runs the compiled graphs
        for region, args, thread in calls:
            row = on_thread(thread, device, lambda r=region, a=args: split_call(r, a, device, reps,
                                                                            rounds))  # fmt: skip
            row["thread"] = "main" if thread == threading.get_ident() else "backward"
            out["calls"].append(row)
        if profile:
            out["profile"] = profile_calls(calls, device, reps, profile)
    out["summary"] = summarize(out["calls"])
    return out


def on_thread(thread: int, device: str, fn: Callable[[], Any]) -> Any:
    """`fn()` on `thread`: this one, or autograd's thread for a backward on `device` (where a
    CUDA backward's region calls run, and their launches were bound: Note [Bound launches]; a
    replay on another thread takes the unbound route, which a real step does not)."""
    if thread == threading.get_ident():
        return fn()
    out: list = []

    class _Run(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            # were autograd's thread another now, the rows' route says so (checked)
            with torch.no_grad():
                out.append(fn())
            return grad

    x = torch.zeros(1, device=device, requires_grad=True)
    with torch.enable_grad():
        _Run.apply(x).sum().backward()
    return out[0]


def profile_calls(calls: list, device: str, reps: int, top: int) -> list[dict[str, Any]]:
    """The step's region calls, `reps` times in order under cProfile, each thread's calls on
    their thread (on_thread): the `top` functions by self time, in us a step (cProfile slows
    Python calls most: read shares, not times)."""
    import cProfile
    import pstats

    stats: Any = None
    for thread in dict.fromkeys(t for _, _, t in calls):
        group = [(region, args) for region, args, t in calls if t == thread]

        def run(group: list = group) -> cProfile.Profile:
            for region, args in group:
                region(*args)
            _sync(device)
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(reps):
                for region, args in group:
                    region(*args)
            profiler.disable()
            _sync(device)
            return profiler

        profiler = on_thread(thread, device, run)
        stats = pstats.Stats(profiler) if stats is None else stats.add(profiler)
    stats = stats.stats  # type: ignore[attr-defined]
    rows = [{"function": f"{file.rsplit('/', 1)[-1]}:{line}({name})" if line else name,
             "calls": n / reps, "self_us": tt / reps * 1e6, "total_us": ct / reps * 1e6}
            for (file, line, name), (_, n, tt, ct, _) in stats.items()]  # fmt: skip
    rows.sort(key=lambda r: -r["self_us"])
    return rows[:top]


def summarize(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Per step kind and per ATen op: count, us ours and bare, summed over the step."""
    kinds: dict[str, dict[str, float]] = {}
    ops: dict[str, dict[str, float]] = {}
    for call in calls:
        for s in call["steps"]:
            k = kinds.setdefault(s["kind"], {"n": 0, "us": 0.0, "checked_us": 0.0, "bare_us": 0.0,
                                             "launches": 0})  # fmt: skip
            k["n"] += 1
            k["us"] += s["us"]
            k["checked_us"] += s.get("checked_us", s["us"])
            k["bare_us"] += s.get("bare_us", 0.0)
            k["launches"] += s.get("launches", 0)
            if "op" in s:
                o = ops.setdefault(s["op"], {"n": 0, "us": 0.0, "checked_us": 0.0, "bare_us": 0.0})
                o["n"] += 1
                o["us"] += s["us"]
                o["checked_us"] += s.get("checked_us", s["us"])
                o["bare_us"] += s["bare_us"]
    wrappers = sum(c["call_us"] - c["steps_us"] for c in calls)
    parts = {k: sum(c.get(k, 0.0) for c in calls) for k in (
        "waited_us", "guard_us", "sequence_us", "constants_us", "in_order_us", "steps_us")}
    routes = sorted({c.get("route", "checked") for c in calls})
    return {"regions_us": sum(c["call_us"] for c in calls), "wrappers_us": wrappers,
            "routes": routes,
            "python_calls": sum(c["python_calls"] for c in calls), "parts": parts,
            "kinds": kinds, "aten_ops": ops}  # fmt: skip


def render(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [f"{result['model']}: step {result['step_ms']:.2f} ms; {result['region_calls']} "
             f"region calls issue {s['regions_us'] / 1e3:.2f} ms, of which wrappers "
             f"(guard, constants, outputs) {s['wrappers_us'] / 1e3:.2f} ms; "
             f"{s['python_calls']} Python calls; steps timed on the "
             f"{'/'.join(s.get('routes', ['checked']))} route"]  # fmt: skip
    p = s["parts"]
    lines.append("  regions, ms: " + ", ".join(f"{k.removesuffix('_us')} {v / 1e3:.2f}"
                                                for k, v in p.items()))  # fmt: skip
    for kind, k in s["kinds"].items():
        extra = f", {k['launches']:.0f} launches" if k["launches"] else ""
        lines.append(f"  {kind:<8} x{k['n']:<4.0f} ours {k['us'] / 1e3:6.2f} ms  bare "
                     f"{k['bare_us'] / 1e3:6.2f} ms  ({(k['us'] - k['bare_us']) / k['n']:5.1f} us"
                     f" a step over bare{extra}; checked route "
                     f"{k['checked_us'] / 1e3:6.2f} ms)")  # fmt: skip
    for op, o in sorted(s["aten_ops"].items(), key=lambda kv: -kv[1]["us"]):
        lines.append(f"    {op:<24} x{o['n']:<4.0f} ours {o['us'] / o['n']:6.1f} us  bare "
                     f"{o['bare_us'] / o['n']:6.1f} us a call  (checked route "
                     f"{o['checked_us'] / o['n']:6.1f})")  # fmt: skip
    if result.get("profile"):
        lines.append("  cProfile of the region calls, us a step (self, total, calls):")
        lines += [f"    {r['self_us']:8.1f} {r['total_us']:8.1f} {r['calls']:6.0f}  {r['function']}"
                  for r in result["profile"]]  # fmt: skip
    whys = {st["why"] for c in result["calls"] for st in c["steps"] if st.get("why")}
    lines += [f"  execute step: {why}" for why in sorted(whys)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_steps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="llama,gpt2",
                        help="of gpt2, llama, resnet18 (benchmarks/model_defs.py)")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--stub", action="store_true", help="CPU, plans for h100, stub launches")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="then the region calls under cProfile: the N heaviest functions")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not args.stub and not torch.cuda.is_available():
        parser.error("no CUDA GPU: pass --stub (CPU, stub launches)")
    device = "cpu" if args.stub else "cuda"
    threads = torch.get_num_threads()
    if args.stub:
        torch.set_num_threads(1)  # the CPU's ops as steady as its Python
    try:
        return _split_models(args, device)
    finally:  # torch's compile caches key on the thread count: leave the caller's as it was
        torch.set_num_threads(threads)


def _split_models(args: argparse.Namespace, device: str) -> int:
    results = []
    if args.stub:
        from benchmarks.host_region import stub_launches

        context = stub_launches()
    else:
        context = contextlib.nullcontext()
    with context:
        for name in args.models.split(","):
            try:
                results.append(split_model(name, args.tiny, device, args.warmup, args.reps,
                                           args.rounds, args.profile))  # fmt: skip
            except Exception as err:  # one model's failure does not lose the other's figures
                print(f"{name}: {type(err).__name__}: {err}", flush=True)
                continue
            print(render(results[-1]), flush=True)
    if args.json:
        meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (stub)",
                "torch": torch.__version__, "tiny": args.tiny}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "models": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
