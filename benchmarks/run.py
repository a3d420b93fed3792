"""Run the benchmark suite on the GPU, in one process.

    python -m benchmarks.run [--family pointwise] [--quick] [-k NAME] [--out DIR] [--rounds N]

Per case: fresh random inputs, one fusion run to compile, a check against eager, then the
fusion, eager and torch.compile timed in this same run, in turn, over --rounds rounds (the
median of each is kept), with the device-to-device copy ceiling measured at the start.
Results are merged by family into DIR/<device-slug>.json (default benchmarks/results), so
families can be run separately; a run with -k replaces only the cases it ran, and the
family's note says so. On the lent GPU machine,
copy the committed JSON into $OUT first and pass `--out $OUT` to get the merged file back.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import traceback
import zlib
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from benchmarks.cases import FAMILIES, Case, as_list, select, short_dtype

DEFAULT_FAMILIES = ("pointwise", "host")
# Each figure is the median of this many rounds, the fusion, eager and torch.compile timed in
# turn in every round. One do_bench median of a 4 to 16 MiB case moved by up to 9% from one
# call to the next with the same kernel (benchmarks/results/sweep-tiny_pointwise.json), and
# torch.compile's figure for one such case from 73 to 672 GB/s across runs; interleaved
# rounds give each contender the same draws of the machine's state.
ROUNDS = 3
RESULTS_DIR = Path(__file__).parent / "results"
CEILING_BYTES = 2**30
ERROR_CHARS = 4000  # enough for a compiler log's head; the full traceback goes to stderr

Timer = Callable[[Callable[[], Any]], float]  # fn -> median milliseconds per call


# --- Timing -----------------------------------------------------------------------------------


def make_timer(quick: bool) -> Timer:
    """triton's do_bench (median, L2 flushed between calls), else CUDA events."""
    warmup, rep = (10, 40) if quick else (25, 100)
    try:
        from triton.testing import do_bench
    except ImportError:
        print("triton is missing: timing with CUDA events instead", file=sys.stderr)
        return bench_with_events

    def timer(fn: Callable[[], Any]) -> float:
        return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))

    return timer


def bench_with_events(fn: Callable[[], Any], reps: int = 100, warmup: int = 10) -> float:
    """Median ms of `reps` calls after `warmup`, each timed alone after flushing L2."""
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for _ in range(warmup):
        fn()
    return statistics.median(call_times_ms(fn, reps, flush.zero_))


def call_times_ms(fn: Callable[[], Any], reps: int, before: Callable[[], Any]) -> list[float]:
    """The ms of each of `reps` calls of `fn`, timed alone with CUDA events, `before` (an L2
    flush) running ahead of each outside the timing."""
    events = []
    for _ in range(reps):
        before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


def time_per_call(fn: Callable[[], Any], batches: int = 30, calls: int = 200) -> float:
    """Host wall time per call in ms: the median over batches, synchronizing only at the end
    of a batch so the host cost of launching is what is measured."""
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        per_call.append((time.perf_counter() - start) / calls)
    return statistics.median(per_call) * 1e3


def measure_copy_ceiling(timer: Timer, nbytes: int = CEILING_BYTES) -> float:
    """Device-to-device copy GB/s (read plus write): the practical ceiling of this run."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    return gbps(2 * nbytes, timer(lambda: dst.copy_(src)))


def gbps(nbytes: int, ms: float | None) -> float | None:
    return nbytes / (ms * 1e-3) / 1e9 if ms else None


# --- One case ---------------------------------------------------------------------------------


def describe(e: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(e), e)).strip()
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + " ..."


def run_case(case: Case, ceiling: float, timer: Timer, rounds: int = ROUNDS) -> dict[str, Any]:
    """Everything about one case; any exception marks the stage failed and the run goes on."""
    record: dict[str, Any] = {
        "name": case.name, "op": case.op, "family": case.family,
        "dtype": short_dtype(case.dtype), "shape": list(case.shape),
        "bytes": case.bytes_moved, "large": case.large,
        "correct": None, "max_err": None, "error": None, "first_call_s": None,
        "fusion_ms": None, "eager_ms": None, "compile_ms": None,
    }
    errors: list[str] = []
    measure = time_per_call if case.family == "host" else timer

    def stage(label: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - a library failure marks the case, not the run
            traceback.print_exc()
            errors.append(f"{label}: {describe(e)}")
            return None

    torch.manual_seed(seed_for(case.name))
    inputs = stage("inputs", lambda: case.inputs("cuda"))
    if inputs is not None:
        fd = stage("build", case.build)
        outputs = stage("execute", lambda: first_call(record, fd, inputs)) if fd else None
        if outputs is not None:
            check = stage("check", lambda: case.check(inputs, outputs))
            if check is not None:
                record["max_err"], problem = check
                record["correct"] = problem is None
                if problem:
                    errors.append(f"check: {problem[:ERROR_CHARS]}")
        runs = {"fusion": (lambda: fd.execute(inputs)) if outputs is not None else None,
                "eager": lambda: case.eager(*inputs),
                "compile": stage("torch.compile", lambda: compiled_for(case, inputs))}
        if case.size_matched:
            runs["size_copy"] = size_matched_copy(case.bytes_moved)
        for label, times in timed_rounds(runs, measure, stage, rounds).items():
            record[f"{label}_ms"] = statistics.median(times) if times else None
            record[f"{label}_rounds_ms"] = times
    record["error"] = "\n".join(errors) or None
    add_rates(record, ceiling)
    return record


def timed_rounds(runs: dict[str, Callable[[], Any] | None], measure: Timer, stage: Callable,
                 rounds: int) -> dict[str, list[float]]:  # fmt: skip
    """Milliseconds of each callable in each of `rounds` rounds, all timed in turn within a
    round; one that fails is timed no more."""
    times: dict[str, list[float]] = {label: [] for label in runs}
    live = {label: fn for label, fn in runs.items() if fn is not None}
    for _ in range(rounds):
        for label, fn in list(live.items()):
            ms = stage(f"time {label}", lambda fn=fn: measure(fn))
            if ms is None:
                del live[label]
            else:
                times[label].append(ms)
    return times


def size_matched_copy(nbytes: int) -> Callable[[], Any]:
    """A device-to-device copy moving `nbytes` (half read, half written), timed as the case
    is: what a kernel of that size reaches under the same timer, launch, ramp and tail and
    the flush's dirty lines included. Reported as pct_of_size_copy beside pct_of_ceiling
    (the 1 GiB copy), which stays the figure a case is judged by."""
    src = torch.empty(nbytes // 2 // 16 * 16, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def seed_for(name: str) -> int:
    # Fresh data per case, yet the same on a rerun, so a failure can be reproduced.
    return zlib.crc32(name.encode())


def first_call(record: dict[str, Any], fd: Any, inputs: list[torch.Tensor]) -> list:
    """Run once, compiling; the wall time of that first call is worth keeping."""
    start = time.perf_counter()
    outputs = as_list(fd.execute(inputs))
    torch.cuda.synchronize()
    record["first_call_s"] = time.perf_counter() - start
    return outputs


def compiled_for(case: Case, inputs: list[torch.Tensor]) -> Callable[[], Any]:
    """torch.compile of the case's eager function, compiled by one call on `inputs`."""
    # A reset per case: static shapes, as a user with one shape gets, and no recompile limit.
    torch._dynamo.reset()
    compiled = torch.compile(case.eager, dynamic=False)
    compiled(*inputs)
    torch.cuda.synchronize()
    return lambda: compiled(*inputs)


def add_rates(record: dict[str, Any], ceiling: float) -> None:
    fusion, eager, compiled = record["fusion_ms"], record["eager_ms"], record["compile_ms"]
    throughput = record["family"] != "host"  # host cases measure launch cost, not bandwidth
    for label, ms in (("fusion", fusion), ("eager", eager), ("compile", compiled)):
        record[f"{label}_gbps"] = gbps(record["bytes"], ms) if throughput else None
    fused = record["fusion_gbps"]
    record["pct_of_ceiling"] = 100 * fused / ceiling if fused else None
    record["speedup_vs_eager"] = eager / fusion if fusion and eager else None
    record["speedup_vs_compile"] = compiled / fusion if fusion and compiled else None
    if record.get("size_copy_ms"):  # Case.size_matched
        record["size_copy_gbps"] = gbps(record["bytes"], record["size_copy_ms"])
        record["pct_of_size_copy"] = 100 * fused / record["size_copy_gbps"] if fused else None


# --- The run ----------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": None,
        "fusion_cache": None,
        "python": platform.python_version(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    try:
        import fusion_cache

        version = fusion_cache.version
        env["fusion_cache"] = str(version() if callable(version) else version)
    except Exception as e:  # noqa: BLE001 - the library is unfinished; say so and go on
        print(f"no fusion_cache version: {describe(e)}", file=sys.stderr)
    return env


def cache_stats() -> Any:
    """FusionCache.get().stats() as JSON data, or None while the library lacks it."""
    try:
        from fusion_cache import FusionCache

        stats = FusionCache.get().stats()
    except Exception as e:  # noqa: BLE001 - the library is unfinished; say so and go on
        print(f"no FusionCache stats: {describe(e)}", file=sys.stderr)
        return None
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        stats = dataclasses.asdict(stats)
    return json.loads(json.dumps(stats, default=repr))


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def merge_results(path: Path, run: dict[str, Any], families: dict[str, Any],
                  pattern: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The file at `path` with this run's families replaced and the others kept. A run of
    some cases only (`-k pattern`) replaces those cases by name and keeps the family's
    others and its header; the family's note says which cases a later run measured."""
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            print(f"ignoring unreadable {path}: {e}", file=sys.stderr)
    data.update(run)  # the top level describes the latest run
    kept = data.setdefault("families", {})
    for family, ran in families.items():
        before = kept.get(family)
        if pattern is None or not before:
            kept[family] = ran
            continue
        fresh = {c["name"]: c for c in ran["cases"]}
        cases = [fresh.pop(c["name"], c) for c in before["cases"]] + list(fresh.values())
        note = (f"cases matching '{pattern}' ({len(ran['cases'])}) re-measured in the run of "
                f"{run.get('date')}, copy ceiling {run.get('copy_ceiling_gbps', 0):.0f} GB/s")  # fmt: skip
        earlier = before.get("note")  # an earlier partial run's note stays
        kept[family] = {**before, "cases": cases, "note": f"{earlier}; {note}" if earlier else note}
    return data


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)  # a run killed mid-write leaves the old file whole


def print_table(records: list[dict[str, Any]], ceiling: float) -> None:
    def cell(value: float | None, fmt: str, unit: str = "", width: int = 8) -> str:
        return (format(value, fmt) + unit if value is not None else "-").rjust(width)

    print(f"\ncopy ceiling {ceiling:.0f} GB/s")
    print(f"{'case':<34} {'ok':>4} {'fusion':>8} {'eager':>8} {'compile':>8} {'%ceil':>6} "
          f"{'x comp':>6}")
    for r in records:
        ok = {True: "yes", False: "NO", None: "ERR"}[r["correct"]]
        if r["family"] == "host":  # per-call host time instead of bandwidth
            cells = [cell(r[f"{k}_ms"] and r[f"{k}_ms"] * 1e3, ".1f", "us")
                     for k in ("fusion", "eager", "compile")]
        else:
            cells = [cell(r[f"{k}_gbps"], ".0f") for k in ("fusion", "eager", "compile")]
        pct = cell(r["pct_of_ceiling"], ".0f", "%", 6)
        ratio = cell(r["speedup_vs_compile"], ".2f", "", 6)
        size = (f"  ({r['pct_of_size_copy']:.0f}% of a {r['size_copy_gbps']:.0f} GB/s copy of its "
                "size)" if r.get("pct_of_size_copy") else "")  # fmt: skip
        print(f"{r['name']:<34} {ok:>4} {' '.join(cells)} {pct} {ratio}{size}")
    print("GB/s: bytes read + written once over the median time; "
          "x comp: torch.compile time / fusion time")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", action="append", choices=[*FAMILIES, "all"],
                        help=f"repeatable; default: {' and '.join(DEFAULT_FAMILIES)}")
    parser.add_argument("--quick", action="store_true",
                        help="first shape per op and dtype, shorter timing")
    parser.add_argument("-k", dest="pattern",
                        help="only cases whose name contains this (or one of its comma-separated parts)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results folder")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"interleaved timing rounds a case, median taken (default {ROUNDS})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.run needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    families = list(FAMILIES) if "all" in (args.family or []) else args.family or DEFAULT_FAMILIES
    families = list(dict.fromkeys(families))
    cases = select(families, args.quick, args.pattern)
    env = environment()
    timer = make_timer(args.quick)
    ceiling = measure_copy_ceiling(timer)
    torch.cuda.empty_cache()
    print(f"{env['device']}: copy ceiling {ceiling:.0f} GB/s; {len(cases)} cases", flush=True)

    records = []
    for i, case in enumerate(cases, 1):
        start = time.perf_counter()
        record = run_case(case, ceiling, timer, max(1, args.rounds))
        records.append(record)
        gc.collect()
        torch.cuda.empty_cache()
        status = "ok" if record["correct"] else "FAILED"
        # the rates too: a call cut short by its time limit still tells what it measured
        rates = " ".join(f"{k} {record[f'{k}_gbps']:.0f}" for k in ("fusion", "eager", "compile")
                         if record.get(f"{k}_gbps"))  # fmt: skip
        print(f"[{i}/{len(cases)}] {case.name}: {status} ({time.perf_counter() - start:.1f} s)"
              f"{' GB/s ' + rates if rates else ''}", flush=True)

    run = {**env, "copy_ceiling_gbps": ceiling}
    stats = cache_stats()
    ran = {fam: {**run, "quick": args.quick, "cache_stats": stats,
                 "cases": [r for r in records if r["family"] == fam]}
           for fam in families if any(r["family"] == fam for r in records)}
    path = args.out / f"{device_slug(env['device'])}.json"
    write_json(path, merge_results(path, run, ran, args.pattern))
    print_table(records, ceiling)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
