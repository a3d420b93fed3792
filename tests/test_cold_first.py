"""benchmarks/cold_first.py on the CPU (stub launches, tiny model): a cold run in a new process
on fresh caches compiles its kernels and plans nothing on the reference evaluator; a run
after it on the same caches (`_warm`) compiles nothing."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks import cold_first

ROOT = str(Path(__file__).resolve().parents[1])


def test_cold_then_warm_in_new_processes(tmp_path, monkeypatch):
    monkeypatch.delenv("FUSION_CACHE_DISABLE_FALLBACK", raising=False)  # eager runs CPU ops
    runs = [["cold", ROOT, "resnet18", "fusion_cache", {}, 0],
            ["warm", ROOT, "resnet18", "fusion_cache", {"_warm": 1}, 0]]  # fmt: skip
    rows = cold_first.run_all(str(tmp_path), runs, 600, ["--tiny", "--stub"])
    assert [r["label"] for r in rows] == ["cold", "warm"]
    cold, warm = (r["counters"] for r in rows)
    assert cold["kernels_compiled"] > 0 and warm["kernels_compiled"] == 0
    assert rows[0]["planned_ahead"] > 0 and rows[1]["planned_ahead"] == 0
    saved = json.loads((tmp_path / "cold-runs.json").read_text())
    assert len(saved) == 2 and "| cold |" in cold_first.table(saved)
