"""Errors of the GPU path name the fusion once (issue #32, item 10): a segmented fusion whose
middle segment no scheduler takes, run with fallback disabled, said "fusion 22: fusion 23:
fusion 23: no scheduler takes it ... (fallback is disabled) (fallback is disabled) (fallback
is disabled)"."""
from __future__ import annotations

import re

import pytest
import torch

from fusion_cache import DataType, FusionDefinition
from fusion_cache.runtime import execute, executor
from fusion_cache.runtime.reference import run_reference


def define_relu_cat_exp() -> FusionDefinition:
    """Segments: pointwise, cat (no scheduler takes it), pointwise."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        y = fd.ops.relu(x)
        fd.add_output(fd.ops.exp(fd.ops.cat([y, y], 1)))
    return fd


def assert_names_the_fusion_once(message: str) -> None:
    named = re.findall(r"fusion \d+:", message)
    assert len(named) == 1, message
    assert message.count("(fallback is disabled)") == 1, message
    assert "no scheduler takes it" in message and "cat (T" in message, message


@pytest.fixture
def cpu_as_gpu(monkeypatch):
    """The GPU path on a CPU machine: plans made for the h100 profile without loading, and a
    plan's kernels run as the reference evaluator; the wrapping of errors is the real one."""
    from schedulers.device import profile_by_name

    def plan(self, values, key):
        found = self.plans.get(key)
        if found is None:
            try:
                found = self.make_plan(values, profile_by_name("h100"), load=False)
            except executor.FusionUnsupportedError as why:
                found = executor.ReferencePlan(str(why))
            self.plans[key] = found
        return found

    real_launch = executor.FusionExecutor.launch

    def launch(self, plan, values):
        if isinstance(plan, executor.LaunchPlan):
            return run_reference(self.fd, values)
        return real_launch(self, plan, values)

    monkeypatch.setattr(executor.FusionExecutor, "plan", plan)
    monkeypatch.setattr(executor.FusionExecutor, "launch", launch)
    monkeypatch.setattr(execute, "_on_gpu", lambda values: True)
    monkeypatch.setattr(executor, "home_device", lambda values: 0)  # no CUDA to ask


def test_a_segment_without_a_scheduler_is_named_once(cpu_as_gpu):
    fd = define_relu_cat_exp()
    x = torch.randn(4, 8)
    for _ in range(2):  # the first run plans, the second takes the cached plans
        with pytest.raises(executor.FusionUnsupportedError) as caught:
            fd.execute([x])
        assert_names_the_fusion_once(str(caught.value))
        assert f"fusion {fd.id()}:" not in str(caught.value)  # the segment's own id


def test_with_fallback_the_same_fusion_runs_on_the_reference(cpu_as_gpu, monkeypatch):
    monkeypatch.delenv("FUSION_CACHE_DISABLE_FALLBACK")
    fd = define_relu_cat_exp()
    x = torch.randn(4, 8)
    with pytest.warns(UserWarning, match="runs on the reference evaluator"):
        (out,) = fd.execute([x])
    torch.testing.assert_close(out, torch.exp(torch.cat([x.relu(), x.relu()], 1)))


@pytest.mark.gpu
def test_a_segment_without_a_scheduler_is_named_once_on_the_gpu():
    fd = define_relu_cat_exp()
    with pytest.raises(executor.FusionUnsupportedError) as caught:
        fd.execute([torch.randn(64, 128, device="cuda")])
    assert_names_the_fusion_once(str(caught.value))
