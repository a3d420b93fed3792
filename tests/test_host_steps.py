"""benchmarks.host_steps on the CPU (stub launches, the tiny Llama-style model): every region
call of a training step is split into its steps, each kind timed against its bare work."""
from __future__ import annotations

import json

from benchmarks import host_steps


def test_host_steps_splits_every_region_call(tmp_path):
    out = tmp_path / "steps.json"
    assert host_steps.main(["--models", "llama", "--tiny", "--stub", "--warmup", "2",
                            "--reps", "1", "--rounds", "1", "--json", str(out)]) == 0  # fmt: skip
    (model,) = json.loads(out.read_text())["models"]
    assert model["region_calls"] == len(model["calls"]) > 0
    summary = model["summary"]
    assert {"kernel", "aten"} <= summary["kinds"].keys()
    assert summary["aten_ops"]["matmul"]["n"] > 0 and summary["python_calls"] > 0
    for call in model["calls"]:
        assert call["steps_us"] == sum(s["us"] for s in call["steps"])
        for step in call["steps"]:
            assert step["us"] > 0 and step["bare_us"] >= 0
            if step["kind"] == "aten":  # the torch call itself is among the bare calls
                assert any(name in ("matmul", "mm", "linear") or "attention" in name
                           for name in step["bare_calls"]), step  # fmt: skip
            if step["kind"] == "execute":
                assert step["why"]
