"""Training steps of backend variants interleaved in one process: an A/B robust to a noisy host.

    python -m benchmarks.ab_steps [--models resnet18,llama] [--variant NAME=ENV=VALUE,...]
        [--eager] [--inductor] [--rounds 6] [--steps 10] [--json FILE]
        [--timeline llama,gpt2 [--timeline-steps 2] [--traces DIR]]
    python -m benchmarks.ab_steps --tiny --device cpu --stub --variant base= --eager  # CPU check

Note [Interleaved A/B]: on the lent H100 eager's own step moved by 30 to 80% between runs of
benchmarks.models (docs/performance.md), so two figures from two runs, or from two contenders
timed one after the other, cannot tell a change of a few percent. Here every contender is
compiled first (its own copy of the model from the same initial weights, its own optimizer),
then the contenders take turns: each round runs `--steps` steps of each, the order rotated by
one a round, so that a slow stretch of the host falls on all of them (`--steps 1 --rounds
100` interleaves step by step). Per contender: the minimum, the lower quartile and the median
step over every timed step, the median of the round medians, the median host time (the
step's time before its closing synchronize: near the step's where the host bounds it), and
against `--baseline`, paired round by round, the median ratio of round medians and the
rounds it was faster; with `--eager`, its losses against eager's over the same batches (a
sanity check: training amplifies a 1-ulp difference, Note [Loss deviation]). `--profile N`:
after the rounds, one more step of each contender under cProfile, its time summed by source
file and its N heaviest functions (self time): where the host time goes, eager's and
inductor's beside ours (cProfile slows Python calls most, so read the shares of a
contender's own step, not figures across contenders).

A variant is fusion_cache compiled with environment variables set (`NAME=FUSION_CACHE_X=1,
FUSION_CACHE_Y=0`; `NAME=` for none): they are set while its first `--warmup` steps run, which
compile its forward and backward graphs and record its launch sequences, so a switch read when
a graph is fused (Note [Unmeasured switches]) holds for that variant alone. Each variant gets a
backend callable of its own, so dynamo keeps a compiled entry per variant (its backend guard)
rather than reusing the first one's. The plans in memory (the executors') are dropped before
and after each variant's warm-up: they are keyed by a fusion's definition and inputs, not by
the switches, so a region defined alike under two variants took the first variant's
segmentation in the second (CPU, tiny Llama-style, VIEWS_TO_READERS, CASTS_BEFORE_VIEWS,
SAVED_VIEWS_REDONE and PEER_REDUCTIONS on against none: 43 launches a step against 57 after
the default, 38 compiled first or alone; the default 52 after them, 57 alone). A variant's
recorded launch sequences hold their plans; only a step replayed through execute() plans
again after the drop, under the environment of its replay.

Note [Host by phase]: the host median split at the forward's return, the backward's and the
optimizer's (perf_counter, nothing waits), medians per phase: where a host-bound step's issue
time goes, unlike a profiler's, whose per-launch instrumentation costs one contender more
than another (Llama-style under CUPTI, H100 17:54 UTC: inductor's wall 6.4 -> 10.5 ms, ours
7.0 -> 7.7). The backward's phase is the autograd engine's whole run, on its device thread.

Note [Graph host]: inside each phase, the host time spent in the compiled graphs themselves
(the OutputCode AOTAutograd calls: inductor's CompiledFxGraph, this backend's FusedGraph),
against the phase's whole: the rest is dynamo's guards, AOTAutograd's and autograd's wrapping
(saved tensors, outputs' aliases), the same code for both contenders, but not the same work
where their graphs save and return different tensors.

`--timeline MODELS`: after those models' rounds, `--timeline-steps` steps of each contender
under torch.profiler (CUDA activity alone), each marked and summarized as benchmarks.step_kernels
--timeline does (GPU busy and idle, idle gaps by the launch after them, waits and allocations
inside the step, runtime calls): where a host-bound step's time goes, beside inductor's, in
the run that timed it; `--traces DIR` keeps the gzipped traces.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks import models
from benchmarks.model_defs import model_cases
from codegen.launch import unbound_launches


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """'name=K=V,K2=V2' -> (name, {K: V, K2: V2}); 'name=' -> (name, {})."""
    name, _, rest = text.partition("=")
    env = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("FUSION_CACHE_"):
            raise ValueError(f"variant {name}: {item!r} is not FUSION_CACHE_<NAME>=<value>")
        env[key] = value
    if not name:
        raise ValueError(f"variant {text!r} has no name")
    return name, env


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def variant_backend() -> Callable:
    """A backend callable of its own for one variant (dynamo guards on the backend)."""
    from fusion_cache.frontends.dynamo_backend import fusion_cache_backend

    def backend(gm: Any, example_inputs: Any) -> Callable:
        return fusion_cache_backend(gm, example_inputs)

    return backend


class Contender:
    """One compiled copy of the model, its optimizer and its timed steps."""

    def __init__(self, name: str, case: Any, device: str, kind: str,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.name, self.case, self.device, self.env = name, case, device, env or {}
        self.kind = kind
        self.model = models.initial_model(case, device)
        if kind == "eager":
            self.fn: Callable = self.model
        elif kind == "inductor":
            self.fn = torch.compile(self.model)
        else:
            self.fn = torch.compile(self.model, backend=variant_backend())
        self.opt = torch.optim.SGD(self.model.parameters(), lr=case.lr, momentum=0.9)
        self.steps_s: list[float] = []
        self.hosts_s: list[float] = []
        self.phases_s: list[tuple[float, float, float]] = []  # host: forward, backward, optimizer
        self.graphs_s: list[tuple[float, float]] = []  # of those, in the compiled graphs
        self.round_medians: list[float] = []
        self.losses: list[torch.Tensor] = []  # of every step, read after the timing
        self.compile_s = 0.0
        self.launches = 0  # our kernels launched over the timed steps
        self.unbound = 0  # of those, bound launches run off their binding thread
        self.reports: list[dict[str, Any]] = []

    def warm_up(self, batches: list, count: int) -> None:
        from fusion_cache import FusionCache
        from fusion_cache.frontends import dynamo_backend

        dynamo_backend.reset_reports()
        start = time.perf_counter()
        ours = self.kind == "fusion_cache"
        if ours:  # plans in memory, before it and its own: see the module's docstring
            FusionCache.get().executors.clear()
        with environment(self.env):
            for i in range(count):
                models.step(self.fn, self.opt, self.case, batches[i % len(batches)], self.device)
                models.sync(self.device)
        if ours:
            FusionCache.get().executors.clear()
        self.compile_s = time.perf_counter() - start
        self.reports = dynamo_backend.reports()

    def run_round(self, batches: list) -> None:
        from fusion_cache import FusionCache

        times = []
        stats = FusionCache.get().stats
        launched = stats()["kernel_launches"]  # ours: those of the sequences' kernel steps
        unbound = unbound_launches()
        for batch in batches:
            models.sync(self.device)
            start = time.perf_counter()
            marks = _Marks()
            before = _GRAPH_S[0]
            loss = models.step(self.fn, self.opt, self.case, batch, self.device, marks)
            self.hosts_s.append(time.perf_counter() - start)
            self.phases_s.append((marks[0] - start, marks[1] - marks[0], marks[2] - marks[1]))
            graphs = marks.graph_s
            self.graphs_s.append((graphs[0] - before, graphs[1] - graphs[0]))
            models.sync(self.device)
            times.append(time.perf_counter() - start)
            # a copy, outside the timing: under CUDA graphs the loss is the graph's static
            # output, which the next replay overwrites
            self.losses.append(loss.detach().clone())
        self.steps_s += times
        self.round_medians.append(statistics.median(times))
        self.launches += stats()["kernel_launches"] - launched
        self.unbound += unbound_launches() - unbound

    def profile(self, batch: tuple, top: int) -> dict[str, Any]:
        """One step under cProfile: self time by source file, and the `top` heaviest
        functions."""
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        models.sync(self.device)
        profiler.enable()
        models.step(self.fn, self.opt, self.case, batch, self.device)
        profiler.disable()
        models.sync(self.device)
        stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        files: dict[str, list[float]] = {}
        rows = []
        for (path, line, func), (_, calls, self_s, _, _) in stats.items():
            where = _short(path)
            entry = files.setdefault(where, [0, 0.0])
            entry[0] += calls
            entry[1] += self_s
            rows.append((self_s, calls, f"{where}:{line}({func})"))
        rows.sort(reverse=True)
        return {"calls": sum(e[0] for e in files.values()),
                "self_us": sum(e[1] for e in files.values()) * 1e6,
                "files": {k: [v[0], v[1] * 1e6] for k, v in sorted(files.items(),
                                                                   key=lambda kv: -kv[1][1])},
                "top": [[name, calls, self_s * 1e6] for self_s, calls, name in rows[:top]]}  # fmt: skip

    def summary(self) -> dict[str, Any]:
        counts = {"regions": sum(r["regions"] for r in self.reports),
                  "ops_eager": sum(r["ops_eager"] for r in self.reports),
                  "launches_a_step": self.launches / len(self.steps_s),
                  "unbound_launches_a_step": self.unbound / len(self.steps_s)}  # fmt: skip
        return {"env": self.env, "compile_s": self.compile_s,
                "min_ms": min(self.steps_s) * 1e3,
                "median_ms": statistics.median(self.steps_s) * 1e3,
                # a host's bursts only ever slow steps: the lower quartile reads past more
                # of them than the median (H100, 10:44 UTC: eager's round medians 7.7-10.4 ms)
                "p25_ms": _quantile(self.steps_s, 0.25) * 1e3,
                "median_of_rounds_ms": statistics.median(self.round_medians) * 1e3,
                "host_median_ms": statistics.median(self.hosts_s) * 1e3,
                "host_min_ms": min(self.hosts_s) * 1e3,
                # Note [Host by phase]: where a host-bound step's issue time goes
                "host_phases_ms": {phase: statistics.median(p[k] for p in self.phases_s) * 1e3
                                   for k, phase in enumerate(("forward", "backward",
                                                              "optimizer"))},  # fmt: skip
                # Note [Graph host]
                "graph_host_ms": {phase: statistics.median(g[k] for g in self.graphs_s) * 1e3
                                  for k, phase in enumerate(("forward", "backward"))},  # fmt: skip
                "round_medians_ms": [t * 1e3 for t in self.round_medians],
                "steps_ms": [t * 1e3 for t in self.steps_s],
                **(counts if self.reports else {})}  # fmt: skip


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _short(path: str) -> str:
    """A source path without its site-packages or checkout prefix."""
    for mark in ("site-packages/", "/benchmarks/", "/fusion_cache/", "/codegen/", "/schedulers/"):
        if mark in path:
            head = "" if mark == "site-packages/" else mark.strip("/") + "/"
            return head + path.split(mark, 1)[1]
    return path


# seconds spent in compiled graphs' calls so far (Note [Graph host]); the backward's run on
# autograd's device thread while the main thread waits in backward(), so one sum serves
_GRAPH_S = [0.0]


class _Marks(list):
    """models.step's phase marks, each with _GRAPH_S as it stood then (`graph_s`)."""

    def __init__(self) -> None:
        super().__init__()
        self.graph_s: list[float] = []

    def append(self, mark: float) -> None:
        super().append(mark)
        self.graph_s.append(_GRAPH_S[0])


def _timed(fn: Callable) -> Callable:
    """fn, its host time added to _GRAPH_S on each call (Note [Graph host])."""
    def timed(*args: Any) -> Any:
        began = time.perf_counter()
        try:
            return fn(*args)
        finally:
            _GRAPH_S[0] += time.perf_counter() - began

    timed._graph_timed = True  # type: ignore[attr-defined]
    return timed


def time_graph_calls() -> None:
    """Time the compiled graphs' calls (Note [Graph host]): the OutputCode classes'
    __call__, inductor's and this backend's, and the boxed functions the backend's compilers
    return for the graphs that stay out of the AOT cache (FUSION_CACHE_AOT_CACHE=0); once a
    process."""
    from fusion_cache.frontends import dynamo_backend
    from fusion_cache.frontends.aot_cache import FusedGraph

    classes: list[type] = [FusedGraph]
    try:
        from torch._inductor.output_code import CompiledFxGraph

        classes.append(CompiledFxGraph)
    except ImportError:
        pass
    for cls in classes:
        if not getattr(cls.__call__, "_graph_timed", False):
            cls.__call__ = _timed(cls.__call__)  # type: ignore[method-assign]
    compiler = dynamo_backend._compiler
    if getattr(compiler, "_graph_timed", False):
        return

    def timed_compiler(kind: str) -> Callable:
        compile_graph = compiler(kind)

        def compile_timed(gm: Any, example_inputs: Any) -> Callable:
            run = _timed(compile_graph(gm, example_inputs))
            run._boxed_call = True  # type: ignore[attr-defined]
            return run

        return compile_timed

    timed_compiler._graph_timed = True  # type: ignore[attr-defined]
    dynamo_backend._compiler = timed_compiler


def run_model(case: Any, args: argparse.Namespace) -> dict[str, Any]:
    batches = models.batches_for(case, max(args.steps, args.warmup), args.device)
    contenders = []
    if args.eager:
        contenders.append(Contender("eager", case, args.device, "eager"))
    if args.inductor:
        contenders.append(Contender("inductor", case, args.device, "inductor"))
    contenders += [Contender(name, case, args.device, "fusion_cache", env)
                   for name, env in args.variants]  # fmt: skip
    for c in contenders:
        print(f"{case.name}: compiling {c.name} {c.env} ...", flush=True)
        c.warm_up(batches, args.warmup)
    for r in range(args.rounds):
        k = r % len(contenders)
        for c in contenders[k:] + contenders[:k]:
            c.run_round(batches[: args.steps])
    result = {"model": case.name, "contenders": {c.name: c.summary() for c in contenders}}
    base = next((c for c in contenders if c.name == args.baseline), None)
    for c in contenders:  # paired by round: a slow stretch of the host falls on both
        if base is not None and c is not base:
            ratios = [a / b for a, b in zip(c.round_medians, base.round_medians)]
            result["contenders"][c.name].update(
                ratio_to_baseline=statistics.median(ratios),
                rounds_faster=sum(r < 1 for r in ratios))  # fmt: skip
    if args.eager:  # Note [Loss deviation] (benchmarks/models.py): a sanity check, not numerics
        want = [float(x) for x in contenders[0].losses]
        for c in contenders[1:]:
            diffs = [abs(float(x) - w) for x, w in zip(c.losses, want)]
            result["contenders"][c.name].update(first_loss_diff=diffs[0],
                                                max_loss_diff=max(diffs))  # fmt: skip
    if args.profile:
        for c in contenders:
            result["contenders"][c.name]["profile"] = c.profile(batches[0], args.profile)
    return result, contenders


def timelines(case: Any, contenders: list[Contender], args: argparse.Namespace) -> dict:
    """Per contender, `--timeline-steps` marked steps under torch.profiler (CUDA activity
    alone), summarized by benchmarks.step_kernels.summarize_trace; traces to `--traces`."""
    from benchmarks.step_kernels import capture_timelines

    batches = models.batches_for(case, args.timeline_steps, args.device)
    out = {}
    for c in contenders:
        def step(batch: tuple, c: Contender = c) -> None:
            models.step(c.fn, c.opt, c.case, batch, c.device)

        def path(mode: str, c: Contender = c) -> Path | None:
            return None if args.traces is None else (
                args.traces / f"trace-{case.name}-{c.name}-{mode}.json.gz")

        out[c.name] = capture_timelines(step, batches, ("light",), path)
    return out


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['model']}: | contender | min ms | p25 ms | median ms | median of rounds ms | "
             "host median ms | regions | ops eager | our launches a step | compile s | "
             "loss diff first / max | "
             "x baseline (rounds faster) |"]  # fmt: skip
    rounds = len(next(iter(result["contenders"].values()))["round_medians_ms"])
    for name, s in result["contenders"].items():
        diff = (f"{s['first_loss_diff']:.1e} / {s['max_loss_diff']:.1e}"
                if "max_loss_diff" in s else "-")  # fmt: skip
        diff += (f" | {s['ratio_to_baseline']:.3f} ({s['rounds_faster']}/{rounds})"
                 if "ratio_to_baseline" in s else " | -")  # fmt: skip
        lines.append(f"| {name} | {s['min_ms']:.2f} | {s['p25_ms']:.2f} | {s['median_ms']:.2f} | "
                     f"{s['median_of_rounds_ms']:.2f} | {s['host_median_ms']:.2f} | "
                     f"{s.get('regions', '-')} | {s.get('ops_eager', '-')} | "
                     f"{format(s['launches_a_step'], '.0f') if 'launches_a_step' in s else '-'} | "
                     f"{s['compile_s']:.1f} | {diff} |")  # fmt: skip
    lines.append("host ms by phase (medians; forward includes zero_grad): " + "; ".join(
        f"{name} " + " / ".join(f"{v:.2f}" for v in s["host_phases_ms"].values())
        for name, s in result["contenders"].items() if "host_phases_ms" in s))
    lines.append("of which in the compiled graphs (Note [Graph host]), forward / backward: " +
                 "; ".join(f"{name} " + " / ".join(f"{v:.2f}" for v in s["graph_host_ms"].values())
                           for name, s in result["contenders"].items() if "graph_host_ms" in s))
    unbound = {name: s["unbound_launches_a_step"] for name, s in result["contenders"].items()
               if "unbound_launches_a_step" in s}  # fmt: skip
    if unbound:  # bound launches off their binding thread (codegen/launch.py unbound_launches)
        lines.append("unbound launches a step: " + ", ".join(f"{name} {n:.0f}"
                                                            for name, n in unbound.items()))
    for name, s in result["contenders"].items():
        prof = s.get("profile")
        if prof is None:
            continue
        lines.append(f"{name} under cProfile: {prof['calls']} calls, {prof['self_us']:.0f} us")
        lines += [f"    {us:8.0f} us {calls:6d} calls  {where}"
                  for where, (calls, us) in list(prof["files"].items())[:12]]  # fmt: skip
        lines += [f"      {us:8.0f} us {calls:6d}  {name}" for name, calls, us in prof["top"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ab_steps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18,llama")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=FUSION_CACHE_X=1,... (repeatable; default: base=)")
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--inductor", action="store_true")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10, help="timed steps a round")
    parser.add_argument("--warmup", type=int, default=3, help="steps under the variant's env")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--stub", action="store_true", help="CPU: plans for h100, stub launches")
    parser.add_argument("--baseline", default="base",
                        help="the contender each other is paired with, round by round: the "
                             "median ratio of round medians and the rounds it was faster")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="one more step of each under cProfile: by file, N top functions")
    parser.add_argument("--json", default=None)
    parser.add_argument("--timeline", default="", metavar="MODELS",
                        help="after these models' rounds, marked steps of each contender under "
                             "torch.profiler: GPU gaps, waits, allocations (step_kernels)")
    parser.add_argument("--timeline-steps", type=int, default=2)
    parser.add_argument("--traces", type=Path, default=None, help="the timelines' gzipped traces")
    args = parser.parse_args(argv)
    args.timeline = [m for m in args.timeline.split(",") if m]
    if args.traces is not None:
        args.traces.mkdir(parents=True, exist_ok=True)
    try:
        args.variants = [parse_variant(v) for v in args.variant or ["base="]]
    except ValueError as err:
        parser.error(str(err))
    names = args.models.split(",")
    cases = [c for c in model_cases(args.tiny) if c.name in names]
    if len(cases) != len(names):
        parser.error(f"models are {[c.name for c in model_cases(args.tiny)]}")
    import torch._dynamo as dynamo

    from fusion_cache.frontends import register_backend

    register_backend()
    time_graph_calls()
    dynamo.config.cache_size_limit = 64  # an entry per contender
    context: Any = contextlib.nullcontext()
    if args.stub:
        from benchmarks.host_region import stub_launches

        context = stub_launches()
    data: dict[str, Any] = {"meta": {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__, "rounds": args.rounds, "steps": args.steps,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, "models": []}  # fmt: skip
    with context, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in cases:
            dynamo.reset()
            result, contenders = run_model(case, args)
            data["models"].append(result)
            print(render(result), flush=True)
            if args.json:  # after each model: a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump(data, f, indent=1)
            if case.name in args.timeline:  # after the JSON: a profiler failure loses only this
                from benchmarks.step_kernels import render_timeline

                result["timeline"] = timelines(case, contenders, args)
                print(render_timeline(case.name, result["timeline"]), flush=True)
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump(data, f, indent=1)
            del contenders  # their models and caches, before the next model compiles
    return 0


if __name__ == "__main__":
    sys.exit(main())
