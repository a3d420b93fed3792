"""Time the alternatives a heuristic chooses between, on the GPU (Note [Tuning knobs]).

    python -m benchmarks.sweep PLAN.json [--out DIR] [--jobs N] [--compile]

PLAN.json is a list of sweeps, each {"cases": [names], "grid": {knob: [values]}}; every
case runs with the heuristic's own choice first, then with each combination of the grid's
values. A sweep with "compile": true times torch.compile for its cases (as --compile does for
all) and records the Triton kernels it chose (benchmarks/inductor_kernels.py; their PTX
goes to DIR/inductor/). Kernels are compiled ahead in N processes (NVRTC needs no GPU), then each variant
is checked against eager and timed as benchmarks.run times the suite. Results go to
DIR/sweep-<plan>.json and a table per case to stdout, best first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from benchmarks.cases import CASES, Case
from benchmarks.run import (
    compiled_for,
    gbps,
    make_timer,
    measure_copy_ceiling,
    seed_for,
    write_json,
)


def combinations(grid: dict[str, list]) -> list[dict[str, Any]]:
    """The heuristic's choice ({}) first, then every combination of the grid."""
    names = list(grid)
    return [{}] + [dict(zip(names, values)) for values in itertools.product(*grid.values())]


def load_plan(path: Path) -> list[tuple[Case, dict[str, Any]]]:
    """(case, knob values) pairs in run order; unknown case names fail here, before a GPU."""
    by_name = {c.name: c for c in CASES}
    runs = []
    for sweep in json.loads(path.read_text()):
        for name in sweep["cases"]:
            if name not in by_name:
                raise SystemExit(f"{path}: unknown case {name!r}")
            runs += [(by_name[name], combo) for combo in combinations(sweep.get("grid", {}))]
    return runs


def compiled_cases(path: Path) -> set[str]:
    """The cases of the plan's sweeps marked "compile": true."""
    return {name for sweep in json.loads(path.read_text()) if sweep.get("compile")
            for name in sweep["cases"]}  # fmt: skip


def _precompile(job: tuple[str, dict[str, Any]]) -> str | None:
    """Compile one variant into the store, in a worker process; the error text or None."""
    from schedulers.tuning import overriding

    name, knobs = job
    case = next(c for c in CASES if c.name == name)
    try:
        with overriding(knobs):
            fd = case.build()
            fd.precompile(case.inputs("meta"), target="h100")
        return None
    except Exception as e:  # noqa: BLE001 - the GPU run reports it against the variant
        return f"{type(e).__name__}: {e}"


def _forget_plans(fd: Any) -> None:
    """Drop the plans cached under other knob values: the fusion's and, as a segmented
    fusion's segments are fusions with executors of their own, every other one too."""
    for ex in list(fd._cache.executors.values()):
        ex.plans.clear()
        getattr(ex, "replays", {}).clear()  # the segmented plans' recorded runs


def run_variant(case: Case, knobs: dict[str, Any], inputs: list, reference: list,
                timer: Any) -> dict[str, Any]:  # fmt: skip
    from fusion_cache.runtime.executor import executor_for
    from schedulers.tuning import overriding

    record: dict[str, Any] = {"case": case.name, "knobs": knobs, "gbps": None, "correct": None,
                              "plan": None, "error": None}  # fmt: skip
    try:
        fd = case.build()
        ex = executor_for(fd)
        _forget_plans(fd)
        with overriding(knobs):
            outputs = fd.execute(inputs)
        plan = ex.last_plan
        spec = getattr(plan, "spec", plan)  # a kernel plan's spec, or a segmented plan
        record["plan"] = getattr(spec, "description", None) or str(plan)[:300]
        _, problem = case.compare(outputs, reference)
        record["correct"] = problem is None
        record["gbps"] = gbps(case.bytes_moved, timer(lambda: fd.execute(inputs)))
        _forget_plans(fd)
    except Exception as e:  # noqa: BLE001 - a refused or broken variant is a result too
        record["error"] = f"{type(e).__name__}: {e}"[:500]
    return record


def sweep_case(case: Case, combos: list[dict[str, Any]], compile_errors: dict, timer: Any,
               with_compile: bool, out: Path | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Every variant of one case on the same fresh inputs, printed best first."""
    torch.manual_seed(seed_for(case.name))
    inputs = case.inputs("cuda")
    reference = case.reference(inputs)
    baselines = {"eager": gbps(case.bytes_moved, timer(lambda: case.eager(*inputs)))}
    kernels: list = []
    if with_compile:
        from benchmarks.inductor_kernels import new_kernels

        baselines["compile"] = gbps(case.bytes_moved, timer(compiled_for(case, inputs)))
        try:
            kernels = new_kernels(_seen_kernels, out / "inductor" if out else None)
        except Exception as e:  # noqa: BLE001 - torch's internals move; the timing stands
            kernels = [{"error": f"{type(e).__name__}: {e}"[:300]}]
    rows = [run_variant(case, knobs, inputs, reference, timer) for knobs in combos]
    for r in rows:
        r["compile_error"] = compile_errors.get(json.dumps([case.name, r["knobs"]]))
        r.update({f"{k}_gbps": v for k, v in baselines.items()})
        if kernels:
            r["compile_kernels"] = kernels
    print(f"\n{case.name}: " + ", ".join(f"{k} {v:.0f}" for k, v in baselines.items()))
    for k in kernels:
        print(f"  torch.compile: {json.dumps(k)}")
    default = rows[0]["gbps"]
    for r in sorted(rows, key=lambda r: -(r["gbps"] or 0)):
        ok = {True: "ok", False: "WRONG", None: "ERR"}[r["correct"]]
        rate = f"{r['gbps']:.0f}" if r["gbps"] else "-"
        rel = f"{r['gbps'] / default:.2f}x" if r["gbps"] and default else ""
        print(f"  {rate:>6} {rel:>6} {ok:>5} {json.dumps(r['knobs'])} | "
              f"{r['plan'] or r['error']}")  # fmt: skip
    return rows


_seen_kernels: set[int] = set()  # torch.compile's kernels already reported


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("plan", type=Path)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    args = parser.parse_args(argv)
    runs = load_plan(args.plan)
    start = time.perf_counter()
    jobs = [(case.name, knobs) for case, knobs in runs]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(_precompile, jobs))
    compile_errors = dict(zip(map(json.dumps, jobs), results))
    failed = [(job, err) for job, err in zip(jobs, results) if err]
    print(f"compiled {len(jobs)} variants in {time.perf_counter() - start:.1f} s; "
          f"{len(failed)} failed", flush=True)  # fmt: skip
    for (name, knobs), err in failed[:3]:
        print(f"  {name} {json.dumps(knobs)}: {err[:2000]}")
    if not torch.cuda.is_available():
        print("no CUDA GPU: compiled only", file=sys.stderr)
        return 0 if not any(compile_errors.values()) else 1
    timer = make_timer(quick=True)
    ceiling = measure_copy_ceiling(timer)
    print(f"{torch.cuda.get_device_name()}: copy ceiling {ceiling:.0f} GB/s", flush=True)
    records: list[dict[str, Any]] = []
    to_compile = compiled_cases(args.plan)
    out = args.out / f"sweep-{args.plan.stem}.json"
    for case in dict.fromkeys(c for c, _ in runs):
        combos = [knobs for c, knobs in runs if c is case]
        records += sweep_case(case, combos, compile_errors, timer,
                              args.compile or case.name in to_compile, args.out)  # fmt: skip
        torch.cuda.empty_cache()
        # written after each case: a call cut short by its time limit keeps what it timed
        write_json(out, {"device": torch.cuda.get_device_name(), "copy_ceiling_gbps": ceiling,
                         "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "plan": json.loads(args.plan.read_text()), "records": records})  # fmt: skip
    print(f"\nwrote {out} ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
