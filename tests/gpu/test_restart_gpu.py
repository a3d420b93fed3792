"""A restart on CUDA (issue 30, restarts): a new process on the warm fusion store and torch's
warm AOTAutograd cache (Note [AOT cache]) takes its graphs from the cache, compiles no kernel,
runs no reference evaluator and trains as the cold process did, with the same kernels."""
from __future__ import annotations

import argparse
import os

import pytest

from benchmarks import models
from benchmarks.model_defs import model_cases

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["gpt2", "llama", "resnet18"])
def test_a_warm_process_compiles_nothing_and_trains_as_the_cold_one(name):
    case = next(c for c in model_cases(tiny=True) if c.name == name)
    cold = models.run_contender("fusion_cache", case, 3, "cuda")
    assert cold["counters"]["kernels_compiled"] > 0
    assert cold["aot_cache"]["saved"] >= 1 and cold["aot_cache"]["hit"] == 0
    args = argparse.Namespace(steps=3, device="cuda", tiny=True, stub=False)
    warm = models.run_warm_child(case, args, os.environ["FUSION_CACHE_DIR"])
    assert "error" not in warm, warm.get("error")
    assert warm["aot_cache"]["hit"] == cold["aot_cache"]["saved"]
    assert warm["aot_cache"]["miss"] == 0 and warm["aot_cache"]["bypass"] == 0
    assert warm["counters"]["kernels_compiled"] == 0
    assert warm["counters"]["reference_runs"] == 0
    assert warm["kernels"] == cold["kernels"]
    assert warm["fused_ops"] == cold["fused_ops"] and warm["regions"] == cold["regions"]
    # the same kernels on the same batches: the losses follow the cold run's
    assert warm["losses"] == pytest.approx(cold["losses"], rel=1e-3)
