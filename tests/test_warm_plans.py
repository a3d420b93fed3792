"""A process restarted on a warm store builds, for every region of a training step, the launch
sequence the cold process built: the same steps, kernels, grids, blocks and shared memory,
the same ATen calls, from the stored segmentations (no search) and stored cubins (no
compile). Run on the CPU with stub launches (benchmarks/host_region.py): plans are made for
the h100 profile as on the GPU machine, and nothing runs (the losses are meaningless here;
tests/test_models_cpu.py checks a warm process's losses against eager's)."""
from __future__ import annotations

import pytest
import torch

from benchmarks import models
from benchmarks.host_region import stub_launches
from benchmarks.model_defs import model_cases
from fusion_cache import FusionCache
from fusion_cache.frontends import dynamo_backend
from fusion_cache.runtime.sequence import AtenStep, ExecuteStep, KernelStep, PlanStep, TensorStep
from schedulers import segmenter


@pytest.fixture(autouse=True)
def _dynamo_for_cpu(fresh_dynamo, monkeypatch):
    """conftest's fresh_dynamo, with the fallback allowed: eager runs the CPU ops."""
    monkeypatch.delenv("FUSION_CACHE_DISABLE_FALLBACK", raising=False)


def _step_text(step) -> tuple:
    if isinstance(step, KernelStep):
        launches = tuple((b.kernel.name, b.grid, b.block, b.shared_mem, b.cooperative,
                          b.dependent) for b in step.launches)  # fmt: skip
        return ("kernel", step.plan.spec.description, launches,
                tuple(a[1:] for a in step.allocs), tuple(a[1:] for a in step.scratch))  # fmt: skip
    if isinstance(step, PlanStep):
        return ("plan", type(step.plan).__name__, step.plan.spec.description)
    if isinstance(step, TensorStep):
        return ("tensor", step.src, step.dst)
    if isinstance(step, AtenStep):  # Note [Prepared ATen calls]: the op, its operands and outputs
        call = step.call
        return ("aten", call.record.name, call.strides, call.outputs, step.reads, step.writes)
    assert isinstance(step, ExecuteStep)
    return ("execute", step.fd.id())


def _train(name: str) -> list:
    """Two steps of the tiny model through the backend; every region's recorded sequences."""
    case = next(c for c in model_cases(tiny=True) if c.name == name)
    torch._dynamo.reset()
    dynamo_backend.reset_reports()
    with stub_launches():
        model = models.initial_model(case, "cpu")
        fn = models.compiled("fusion_cache", model)
        models.train(fn, list(model.parameters()), case,
                                 models.batches_for(case, 2, "cpu"), "cpu")  # fmt: skip
    built = []
    for report in dynamo_backend._reports:
        for region in report.regions_list:
            for seq in region.sequences:
                built.append((report.graph, region.fusion_id, seq.describe(),
                              tuple(_step_text(s) for s in seq.steps)))  # fmt: skip
    return built


# every region compiles for the h100: a kernel NVRTC refuses would fall back with a warning
# (ResNet-18's batch-norm backward once declared a carried value twice)
@pytest.mark.filterwarnings("error::UserWarning:fusion_cache.runtime.engine")
@pytest.mark.parametrize("name", ["gpt2", "resnet18"])
def test_a_warm_process_builds_the_cold_plans(name, monkeypatch):
    cold = _train(name)
    assert cold and any(step[0] == "kernel" for *_, steps in cold for step in steps)
    FusionCache.reset()  # a new process: the same store, nothing in memory
    searched = []
    search = segmenter._Segmenter.run

    def counted(self):
        searched.append(1)
        return search(self)

    monkeypatch.setattr(segmenter._Segmenter, "run", counted)
    before = dict(FusionCache.get().stats())
    warm = _train(name)
    stats = FusionCache.get().stats()
    assert warm == cold
    assert stats.get("kernels_compiled", 0) == before.get("kernels_compiled", 0)
    assert not searched, "a warm process searched a segmentation the store holds"
