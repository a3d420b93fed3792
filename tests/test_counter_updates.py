"""Note [Counter updates] (fusion_cache/frontends/fx_counters.py): copy_(x, add(x, 1)) is one
eager add_, and with FUSION_CACHE_COUNTERS_REGION on (the default) a graph's counters are one region,
called where the last update was; a counter read after its update stays eager."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fusion_cache.frontends import dynamo_backend

pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def _counters(*values):
    # 1-element counters: a 0-d CPU tensor is a CPU scalar to a fusion, which cannot tell
    # the region's device (batch norm's, on a GPU, are 0-d CUDA tensors)
    return [torch.tensor([v]) for v in values]


def _step(c1, c2, c3, x):
    z = x * 2 + c1.float() + c3.float()  # read before the updates, which end the graph as
    c1.copy_(c1 + 1)  # AOTAutograd's buffer mutations do
    c2.copy_(c2 + 1)
    c3.copy_(c3 + 2)
    return z


def _fused(fn, args):
    gm = make_fx(fn)(*[a.clone() for a in args])
    with torch.no_grad():
        report = dynamo_backend.fuse_graph(gm, "forward")
    return gm, report


def test_counters_update_in_one_region(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_COUNTERS_REGION", "1")
    x = torch.randn(5)
    counters = _counters(3, -1, 7)
    gm, report = _fused(_step, [*counters, x])
    assert report["fused_ops"].get("add_") == 3 and "add_" not in report["eager_ops"], report
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert calls[-1].target.__name__.endswith("counters")  # at the last update's place
    want_counters = _counters(3, -1, 7)
    for _ in range(3):  # the recording call and replays
        with torch.no_grad():
            got = gm(*counters, x)
        want = _step(*want_counters, x)
        torch.testing.assert_close(got, want)
        for c, w in zip(counters, want_counters):
            torch.testing.assert_close(c, w)


def test_counter_read_after_its_update_stays_eager(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_COUNTERS_REGION", "1")

    def step(c1, c2, c3, x):
        c1.copy_(c1 + 1)
        y = x + c1.float()  # reads the updated counter: its update cannot move later
        c2.copy_(c2 + 1)
        c3.copy_(c3 + 1)
        return y

    x = torch.randn(4)
    counters = _counters(0, 5, 9)
    gm, report = _fused(step, [*counters, x])
    assert report["fused_ops"].get("add_") == 2, report
    assert set(report["eager_ops"]["add_"]) == {"no lowering for aten::add_"}, report
    want_counters = _counters(0, 5, 9)
    for _ in range(2):
        with torch.no_grad():
            got = gm(*counters, x)
        torch.testing.assert_close(got, step(*want_counters, x))
        for c, w in zip(counters, want_counters):
            torch.testing.assert_close(c, w)


def test_counters_stay_eager_add_without_the_switch(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_COUNTERS_REGION", "0")  # on by default
    x = torch.randn(5)
    counters = _counters(1, 2, 3)
    gm, report = _fused(_step, [*counters, x])
    assert report["eager_ops"]["add_"] == {"no lowering for aten::add_": 3}, report
    with torch.no_grad():
        gm(*counters, x)
    assert [int(c) for c in counters] == [2, 3, 5]


def test_a_region_read_before_an_eager_write_runs_before_it():
    """A region is called where its last node was: one that reads a tensor before an eager
    in-place write of it and computes more after the write is cut there (Note [Eager
    writes]), so its first half reads the value from before the write."""

    def step(x, c):
        y = x * 2 + c  # reads c before the eager write below
        c.copy_(c + 1)  # the counter rule makes this an eager add_
        return y * 3 + 1

    x, c = torch.randn(6), torch.randn(6)
    gm, report = _fused(step, [x, c])
    want_c = c.clone()
    for _ in range(3):
        with torch.no_grad():
            got = gm(x, c)
        want = step(x, want_c)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(c, want_c)
