"""Note [Eager views]: the view ops a fused graph keeps run as Tensor methods, and make the
same views as the aten ops they replace."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fusion_cache.frontends.eager_views import aten_op_of, fast_views

_aten = torch.ops.aten


def _views(x, w, r):
    a = w.t().t()  # a transpose of a transpose: a detach of w
    b = x.detach().detach()
    c = r[1:5].view(2, 2, 3)
    d = r[-3:100]  # slice clamps its end
    e = x.permute(1, 0).unsqueeze(0).expand(2, 6, 4)
    f = x.transpose(0, 1).select(0, 2)
    g = x.unsqueeze(1).squeeze(1)
    return a, b, c, d, e, f, g, w.t()


def _layout(t):
    return t.shape, t.stride(), t.storage_offset(), t.untyped_storage().data_ptr()


@pytest.mark.parametrize("old", [False, True], ids=["aliases", "old_host_path"])
def test_views_outside_regions_become_tensor_methods_with_the_same_views(old, monkeypatch):
    """Note [Views as aliases]: t(t(w)) is w and detach(detach(x)) is x; with the old path
    each keeps one op (a detach)."""
    monkeypatch.setenv("FUSION_CACHE_OLD_HOST_PATH", "1" if old else "0")
    args = (torch.randn(4, 6), torch.randn(3, 5), torch.randn(8, 3))
    gm = make_fx(_views)(*args)
    want = gm(*args)
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert fast_views(gm) > 0
    gm.recompile()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert not any(isinstance(t, torch._ops.OpOverload) for t in targets), targets
    assert len(targets) == len(ops) - (2 if old else 4)
    assert targets.count(torch.Tensor.detach) == (2 if old else 0)
    assert targets.count(torch.Tensor.narrow) == 2
    fresh = tuple(torch.randn_like(a) for a in args)  # fresh inputs of the same layouts
    for got, ref in zip(gm(*fresh), make_fx(_views)(*args)(*fresh)):
        assert _layout(got)[:3] == _layout(ref)[:3]
        assert got.untyped_storage().data_ptr() == ref.untyped_storage().data_ptr()
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    for got, ref in zip(gm(*args), want):
        assert _layout(got) == _layout(ref)


def _repeated(x, cos):
    a = cos[0:4].view(1, 4, 2)  # the rotary tables' slice and view, made per use
    b = cos[0:4].view(1, 4, 2)
    c = x.detach()
    return a * x, b + x, c, cos[0:4].view(1, 4, 2), cos[1:5]


def test_repeated_views_are_made_once_and_detaches_are_their_sources():
    """Note [Views as aliases]: the same view of the same arguments is one node, read by
    every reader of the others; a detach's readers read its source; the results hold the
    same values, layouts and storages as before."""
    args = (torch.randn(1, 4, 2), torch.randn(8, 2))
    gm = make_fx(_repeated)(*args)
    want = gm(*args)
    fast_views(gm)
    gm.recompile()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.Tensor.narrow) == 2  # [0:4] once, [1:5]
    assert targets.count(torch.Tensor.view) == 1
    assert torch.Tensor.detach not in targets and _aten.detach.default not in targets
    got = gm(*args)
    assert got[2] is args[0]
    for k, (g, w) in enumerate(zip(got, want)):
        assert _layout(g)[:3] == _layout(w)[:3]
        assert k < 2 or _layout(g) == _layout(w)  # the views: the same storage
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_rewritten_nodes_name_their_aten_ops(monkeypatch):
    """The fused graph's form (Note [Fused graph form]) keeps aten ops: each method node
    names the op it calls, squeeze by its argument (the detach kept: the old path)."""
    monkeypatch.setenv("FUSION_CACHE_OLD_HOST_PATH", "1")
    gm = make_fx(lambda x: (x.t(), x.unsqueeze(0).squeeze(0), x[None].squeeze([0]),
                            x.view(-1), x.detach()))(torch.randn(2, 3))  # fmt: skip
    before = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    fast_views(gm)
    after = [aten_op_of(n) for n in gm.graph.nodes if n.op == "call_function"]
    assert after == before


def test_keyword_arguments_and_steps_stay_aten_ops():
    gm = make_fx(lambda x: (x[::2], x.expand(2, 4, 3)))(torch.randn(4, 3))
    for node in gm.graph.nodes:
        if node.target is _aten.expand.default:
            node.kwargs = {"implicit": False}
    fast_views(gm)
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert {_aten.slice.Tensor, _aten.expand.default} <= targets
