"""What a process restarted on a warm store pays for the store: opening it on first use, and
each further known fusion (PERFORMANCE.md target 4: at most 50 ms and 3 ms).

    python -m benchmarks.warm_store [--fusions 5] [--runs 5] [--target h100] [--dir DIR]

One cold process fills a fresh store with small fusions (executing them on a GPU, else
precompiling them for --target with NVRTC). Then every run is a new process, started after
`import torch` (and CUDA init on a GPU), as a restarted job is:
  store     the store path alone: import and open the store, then per fusion its id
            (trie key -> id), its plan and its cubins, as the runtime asks for them;
  frontend  define each fusion and precompile it (schedule, generate, fetch the cubins);
  execute   (GPU only) define each fusion and run it once, synchronized.
Each prints the first fusion (which opens the store) and the mean of the others, in ms; a
warm run must compile nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(fd, i: int) -> None:
    """Five small fusions of the kinds a training step has (pointwise, reductions)."""
    from fusion_cache import DataType

    def tensor():
        return fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)

    t0 = tensor()
    k = i // 5  # more than five: the same shapes with other constants
    kind = i % 5
    if kind == 0:
        fd.add_output(fd.ops.relu(fd.ops.add(fd.ops.mul(t0, fd.define_scalar(2.0 + k)),
                                             fd.define_scalar(1.0))))  # fmt: skip
    elif kind == 1:
        t1 = tensor()
        fd.add_output(fd.ops.mul(fd.ops.add(t0, t1), fd.define_scalar(0.5 + k)))
    elif kind == 2:
        fd.add_output(fd.ops.sum(fd.ops.mul(t0, fd.define_scalar(1.0 + k)), [1]))
    elif kind == 3:
        fd.add_output(fd.ops.exp(fd.ops.sub(t0, fd.define_scalar(float(k)))))
    else:
        fd.add_output(fd.ops.max(fd.ops.abs(fd.ops.add(t0, fd.define_scalar(float(k)))), [1]))


def inputs(i: int, device: str) -> list:
    import torch

    x = torch.randn(64, 256, device=device)
    return [x, torch.randn(64, 256, device=device)] if i % 5 == 1 else [x]


def define(i: int):
    from fusion_cache import FusionDefinition

    with FusionDefinition() as fd:
        build(fd, i)
    return fd


# -- the child processes ------------------------------------------------------------------------


def child_fill(n: int, target: str | None, out: str) -> None:
    import torch

    from fusion_cache import FusionCache

    gpu = torch.cuda.is_available()
    start = time.perf_counter()
    fusions = []
    for i in range(n):
        fd = define(i)
        if gpu:
            fd.execute(inputs(i, "cuda"))
        else:
            fd.precompile(inputs(i, "cpu"), target=target)
        store = FusionCache.get().store
        keys = [k.key for k in store.kernels(fd.id())]  # the kernels its plan linked
        entry = store.fusion_by_id(fd.id())
        plan = store.plans_for(fd.id())[0]
        fusions.append({"key": entry.definition_key, "records": entry.records_json,
                        "python": entry.python_definition, "signature": plan.signature_key,
                        "target": plan.target, "kernels": keys})  # fmt: skip
    stats = FusionCache.get().stats()
    Path(out).write_text(json.dumps({"fusions": fusions, "gpu": gpu,
                                     "seconds": time.perf_counter() - start,
                                     "compiled": stats["kernels_compiled"]}))  # fmt: skip


def child_store(manifest: str) -> dict:
    """The store path alone, as the runtime walks it for a known fusion."""
    fusions = json.loads(Path(manifest).read_text())["fusions"]
    t0 = time.perf_counter()
    from fusion_cache.store import default_store

    t1 = time.perf_counter()
    store = default_store()
    t2 = time.perf_counter()
    each = []
    for f in fusions:
        start = time.perf_counter()
        fid = store.fusion_id_for(f["key"], f["records"], f["python"])
        assert store.get_plan(fid, f["signature"], f["target"]) is not None, "plan missing"
        for key in f["kernels"]:
            cubin, compiled = store.compile_once(key, _no_compile)
            store.link_kernel(fid, key)
        store.put_plan(fid, f["signature"], f["target"], store.get_plan(fid, f["signature"],
                                                                        f["target"]))  # fmt: skip
        each.append((time.perf_counter() - start) * 1e3)
    return {"import_ms": (t1 - t0) * 1e3, "open_ms": (t2 - t1) * 1e3, "each_ms": each,
            "sqlalchemy": "sqlalchemy" in sys.modules}  # fmt: skip


def _no_compile():
    raise AssertionError("a warm run compiled a kernel")


def child_frontend(n: int, target: str | None, execute: bool) -> dict:
    import torch

    from fusion_cache import FusionCache

    device = "cuda" if execute else "cpu"
    data = [inputs(i, device) for i in range(n)]
    if execute:
        torch.cuda.synchronize()
    each = []
    for i in range(n):
        start = time.perf_counter()
        fd = define(i)
        if execute:
            fd.execute(data[i])
            torch.cuda.synchronize()
        else:
            fd.precompile(data[i], target=target)
        each.append((time.perf_counter() - start) * 1e3)
    stats = FusionCache.get().stats()
    return {"each_ms": each, "compiled": stats["kernels_compiled"],
            "loaded": stats["kernels_loaded"]}  # fmt: skip


def child(args: argparse.Namespace) -> None:
    import torch  # before the clock, as in a job that restarts

    if torch.cuda.is_available():
        torch.cuda.init()
        torch.empty(1, device="cuda")
    import fusion_cache  # noqa: F401  (the frontend's import is not the store's)

    if args.child == "fill":
        child_fill(args.fusions, args.target, args.out)
        return
    if args.child == "store":
        result = child_store(args.manifest)
    else:
        result = child_frontend(args.fusions, args.target, execute=args.child == "execute")
    Path(args.out).write_text(json.dumps(result))


# -- the parent -----------------------------------------------------------------------------------


def run_child(kind: str, args: argparse.Namespace, store_dir: Path, out: Path,
              manifest: Path | None = None) -> dict:  # fmt: skip
    cmd = [sys.executable, "-m", "benchmarks.warm_store", "--child", kind, "--out", str(out),
           "--fusions", str(args.fusions)]  # fmt: skip
    if args.target:
        cmd += ["--target", args.target]
    if manifest is not None:
        cmd += ["--manifest", str(manifest)]
    env = dict(os.environ, FUSION_CACHE_DIR=str(store_dir))
    env.pop("FUSION_CACHE_DB_URL", None)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{kind} run failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(out.read_text())


def summary(name: str, runs: list[dict], extra: str = "") -> str:
    first = [r["each_ms"][0] for r in runs]
    rest = [statistics.mean(r["each_ms"][1:]) for r in runs if len(r["each_ms"]) > 1]

    def spread(xs: list[float], digits: int) -> str:
        return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"

    line = f"  {name:9} first fusion {spread(first, 1)} ms"
    if rest:
        line += f", each further {spread(rest, 2)} ms"
    return line + extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm_store", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fusions", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5, help="new processes per kind of run")
    parser.add_argument("--target", default=None,
                        help="without a GPU: the profile to compile for (default h100)")
    parser.add_argument("--dir", default=None, help="store directory (default: a fresh one)")
    parser.add_argument("--child", choices=["fill", "store", "frontend", "execute"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--manifest", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0

    work = Path(tempfile.mkdtemp(prefix="fc-warm-"))
    store_dir = Path(args.dir) if args.dir else work / "store"
    manifest = work / "fill.json"
    import torch

    gpu = torch.cuda.is_available()
    if not gpu and args.target is None:
        args.target = "h100"
    fill = run_child("fill", args, store_dir, manifest)
    device = torch.cuda.get_device_name() if gpu else f"no GPU (compiled for {args.target})"
    print(f"warm store: {args.fusions} fusions, {args.runs} new processes a kind, {device}; "
          f"store {store_dir}")
    print(f"  fill      {fill['compiled']} kernels compiled in {fill['seconds']:.1f} s (cold)")
    kinds = ["store", "frontend"] + (["execute"] if gpu else [])
    results: dict[str, list[dict]] = {k: [] for k in kinds}
    for r in range(args.runs):
        for kind in kinds:  # interleaved, so drift on a shared machine hits each alike
            out = work / f"{kind}.{r}.json"
            results[kind].append(run_child(kind, args, store_dir, out,
                                           manifest if kind == "store" else None))  # fmt: skip
    store_runs = results["store"]
    opened = [r["import_ms"] + r["open_ms"] + r["each_ms"][0] for r in store_runs]
    print(f"  store     open on first use {statistics.median(opened):.1f} ms "
          f"({min(opened):.1f}-{max(opened):.1f}): import "
          f"{statistics.median(r['import_ms'] for r in store_runs):.1f}, open "
          f"{statistics.median(r['open_ms'] for r in store_runs):.1f}, first fusion's lookups "
          f"{statistics.median(r['each_ms'][0] for r in store_runs):.1f}; SQLAlchemy imported: "
          f"{any(r['sqlalchemy'] for r in store_runs)}")
    print(summary("store", store_runs))
    for kind in kinds[1:]:
        runs = results[kind]
        compiled = sum(r["compiled"] for r in runs)
        print(summary(kind, runs, f"; compiles {compiled}, loaded {runs[0]['loaded']} a run"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
