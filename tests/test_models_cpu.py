"""`python -m benchmarks.models` end to end on the CPU, tiny models: the script runs, writes
its results, and fusion_cache's losses match eager's (the reference evaluator runs the
regions here), in this process and in a new one on the warm store."""
from __future__ import annotations

import json

import pytest

from benchmarks import models


@pytest.fixture(autouse=True)
def restored_cache_env(monkeypatch, tmp_path):
    """The script points these at its fresh caches: undone after each test."""
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))


def _run(tmp_path, *extra: str) -> dict:
    out = tmp_path / "results"
    assert models.main(["--tiny", "--device", "cpu", "--steps", "3", "--out", str(out),
                        "--caches", str(tmp_path / "caches"),
                        "--contenders", "eager,fusion_cache", *extra]) == 0  # fmt: skip
    (path,) = out.glob("models-*-tiny.json")
    assert path.with_suffix(".md").read_text().startswith("# Training steps")
    return json.loads(path.read_text())


def _check_losses(row: dict, eager: dict) -> None:
    assert "error" not in row, row.get("error")
    assert len(row["losses"]) == 3
    for got, want in zip(row["losses"], eager["losses"]):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5)


def test_gpt2_with_a_warm_process(tmp_path):
    data = _run(tmp_path, "--models", "gpt2", "--warm-without-aot")
    (gpt,) = data["models"]
    rows = gpt["contenders"]
    for name in ("fusion_cache", "fusion_cache_warm", "fusion_cache_warm_noaot"):
        _check_losses(rows[name], rows["eager"])
        assert rows[name]["regions"] > 0 and rows[name]["ops_fused"] > 0
        assert rows[name]["median_ms"] > 0 and rows[name]["first_step_s"] > 0
    # the same graphs, regions and fusions in the new process, with torch's AOTAutograd cache
    # (Note [AOT cache]) and without it
    assert rows["fusion_cache_warm"]["fused_ops"] == rows["fusion_cache"]["fused_ops"]
    assert rows["fusion_cache_warm_noaot"]["fused_ops"] == rows["fusion_cache"]["fused_ops"]
    assert rows["fusion_cache"]["aot_cache"]["saved"] == 1
    assert rows["fusion_cache_warm"]["aot_cache"]["hit"] == 1
    assert rows["fusion_cache_warm_noaot"]["aot_cache"] == {"hit": 0, "miss": 0, "bypass": 0,
                                                            "saved": 0}  # fmt: skip
    # ops left to eager are listed with reasons (none since embedding_fwd and
    # index_put_accumulate landed: GPT-2's embedding and its backward fuse too)
    assert isinstance(rows["fusion_cache"]["eager_ops"], dict)
    assert all(isinstance(why, str) for whys in rows["fusion_cache"]["eager_ops"].values()
               for why in whys)  # fmt: skip


def test_a_cold_run_in_a_new_process(tmp_path):
    """--cold-process: fusion_cache's cold run is a new process on the empty caches (it
    misses torch's AOTAutograd cache and saves the entry), the warm one a new process after
    it (it hits). No kernel compiles here: the CPU runs the regions on the reference."""
    data = _run(tmp_path, "--models", "gpt2", "--cold-process")
    rows = data["models"][0]["contenders"]
    for name in ("fusion_cache", "fusion_cache_warm"):
        _check_losses(rows[name], rows["eager"])
    cold, warm = rows["fusion_cache"], rows["fusion_cache_warm"]
    assert cold["new_process"]
    assert cold["aot_cache"]["miss"] == 1 and cold["aot_cache"]["saved"] == 1
    assert warm["aot_cache"]["hit"] == 1 and warm["fused_ops"] == cold["fused_ops"]


def test_torchs_floor_and_dynamos_cache(tmp_path):
    """Note [Torch's floor]: aot_eager and dynamo_eager in new processes; Note [Dynamo's cache]:
    the warm process loads dynamo's cache and traces nothing, with eager's losses."""
    out = tmp_path / "results"
    assert models.main(["--tiny", "--device", "cpu", "--steps", "3", "--out", str(out),
                        "--caches", str(tmp_path / "caches"), "--models", "llama",
                        "--cold-process", "--dynamo-cache",
                        "--contenders", "eager,fusion_cache,aot_eager,dynamo_eager"]) == 0
    (path,) = out.glob("models-*-tiny.json")
    assert "## Torch's floor" in path.with_suffix(".md").read_text()
    rows = json.loads(path.read_text())["models"][0]["contenders"]
    for name in ("fusion_cache", "fusion_cache_warm", "fusion_cache_warm_traced", "aot_eager",
                 "dynamo_eager"):  # fmt: skip
        _check_losses(rows[name], rows["eager"])
        assert rows[name]["new_process"] if name in models.FLOORS else True
    assert "_compile.compile_inner" not in rows["fusion_cache_warm"]["tracing_s"]
    assert rows["fusion_cache_warm_traced"]["tracing_s"]["_compile.compile_inner"] > 0
    assert rows["fusion_cache_warm"]["fused_ops"] == rows["fusion_cache"]["fused_ops"]


def test_llama_and_resnet(tmp_path):
    data = _run(tmp_path, "--models", "llama,resnet18", "--no-warm")
    assert [m["model"] for m in data["models"]] == ["llama", "resnet18"]
    for m in data["models"]:
        rows = m["contenders"]
        assert set(rows) == {"eager", "fusion_cache"}
        _check_losses(rows["fusion_cache"], rows["eager"])
        assert rows["fusion_cache"]["max_loss_diff"] < 1e-3


def test_llama_with_the_switches_on(tmp_path):
    """Note [Unmeasured switches]: the contender with every switch on trains as eager does."""
    data = _run(tmp_path, "--models", "llama", "--no-warm", "--contenders",
                "eager,fusion_cache_switched")  # fmt: skip
    rows = data["models"][0]["contenders"]
    _check_losses(rows["fusion_cache_switched"], rows["eager"])
    assert rows["fusion_cache_switched"]["regions"] > 0


def test_gpt2_in_whole_regions(tmp_path, monkeypatch):
    """FUSION_CACHE_WHOLE_REGIONS (Note [Region cuts]): one region a graph where the cuts
    after each attention op made a region a layer, training as eager does."""
    monkeypatch.setenv("FUSION_CACHE_WHOLE_REGIONS", "1")
    data = _run(tmp_path, "--models", "gpt2", "--no-warm")
    rows = data["models"][0]["contenders"]
    _check_losses(rows["fusion_cache"], rows["eager"])
    assert rows["fusion_cache"]["regions"] == 2  # the forward's and the backward's


def test_eager_again_and_deterministic(tmp_path):
    """Note [Loss deviation]: eager run a second time is a contender (its loss diff is eager's
    own deviation, 0 on the CPU), and --deterministic names itself in the results."""
    import torch

    flags = [(torch.backends.cudnn, n) for n in ("deterministic", "benchmark", "allow_tf32")]
    flags.append((torch.backends.cuda.matmul, "allow_tf32"))
    # torch's precision settings last: setting allow_tf32 back leaves matmul's fp32_precision
    # "ieee" where it was "none", a change of torch's configuration that keys the AOTAutograd
    # cache, so a later test's warm process missed the entry its cold run saved
    flags += [(m, "fp32_precision") for m in (torch.backends.cuda.matmul, torch.backends.cudnn)
              if hasattr(m, "fp32_precision")]  # fmt: skip
    saved = [getattr(m, n) for m, n in flags]
    out = tmp_path / "results"
    try:
        assert models.main(["--tiny", "--device", "cpu", "--steps", "2", "--out", str(out),
                            "--caches", str(tmp_path / "caches"), "--models", "resnet18",
                            "--no-warm", "--deterministic", "--contenders",
                            "eager,eager_again"]) == 0  # fmt: skip
    finally:  # the process's settings: the next test gets torch's defaults back
        for (m, n), v in zip(flags, saved):
            setattr(m, n, v)
    (path,) = out.glob("models-*-tiny-deterministic.json")
    data = json.loads(path.read_text())
    assert data["meta"]["deterministic"] is True
    again = data["models"][0]["contenders"]["eager_again"]
    assert again["max_loss_diff"] == 0.0 and again["first_grad_rel_diff"] == 0.0
    assert "deterministic cuDNN" in path.with_suffix(".md").read_text()
