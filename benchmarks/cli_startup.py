"""Whole-process times of `fusion-cache` commands (no GPU): python -m benchmarks.cli_startup

Each command runs --runs times as a fresh process on a store of --fusions fusions made
first in a temporary FUSION_CACHE_DIR; prints min / median / max seconds per command and
whether the process imported torch. The targets (issue #32): --help under 0.3 s, ls,
stats and show under 1 s.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

COMMANDS = [["--help"], ["ls"], ["stats"], ["show", "0"], ["show", "999999"]]
# the entry point's own code, plus a report of whether torch came in
PROBE = ("import sys; from fusion_cache.cli import main; code = main({argv!r}); "
         "sys.stderr.write('TORCH %s\\n' % ('torch' in sys.modules)); sys.exit(code)")  # fmt: skip


def fill(directory: str, fusions: int) -> None:
    from fusion_cache.store import KernelMeta, open_store

    with open_store(cache_dir=directory) as store:
        for i in range(fusions):
            fid = store.fusion_id_for(f"key-{i}", "[]", "def nvfuser_fusion_id(fd):\n    pass\n")
            store.put_plan(fid, "[]", "sm_90", '{"scheduler": "pointwise", "plan": "p"}')
            meta = KernelMeta(f"k{i}", 90, "13.0", (), "// src", "pointwise", "{}", 1.0)
            store.put_kernel(f"kernel-{i}", b"\x7fELF" * 1000, meta)
            store.link_kernel(fid, f"kernel-{i}")


def time_command(argv: list[str], env: dict, runs: int) -> tuple[list[float], bool]:
    times, torch_seen = [], False
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], env=env,
                              capture_output=True, text=True)  # fmt: skip
        times.append(time.perf_counter() - start)
        torch_seen |= "TORCH True" in done.stderr
    return times, torch_seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--fusions", type=int, default=50)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        fill(directory, args.fusions)
        env = dict(os.environ, FUSION_CACHE_DIR=directory)
        env.pop("FUSION_CACHE_DB_URL", None)
        print(f"{'command':16} {'min':>6} {'median':>6} {'max':>6}  torch  ({args.runs} runs, "
              f"{args.fusions} fusions)")  # fmt: skip
        for argv in COMMANDS:
            times, torch_seen = time_command(argv, env, args.runs)
            print(f"{' '.join(argv):16} {min(times):6.2f} {statistics.median(times):6.2f} "
                  f"{max(times):6.2f}  {'yes' if torch_seen else 'no'}")  # fmt: skip


if __name__ == "__main__":
    main()
