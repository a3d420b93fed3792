"""What one steady training step does, in a cold process and in a new one on the warm caches.

    python -m benchmarks.step_trace [--model gpt2] [--tiny] [--stub] [--warmup 6] [--out DIR]

Issue 30 asks why a new process on the warm store steps slower than the cold one that filled
it. This runs benchmarks.models' training loop through backend="fusion_cache" on fresh caches
(the cold process), then starts itself again on those caches (the warm one, its compiled
graphs from torch's AOTAutograd cache, Note [AOT cache]); in each, after `--warmup` steps,
one step is traced:

- every Python function entered (file:line:name -> calls) and every C function called;
- every aten op dispatched below autograd (op, dtypes, shapes, strides): eager ops, the
  regions' ATen segments, the optimizer's;
- with --stub, every kernel launched (name, grid, block);
- on a GPU, the next step under torch.profiler: kernels, their summed time, and the wall.

Deterministic where timings are not (a loaded CPU). The two traces are written to
DIR/step-trace-<model>-{cold,warm}.json and their differences printed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks import models
from benchmarks.model_defs import model_cases


class _AtenOps(TorchDispatchMode):
    """Every aten op dispatched, with its tensors' dtypes, shapes and strides."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}

        def desc(v: Any) -> str:
            if isinstance(v, torch.Tensor):
                return f"{str(v.dtype)[6:]}{list(v.shape)}{list(v.stride())}"
            return "" if isinstance(v, (int, float, bool)) or v is None else type(v).__name__

        flat = [desc(a) for a in (*args, *kwargs.values())]
        flat += [desc(a) for a in args if isinstance(a, (list, tuple)) for a in a]
        self.ops.append(f"{func}({', '.join(x for x in flat if x)})")
        return func(*args, **kwargs)


def _trace_step(run_step) -> dict[str, Any]:
    py: collections.Counter = collections.Counter()
    c_calls: collections.Counter = collections.Counter()

    def profiler(frame, event, arg):
        if event == "call":
            code = frame.f_code
            py[f"{Path(code.co_filename).name}:{code.co_firstlineno}:{code.co_name}"] += 1
        elif event == "c_call":
            c_calls[getattr(arg, "__qualname__", None) or repr(arg)] += 1

    sys.setprofile(profiler)
    try:
        run_step()
    finally:
        sys.setprofile(None)
    mode = _AtenOps()
    with mode:
        run_step()
    return {"python_calls": sum(py.values()), "python": dict(py.most_common()),
            "c_calls": sum(c_calls.values()), "c": dict(c_calls.most_common()),
            "aten": mode.ops}  # fmt: skip


def process_state() -> dict[str, Any]:
    """What of a process's state changes every op's cost: threads, hooks, modes, gc."""
    import gc
    import threading

    return {
        "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
        "python_threads": sorted(t.name for t in threading.enumerate()),
        "trace_hook": repr(sys.gettrace()), "profile_hook": repr(sys.getprofile()),
        "grad": torch.is_grad_enabled(), "inference_mode": torch.is_inference_mode_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "anomaly": torch.is_anomaly_enabled(),
        "dispatch_modes": torch._C._len_torch_dispatch_stack(),
        "function_modes": torch._C._len_torch_function_stack(),
        "gc_enabled": gc.isenabled(), "gc_threshold": list(gc.get_threshold()),
        "gc_objects": len(gc.get_objects()), "gc_frozen": gc.get_freeze_count(),
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("OMP", "MKL", "CUDA", "TORCH", "PYTORCH", "FUSION"))},
    }  # fmt: skip


def _kernel_profile(run_step) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        run_step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels: dict[str, list[float]] = {}  # name -> [launches, us]
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            row = kernels.setdefault(ev.name[:100], [0, 0.0])
            row[0] += 1
            row[1] += ev.device_time
    # host time by op (the profiler's own cost is in both processes alike)
    cpu = sorted(((e.key, e.count, e.self_cpu_time_total) for e in prof.key_averages()
                  if e.self_cpu_time_total > 0), key=lambda r: -r[2])  # fmt: skip
    return {"wall_ms": wall * 1e3, "kernel_ms": sum(r[1] for r in kernels.values()) / 1e3,
            "kernels": kernels, "cpu_ops": [list(r) for r in cpu[:60]]}  # fmt: skip


def trace(name: str, tiny: bool, stub: bool, warmup: int) -> dict[str, Any]:
    """Warm-up steps through the backend, then one traced step (and on a GPU one profiled)."""
    case = next(c for c in model_cases(tiny) if c.name == name)
    device = "cpu" if stub else "cuda"
    log: list | None = [] if stub else None
    if stub:
        from benchmarks.host_region import stub_launches

        context = stub_launches(log=log)
    else:
        import contextlib

        context = contextlib.nullcontext()
    with context, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = models.initial_model(case, device)
        fn = models.compiled("fusion_cache", model)
        params = list(model.parameters())
        batches = models.batches_for(case, warmup + 1, device)
        opt = torch.optim.SGD(params, lr=case.lr, momentum=0.9)

        def run_step() -> None:
            models.step(fn, opt, case, batches[-1], device)

        steps, hosts = [], []  # the step's wall, and its host time before the synchronize
        started = time.time()  # to set the steps beside a clock log (nvidia-smi's)
        for batch in batches[:warmup]:
            models.sync(device)
            start = time.perf_counter()
            models.step(fn, opt, case, batch, device)
            issued = time.perf_counter()
            models.sync(device)
            steps.append((time.perf_counter() - start) * 1e3)
            hosts.append((issued - start) * 1e3)
        if log is not None:
            log.clear()
        state = process_state()
        out = _trace_step(run_step)
        out["state"] = state
        out["steps_ms"], out["host_ms"], out["started"] = steps, hosts, started
        out["aot_cache"] = models.aot_counters()
        if log is not None:
            out["launches"] = [f"{k[0]} {k[1]} {k[2]}" for k in log[: len(log) // 2]]
        if device == "cuda":
            out["profile"] = _kernel_profile(run_step)
    if not stub:  # eager in the same process, after: its steps beside the backend's
        out["eager_ms"], out["eager_host_ms"] = _eager_steps(case, device, warmup)
    return out


def _eager_steps(case: Any, device: str, steps: int) -> tuple[list[float], list[float]]:
    model = models.initial_model(case, device)
    hosts: list[float] = []
    _, times = models.train(model, list(model.parameters()), case,
                            models.batches_for(case, steps, device), device, hosts=hosts)
    return [t * 1e3 for t in times], [t * 1e3 for t in hosts]


def diff(cold: dict[str, Any], warm: dict[str, Any]) -> list[str]:
    lines = [f"python calls a step: cold {cold['python_calls']}, warm {warm['python_calls']}; "
             f"C calls: cold {cold['c_calls']}, warm {warm['c_calls']}; aten ops: "
             f"cold {len(cold['aten'])}, warm {len(warm['aten'])}"]  # fmt: skip
    for key in ("python", "c"):
        a, b = cold[key], warm[key]
        rows = [(b.get(k, 0) - a.get(k, 0), k) for k in set(a) | set(b) if a.get(k) != b.get(k)]
        rows.sort(key=lambda r: -abs(r[0]))
        lines.append(f"{key} functions whose calls differ (warm - cold): {len(rows)}")
        lines += [f"  {d:+6d}  {k}" for d, k in rows[:40]]
    ca, wa = collections.Counter(cold["aten"]), collections.Counter(warm["aten"])
    rows = [(wa[k] - ca[k], k) for k in set(ca) | set(wa) if ca[k] != wa[k]]
    rows.sort(key=lambda r: -abs(r[0]))
    lines.append(f"aten ops whose calls differ (warm - cold): {len(rows)}")
    lines += [f"  {d:+4d}  {k}" for d, k in rows[:40]]
    if "launches" in cold:
        same = cold["launches"] == warm.get("launches")
        lines.append(f"kernel launches: cold {len(cold['launches'])}, warm "
                     f"{len(warm.get('launches', []))}, same sequence: {same}")  # fmt: skip
    def median(values: list[float]) -> str:
        tail = values[5:] or values
        return f"{statistics.median(tail):.2f}" if tail else "-"

    for run, data in (("cold", cold), ("warm", warm)):
        lines.append(f"{run}: started {time.strftime('%H:%M:%S', time.gmtime(data['started']))} "
                     f"UTC; first step {data['steps_ms'][0] / 1e3:.2f} s; steps 6+ median "
                     f"{median(data['steps_ms'])} ms, host {median(data['host_ms'])} ms; eager "
                     f"in the same process {median(data.get('eager_ms', []))} ms, host "
                     f"{median(data.get('eager_host_ms', []))} ms")  # fmt: skip
    sa, sb = cold.get("state", {}), warm.get("state", {})
    for k in sorted(set(sa) | set(sb)):
        if sa.get(k) != sb.get(k):
            lines.append(f"process state {k}: cold {sa.get(k)}, warm {sb.get(k)}")
    for run, data in (("cold", cold), ("warm", warm)):
        prof = data.get("profile")
        steps = " ".join(f"{t:.1f}" for t in data["steps_ms"])
        hosts = " ".join(f"{t:.1f}" for t in data.get("host_ms", []))
        lines.append(f"{run}: steps ms {steps}; of which host before the sync {hosts}; "
                     f"AOT cache {data['aot_cache']}")
        if "eager_ms" in data:
            eager = " ".join(f"{t:.1f}" for t in data["eager_ms"])
            eager_host = " ".join(f"{t:.1f}" for t in data["eager_host_ms"])
            lines.append(f"{run}: eager after it, same process: steps ms {eager}; host "
                         f"{eager_host}")
        if prof:
            launched = sum(r[0] for r in prof["kernels"].values())
            lines.append(f"{run}: profiled step {prof['wall_ms']:.2f} ms wall, kernels "
                         f"{prof['kernel_ms']:.2f} ms, {launched} launched")
    if cold.get("profile") and warm.get("profile"):
        a, b = cold["profile"]["kernels"], warm["profile"]["kernels"]
        zero = [0, 0.0]
        rows = [(b.get(k, zero)[1] - a.get(k, zero)[1], b.get(k, zero)[0] - a.get(k, zero)[0], k)
                for k in set(a) | set(b)]  # fmt: skip
        rows.sort(key=lambda r: -abs(r[0]))
        lines.append("GPU kernels by time difference (warm - cold): us, launches")
        lines += [f"  {d:+9.1f} us {n:+4d}  {k}" for d, n, k in rows[:25]]
        ca = {k: (n, us) for k, n, us in cold["profile"]["cpu_ops"]}
        wa = {k: (n, us) for k, n, us in warm["profile"]["cpu_ops"]}
        rows = [(wa.get(k, (0, 0.0))[1] - ca.get(k, (0, 0.0))[1], k) for k in set(ca) | set(wa)]
        rows.sort(key=lambda r: -abs(r[0]))
        lines.append("host ops by self CPU time difference (warm - cold, under the profiler): "
                     "us (cold calls / us, warm calls / us)")  # fmt: skip
        lines += [f"  {d:+9.1f} us  {k} ({ca.get(k)} / {wa.get(k)})" for d, k in rows[:25]]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_trace", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--stub", action="store_true", help="CPU, plans for h100, stub launches")
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path("."), help="the diff's folder")
    parser.add_argument("--traces", type=Path, default=None,
                        help="the two traces' folder (default: --out; they run to MBs)")
    parser.add_argument("--run", choices=("cold", "warm"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    traces = args.traces or args.out
    for folder in (args.out, traces):
        folder.mkdir(parents=True, exist_ok=True)
    stem = traces / f"step-trace-{args.model}"
    if args.run is not None:  # one process: trace and write
        data = trace(args.model, args.tiny, args.stub, args.warmup)
        Path(f"{stem}-{args.run}.json").write_text(json.dumps(data, indent=0))
        # at once, so a run cut short by a time limit still tells its steps
        steps = " ".join(f"{t:.1f}" for t in data["steps_ms"])
        hosts = " ".join(f"{t:.1f}" for t in data["host_ms"])
        print(f"{args.run}: steps ms {steps}; host before the sync {hosts}", flush=True)
        return 0
    models.fresh_caches(None)  # sets the store and torch's cache dirs in os.environ
    for run in ("cold", "warm"):  # each a new process: cold fills the caches, warm reads them
        cmd = [sys.executable, "-m", "benchmarks.step_trace", "--run", run, "--model",
               args.model, "--warmup", str(args.warmup), "--out", str(args.out),
               "--traces", str(traces)]  # fmt: skip
        cmd += ["--tiny"] if args.tiny else []
        cmd += ["--stub"] if args.stub else []
        root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        subprocess.run(cmd, env=env, check=True, cwd=root)
    cold = json.loads(Path(f"{stem}-cold.json").read_text())
    warm = json.loads(Path(f"{stem}-warm.json").read_text())
    text = "\n".join(diff(cold, warm))
    print(text)
    (args.out / f"step-trace-{args.model}-diff.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
