"""Cold first steps of the torch.compile backend, each in a new process on fresh caches, for an
A/B of two source trees (or of knobs) in one run on one machine.

    python -m benchmarks.cold_first OUT '[[label, tree, model, contender, {env}, need_s], ...]'
        DEADLINE_S [--tiny --stub] [--profile PATH]

--profile PATH writes each run's first step under cProfile to PATH with the suffixes .prof and
.txt (models.train's profile), "{label}" in it replaced by the run's label.

Each run starts `python benchmarks/cold_first.py --child MODEL CONTENDER` with PYTHONPATH and
working directory `tree` (e.g. an untracked `git archive main` beside this one: the baseline)
and `env` added, on an empty fusion store and empty inductor/Triton caches: the model, batch,
compile call and training step of benchmarks/models.py, one step, reported as one JSON line,
then os._exit (no teardown: what a device call with a few seconds to spare can afford). A run
is skipped where fewer than `need_s` seconds are left of DEADLINE_S. `{"_warm": 1}` in a run's env
runs it on the store and caches the run before it filled (a restart: the warm first step); with
TORCH_CACHING_PRECOMPILE=1 in both, the first saves dynamo's cache and the second's compile call
("wrap_s") loads it (Note [Dynamo's cache] in benchmarks/models.py). Writes OUT/cold-runs.json
and prints a Markdown table (`--table OUT/cold-runs.json` prints it again).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(name: str, contender: str, tiny: bool, stub: bool, profile: str | None = None) -> None:
    start = time.perf_counter()
    import torch

    from benchmarks import models
    from benchmarks.model_defs import model_cases

    device = "cpu" if stub else "cuda"
    case = next(c for c in model_cases(tiny) if c.name == name)
    stubbed = None
    if stub:
        from benchmarks.host_region import stub_launches

        stubbed = stub_launches()  # held to the end: this process ends with the run
        stubbed.__enter__()
    from torch._dynamo.utils import compilation_time_metrics

    key_s = _time_aot_cache_key()
    model = models.initial_model(case, device)
    batches = models.batches_for(case, 1, device)
    models.sync(device)
    wrap_start = time.perf_counter()
    fn = models.compiled(contender, model)
    wrap_s = time.perf_counter() - wrap_start
    compilation_time_metrics.clear()
    _, times = models.train(fn, list(model.parameters()), case, batches, device,
                            profile=Path(profile) if profile else None)  # fmt: skip
    row = {"model": name, "contender": contender, "first_step_s": times[0], "wrap_s": wrap_s,
           "before_compile_s": wrap_start - start, "tracing_s": models.tracing_times(),
           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (stub)",
           "torch": torch.__version__}  # fmt: skip
    if contender.startswith("fusion_cache"):
        # imported by the compile call (register_backend), as torch's entry point imports it
        from fusion_cache.frontends import dynamo_backend

        row.update(models.graph_summary(dynamo_backend.reports()))
        row["counters"] = models.fusion_counters()
        from fusion_cache.runtime import pending_compiles

        if hasattr(pending_compiles, "waited"):  # a tree before it: none
            row["compile_wait_s"], row["compile_waits"] = pending_compiles.waited()
        row["aot"] = models.aot_counters()
    row["aot_key_s"] = key_s[0]
    row.pop("eager_reasons", None)
    if os.environ.get(models.DYNAMO_CACHE_ENV) == "1":  # Note [Dynamo's cache] in models.py:
        torch.compiler.save_cache_artifacts()  # for a next run with "_warm" (its compile call
        # loads them: "wrap_s")
    row["process_s"] = time.perf_counter() - start
    print("FIRST " + json.dumps(row, default=str), flush=True)
    os._exit(0)


def _time_aot_cache_key() -> list[float]:
    """Seconds torch spends computing its AOTAutograd cache keys in this process, summed into
    the list returned: its first call hashes torch's sources and Triton's (its 396 MiB shared
    library on the GPU machine), before a warm process can load a single entry."""
    spent = [0.0]
    try:
        from torch._functorch._aot_autograd import autograd_cache
    except ImportError:
        return spent
    inner = autograd_cache.autograd_cache_key

    def timed(*args: object, **kwargs: object) -> object:
        began = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - began

    autograd_cache.autograd_cache_key = timed
    return spent


def run_all(out: str, runs: list, deadline: float, extra: list[str]) -> list[dict]:
    start = time.monotonic()
    rows: list[dict] = []
    root = tempfile.mkdtemp(prefix="cold-")
    for label, tree, model, contender, env, need in runs:
        left = deadline - (time.monotonic() - start)
        if left < need:
            print(f"{label} {model}: skipped, {left:.0f} s left (needs {need})", flush=True)
            continue
        env = dict(env)
        if not env.pop("_warm", None):  # else: the last run's store and caches
            root = tempfile.mkdtemp(prefix="cold-")
        tree = os.path.abspath(tree)
        full = dict(os.environ, FUSION_CACHE_DIR=os.path.join(root, "fc"),
                    TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"),
                    TRITON_CACHE_DIR=os.path.join(root, "triton"),
                    PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
        full.pop("FUSION_CACHE_DB_URL", None)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", model, contender,
               *(x.replace("{label}", label) for x in extra)]
        began = time.perf_counter()
        try:
            done = subprocess.run(cmd, env=full, cwd=tree, capture_output=True, text=True,
                                  timeout=max(1.0, left - 1))  # fmt: skip
        except subprocess.TimeoutExpired:
            print(f"{label} {model}: timed out after {time.perf_counter() - began:.0f} s")
            break
        line = next((x for x in done.stdout.splitlines() if x.startswith("FIRST ")), None)
        if line is None:
            print(f"{label} {model}: failed ({done.returncode}) {done.stderr[-2000:]}", flush=True)
            continue
        row = json.loads(line.removeprefix("FIRST "))
        row.update(label=label, tree=os.path.basename(tree), env=env,
                   process_wall_s=time.perf_counter() - began,
                   utc=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()))  # fmt: skip
        rows.append(row)
        print(table_row(row), flush=True)
        with open(os.path.join(out, "cold-runs.json"), "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return rows


HEADER = ("| UTC | run | tree, env | model | contender | compile call s | first step s | lowering s (planning "
          "ahead) | first region calls s (compile waits) | dynamo s (AOT cache key s) | joint graph s | kernels "
          "compiled | AOT cache hits | reference runs | process s |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def table_row(r: dict) -> str:
    c, tr = r.get("counters") or {}, r.get("tracing_s") or {}
    env = " ".join(f"{k}={v}" for k, v in (r.get("env") or {}).items())
    return (f"| {r['utc']} | {r['label']} | {r['tree']} {env} | {r['model']} | {r['contender']} | "
            f"{r.get('wrap_s') or 0:.2f} | {r['first_step_s']:.2f} | {r.get('fuse_s') or 0:.2f} ({r.get('ahead_s') or 0:.2f}) | "
            f"{r.get('record_s') or 0:.2f} ({r.get('compile_wait_s') or 0:.2f}) | "
            f"{tr.get('_compile.compile_inner', 0):.2f} ({r.get('aot_key_s') or 0:.2f}) | "
            f"{tr.get('aot_trace_joint_graph', 0):.2f} | "
            f"{c.get('kernels_compiled', '-')} | {(r.get('aot') or {}).get('hit', '-')} | "
            f"{c.get('reference_runs', '-')} | "
            f"{r.get('process_wall_s', 0):.1f} |")


def table(rows: list[dict]) -> str:
    head = f"# Cold first steps: {rows[0].get('device')} (torch {rows[0].get('torch')})\n\n"
    return head + HEADER + "\n" + "\n".join(table_row(r) for r in rows) + "\n"


def main(argv: list[str]) -> int:
    if argv[0] == "--child":
        profile = argv[argv.index("--profile") + 1] if "--profile" in argv else None
        child(argv[1], argv[2], "--tiny" in argv, "--stub" in argv, profile)
        return 0
    if argv[0] == "--table":
        with open(argv[1]) as f:
            print(table(json.load(f)), end="")
        return 0
    rows = run_all(argv[0], json.loads(argv[1]), float(argv[2]), argv[3:])
    if rows:
        print(table(rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
