"""Where a training step's GPU time goes: torch.profiler over steady steps, per contender.

    python -m benchmarks.step_kernels [--models gpt2,llama,resnet18]
        [--contenders eager,inductor,fusion_cache,fusion_cache_graphs,inductor_graphs,
                      fusion_cache_switched,fusion_cache_switched_graphs]
        [--warmup 6] [--steps 3] [--top 30] [--out DIR]

benchmarks.profile_model says where the host time goes; this says where the device time goes:
for each model and contender, the summed kernel time of a step, the kernels launched per step,
the step's wall time, and the busiest kernels (CUDA time per step, calls per step), grouped
as GEMM / attention / convolution / ours / triton / other ATen. With CUDA graphs the replayed
kernels show too. Text tables to stdout and DIR/step-kernels-<model>.txt.

`--timeline` (issue 30: a host-bound step against inductor's): per model and contender, two
more torch.profiler captures of `--steps` steps each, `light` (CUDA activity alone: kernels
and the runtime and driver calls, the host least disturbed) and `ops` (CPU ops too, to tell
what the host was in). Each step is delimited by a spin kernel launched before it and one
after its last issue (torch.cuda._sleep), then the closing synchronize. Per step: the wall,
the issue time, the GPU's busy and idle time, its idle gaps by the host op (or call) the next
kernel's launch was made under, the launch-to-start latency, every runtime and driver call by
name, the calls that wait or allocate inside the step (synchronizes, copies, mallocs: any is
a suspect), host time by outermost and by innermost op, collections of Python's gc, and the
caching allocator's device allocations. Summaries to DIR/timeline-<model>.json and .txt, the
traces gzipped beside them (DIR/trace-<model>-<contender>-<mode>.json.gz).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import re
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from benchmarks import models
from benchmarks.model_defs import model_cases

GROUPS = (  # first match wins: the kernel name's family
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn.*(mha|sdpa)", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|sm90_xmma|xmma|nvjet|ampere_|sm80_|s16816|s1688|cublas", re.I)),
    ("conv", re.compile(r"conv|implicit_convolve|winograd|fft|cudnn|dgrad|wgrad", re.I)),
    ("ours", re.compile(r"^fc_")),
    ("triton", re.compile(r"^triton_")),
)


def group_of(name: str) -> str:
    return next((g for g, pat in GROUPS if pat.search(name)), "aten-other")


def profile_contender(case, contender: str, warmup: int, steps: int):
    device = "cuda"
    model = models.initial_model(case, device)
    fn = models.compiled(contender, model)
    params = list(model.parameters())
    batches = models.batches_for(case, warmup + steps, device)
    models.train(fn, params, case, batches[:warmup], device)
    walls = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _, walls = models.train(fn, params, case, batches[warmup:], device)
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = ev.name
        if name.startswith(("Memcpy", "Memset")) or "memcpy" in name.lower():
            name = name.split(" ")[0]
        row = per_kernel[name]
        row[0] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        row[1] += 1
    models.release_memory(device)
    return per_kernel, walls


def render(model: str, contender: str, per_kernel, walls, steps: int, top: int) -> str:
    total = sum(v[0] for v in per_kernel.values()) / steps
    launches = sum(v[1] for v in per_kernel.values()) / steps
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, (us, n) in per_kernel.items():
        g = groups[group_of(name)]
        g[0] += us / steps
        g[1] += n / steps
    lines = [f"## {model} / {contender}: step wall {statistics.median(walls) * 1e3:.2f} ms, "
             f"kernel time {total / 1e3:.3f} ms, kernels {launches:.0f} per step"]
    lines.append("  groups: " + ", ".join(f"{g} {us / 1e3:.3f} ms ({n:.0f})"
                                          for g, (us, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])))
    for name, (us, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {us / steps:9.1f} us {n / steps:5.0f}x  [{group_of(name)}] {name[:150]}")
    return "\n".join(lines)


# ---- timeline (--timeline) ---------------------------------------------------------------------

SPIN = "spin_kernel"  # torch.cuda._sleep's kernel: the step marks
LAUNCHES = re.compile(r"^(cudaLaunchKernel|cuLaunchKernel|cudaLaunchKernelExC|cudaLaunchCooperative"
                      r"|cuLaunchCooperativeKernel)")
# calls that make the host wait on the GPU or reach the driver's allocator inside a step
SUSPECTS = re.compile(r"Synchronize|Memcpy|Malloc|Free|HostAlloc|HostRegister|StreamWaitEvent|"
                      r"cuMemAlloc|cuMemFree|cuMemcpy|cuStreamSynchronize|cuCtxSynchronize|"
                      r"cuEventSynchronize|cudaStreamQuery|cuStreamQuery", re.I)
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cpu_op", "user_annotation")
CALL_CATS = ("cuda_runtime", "cuda_driver")


def _corr(ev: dict) -> int | None:
    return (ev.get("args") or {}).get("correlation")


def _chains(ops: list[dict], queries: list[dict]) -> list[list[dict]]:
    """For each query event, the ops of its thread whose span holds its start, outermost first
    (one sweep over both, sorted)."""
    items = sorted([(o["tid"], o["ts"], -o["dur"], 0, i) for i, o in enumerate(ops)]
                   + [(q["tid"], q["ts"], -q["dur"], 1, j) for j, q in enumerate(queries)],
                   key=lambda r: (str(r[0]), *r[1:]))  # fmt: skip
    out: list[list[dict]] = [[] for _ in queries]
    stack: list[dict] = []
    tid = None
    for t, ts, _, kind, idx in items:
        if t != tid:
            stack, tid = [], t
        while stack and ts >= stack[-1]["ts"] + stack[-1]["dur"]:
            stack.pop()
        if kind == 0:
            stack.append(ops[idx])
        else:
            out[idx] = list(stack)
    return out


def _union_us(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def summarize_trace(trace: dict, top: int = 12) -> list[dict]:
    """Per step of a kineto chrome trace whose steps are marked by spin kernels (a spin, the
    step's issue, a spin, the closing synchronize): where its host and GPU time went."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    for e in events:
        e["ts"], e["dur"] = float(e["ts"]), float(e["dur"])
    calls = sorted((e for e in events if e.get("cat") in CALL_CATS), key=lambda e: e["ts"])
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    ops = sorted((e for e in events if e.get("cat") in HOST_CATS
                  and not e["name"].startswith(("timeline step", "ProfilerStep"))),
                 key=lambda e: (e["ts"], -e["dur"]))  # fmt: skip
    launch_of = {_corr(c): c for c in calls if LAUNCHES.match(c["name"]) and _corr(c) is not None}
    spins = [k for k in gpu if SPIN in k["name"]]
    spin_calls = [launch_of[_corr(k)] for k in spins if _corr(k) in launch_of]
    steps = []
    for first, last in zip(spin_calls[0::2], spin_calls[1::2]):
        start, issued = first["ts"], last["ts"]
        syncs = [c for c in calls if c["ts"] > issued and "Synchronize" in c["name"]]
        end = syncs[0]["ts"] + syncs[0]["dur"] if syncs else issued + last["dur"]
        steps.append(_summarize_step(start, issued, end, syncs[0] if syncs else None, calls, gpu,
                                     ops, launch_of, top))  # fmt: skip
    return steps


def _summarize_step(start, issued, end, closing, calls, gpu, ops, launch_of, top) -> dict:
    inside = [c for c in calls if start <= c["ts"] <= end and c is not closing]
    kernels = [k for k in gpu if start <= k["ts"] <= end and SPIN not in k["name"]]
    step_ops = [o for o in ops if start <= o["ts"] and o["ts"] + o["dur"] <= end]
    spans = [(k["ts"], k["ts"] + k["dur"]) for k in kernels]
    busy = _union_us(spans)
    span = (max(b for _, b in spans) - min(a for a, _ in spans)) if spans else 0.0
    runtime: dict[str, list[float]] = {}
    for c in inside:
        row = runtime.setdefault(c["name"], [0, 0.0, 0.0])
        row[0] += 1
        row[1] += c["dur"]
        row[2] = max(row[2], c["dur"])
    chains = {id(c): chain for c, chain in zip(inside, _chains(step_ops, inside))}

    def where(call: dict) -> str:
        chain = chains.get(id(call))
        return " > ".join(o["name"][:60] for o in chain[-2:]) if chain else call["name"]

    # idle gaps on the GPU: what the host was in when the kernel after each gap was launched
    gaps, by_op, lags = [], {}, []
    reach = None
    for k in kernels:
        launch = launch_of.get(_corr(k))
        if launch is not None:
            lags.append(k["ts"] - launch["ts"])
        if reach is not None and k["ts"] - reach > 2.0:
            gap = k["ts"] - reach
            at = where(launch) if launch is not None else "?"
            lag = launch["ts"] - reach if launch is not None else float("nan")
            gaps.append([round(gap, 1), round(lag, 1), k["name"][:70], at])
            row = by_op.setdefault(at, [0, 0.0])
            row[0] += 1
            row[1] += gap
        reach = k["ts"] + k["dur"] if reach is None else max(reach, k["ts"] + k["dur"])
    suspects = [[c["name"], round(c["ts"] - start, 1), round(c["dur"], 1), where(c)]
                for c in inside if SUSPECTS.search(c["name"])]  # fmt: skip
    outer: dict[str, list[float]] = {}
    for o, chain in zip(step_ops, _chains(step_ops, step_ops)):
        if len(chain) <= 1:  # the op itself, or nothing where it starts with its parent
            row = outer.setdefault(o["name"][:80], [0, 0.0, 0])
            row[0] += 1
            row[1] += o["dur"]
    for c in inside:
        chain = chains[id(c)]
        if chain and LAUNCHES.match(c["name"]) and chain[0]["name"][:80] in outer:
            outer[chain[0]["name"][:80]][2] += 1
    selfs = _self_times(step_ops, inside)
    lags.sort()
    return {
        "wall_us": end - start, "issue_us": issued - start,
        "closing_sync_us": closing["dur"] if closing else None,
        "kernels": len(kernels), "gpu_busy_us": busy, "gpu_span_us": span,
        "gpu_idle_us": span - busy,
        "first_kernel_after_us": kernels[0]["ts"] - start if kernels else None,
        "gaps_over_2us": [len(gaps), sum(g[0] for g in gaps)],
        "top_gaps": sorted(gaps, key=lambda g: -g[0])[:top],
        "gap_by_host_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1][1])[:top]),
        "launch_latency_us": ({"median": lags[len(lags) // 2], "p90": lags[int(0.9 * len(lags))],
                               "max": lags[-1]} if lags else None),
        "calls": dict(sorted(runtime.items(), key=lambda kv: -kv[1][1])),
        "suspects": suspects[:40], "suspects_total": len(suspects),
        "outer_ops": dict(sorted(outer.items(), key=lambda kv: -kv[1][1])[:top * 2]),
        "self_ops": dict(sorted(selfs.items(), key=lambda kv: -kv[1][1])[:top * 2]),
    }  # fmt: skip


def _self_times(step_ops: list[dict], calls: list[dict]) -> dict[str, list[float]]:
    """Each op's time less its children's (ops and runtime calls), summed by name."""
    spans = sorted(step_ops + calls, key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    out: dict[str, list[float]] = {}
    stack: list[list] = []  # [event, children's us]
    for e in spans + [None]:
        while stack and (e is None or e["tid"] != stack[-1][0]["tid"]
                         or e["ts"] + max(e["dur"], 1e-3)
                         > stack[-1][0]["ts"] + stack[-1][0]["dur"]):
            done, inner = stack.pop()
            row = out.setdefault(done["name"][:80], [0, 0.0])
            row[0] += 1
            row[1] += done["dur"] - inner
            if stack:
                stack[-1][1] += done["dur"]
        if e is not None:
            stack.append([e, 0.0])
    return out


def marked_steps(step: Callable[[tuple], Any], batches: list) -> list[float]:
    """Each batch's step between two spin kernels (the marks summarize_trace looks for) and
    synchronizes; the steps' wall times, ms."""
    walls = []
    gpu = torch.cuda.is_available()  # else (a CPU test of the path) unmarked
    for batch in batches:
        if gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        if gpu:
            torch.cuda._sleep(1)
        step(batch)
        if gpu:
            torch.cuda._sleep(1)
            torch.cuda.synchronize()
        walls.append((time.perf_counter() - start) * 1e3)
    return walls


def capture_timelines(step: Callable[[tuple], Any], batches: list, modes: Sequence[str],
                      trace_path: Callable[[str], Path | None]) -> dict:  # fmt: skip
    """A capture of marked steps over `batches` per mode (`light`: CUDA activity alone; `ops`:
    CPU ops too): its walls, Python's collections and the allocator's device allocations
    inside it, and summarize_trace's steps; each trace gzipped to `trace_path(mode)` (None:
    kept nowhere)."""
    collected = [0, 0.0]

    def gc_watch(phase: str, info: dict) -> None:  # collections inside the steps
        if phase == "start":
            collected[1] -= time.perf_counter()
        else:
            collected[0] += 1
            collected[1] += time.perf_counter()

    cpu = torch.profiler.ProfilerActivity.CPU
    gpu = torch.cuda.is_available()
    cuda = torch.profiler.ProfilerActivity.CUDA if gpu else cpu
    result: dict = {}
    for mode in modes:
        stats0 = torch.cuda.memory_stats() if gpu else {}
        gc.callbacks.append(gc_watch)
        collected[:] = [0, 0.0]
        try:
            acts = [cuda] if mode == "light" else list(dict.fromkeys([cpu, cuda]))
            with torch.profiler.profile(activities=acts) as prof:
                walls = marked_steps(step, batches)
        finally:
            gc.callbacks.remove(gc_watch)
        stats1 = torch.cuda.memory_stats() if gpu else {}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            raw = path.read_bytes()
        target = trace_path(mode)
        if target is not None:
            packed = gzip.compress(raw, 6)
            if len(packed) < 15 * 2**20:
                target.write_bytes(packed)
        result[mode] = {
            "walls_ms": walls, "gc": {"collections": collected[0], "ms": collected[1] * 1e3},
            "device_allocs": {k: stats1.get(k, 0) - stats0.get(k, 0)
                              for k in ("num_device_alloc", "num_device_free", "num_alloc_retries")},
            "steps": summarize_trace(json.loads(raw)),
        }  # fmt: skip
    return result


def timeline_contender(case, contender: str, label: str, warmup: int, steps: int,
                       out: Path, device: str = "cuda") -> dict:  # fmt: skip
    """Warm-up steps, then one `light` and one `ops` capture of `steps` marked steps each."""
    model = models.initial_model(case, device)
    fn = models.compiled(contender, model)
    batches = models.batches_for(case, warmup + steps, device)
    opt = torch.optim.SGD(model.parameters(), lr=case.lr, momentum=0.9)

    def step(batch: tuple) -> None:
        models.step(fn, opt, case, batch, device)

    marked_steps(step, batches[:warmup])
    result: dict = {"unprofiled_ms": marked_steps(step, batches[warmup:])}
    result.update(capture_timelines(step, batches[warmup:], ("light", "ops"),
                                    lambda mode: out / f"trace-{case.name}-{label}-{mode}.json.gz"))
    models.release_memory(device)
    return result


def render_timeline(model: str, data: dict) -> str:
    lines = [f"# {model}: per contender and capture, medians over the marked steps (us)"]
    keys = ("wall_us", "issue_us", "closing_sync_us", "kernels", "gpu_busy_us", "gpu_idle_us",
            "first_kernel_after_us")  # fmt: skip
    for contender, res in data.items():
        lines.append(f"## {contender}: unprofiled steps ms "
                     + " ".join(f"{t:.2f}" for t in res.get("unprofiled_ms", [])))  # fmt: skip
        for mode in ("light", "ops"):
            if mode not in res:
                continue
            steps = res[mode]["steps"]
            if not steps:
                lines.append(f"  {mode}: no marked steps found")
                continue
            med = {k: statistics.median(s[k] or 0 for s in steps) for k in keys}
            lines.append(f"  {mode}: " + ", ".join(f"{k[:-3] if k.endswith('_us') else k} "
                                                   f"{v:.0f}" for k, v in med.items())
                         + f"; gc {res[mode]['gc']}; allocs {res[mode]['device_allocs']}")
            s = steps[len(steps) // 2]
            lines.append(f"    gaps>2us {s['gaps_over_2us'][0]} = {s['gaps_over_2us'][1]:.0f} us; "
                         f"launch latency {s['launch_latency_us']}")
            lines.append(f"    suspects ({s['suspects_total']}): "
                         + "; ".join(f"{n} @{t} {d}us [{w}]" for n, t, d, w in s["suspects"][:12]))
            lines.append("    calls: " + ", ".join(f"{n} {c}x {t:.0f}us (max {m:.0f})"
                                                  for n, (c, t, m) in list(s["calls"].items())[:10]))
            lines.append("    gap by host op: " + "; ".join(
                f"{n} {c}x {t:.0f}us" for n, (c, t) in list(s["gap_by_host_op"].items())[:8]))
            lines.append("    top gaps: " + "; ".join(f"{g} (lag {lag}) before {k[:40]} [{w}]"
                                                     for g, lag, k, w in s["top_gaps"][:6]))
            if mode == "ops":
                lines.append("    outer ops: " + "; ".join(
                    f"{n} {c}x {t:.0f}us {k}L" for n, (c, t, k) in list(s["outer_ops"].items())[:12]))
                lines.append("    self ops: " + "; ".join(
                    f"{n} {c}x {t:.0f}us" for n, (c, t) in list(s["self_ops"].items())[:16]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_kernels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2,llama,resnet18")
    parser.add_argument("--contenders",
                        default="eager,inductor,fusion_cache,inductor_graphs,fusion_cache_graphs")
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--switches", default="",
                        help="the switches a *_switched contender turns on (default: all)")
    parser.add_argument("--timeline", action="store_true",
                        help="host and GPU timelines of marked steps (needs --out)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    cases = {c.name: c for c in model_cases(False)}
    models.SWITCHED_ONLY = [n for n in args.switches.split(",") if n] or None
    if args.timeline:
        if args.out is None:
            parser.error("--timeline needs --out")
        args.out.mkdir(parents=True, exist_ok=True)
        for name in args.models.split(","):
            data = {}
            for contender in args.contenders.split(","):
                start = time.perf_counter()
                switched = models.switches_on() if models.SWITCHED in contender else nullcontext()
                with switched:
                    data[contender] = timeline_contender(
                        cases[name], contender.replace(models.SWITCHED, ""), contender, args.warmup,
                        args.steps, args.out)  # fmt: skip
                print(f"{name} / {contender}: {time.perf_counter() - start:.0f} s", flush=True)
                (args.out / f"timeline-{name}.json").write_text(json.dumps(data, indent=1))
            text = render_timeline(name, data)
            print(text, flush=True)
            (args.out / f"timeline-{name}.txt").write_text(text + "\n")
        return 0
    for name in args.models.split(","):
        text = []
        for contender in args.contenders.split(","):
            start = time.perf_counter()
            switched = models.switches_on() if models.SWITCHED in contender else nullcontext()
            with switched:  # Note [Unmeasured switches]
                per_kernel, walls = profile_contender(cases[name],
                                                      contender.replace(models.SWITCHED, ""),
                                                      args.warmup, args.steps)  # fmt: skip
            block = render(name, contender, per_kernel, walls, args.steps, args.top)
            print(block + f"\n  ({time.perf_counter() - start:.0f} s)", flush=True)
            text.append(block)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"step-kernels-{name}.txt").write_text("\n\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
