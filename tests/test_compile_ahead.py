"""Note [Compiles ahead]: the backend plans each region when it lowers a graph and hands the
kernels to a thread pool; the region's first call takes them instead of compiling. Run on
the CPU with stub launches (benchmarks/host_region.py): plans for the h100 profile, NVRTC
compiling here."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from benchmarks.host_region import stub_launches
from fusion_cache import FusionCache
from fusion_cache.frontends import dynamo_backend
from fusion_cache.runtime import compile_ahead


@pytest.fixture(autouse=True)
def no_compiles_pending():
    """Compiles queued by an earlier test's regions that never ran would count as this one's."""
    from fusion_cache.runtime import pending_compiles

    pending_compiles.drain()


def _block(x, w, b, r):
    h = F.gelu(x * 2 + r, approximate="tanh")
    return F.layer_norm(h, [h.shape[-1]], w, b) * 3, h.sum(0)


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen) for s in ((64, 256), (256,), (256,), (64, 256))]


def _compiled(count):
    return FusionCache.get().stats().get(count, 0)


def _lower_and_run(inputs):
    with stub_launches():
        gm = make_fx(_block, tracing_mode="fake")(*inputs)
        report = dynamo_backend.fuse_graph(gm, "forward")
        queued = compile_ahead.pending()
        before = _compiled("kernels_compiled")
        gm(*inputs)
    return report, queued, before


def test_a_regions_kernels_compile_in_the_pool_and_its_first_call_takes_them():
    report, queued, _ = _lower_and_run(_inputs())
    assert report["regions"] == 1 and report["planned_ahead"] == 1, report
    assert queued >= 1
    assert compile_ahead.pending() == 0  # every one taken by the first call
    # compiled once each: by the pool, none again at the first call
    compiled = _compiled("kernels_compiled")
    assert compiled == queued, (compiled, queued)


def test_a_warm_store_plans_nothing_ahead():
    _lower_and_run(_inputs())
    compiled = _compiled("kernels_compiled")
    FusionCache.reset()  # a new process on the same store
    report, queued, _ = _lower_and_run(_inputs())
    assert report["planned_ahead"] == 0 and queued == 0
    assert _compiled("kernels_compiled") == 0 and _compiled("kernels_loaded") == compiled


def test_turned_off_the_first_call_compiles(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_COMPILE_AHEAD", "0")
    report, queued, before = _lower_and_run(_inputs())
    assert report["planned_ahead"] == 0 and queued == 0 and before == 0
    assert _compiled("kernels_compiled") >= 1


@pytest.mark.parametrize("offset", [0, 3])
def test_stand_ins_keep_sizes_strides_and_offsets(offset):
    base = torch.randn(40)
    view = base.as_strided((4, 3), (1, 8), offset)
    meta = compile_ahead.stand_in(view)
    assert meta.is_meta and meta.shape == view.shape and meta.stride() == view.stride()
    assert meta.storage_offset() == offset and meta.dtype == view.dtype
    scalar = compile_ahead.stand_in(torch.tensor(2.0))
    assert scalar.device.type == "cpu" and scalar.dim() == 0


def _segmented(x, w, r):
    h = F.gelu(x * 2 + r, approximate="tanh")
    y = h @ w
    return torch.softmax(y, -1) * 3, y.sum(0)


def _plans() -> list:
    """What every executor of this process planned: kind and description."""
    executors = FusionCache.get().executors.values()
    return sorted((type(p).__name__, getattr(p, "description", "") or p.spec.description)
                  for ex in executors for p in ex.plans.values())  # fmt: skip


def test_the_first_call_takes_the_plans_made_ahead(monkeypatch):
    """Note [Plans kept from ahead]: neither the segmentation nor a segment's kernels are
    planned again at the first call, and the plans are those a first call makes alone."""
    from fusion_cache.runtime import executor
    from schedulers import segmenter

    calls = []
    segment, plan_for = segmenter.segment, executor.plan_for
    monkeypatch.setattr(segmenter, "segment", lambda *a, **k: calls.append("segment") or
                        segment(*a, **k))  # fmt: skip
    monkeypatch.setattr(executor, "plan_for", lambda *a, **k: calls.append("plan_for") or
                        plan_for(*a, **k))  # fmt: skip
    inputs = _inputs()
    inputs = [inputs[0], torch.randn(256, 128), inputs[3]]
    with stub_launches():
        gm = make_fx(_segmented, tracing_mode="fake")(*inputs)
        dynamo_backend.fuse_graph(gm, "forward")
        assert "segment" in calls and "plan_for" in calls  # planned ahead
        calls.clear()
        gm(*inputs)
    assert calls == []
    ahead = _plans()
    monkeypatch.setenv("FUSION_CACHE_COMPILE_AHEAD", "0")
    FusionCache.reset()
    with stub_launches():
        gm = make_fx(_segmented, tracing_mode="fake")(*inputs)
        dynamo_backend.fuse_graph(gm, "forward")
        assert calls == []
        gm(*inputs)
    assert "segment" in calls and "plan_for" in calls  # planned at the first call this time
    assert _plans() == ahead and any(kind == "SegmentedPlan" for kind, _ in ahead)


def test_kept_plans_turned_off_the_first_call_plans_again(monkeypatch):
    from fusion_cache.runtime import executor

    monkeypatch.setenv("FUSION_CACHE_KEEP_AHEAD_PLANS", "0")
    calls = []
    plan_for = executor.plan_for
    monkeypatch.setattr(executor, "plan_for", lambda *a, **k: calls.append(1) or
                        plan_for(*a, **k))  # fmt: skip
    inputs = _inputs()
    with stub_launches():
        gm = make_fx(_block, tracing_mode="fake")(*inputs)
        dynamo_backend.fuse_graph(gm, "forward")
        calls.clear()
        gm(*inputs)
    assert calls
