"""Note [Eager views]: the view ops a fused graph keeps run as Tensor methods, and make the
same views as the aten ops they replace."""
from __future__ import annotations

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


def test_views_outside_regions_become_tensor_methods_with_the_same_views():
    args = (torch.randn(4, 6), torch.randn(3, 5), torch.randn(8, 3))
    gm = make_fx(_views)(*args)
    want = gm(*args)
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert fast_views(gm) > 0
    gm.recompile()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert not any(isinstance(t, torch._ops.OpOverload) for t in targets), targets
    assert len(targets) == len(ops) - 2  # t(t(w)) and detach(detach(x)) lost their inner op
    assert targets.count(torch.Tensor.narrow) == 2
    fresh = tuple(torch.randn_like(a) for a in args)  # fresh inputs of the same layouts
    for got, ref in zip(gm(*fresh), make_fx(_views)(*args)(*fresh)):
        assert _layout(got)[:3] == _layout(ref)[:3]
        assert got.untyped_storage().data_ptr() == ref.untyped_storage().data_ptr()
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    for got, ref in zip(gm(*args), want):
        assert _layout(got) == _layout(ref)


def test_rewritten_nodes_name_their_aten_ops():
    """The fused graph's form (Note [Fused graph form]) keeps aten ops: each method node
    names the op it calls, squeeze by its argument."""
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
