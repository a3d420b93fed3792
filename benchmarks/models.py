"""Training steps of three models: eager, inductor and fusion_cache in one run.

    python -m benchmarks.models [--models gpt2,llama,resnet18] [--steps 20] [--out DIR]
    python -m benchmarks.models --tiny --device cpu --contenders eager,fusion_cache  # CPU check

Per model (benchmarks/model_defs.py) and contender, from the same initial weights on the same
batches: the step time (the median of steps 5 to the last), the first step (cold: compiles
included, on an empty fusion store and empty inductor caches), the loss of every step and
its largest difference from eager's. `eager_again` is eager run a second time: its
difference is eager's own run-to-run deviation, the floor under every other contender's
(Note [Loss deviation]). For fusion_cache also: the first step of a new process
on the warm store and that process's steady step (`--warm-child`, run as a subprocess), the
regions and the ops fused and left to eager with their reasons, kernels compiled and loaded,
plan misses and reference-evaluator runs (zero on a GPU). `fusion_cache_graphs` and
`inductor_graphs` (opt-in, in --contenders) are fusion_cache and inductor with CUDA graphs
(mode="reduce-overhead"); `fusion_cache_switched` and `fusion_cache_switched_graphs` (opt-in)
are fusion_cache with every switch of Note [Unmeasured switches] (schedulers/tuning.py) on,
timed beside the others in the same run.

Note [Torch's floor]: `aot_eager` and `dynamo_eager` (opt-in) are torch.compile with torch's
own backends "aot_eager" (dynamo's tracing and AOT autograd, the graphs run by eager) and
"eager" (dynamo's tracing alone), each run in a new process: their first step is what any
backend built on dynamo (and on AOT autograd) pays in a new process before compiling anything,
the floor under fusion_cache's warm first step. Our warm process hits torch's AOTAutograd
cache (Note [AOT cache]) and so pays less than aot_eager's AOT tracing, but never less than
dynamo_eager's. The report's "Torch's floor" table sets both against our cold and warm first
steps.

`--stub` (with --device cpu) is a model of the GPU path's host side on a machine without
one: fusion_cache plans every region for the h100 profile (NVRTC compiles here, through
the store), stub kernels launch nothing, and the eager ops run on the CPU; losses are
meaningless, plans, compiles, fallbacks and host times are not.

Note [Loss deviation]: a loss difference from eager is meaningful only beside eager's own.
By default cuDNN may pick nondeterministic convolution algorithms (atomics in the weight and
input gradients) and runs f32 convolutions in TF32, so two runs of one program part after a
few steps (H100, ResNet-18: fusion_cache cold and warm, the same kernels, 1.8e-2 apart over
12 steps, more than inductor's 1.1e-2 from eager). `--deterministic` sets
cudnn.deterministic, no cudnn.benchmark and no TF32 (cuDNN and cuBLAS) for every contender,
the warm process included; eager_again then differs by 0 (H100). Even so the largest loss
difference over the steps measures the training's amplification more than numerics: a 1-ulp
difference in the first loss grew to 1.4e-2 by step 11 (inductor from 0 at step 1 to 1.3e-2).
So each contender's first step is also compared alone: "step-1 grad diff" is the largest
relative 2-norm difference of a parameter's gradient from eager's after one forward and
backward from the same weights on the same batch.

A step: zero_grad, forward (under bf16 autocast for GPT-2), backward, SGD step, synchronize.
Results: DIR/models-<device>.json and .md (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from benchmarks.model_defs import ModelCase, model_cases

RESULTS_DIR = Path(__file__).parent / "results"
CONTENDERS = ("eager", "eager_again", "inductor", "fusion_cache")
OPTIONAL = ("fusion_cache_graphs", "inductor_graphs", "fusion_cache_switched",
            "fusion_cache_switched_graphs", "aot_eager", "dynamo_eager")
# Note [Torch's floor]: contender -> torch's backend, each run in a new process
FLOORS = {"aot_eager": "aot_eager", "dynamo_eager": "eager"}
# Note [Dynamo's cache]: torch's experimental caching precompile (dynamo's bytecode and guards,
# the backend's bundled AOTAutograd entry), saved by a run and loaded by torch.compile in the
# next process. --dynamo-cache runs fusion_cache's cold and warm processes with it on, and a
# warm process with it off beside them (fusion_cache_warm_traced)
DYNAMO_CACHE_ENV = "TORCH_CACHING_PRECOMPILE"
SWITCHED = "_switched"  # Note [Unmeasured switches]: the contender with every switch on
MEDIAN_FROM = 4  # steps 5.. (0-based 4..): the median skips compiles and warm-up


# ---- one training run -------------------------------------------------------------------------


def set_deterministic() -> None:
    """Note [Loss deviation]: the same convolution algorithms and f32 math in every run."""
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def batches_for(case: ModelCase, steps: int, device: str) -> list[tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(1234)
    return [case.batch(gen, device) for _ in range(steps)]


def initial_model(case: ModelCase, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return case.build().to(device=device, dtype=case.weights)


def step(model: Callable, opt: torch.optim.Optimizer, case: ModelCase, batch: tuple,
         device: str, marks: list[float] | None = None) -> torch.Tensor:
    """One training step, issued (not waited for): zero_grad, forward (under the case's
    autocast), backward, optimizer step; the loss. `marks` gets perf_counter() after the
    forward, the backward and the optimizer step (host time by phase: nothing waits)."""
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=case.autocast or torch.bfloat16,
                        enabled=case.autocast is not None):  # fmt: skip
        loss = model(*batch)
    if marks is not None:
        marks.append(time.perf_counter())
    loss.backward()
    if marks is not None:
        marks.append(time.perf_counter())
    opt.step()
    if marks is not None:
        marks.append(time.perf_counter())
    return loss


def train(model: Callable, params: list[torch.nn.Parameter], case: ModelCase, batches: list,
          device: str, after_step: Callable[[], None] | None = None,
          profile: Path | None = None, hosts: list[float] | None = None,
          first_grads: list | None = None,
          ) -> tuple[list[float], list[float]]:  # fmt: skip
    """Loss and seconds of each step; `after_step()` runs after each, outside the timing;
    `hosts` gets each step's seconds before its closing synchronize (its host time where
    the step is host-bound: set against the step's, it tells host from device).
    `profile`: the first step runs under cProfile, its stats written there (.prof, and the
    heaviest functions by cumulative time as .txt). `first_grads`: gets the first step's
    gradients, on the CPU (Note [Loss deviation])."""
    import cProfile

    opt = torch.optim.SGD(params, lr=case.lr, momentum=0.9)
    losses, times = [], []
    for i, batch in enumerate(batches):
        profiler = cProfile.Profile() if profile is not None and i == 0 else None
        sync(device)
        if profiler is not None:
            profiler.enable()
        start = time.perf_counter()
        loss = step(model, opt, case, batch, device)
        if hosts is not None:
            hosts.append(time.perf_counter() - start)
        sync(device)
        times.append(time.perf_counter() - start)
        if profiler is not None:
            profiler.disable()
            write_profile(profiler, profile)
        losses.append(float(loss.detach()))
        if first_grads is not None and i == 0:
            first_grads.extend(None if p.grad is None else p.grad.detach().float().cpu()
                               for p in params)  # fmt: skip
        if after_step is not None:
            after_step()
    return losses, times


def write_profile(profiler: Any, path: Path) -> None:
    import io
    import pstats

    profiler.dump_stats(str(path.with_suffix(".prof")))
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(80)
    path.with_suffix(".txt").write_text(text.getvalue())


def tracing_times() -> dict[str, float]:
    """Seconds torch spent compiling by phase since the last reset (dynamo's tracing with
    the backend call inside it, the backend, the lazy backward compile, ...)."""
    from torch._dynamo.utils import compile_times

    names, values = compile_times(repr="csv", aggregate=True)
    return {n: float(v) for n, v in zip(names, values)}


def compiled(contender: str, model: torch.nn.Module) -> Callable:
    import torch._dynamo

    torch._dynamo.reset()
    if contender in ("eager", "eager_again"):
        return model
    if contender == "inductor":
        return torch.compile(model)
    if contender in FLOORS:  # Note [Torch's floor]
        return torch.compile(model, backend=FLOORS[contender])
    if contender == "inductor_graphs":  # beside fusion_cache_graphs: both replay CUDA graphs
        return torch.compile(model, mode="reduce-overhead")
    from fusion_cache.frontends import register_backend

    register_backend()
    if contender == "fusion_cache_graphs":
        return torch.compile(model, backend="fusion_cache", mode="reduce-overhead")
    return torch.compile(model, backend="fusion_cache")


def fusion_counters() -> dict[str, int]:
    from fusion_cache import FusionCache

    return dict(FusionCache.get().stats())


def aot_counters() -> dict[str, int]:
    from fusion_cache.frontends.aot_cache import cache_counters

    return cache_counters()


# per step: what a steady step should not do (compile, plan, fall back, recompile), and
# what it does from Python (launches; none once CUDA graphs replay)
STEP_COUNTERS = ("kernel_launches", "plan_cache_misses", "kernels_compiled", "kernels_loaded",
                 "reference_runs")  # fmt: skip


class StepWatch:
    """Counter deltas, dynamo recompiles and garbage-collection time of each step."""

    def __init__(self) -> None:
        import gc

        self.rows: list[dict[str, float]] = []
        self._last = self._snapshot()
        self._gc_s = 0.0
        self._gc_start = 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self._gc_s += time.perf_counter() - self._gc_start

    @staticmethod
    def _snapshot() -> dict[str, float]:
        from torch._dynamo.utils import counters

        snap = {k: float(v) for k, v in fusion_counters().items() if k in STEP_COUNTERS}
        snap["dynamo_frames"] = float(sum(counters["frames"].values()))
        snap["recompiles"] = float(sum(counters["recompiles"].values()))
        return snap

    def __call__(self) -> None:
        now = self._snapshot()
        row = {k: now[k] - self._last.get(k, 0.0) for k in now}
        row["gc_ms"], self._gc_s = self._gc_s * 1e3, 0.0
        self.rows.append(row)
        self._last = now

    def close(self) -> None:
        import gc

        gc.callbacks.remove(self._gc)


def release_memory(device: str) -> None:
    """Give the caching allocator's free blocks back: cuDNN and cuBLAS size their workspaces
    (and cuDNN picks its algorithms) by the memory the device has free, so a run, or a new
    process beside this one, must not start with another run's cache held."""
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def free_gib(device: str) -> float | None:
    return torch.cuda.mem_get_info()[0] / 2**30 if device == "cuda" else None


def run_contender(contender: str, case: ModelCase, steps: int, device: str,
                  stub: bool = False, profile: Path | None = None) -> dict[str, Any]:  # fmt: skip
    if SWITCHED in contender:
        with switches_on():
            return run_contender(contender.replace(SWITCHED, ""), case, steps, device, stub,
                                 profile)  # fmt: skip
    if stub and contender.startswith("fusion_cache"):
        from benchmarks.host_region import stub_launches

        with stub_launches():
            row = run_contender(contender, case, steps, device, profile=profile)
        row["fallbacks"] = reference_plans()
        return row
    from torch._dynamo.utils import compilation_time_metrics

    from fusion_cache.frontends import dynamo_backend

    release_memory(device)
    free = free_gib(device)
    model = initial_model(case, device)
    batches = batches_for(case, steps, device)
    dynamo_backend.reset_reports()
    before = fusion_counters()
    aot_before = aot_counters()
    wrap_start = time.perf_counter()
    fn = compiled(contender, model)  # with dynamo's cache on, its load (Note [Dynamo's cache])
    wrap_s = time.perf_counter() - wrap_start
    compilation_time_metrics.clear()
    watch = StepWatch()
    hosts: list[float] = []
    grads: list = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # recompile notes and the like: the results say it
            losses, times = train(fn, list(model.parameters()), case, batches, device, watch,
                                  profile, hosts, grads)  # fmt: skip
    finally:
        watch.close()
    after = fusion_counters()
    row: dict[str, Any] = {
        "losses": losses, "step_s": times, "first_step_s": times[0],
        "median_ms": statistics.median(times[MEDIAN_FROM:] or times) * 1e3,
        "host_s": hosts, "host_median_ms": statistics.median(hosts[MEDIAN_FROM:] or hosts) * 1e3,
        "free_gib_at_start": free, "tracing_s": tracing_times(), "wrap_s": wrap_s,
        FIRST_GRADS: grads,  # dropped once compared with eager's (run_model)
    }  # fmt: skip
    row["per_step"] = {k: [r[k] for r in watch.rows] for k in watch.rows[0]} if watch.rows else {}
    if contender.startswith("fusion_cache"):
        row["counters"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        # torch's AOTAutograd cache (Note [AOT cache]): graphs hit, missed, bypassed, saved
        row["aot_cache"] = {k: v - aot_before.get(k, 0) for k, v in aot_counters().items()}
        row.update(graph_summary(dynamo_backend.reports()))
        row["kernels"] = kernel_keys()
        if os.environ.get(DYNAMO_CACHE_ENV) == "1":  # Note [Dynamo's cache]: for the next process
            torch.compiler.save_cache_artifacts()
    torch._dynamo.reset()
    return row


# the switches the _switched contenders turn on (--switches; None: every one)
SWITCHED_ONLY: list[str] | None = None


@contextlib.contextmanager
def switches_on() -> Iterator[None]:
    """The switches of Note [Unmeasured switches] (SWITCHED_ONLY, or every one) on for the
    block. Plans made in memory before and inside it are dropped on both sides: the same
    definitions plan otherwise."""
    from fusion_cache import FusionCache
    from schedulers.tuning import SWITCHES

    names = [f"FUSION_CACHE_{name}" for name in SWITCHED_ONLY or SWITCHES]
    saved = {n: os.environ.get(n) for n in names}
    FusionCache.get().executors.clear()
    os.environ.update({n: "1" for n in names})
    try:
        yield
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v
        FusionCache.get().executors.clear()


def reference_plans() -> dict[int, str]:
    """Fusion id -> why it runs on the reference evaluator, for every such plan."""
    from fusion_cache import FusionCache

    out = {}
    for fid, ex in FusionCache.get().executors.items():
        for plan in ex.plans.values():
            if hasattr(plan, "reason") and not hasattr(plan, "spec"):
                out[fid] = plan.reason
    return out


def kernel_keys() -> list[str]:
    """The store keys of every kernel the process's fusions planned (cold and warm runs of
    the same model should list the same ones)."""
    from fusion_cache import FusionCache

    keys = set()
    for ex in FusionCache.get().executors.values():
        for plan in ex.plans.values():
            keys.update(ref.key[:16] for ref in getattr(plan, "refs", ()))
    return sorted(keys)


def graph_summary(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Regions and ops over the compiled graphs: fused by op, left to eager by op and reason."""
    eager: dict[str, dict[str, int]] = {}
    fused: dict[str, int] = {}
    for r in reports:
        for op, n in r["fused_ops"].items():
            fused[op] = fused.get(op, 0) + n
        for op, whys in r["eager_ops"].items():
            for why, n in whys.items():
                eager.setdefault(op, {})
                eager[op][why] = eager[op].get(why, 0) + n
    return {
        "graphs": len(reports),
        # of the first step: partitioning and lowering the graphs, and the regions' first
        # calls (planning, compiling or loading kernels); the rest is torch's tracing and
        # the step itself
        "fuse_s": sum(r["fuse_s"] for r in reports),
        "record_s": sum(r["record_s"] for r in reports),
        # regions whose first call's strides were not the traced ones (defined again)
        "redefined": sum(r.get("redefined", 0) for r in reports),
        "planned_ahead": sum(r.get("planned_ahead", 0) for r in reports),
        "ahead_s": sum(r.get("ahead_s", 0.0) for r in reports),
        "regions": sum(r["regions"] for r in reports),
        "ops_fused": sum(r["ops_fused"] for r in reports),
        "ops_eager": sum(r["ops_eager"] for r in reports),
        "fused_ops": dict(sorted(fused.items(), key=lambda kv: -kv[1])),
        "eager_ops": dict(sorted(eager.items(), key=lambda kv: -sum(kv[1].values()))),
    }


# ---- the warm child ---------------------------------------------------------------------------


def warm_child(name: str, tiny: bool, steps: int, device: str, stub: bool,
               profile: Path | None = None, contender: str = "fusion_cache") -> int:  # fmt: skip
    """In a new process on the store FUSION_CACHE_DIR names: one run (fusion_cache's, or a
    floor's: Note [Torch's floor]), as JSON."""
    case = next(c for c in model_cases(tiny) if c.name == name)
    row = run_contender(contender, case, steps, device, stub, profile)
    row.pop(FIRST_GRADS, None)  # tensors: compared in the parent only for its own runs
    print("WARM-RESULT " + json.dumps(row))
    return 0


def run_warm_child(case: ModelCase, args: argparse.Namespace, store: str,
                   profile: Path | None = None, extra_env: dict[str, str] | None = None,
                   contender: str = "fusion_cache") -> dict[str, Any]:  # fmt: skip
    """fusion_cache's run in a new process on `store` and this process's torch cache dir:
    warm, or cold where both are still empty (--cold-process); or a floor's (Note [Torch's
    floor])."""
    cmd = [sys.executable, "-m", "benchmarks.models", "--warm-child", case.name,
           "--steps", str(args.steps), "--device", args.device, "--child-contender", contender]
    cmd += ["--tiny"] if args.tiny else []
    cmd += ["--stub"] if args.stub else []
    cmd += ["--deterministic"] if getattr(args, "deterministic", False) else []
    cmd += ["--profile-stem", str(profile.resolve())] if profile is not None else []
    env = dict(os.environ, FUSION_CACHE_DIR=store, **(extra_env or {}))
    env.pop("FUSION_CACHE_DB_URL", None)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=root)
    wall = time.perf_counter() - start
    line = next((x for x in done.stdout.splitlines() if x.startswith("WARM-RESULT ")), None)
    if done.returncode != 0 or line is None:
        return {"error": f"warm child failed ({done.returncode}): {done.stderr[-3000:]}"}
    row = json.loads(line.removeprefix("WARM-RESULT "))
    row["process_s"] = wall
    return row


# ---- one model, every contender ---------------------------------------------------------------


def dynamo_cache(args: argparse.Namespace) -> dict[str, str] | None:
    """The environment that turns dynamo's cache on in a child (Note [Dynamo's cache])."""
    return {DYNAMO_CACHE_ENV: "1"} if args.dynamo_cache else None


def first_step_line(model: str, name: str, row: dict[str, Any]) -> str:
    """One run's first-step figures as a line of JSON, printed as soon as they are measured
    (a run killed at its time limit keeps them in its log)."""
    c = row.get("counters", {})
    keep = {"first_step_s": row.get("first_step_s"), "lowering_s": row.get("fuse_s"),
            "region_calls_s": row.get("record_s"), "wrap_s": row.get("wrap_s"),
            "dynamo_s": row.get("tracing_s", {}).get("_compile.compile_inner"),
            "process_s": row.get("process_s"), "compiled": c.get("kernels_compiled"),
            "loaded": c.get("kernels_loaded"), "reference_runs": c.get("reference_runs"),
            "error": row.get("error", "")[:300]}  # fmt: skip
    return "FIRST-STEP " + json.dumps({"model": model, "run": name, **keep})


def run_model(case: ModelCase, args: argparse.Namespace) -> dict[str, Any]:
    store = fresh_caches(args.caches)  # each model's cold start is cold
    out: dict[str, Any] = {"model": case.name, "contenders": {}}

    def keep(name: str, row: dict[str, Any]) -> None:
        out["contenders"][name] = row
        print(first_step_line(case.name, name, row), flush=True)

    for contender in args.contenders:
        print(f"{case.name}: {contender} ...", flush=True)
        try:
            profile = (args.profile_first / f"profile-cold-{case.name}"
                       if args.profile_first and contender == "fusion_cache" else None)
            if contender in FLOORS:  # Note [Torch's floor]: always a new process
                keep(contender, {**run_warm_child(case, args, store, contender=contender),
                                 "new_process": True})  # fmt: skip
            elif contender == "fusion_cache" and args.cold_process:
                # the store still empty: a cold run in a new process, as the warm one will be
                keep(contender, {**run_warm_child(case, args, store, profile, dynamo_cache(args)),
                                 "new_process": True})  # fmt: skip
            else:
                keep(contender, run_contender(contender, case, args.steps, args.device,
                                              args.stub, profile))  # fmt: skip
        except Exception as err:  # one failing contender does not lose the others' figures
            keep(contender, {"error": f"{type(err).__name__}: {err}"[:3000]})
    if "fusion_cache" in args.contenders and not args.no_warm:
        print(f"{case.name}: fusion_cache, new process on the warm store ...", flush=True)
        if not args.warm_beside_cache:
            release_memory(args.device)
        keep("fusion_cache_warm", run_warm_child(case, args, store, extra_env=dynamo_cache(args)))
        if args.dynamo_cache:  # the same warm stores, dynamo tracing again: the baseline
            print(f"{case.name}: fusion_cache, new process without dynamo's cache ...", flush=True)
            keep("fusion_cache_warm_traced",
                 run_warm_child(case, args, store, extra_env={DYNAMO_CACHE_ENV: "0"}))
        if args.warm_without_aot:  # the same warm store, AOTAutograd traced again: the baseline
            print(f"{case.name}: fusion_cache, new process without the AOT cache ...", flush=True)
            keep("fusion_cache_warm_noaot",
                 run_warm_child(case, args, store, extra_env={"FUSION_CACHE_AOT_CACHE": "0"}))
        if args.profile_warm:  # a third process, so that cProfile slows no figure above
            print(f"{case.name}: fusion_cache, profiled first step on the warm store ...",
                  flush=True)  # fmt: skip
            prof = run_warm_child(case, args, store, args.out / f"profile-warm-{case.name}")
            out["warm_profiled_first_step_s"] = prof.get("first_step_s")
    eager = out["contenders"].get("eager", {}).get("losses")
    eager_grads = out["contenders"].get("eager", {}).get(FIRST_GRADS)
    for row in out["contenders"].values():
        if eager and "losses" in row:
            diffs = [abs(a - b) for a, b in zip(row["losses"], eager)]
            row["max_loss_diff"] = max(diffs)
            row["max_loss_rel_diff"] = max(d / max(abs(b), 1e-12) for d, b in zip(diffs, eager))
            row["first_loss_diff"] = diffs[0]
        if eager_grads and row.get(FIRST_GRADS):
            row["first_grad_rel_diff"] = grad_deviation(row[FIRST_GRADS], eager_grads)
    for row in out["contenders"].values():
        row.pop(FIRST_GRADS, None)
    return out


FIRST_GRADS = "_first_grads"


def grad_deviation(grads: list, want: list) -> float:
    """Note [Loss deviation]: the largest over the parameters of |g - g_eager| / |g_eager|
    (2-norms) after the first step: one forward and backward from the same weights on the
    same batch, before training amplifies any difference."""
    worst = 0.0
    for g, w in zip(grads, want):
        if g is None or w is None:
            if (g is None) != (w is None):
                return float("inf")
            continue
        worst = max(worst, float((g - w).norm() / w.norm().clamp_min(1e-30)))
    return worst


def device_slug(device: str) -> str:
    name = torch.cuda.get_device_name() if device == "cuda" else f"cpu-{platform.machine()}"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def fresh_caches(under: Path | None) -> str:
    """An empty fusion store and empty inductor/Triton caches for this process: cold starts."""
    if under is not None:
        under.mkdir(parents=True, exist_ok=True)
    root = tempfile.mkdtemp(prefix="fc-models-", dir=under)
    store = os.path.join(root, "fusion_cache")
    os.environ["FUSION_CACHE_DIR"] = store
    os.environ.pop("FUSION_CACHE_DB_URL", None)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    from fusion_cache import FusionCache

    FusionCache.reset()
    return store


# ---- report -----------------------------------------------------------------------------------


def _ms(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "-"


def _e(value: Any) -> str:
    return f"{value:.1e}" if isinstance(value, (int, float)) else "-"


def _s(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "-"


def render_markdown(data: dict[str, Any]) -> str:
    meta = data["meta"]
    lines = [f"# Training steps: {meta['device']} ({meta['date']})", "",
             f"torch {meta['torch']}; {meta['steps']} steps; step time = median of steps "
             f"{MEDIAN_FROM + 1}-{meta['steps']}; first step cold (empty caches) and warm (a new "
             "process on the warm fusion store). Loss diff: the largest over the steps; "
             "eager_again is eager's own run-to-run deviation; step-1 grad diff: the largest "
             "relative difference of a parameter's first gradient from eager's (Note [Loss "
             "deviation]); "
             + ("deterministic cuDNN, no TF32 for every contender."
                if meta.get("deterministic") else "torch's default cuDNN and TF32 settings.")
             + f" Switches of the _switched contenders: {meta.get('switched', 'all')}.",
             "",
             "| model | contender | step ms | first step s | loss diff vs eager | "
             "step-1 grad diff | regions | ops fused / eager | kernels compiled / loaded | "
             "reference runs |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for m in data["models"]:
        for name, row in m["contenders"].items():
            if "error" in row:
                lines.append(f"| {m['model']} | {name} | error: {row['error'][:120]} ||||||||")
                continue
            c = row.get("counters", {})
            fused = f"{row['ops_fused']} / {row['ops_eager']}" if "ops_fused" in row else "-"
            kernels = (f"{c.get('kernels_compiled', 0)} / {c.get('kernels_loaded', 0)}"
                       if c else "-")  # fmt: skip
            lines.append(
                f"| {m['model']} | {name} | {_ms(row['median_ms'])} | {_s(row['first_step_s'])} "
                f"| {row.get('max_loss_diff', 0):.2e} | {_e(row.get('first_grad_rel_diff'))} "
                f"| {row.get('regions', '-')} | {fused} "
                f"| {kernels} | {c.get('reference_runs', '-') if c else '-'} |")
    lines += ["", "## Restarts and steady steps", "",
              "dynamo s: torch's tracing of the first step's graphs with the backend call inside "
              "it: AOT autograd (or its cache, Note [AOT cache]) and the forward's lowering, and "
              "the backward's where the AOT cache is on (else it is compiled later, in the step); "
              "steps 2+ of each run: plan misses, compiles, reference runs, dynamo recompiles "
              "and garbage-collection ms (all should be 0 but gc), Python launches a step "
              "(0 once CUDA graphs replay); host ms: a step's time before its closing synchronize "
              "(median, as step ms): near step ms where the step is host-bound; compile call s: "
              "torch.compile's own call, before the first step (dynamo's cache loads there, "
              "Note [Dynamo's cache])", "",
              "| model | run | first step s | of which lowering s / first region calls s | "
              "dynamo s | compile call s | AOT cache hit / miss | step ms | host ms | warm/cold first | kernels as cold | "
              "misses | compiles | ref runs | recompiles | gc ms | launches/step | "
              "free GiB at start |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for m in data["models"]:
        rows = m["contenders"]
        cold = rows.get("fusion_cache", {})
        for name, row in rows.items():
            if not name.startswith("fusion_cache") or "per_step" not in row:
                continue
            steady = {k: v[1:] for k, v in row["per_step"].items()}
            ratio = (f"{row['first_step_s'] / cold['first_step_s']:.2f}"
                     if name.startswith("fusion_cache_warm") and cold.get("first_step_s")
                     else "-")  # fmt: skip
            same = ("yes" if row.get("kernels") == cold.get("kernels") else "no") if name != (
                "fusion_cache") else "-"  # fmt: skip
            launches = statistics.median(steady["kernel_launches"]) if steady["kernel_launches"] \
                else 0  # fmt: skip
            aot = (f"{row['aot_cache']['hit']} / {row['aot_cache']['miss']}"
                   if "aot_cache" in row else "-")  # fmt: skip
            lines.append(
                f"| {m['model']} | {name} | {_s(row['first_step_s'])} "
                f"| {_s(row.get('fuse_s'))} / {_s(row.get('record_s'))} "
                f"| {_s(row.get('tracing_s', {}).get('_compile.compile_inner'))} "
                f"| {_s(row.get('wrap_s'))} | {aot} | {_ms(row['median_ms'])} | {_ms(row.get('host_median_ms'))} "
                f"| {ratio} | {same} | {sum(steady['plan_cache_misses']):g} "
                f"| {sum(steady['kernels_compiled']):g} | {sum(steady['reference_runs']):g} "
                f"| {sum(steady['recompiles']):g} | {sum(steady['gc_ms']):.1f} | {launches:g} "
                f"| {_s(row.get('free_gib_at_start'))} |")
    lines += floor_table(data)
    for m in data["models"]:
        row = m["contenders"].get("fusion_cache", {})
        if "eager_ops" not in row:
            continue
        lines += ["", f"## {m['model']}: ops left to eager", ""]
        for op, whys in row["eager_ops"].items():
            for why, n in whys.items():
                lines.append(f"- {op} x{n}: {why}")
    return "\n".join(lines) + "\n"


def floor_table(data: dict[str, Any]) -> list[str]:
    """Note [Torch's floor]: torch's own first step in a new process against ours, cold and
    warm; the target asks warm <= cold / 4."""
    models_with = [m for m in data["models"] if any(f in m["contenders"] for f in FLOORS)]
    if not models_with:
        return []
    lines = ["", "## Torch's floor", "",
             "first steps in new processes, s; dynamo s: torch's compile_inner (tracing and "
             "the backend inside it); floor / cold: torch's floor over fusion_cache's cold "
             "first step (above 0.25: a warm first step under a quarter of the cold one is "
             "beyond any backend that pays it)", "",
             "| model | fusion_cache cold | fusion_cache warm | warm / cold | inductor cold "
             "| cold / inductor | aot_eager (dynamo s) | dynamo_eager (dynamo s) "
             "| aot_eager / cold | dynamo_eager / cold |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def first(row: dict) -> Any:
        return row.get("first_step_s") if isinstance(row, dict) else None

    def ratio(a: Any, b: Any) -> str:
        return f"{a / b:.2f}" if isinstance(a, (int, float)) and b else "-"

    for m in models_with:
        rows = m["contenders"]
        cold, warm = first(rows.get("fusion_cache", {})), first(rows.get("fusion_cache_warm", {}))
        ind = first(rows.get("inductor", {}))
        floors = []
        for name in FLOORS:
            row = rows.get(name, {})
            dyn = row.get("tracing_s", {}).get("_compile.compile_inner") if row else None
            floors.append((first(row), f"{_s(first(row))} ({_s(dyn)})"))
        lines.append(f"| {m['model']} | {_s(cold)} | {_s(warm)} | {ratio(warm, cold)} | {_s(ind)} "
                     f"| {ratio(cold, ind)} | {floors[0][1]} | {floors[1][1]} "
                     f"| {ratio(floors[0][0], cold)} | {ratio(floors[1][0], cold)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2,llama,resnet18")
    parser.add_argument("--contenders", default=",".join(CONTENDERS),
                        help=f"of {', '.join(CONTENDERS + OPTIONAL)}")  # fmt: skip
    # 20: a new process's first steps after its compiles run slow for a while (H100, the
    # warm ResNet-18: 9.8 -> 7.4 ms over steps 2-9); a median over steps 5-10 read that as
    # a slower warm steady state (8.53 against 7.66 ms) with the cold process's plans,
    # kernels and launches (tests/test_warm_plans.py). Over steps 5-20: 7.10 against 6.85.
    # GPT-2 still read 13.65 warm against 10.55 cold over steps 5-20 (12:49 UTC, a shared
    # and loaded machine), with the same plans and the same host time a step on the CPU
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="small models (the CPU test's)")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-store process")
    parser.add_argument("--warm-without-aot", action="store_true",
                        help="also a new process on the warm store with FUSION_CACHE_AOT_CACHE=0 "
                             "(fusion_cache_warm_noaot): what torch's AOTAutograd cache saves, "
                             "in the same run (docs/restarts.md)")  # fmt: skip
    parser.add_argument("--cold-process", action="store_true",
                        help="fusion_cache's cold run in a new process too (not this one, after "
                             "eager and inductor warmed its imports, CUDA libraries and "
                             "allocator): cold and warm processes of the same history")
    parser.add_argument("--dynamo-cache", action="store_true",
                        help="fusion_cache's cold and warm processes with torch's caching "
                             "precompile on (Note [Dynamo's cache]; needs --cold-process), and "
                             "a warm process with it off (fusion_cache_warm_traced)")
    parser.add_argument("--warm-beside-cache", action="store_true",
                        help="start the warm-store process while this one holds its allocator's "
                             "cache (the condition a warm ResNet-18 once ran slower under)")
    parser.add_argument("--switches", default=None,
                        help="comma list of the switches the _switched contenders turn on "
                             "(default: every one of Note [Unmeasured switches])")
    parser.add_argument("--deterministic", action="store_true",
                        help="deterministic cuDNN, no TF32, for every contender (Note [Loss "
                             "deviation]): loss differences then measure numerics, not noise")
    parser.add_argument("--stub", action="store_true",
                        help="CPU only: plan for h100, launch nothing (the host side's model)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--caches", type=Path, default=None,
                        help="where the fresh stores and compiler caches go (default: a temp dir)")
    parser.add_argument("--profile-warm", action="store_true",
                        help="also run the warm-store process with its first step under "
                             "cProfile: OUT/profile-warm-<model>.prof and .txt")  # fmt: skip
    parser.add_argument("--warm-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--profile-first", type=Path, default=None,
                        help="a folder: fusion_cache's cold first step runs under cProfile "
                             "(profile-cold-<model>.prof/.txt; its figures are slowed by it)")
    parser.add_argument("--profile-stem", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-contender", default="fusion_cache", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.deterministic:
        set_deterministic()
    if args.warm_child:
        return warm_child(args.warm_child, args.tiny, args.steps, args.device, args.stub,
                          args.profile_stem, args.child_contender)  # fmt: skip
    if args.dynamo_cache and not args.cold_process:
        parser.error("--dynamo-cache runs fusion_cache's cold run in a new process: add "
                     "--cold-process")
    if args.stub and args.device != "cpu":
        parser.error("--stub runs on the CPU (--device cpu)")
    global SWITCHED_ONLY
    SWITCHED_ONLY = [n for n in args.switches.split(",") if n] if args.switches else None
    if SWITCHED_ONLY:
        from schedulers.tuning import SWITCHES

        if set(SWITCHED_ONLY) - set(SWITCHES):
            parser.error(f"unknown switches {sorted(set(SWITCHED_ONLY) - set(SWITCHES))}")
    args.contenders = [c for c in args.contenders.split(",") if c]
    unknown = set(args.contenders) - set(CONTENDERS + OPTIONAL)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}")
    names = args.models.split(",")
    cases = [c for c in model_cases(args.tiny) if c.name in names]
    if len(cases) != len(names):
        parser.error(f"models are {[c.name for c in model_cases(args.tiny)]}")
    data: dict[str, Any] = {"meta": {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__, "steps": args.steps, "tiny": args.tiny, "stub": args.stub,
        "deterministic": args.deterministic, "switched": args.switches or "all",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }, "models": []}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = ("-tiny" if args.tiny else "") + ("-stub" if args.stub else "") + (
        "-deterministic" if args.deterministic else "")
    stem = args.out / f"models-{device_slug(args.device)}{suffix}"
    for case in cases:
        data["models"].append(run_model(case, args))
        print(render_markdown({**data, "models": [data["models"][-1]]}), flush=True)
        # written after each model: a run cut short keeps what it measured
        stem.with_suffix(".json").write_text(json.dumps(data, indent=1))
        stem.with_suffix(".md").write_text(render_markdown(data))
    print(f"wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
