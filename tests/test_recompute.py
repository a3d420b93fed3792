"""Note [Recompute in the backward] and Note [Casts before views]: what the backend's
forward graphs save for the backward, the nll_loss gradient written without the
log-probabilities, and casts moved ahead of views, each against torch eager on random
inputs."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from fusion_cache.frontends import recompute
from fusion_cache.frontends.fx_casts import casts_before_views

aten = torch.ops.aten


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_nll_loss_backward_matches_torch(reduction):
    n, c = 24, 17
    logp = torch.randn(n, c, generator=_gen(1)).log_softmax(1)
    target = torch.randint(0, c, (n,), generator=_gen(2))
    target[::5] = -100  # ignored rows
    grad = torch.randn(n if reduction == 0 else (), generator=_gen(3))
    total = (target != -100).sum().to(torch.float32)
    want = aten.nll_loss_backward(grad, logp, target, None, reduction, -100, total)
    got = recompute._nll_loss_backward(grad, logp, target, None, reduction, -100, total)
    torch.testing.assert_close(got, want)


def test_weighted_nll_loss_backward_stays_torch_op():
    logp, target = torch.randn(4, 3).log_softmax(1), torch.tensor([0, 1, 2, 1])
    out = recompute._nll_loss_backward(torch.tensor(1.0), logp, target, torch.ones(3), 1, -100,
                                       torch.tensor(4.0))  # fmt: skip
    assert out is NotImplemented


def _saved_and_grads(fn, *args):
    """(the forward graph's outputs' (shape, dtype), output, input grads) under the backend's
    partitioner and decompositions."""
    saved = []

    def fw(gm, example):
        out = next(n for n in gm.graph.nodes if n.op == "output")
        saved.extend((tuple(a.meta["val"].shape), a.meta["val"].dtype) for a in out.args[0]
                     if hasattr(a, "meta") and isinstance(a.meta.get("val"), torch.Tensor))
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=fw, bw_compiler=lambda gm, ex: make_boxed_func(gm.forward),
                           partition_fn=recompute.partition_fn(),
                           decompositions=recompute.decompositions())  # fmt: skip
    torch._dynamo.reset()
    args = [a.detach().requires_grad_(a.is_floating_point()) for a in args]
    out = torch.compile(fn, backend=backend)(*args)
    out.backward()
    return saved, out, [a.grad for a in args if a.requires_grad]


def test_cross_entropy_saves_bf16_logits_not_fp32_log_softmax():
    n, d, c = 16, 8, 96
    x = torch.randn(n, d, generator=_gen(4)).to(torch.bfloat16)
    w = torch.randn(d, c, generator=_gen(5)).to(torch.bfloat16)
    t = torch.randint(0, c, (n,), generator=_gen(6))

    def loss(x, w, t):
        return F.cross_entropy((x @ w).float(), t)

    saved, out, grads = _saved_and_grads(loss, x, w, t)
    assert (n, c) in {s for s, _ in saved}
    assert not [s for s, dt in saved if s == (n, c) and dt == torch.float32], saved
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    want = loss(xe, we, t)
    want.backward()
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(grads[0], xe.grad)
    torch.testing.assert_close(grads[1], we.grad)


def test_casts_move_ahead_of_views():
    def rope_like(a, b):
        return torch.stack((a * 2.0, b - 1.0), dim=-1).flatten(2).to(torch.bfloat16).sin()

    graphs = []

    def fw(gm, example):
        moved = casts_before_views(gm)
        graphs.append((moved, [n.target for n in gm.graph.nodes if n.op == "call_function"]))
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    a, b = torch.randn(3, 4, 5, generator=_gen(7)), torch.randn(3, 4, 5, generator=_gen(8))
    got = torch.compile(rope_like, backend=aot_autograd(fw_compiler=fw))(a, b)
    torch.testing.assert_close(got, rope_like(a, b))
    moved, targets = graphs[0]
    assert moved == 1
    cast = targets.index(aten._to_copy.default)
    assert targets[cast + 1] == aten.view.default  # the view now reads the cast


def _default_partition_matches_eager(fn, grads, rest, fw):
    """`fn` compiled with the default partitioner of Note [Saved views redone] (the forward
    graph handed to `fw`): its value and the gradients of `grads` are eager's."""
    backend = aot_autograd(fw_compiler=fw, bw_compiler=lambda gm, ex: make_boxed_func(gm.forward),
                           partition_fn=recompute._default_views_redone)  # fmt: skip
    torch._dynamo.reset()
    args = [a.clone().requires_grad_() for a in grads] + list(rest)
    got = torch.compile(fn, backend=backend)(*args)
    got.backward()
    want_args = [a.clone().requires_grad_() for a in grads] + list(rest)
    want = fn(*want_args)
    want.backward()
    torch.testing.assert_close(got, want)
    for g, e in zip(args[:len(grads)], want_args[:len(grads)]):
        torch.testing.assert_close(g.grad, e.grad)


def test_saved_views_of_inputs_are_redone_in_the_backward():
    """Note [Saved views redone]: a linear layer's transposed weight and a slice of a table
    are saved as their inputs, no view; the gradients are eager's."""
    n, d, h = 8, 6, 10
    x = torch.randn(n, d, generator=_gen(9))
    w1, w2 = torch.randn(h, d, generator=_gen(10)), torch.randn(d, h, generator=_gen(11))
    table = torch.randn(16, d, generator=_gen(12))

    def fn(x, w1, w2, table):
        y = torch.tanh(x @ w1.t()) @ w2.t()
        return (y * table[:n]).sum()

    saved_views = []

    def fw(gm, example):
        out = next(node for node in gm.graph.nodes if node.op == "output")
        saved_views.extend(a.target for a in out.args[0]
                           if hasattr(a, "op") and a.op == "call_function" and a.target in
                           recompute._REDONE_VIEWS)  # fmt: skip
        return make_boxed_func(gm.forward)

    _default_partition_matches_eager(fn, (x, w1, w2), (table,), fw)
    assert saved_views == []


def test_the_same_view_taken_twice_is_one_node():
    """Note [Same views once]: RoPE's two slices of one table (query and key heads) become
    one node of the forward graph; the values and gradients are eager's."""
    t, d = 6, 4
    cos = torch.randn(16, d, generator=_gen(13))
    q, k = torch.randn(t, d, generator=_gen(14)), torch.randn(t, d, generator=_gen(15))

    def fn(q, k, cos):
        return (q * cos[:t].view(1, t, d)).sum() + (k * cos[:t].view(1, t, d)).sum()

    slices = []

    def fw(gm, example):
        slices.append(sum(1 for n in gm.graph.nodes if n.target is torch.ops.aten.slice.Tensor))
        return make_boxed_func(gm.forward)

    _default_partition_matches_eager(fn, (q, k), (cos,), fw)
    assert slices == [1]


def test_views_returned_by_the_graph_keep_their_own_nodes():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(torch.ops.aten.slice.Tensor, (x, 0, 0, 2))
    b = graph.call_function(torch.ops.aten.slice.Tensor, (x, 0, 0, 2))
    c = graph.call_function(torch.ops.aten.slice.Tensor, (x, 0, 0, 2))
    e = graph.call_function(torch.ops.aten.slice.Tensor, (x, 0, 0, 2))
    d = graph.call_function(torch.ops.aten.mul.Tensor, (c, e))
    graph.output((a, b, d))
    assert recompute.same_views_once(graph) == 1
    assert d.args == (c, c) and {n for n in graph.nodes if n.target is torch.ops.aten.slice.Tensor} == {a, b, c}


def test_saved_views_redone_switch_picks_the_default_partitioner(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_SAVED_VIEWS_REDONE", "1")
    monkeypatch.delenv("FUSION_CACHE_MIN_CUT", raising=False)
    assert recompute.aot_options() == {"partition_fn": recompute._default_views_redone}


def test_cuda_graph_mode_takes_the_min_cut_unless_switched_off(monkeypatch):
    # Note [Min-cut under CUDA graphs]: on by default there, FUSION_CACHE_MIN_CUT=0 turns it off;
    # outside graph mode the switch alone decides (off by default)
    monkeypatch.delenv("FUSION_CACHE_MIN_CUT", raising=False)
    monkeypatch.delenv("FUSION_CACHE_SAVED_VIEWS_REDONE", raising=False)
    graphs = recompute.aot_options(graphs=True)
    assert graphs["partition_fn"] is recompute.partition_fn()
    assert torch.ops.aten._log_softmax.default in graphs["decompositions"]
    assert recompute.aot_options() == {"partition_fn": recompute._default_views_redone}
    monkeypatch.setenv("FUSION_CACHE_MIN_CUT", "0")
    assert recompute.aot_options(graphs=True) == {"partition_fn": recompute._default_views_redone}
    monkeypatch.setenv("FUSION_CACHE_MIN_CUT", "1")
    assert recompute.aot_options()["partition_fn"] is recompute.partition_fn()


def test_a_backward_view_is_not_taken_for_the_forward_one():
    """Merged into the forward's, a backward's view would make the forward save it."""
    graph = torch.fx.Graph()
    x = graph.placeholder("primals_1")
    a = graph.call_function(torch.ops.aten.slice.Tensor, (x, 0, 0, 2))
    fwd = graph.call_function(torch.ops.aten.mul.Tensor, (a, a))
    fwd.meta["partitioner_tag"] = "is_forward"
    g = graph.placeholder("tangents_1")
    b = graph.call_function(torch.ops.aten.slice.Tensor, (x, 0, 0, 2))
    c = graph.call_function(torch.ops.aten.slice.Tensor, (x, 0, 0, 2))
    bwd = graph.call_function(torch.ops.aten.mul.Tensor, (g, graph.call_function(
        torch.ops.aten.add.Tensor, (b, c))))
    graph.output((fwd, bwd))
    assert recompute.same_views_once(graph) == 1
    adds = [n for n in graph.nodes if n.target is torch.ops.aten.add.Tensor]
    assert adds[0].args == (b, b)
