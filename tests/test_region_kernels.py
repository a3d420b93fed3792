"""The kernels a training step's regions plan for an H100, counted on the CPU
(benchmarks.region_kernels on the tiny Llama-style model): what the segmenter saves shows
as fewer kernels, and no region lands on the reference evaluator."""
from __future__ import annotations

import pytest

from benchmarks.region_kernels import region_plans, summary
from schedulers.tuning import SWITCHES

# views a reader can take along; an expand then merged by a reshape (grouped-query attention's
# repeated key/value heads) is a real copy: torch's reshape copies it too
_VIEWS = {"reshape", "permute", "squeeze"}


@pytest.fixture(scope="module")
def llama_plans(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("FUSION_CACHE_DIR", str(tmp_path_factory.mktemp("store")))
    mp.setenv("FUSION_CACHE_DISABLE_FALLBACK", "1")
    for name in SWITCHES:  # Note [Unmeasured switches]: what they save is counted here
        mp.setenv(f"FUSION_CACHE_{name}", "1")
    try:
        yield region_plans("llama", tiny=True)
    finally:
        mp.undo()


def test_llama_regions_plan_no_reference_segment_and_fewer_kernels(llama_plans):
    total = summary(llama_plans)
    assert total["reference"] == 0
    # switches off: 63 generated kernels (backward: 44); Note [Views go with their readers]:
    # 52 (backward: 33); Note [Casts before views]: 46
    backward = sum(p.kernels for p in llama_plans if p.graph == "backward")
    assert backward <= 29, [(p.name, p.segments) for p in llama_plans if p.graph == "backward"]
    assert total["kernels"] <= 46


def test_no_generated_segment_only_copies_a_view(llama_plans):
    """A segment of reshapes, permutes and squeezes alone is a copy kernel: its readers take
    the views along (Note [Views go with their readers])."""
    copies = [(p.graph, p.name, desc) for p in llama_plans for _, k, desc, ops in p.segments
              if k and ops <= _VIEWS]  # fmt: skip
    assert not copies


def test_column_sums_over_two_leading_dims_plan_one_inner_outer_kernel(monkeypatch):
    """Note [Leading dims as rows]: planned for h100 on the CPU, and the reference evaluator
    (which runs it here) agrees with eager."""
    import torch
    from segment_patterns import (
        rms_norm_backward_3d,
        rms_norm_backward_3d_eager,
        rms_norm_backward_3d_inputs,
    )

    from fusion_cache.runtime.executor import executor_for
    from fusion_cache.runtime.plans import LaunchPlan

    monkeypatch.setenv("FUSION_CACHE_LEADING_ROWS", "1")  # Note [Unmeasured switches]
    fd = rms_norm_backward_3d(torch.float32)
    inputs = rms_norm_backward_3d_inputs(4, 16, 96, torch.float32, seed=5)
    fd.precompile([t.to("meta") for t in inputs], target="h100")
    plan = executor_for(fd).last_plan
    assert isinstance(plan, LaunchPlan) and plan.spec.scheduler == "inner_outer"
    for got, want in zip(fd.execute(inputs), rms_norm_backward_3d_eager(*inputs)):
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=1e-4)
