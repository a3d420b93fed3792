"""The examples run end to end on a CPU machine: the warmup command fills a store for a
named GPU, and a multi-process job on one cold store compiles each kernel once in total."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(args, store, **kw):
    env = dict(os.environ, FUSION_CACHE_DIR=str(store))
    return subprocess.run(args, env=env, capture_output=True, text=True, cwd=ROOT, timeout=300, **kw)


def test_warmup_then_restart_compiles_nothing(fresh_store):
    cli = [sys.executable, "-m", "fusion_cache.cli"]
    first = _run(cli + ["warmup", "examples/warmup_script.py", "--target", "h100"], fresh_store)
    assert first.returncode == 0, first.stderr
    assert "5 kernels compiled" in first.stdout
    again = _run(cli + ["warmup", "examples/warmup_script.py", "--target", "h100"], fresh_store)
    assert "0 kernels compiled, 5 already stored" in again.stdout
    listing = _run(cli + ["ls"], fresh_store)
    assert listing.returncode == 0 and len(listing.stdout.strip().splitlines()) == 6
    shown = _run(cli + ["show", "0", "--ir"], fresh_store)
    assert "Fusion IR:" in shown.stdout and "scheduler: pointwise" in shown.stdout
    assert _run(cli + ["verify"], fresh_store).returncode == 0


def test_multiprocess_job_compiles_each_kernel_once(fresh_store):
    out = _run([sys.executable, "examples/multiprocess_job.py", "--workers", "4"], fresh_store)
    assert out.returncode == 0, out.stderr
    assert "5 kernels compiled in total, fusion ids identical: True" in out.stdout


def test_bad_warmup_target_names_known_ones(fresh_store):
    out = _run([sys.executable, "-m", "fusion_cache.cli", "warmup", "examples/warmup_script.py",
                "--target", "h999"], fresh_store)  # fmt: skip
    assert out.returncode != 0 and "h100" in (out.stderr + out.stdout)

