"""The torch.compile backend "fusion_cache" on CPU: training matches eager, regions reported."""
from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusion_cache.frontend.ops import Operators
from fusion_cache.frontends import dynamo_backend

# with the fusion's ATen ops, GEMMs and attention join the regions (aten_library.py)
HAS_ATEN = hasattr(Operators, "matmul")


class MLP(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.norm(x)))))


class Attention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.scale = d**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        scores = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1)
        return x + scores @ v


class Model(nn.Module):
    def __init__(self, d: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.attn = Attention(d)
        self.mlp = MLP(d, hidden)
        self.head = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(self.attn(x)))


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def _train(model: nn.Module, steps: int, data: list[torch.Tensor]) -> list[tuple]:
    """Loss, output and parameter gradients of each SGD step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    history = []
    for x in data[:steps]:
        opt.zero_grad()
        out = model(x)
        loss = out.square().mean()
        loss.backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        history.append((loss.detach(), out.detach(), grads))
        opt.step()
    return history


def test_training_matches_eager():
    torch.manual_seed(0)
    eager = Model().eval()  # eval: dropout is the identity, so both runs see the same math
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="fusion_cache")
    data = [torch.randn(2, 8, 16) for _ in range(3)]
    want = _train(eager, 3, data)
    got = _train(compiled, 3, data)
    for (l1, o1, g1), (l2, o2, g2) in zip(got, want):
        torch.testing.assert_close(l1, l2, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(o1, o2, rtol=1e-4, atol=1e-5)
        for a, b in zip(g1, g2):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for p1, p2 in zip(compiled_model.parameters(), eager.parameters()):
        torch.testing.assert_close(p1, p2, rtol=1e-4, atol=1e-5)

    reports = dynamo_backend.reports()
    kinds = {r["graph"] for r in reports}
    assert {"forward", "backward"} <= kinds
    for r in reports:
        assert r["regions"] > 0 and r["ops_fused"] > 0
        assert HAS_ATEN or r["ops_eager"] > 0  # without ATen ops the GEMMs stay eager
        assert len(r["fusion_ids"]) == r["regions"]
    assert dynamo_backend.last_report() == reports[-1]


def test_inference_graph_and_single_node_knob(monkeypatch):
    torch.manual_seed(1)
    model = Model().eval()
    x = torch.randn(2, 8, 16)
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend="fusion_cache")(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    default = dynamo_backend.last_report()
    assert default["graph"] == "inference" and default["regions"] > 0

    def lone_ops(x):  # sort has no lowering: the exps before and after it stand alone
        return torch.sort((x * 2).exp()).values.exp()

    torch._dynamo.reset()
    for single, regions in (("0", 1), ("1", 2)):
        monkeypatch.setenv("FUSION_CACHE_SINGLE_NODE", single)
        torch._dynamo.reset()
        got = torch.compile(lone_ops, backend="fusion_cache")(x)
        torch.testing.assert_close(got, lone_ops(x))
        assert dynamo_backend.last_report()["regions"] == regions


def test_identical_regions_share_a_fusion_id():
    def twice(x):  # the same region on either side of an op left to eager (sort)
        a = torch.sort(x).values
        b = torch.sort((a * 2).exp() + a).values
        return (b * 2).exp() + b

    x = torch.randn(4, 16)
    torch.testing.assert_close(torch.compile(twice, backend="fusion_cache")(x), twice(x))
    ids = dynamo_backend.last_report()["fusion_ids"]
    assert len(ids) > len(set(ids))  # the trie sees the same records twice


def test_dump_graph_gives_reasons(monkeypatch, capsys):
    monkeypatch.setenv("FUSION_CACHE_DUMP", "graph,python_definition")
    model = Attention(8).eval()
    x = torch.randn(2, 3, 8)
    with torch.no_grad():
        torch.compile(model, backend="fusion_cache")(x)
    out = capsys.readouterr().out
    from fusion_cache.frontend.ops import Operators

    assert "regions" in out and "= bmm(" in out
    if not hasattr(Operators, "matmul"):  # else the GEMMs join the regions
        assert "[eager: this build's frontend has no fd.ops.matmul]" in out
    assert HAS_ATEN or "region of 1 op (FUSION_CACHE_SINGLE_NODE=1" in out
    assert "[region 0]" in out
    assert "def nvfuser_fusion_id" in out  # each region's definition


def test_graph_without_fusable_ops_runs_eager():
    model = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    got = torch.compile(model, backend="fusion_cache")(x)
    torch.testing.assert_close(got, model(x))
    assert all(r["regions"] == 0 for r in dynamo_backend.reports())


def test_fuse_graph_on_a_traced_aten_graph():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        y = torch.softmax(x * 2.0, dim=-1) @ w
        return F.gelu(y) + 1.0

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    gm = make_fx(f)(x, w)
    report = dynamo_backend.fuse_graph(gm, "forward")
    assert report["regions"] == (1 if HAS_ATEN else 2)  # softmax | mm | gelu, or all in one
    torch.testing.assert_close(gm(x, w), f(x, w), rtol=1e-5, atol=1e-6)


def test_a_region_longer_than_1024_records_lowers():
    """A whole transformer's forward is one region once GEMMs and attention lower (GPT-2's
    six layers: about 1500 records), past a definition's default max_length."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        for k in range(700):
            x = x * 1.001 + k * 1e-4
        return x

    x = torch.randn(4, 8)
    gm = make_fx(f)(x)
    report = dynamo_backend.fuse_graph(gm, "forward")
    assert report["regions"] == 1 and report["ops_eager"] == 0, report["eager_ops"]
    torch.testing.assert_close(gm(x), f(x))


@pytest.mark.skipif(not HAS_ATEN, reason="attention lowers through the fusion's ATen ops")
def test_regions_end_after_attention_and_layers_share_a_fusion():
    """Note [Region cuts]: each layer's piece between two attention ops is one
    region, the same definition for every middle layer."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        for _ in range(4):
            y = F.scaled_dot_product_attention(x * w, x, x, is_causal=True)
            x = torch.tanh(y * 2 + x)
        return x

    x, w = torch.randn(2, 3, 8, 4), torch.randn(4)
    gm = make_fx(f)(x, w)
    report = dynamo_backend.fuse_graph(gm, "forward")
    ids = report["fusion_ids"]
    assert report["regions"] == 5 and report["ops_eager"] == 0, report
    assert ids[1] == ids[2] == ids[3] and len(set(ids)) == 3, ids
    torch.testing.assert_close(gm(x, w), f(x, w), rtol=1e-5, atol=1e-6)


def test_conv_batch_norm_relu_eval():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1))
    model.eval()
    with torch.no_grad():
        model[1].running_mean.normal_()
        model[1].running_var.uniform_(0.5, 2.0)
        x = torch.randn(2, 3, 10, 10)
        got = torch.compile(model, backend="fusion_cache")(x)
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-5)
    report = dynamo_backend.last_report()
    # batch norm (eval) + relu + the second convolution; the first convolution, alone in its
    # piece (Note [Region cuts]), stays eager
    assert report["regions"] == 1 and report["fused_ops"].get("convolution") == 1, report


def test_training_mode_dropout_stays_eager():
    torch.manual_seed(4)
    model = Model().train()
    compiled = torch.compile(model, backend="fusion_cache")
    loss = compiled(torch.randn(2, 8, 16)).square().mean()
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    forward = next(r for r in dynamo_backend.reports() if r["graph"] == "forward")
    assert "random op" in forward["eager_reasons"].values()


def _grads_of(fn):
    def run(x, w):
        x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
        return torch.autograd.grad(fn(x, w).square().sum(), (x, w))

    return run


BACKWARD_CASES = {
    "relu": lambda x, w: torch.relu(x * w),
    "sigmoid_tanh": lambda x, w: torch.sigmoid(x) * torch.tanh(w),
    "log_softmax": lambda x, w: torch.log_softmax(x + w, dim=-1),
    "gelu_tanh": lambda x, w: F.gelu(x * w, approximate="tanh"),
    "silu_mean_var": lambda x, w: F.silu(x).mean(dim=0) + x.var(dim=1, keepdim=True) * w,
    "layer_norm": lambda x, w: F.layer_norm(x, [x.shape[-1]], w[0], w[1]),
}


@pytest.mark.parametrize("name", sorted(BACKWARD_CASES))
def test_backward_ops_lower(name, monkeypatch):
    from torch.fx.experimental.proxy_tensor import make_fx

    monkeypatch.setenv("FUSION_CACHE_SINGLE_NODE", "1")
    fn = _grads_of(BACKWARD_CASES[name])
    x, w = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    gm = make_fx(fn)(x, w)
    report = dynamo_backend.fuse_graph(gm, "backward")
    assert report["regions"] > 0, report["eager_reasons"]
    x2, w2 = torch.randn_like(x), torch.randn_like(w)
    for got, want in zip(gm(x2, w2), fn(x2, w2)):
        torch.testing.assert_close(got, want)


def test_cuda_graph_knobs():
    from fusion_cache.frontends.cuda_graphs import cuda_graphs_wanted

    assert cuda_graphs_wanted("reduce-overhead", None)
    assert not cuda_graphs_wanted(None, None) and not cuda_graphs_wanted("default", None)
    assert cuda_graphs_wanted(None, {"cuda_graphs": True})
    assert not cuda_graphs_wanted("reduce-overhead", {"cuda_graphs": False})
    with pytest.raises(ValueError, match="unknown options \\['triton.cudagraphs'\\]"):
        cuda_graphs_wanted(None, {"triton.cudagraphs": True})
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        cuda_graphs_wanted("fast", None)


def test_cuda_graph_mode_on_cpu_tensors_runs_without_graphs(monkeypatch):
    """The capture skips graphs on the CPU (torch's check), with a warning; results hold."""
    monkeypatch.setenv("FUSION_CACHE_CUDA_GRAPHS", "1")
    torch.manual_seed(5)
    model = Model().eval()
    x = torch.randn(2, 8, 16)
    compiled = torch.compile(model, backend="fusion_cache")
    with pytest.warns(UserWarning, match="without CUDA graphs"):
        loss = compiled(x).square().mean()
    loss.backward()
    torch.testing.assert_close(loss, model(x).square().mean(), rtol=1e-4, atol=1e-5)
    assert {r["graph"] for r in dynamo_backend.reports()} >= {"forward", "backward"}


def test_cuda_graph_mode_reads_parameters_and_buffers_in_place():
    """Note [CUDA-graph mode]: the forward's parameters and buffers are static inputs (read
    in place, re-recorded if they move), the batch alone is copied into the graph's buffer;
    with nn modules inlined none of them is lifted by AOTAutograd, so the lifted count is 0."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.utils import num_fw_fixed_arguments

    from fusion_cache.frontends.cuda_graphs import _static_inputs

    seen = {}

    def backend(gm, example_inputs):
        def forward(aot_gm, aot_inputs):
            fixed = num_fw_fixed_arguments(len(example_inputs), len(aot_inputs))
            seen["fixed"], seen["static"] = fixed, _static_inputs(fixed)
            seen["shapes"] = [tuple(t.shape) for t in aot_inputs]
            return aot_gm.forward

        return aot_autograd(fw_compiler=forward, bw_compiler=lambda g, _: g.forward)(
            gm, example_inputs)  # fmt: skip

    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16))  # parameters and buffers
    x = torch.randn(4, 8)
    torch.compile(model, backend=backend)(x).sum().backward()
    want = len(list(model.parameters())) + len(list(model.buffers()))
    assert len(seen["shapes"]) == want + 1
    assert len(seen["static"]) == want, seen
    (batch,) = set(range(want + 1)) - set(seen["static"])
    assert seen["shapes"][batch] == (4, 8)


def test_region_outputs_known_when_lowering_come_back_as_constants():
    """A region may return what the lowering knows as a Python value (an undefined gradient,
    a static size); the fusion returns only the tensors and the call puts them back."""
    from fusion_cache.frontends.fx_region import RegionCall, build_region, spec_of

    graph = torch.fx.Graph()
    g, x, mean, invstd, w = (graph.placeholder(n) for n in ("g", "x", "mean", "invstd", "w"))
    bwd = graph.call_function(torch.ops.aten.native_batch_norm_backward.default,
                              (g, x, w, None, None, mean, invstd, True, 1e-5,
                               [True, False, False]))  # fmt: skip
    items = [graph.call_function(operator.getitem, (bwd, i)) for i in range(3)]
    doubled = graph.call_function(torch.ops.aten.mul.Tensor, (items[0], 2.0))
    graph.output((items[1], doubled, 7, items[2]))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    args = [torch.randn(4, 3, 2, dtype=torch.float64), torch.randn(4, 3, 2, dtype=torch.float64),
            torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5,
            torch.randn(3, dtype=torch.float64)]  # fmt: skip
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        for node, a in zip([g, x, mean, invstd, w], args):
            node.meta["val"] = mode.from_tensor(a)
        for node in graph.nodes:
            if node.op == "call_function":
                node.meta["val"] = node.target(*torch.fx.node.map_arg(
                    node.args, lambda n: n.meta["val"]))  # fmt: skip
    specs = tuple(spec_of(a) for a in args)
    fd, constants = build_region(gm, specs)
    assert constants == ((0, None), (2, 7), (3, None)) and len(fd.output_records()) == 1
    region = RegionCall("r", gm, fd, specs, constants)
    for _ in range(2):  # the recording call and a replay
        got = region(*args)
        want = gm(*args)
        assert got[0] is None and got[2] == 7 and got[3] is None
        torch.testing.assert_close(got[1], want[1])


def test_casts_alone_make_no_region(monkeypatch):
    """A cast between ops left to eager stays eager even where single ops fuse."""
    monkeypatch.setenv("FUSION_CACHE_SINGLE_NODE", "1")

    def fn(x):
        return torch.sort(torch.sort(x).values.double()).values

    x = torch.randn(4, 8)
    torch.testing.assert_close(torch.compile(fn, backend="fusion_cache")(x), fn(x))
    report = dynamo_backend.last_report()
    assert report["regions"] == 0
    assert "only casts" in report["eager_ops"]["_to_copy"].popitem()[0]


def test_view_outputs_come_back_as_views_not_copies():
    """Note [View outputs]: outputs that are views of a fusion output, of a value the fusion
    computes and returns for them alone, or of a region input, come back as those views of
    it (as eager makes them), not as fusion outputs of their own."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusion_cache.frontends import fx_region
    from fusion_cache.frontends.fx_region import (
        DerivedOutput,
        RecordedView,
        RegionCall,
        build_region,
        spec_of,
    )

    def fn(x, w):
        y = x * 2.0
        z = w.to(torch.float64)
        return y.view(24), w.t(), z.t().unsqueeze(0), y, (x + 1).view(6, 4).permute(1, 0)

    args = [torch.randn(4, 6), torch.randn(3, 6)]
    gm = make_fx(fn)(*args)
    specs = tuple(spec_of(a) for a in args)
    fd, constants = build_region(gm, specs)
    assert [k for k, v in constants if isinstance(v, DerivedOutput)] == [0, 1, 2, 4]
    assert constants.hidden == 2 and len(fd.output_records()) == 3  # y, and z, x + 1 hidden
    region = RegionCall("r", gm, fd, specs, constants)
    for k in range(3):  # the recording call and replays, the last on a w at a storage offset
        x, w = torch.randn(4, 6), torch.randn(3, 6) if k < 2 else torch.randn(22)[4:].view(3, 6)
        got, want = region(x, w), fn(x, w)
        assert len(got) == len(want)
        for g, e in zip(got, want):
            assert g.shape == e.shape and g.stride() == e.stride() and g.dtype == e.dtype
            torch.testing.assert_close(g, e)
        assert got[0].untyped_storage().data_ptr() == got[3].untyped_storage().data_ptr()
        assert got[1].untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
        assert got[1].data_ptr() == w.data_ptr()
    # replays make the views from the layouts the first call gave (Note [Recorded views])
    recorded = [k for k, v in region._last[2] if isinstance(v, RecordedView)]
    assert recorded == ([0, 1, 2, 4] if fx_region._reinterpret is not None else [])


def test_a_recorded_view_of_a_source_laid_out_otherwise_takes_its_methods():
    """Note [Recorded views]: a fusion output's strides are checked on each call; where they
    differ from the recorded ones (an ATen result torch lays out), the view methods run."""
    from fusion_cache.frontends.fx_region import (
        Constants,
        DerivedOutput,
        RecordedView,
        _with_constants,
    )

    derived = DerivedOutput(0, False, ((torch.Tensor.t, ()),))
    view = RecordedView(0, False, (6, 4), (1, 6), 0, (6, 1), derived)
    constants = Constants([(1, view)])
    a = torch.randn(4, 6)
    got = _with_constants([a], constants, ())
    assert got[0] is a and torch.equal(got[1], a.t()) and got[1].stride() == (1, 6)
    b = torch.randn(6, 4).t()  # (4, 6) with strides (1, 4): the recorded layout would be wrong
    got = _with_constants([b], constants, ())
    assert torch.equal(got[1], b.t()) and got[1].stride() == b.t().stride()


@pytest.mark.parametrize("dims", [(0,), (0, 1)])
def test_a_view_that_drops_unit_dims_stays_in_the_reductions_kernel(dims):
    """A keepdim sum viewed to a bias's shape lowers to a squeeze, which the reduction takes
    as its epilogue: one kernel (stub plans for the h100), where a reshape made two; the
    values are eager's."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from benchmarks.host_region import stub_launches
    from fusion_cache.frontends.fx_region import RegionCall, build_region, spec_of

    shape = (96,)

    def fn(g):
        return g.sum(dims, keepdim=True).view(shape).float()

    args = [torch.randn(*(4, 16, 96)[-len(dims) - 1 :]).bfloat16()]
    gm = make_fx(fn)(*args)
    specs = tuple(spec_of(a) for a in args)
    fd, constants = build_region(gm, specs)
    got = RegionCall("r", gm, fd, specs, constants)(*args)
    torch.testing.assert_close(got, fn(*args), rtol=2e-2, atol=2e-2)
    assert got.shape == shape and got.dtype == torch.float32
    with stub_launches():
        region = RegionCall("r", gm, fd, specs, constants)
        region(*args)
        (seq,) = region.sequences
        assert seq.launches == 1, seq.describe()


def test_buffer_updates_are_written_in_place():
    """Note [Buffer updates in place]: a copy_ into a graph input whose other readers are in
    its region becomes the region's in-place output; one into an input eager also reads
    stays eager, after that read."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(buf, other, count, x):
        y = torch.relu(x * 2) + other.sum()
        new = buf * 0.5 + 1
        buf.copy_(new)
        other.copy_(other * 3 + 1)
        count.copy_(count + 1)
        return y, new * 2

    buf, other, count, x = torch.randn(3), torch.randn(3), torch.zeros(1), torch.randn(4)
    want_buf, want_other = buf * 0.5 + 1, other * 3 + 1
    want = torch.relu(x * 2) + other.sum()
    gm = make_fx(f)(buf.clone(), other.clone(), count.clone(), x)
    with torch.no_grad():
        report = dynamo_backend.fuse_graph(gm, "forward")
        got, _ = gm(buf, other, count, x)
    assert report["fused_ops"].get("copy_") == 1, report
    # the sum of `other` is in x's region: its copy_ waits for that region, in eager; the
    # counter's copy_(count, add(count, 1)) is one eager add_
    why = report["eager_ops"]["copy_"]
    assert set(why) == {"copy_ into an input another region or eager op reads"}, why
    assert "add_" in report["eager_ops"], report["eager_ops"]
    torch.testing.assert_close(count, torch.ones(1))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(buf, want_buf)
    torch.testing.assert_close(other, want_other)
