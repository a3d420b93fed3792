"""Each aten lowering through torch.compile(backend="fusion_cache") on tiny CPU tensors (the
reference evaluator runs the regions here): forward and backward against eager, on fresh
random inputs, and the op shows up fused in the graph reports (not left to eager)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusion_cache.frontends import dynamo_backend, register_backend


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch):
    import torch._dynamo

    register_backend()
    monkeypatch.setenv("FUSION_CACHE_SINGLE_NODE", "1")  # a lone op still makes a region
    monkeypatch.delenv("FUSION_CACHE_DUMP", raising=False)
    torch._dynamo.reset()
    dynamo_backend.reset_reports()
    yield
    torch._dynamo.reset()


def _rope(x):
    b, t, d = x.shape
    x1, x2 = (x * 1.5).reshape(b, t, d // 2, 2).unbind(-1)
    cos, sin = torch.cos(x1), torch.sin(x2)
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(2)


# name -> (function, input shapes, ops the forward must fuse, ops the backward must fuse)
CASES = {
    "split_sizes": (lambda x: [t * (i + 2) for i, t in enumerate((x * 2).split([2, 3, 1], 1))],
                    [(4, 6)], {"split_with_sizes"}, {"cat"}),
    "split_even": (lambda x: [t.exp() for t in (x + 1).split(2, -1)], [(3, 5)], {"split"},
                   {"cat"}),
    "chunk": (lambda x: (lambda q, k: q * k)(*(x * 2).chunk(2, dim=-1)), [(2, 3, 8)], {"split"},
              {"cat"}),
    "unbind_stack_rope": (_rope, [(2, 3, 8)], {"unbind", "stack"}, {"stack"}),
    "stack_dim1": (lambda x, y: torch.stack([x * 2, y + 1, x * y], dim=1).sin(),
                   [(3, 4), (3, 4)], {"stack"}, set()),
    "select": (lambda x: (x * 2)[:, 1] * 3 + (x * 2)[-1], [(5, 5)], {"select"},
               {"select_backward"}),
    "slice": (lambda x: (x * 2)[:, 1:4] + (x * 3)[:, -3:], [(3, 6)], {"slice"},
              {"slice_backward"}),
    "slice_step": (lambda x: (x * 2)[::2, 1::3].exp(), [(5, 7)], {"slice"}, set()),
    "narrow": (lambda x: (x * 2).narrow(1, 1, 2) + 1, [(3, 5)], {"slice"}, set()),
    "cat": (lambda x, y: torch.cat([x.sin(), y.cos(), x * 2], dim=0) * 3, [(2, 4), (3, 4)],
            {"cat"}, set()),
    "cat_last_dim": (lambda x, y: torch.cat([x * 2, y.exp()], dim=-1).tanh(),
                     [(2, 3, 4), (2, 3, 1)], {"cat"}, set()),
    "pad": (lambda x: F.pad(x * 2, (1, 2, 0, 1), value=0.5).exp(), [(3, 4)],
            {"constant_pad_nd"}, {"constant_pad_nd"}),
    "arange_full": (lambda x: x * torch.arange(x.shape[1], dtype=x.dtype)
                    + torch.arange(1, 2 * x.shape[1], 2) + torch.full((x.shape[1],), 0.5)
                    + torch.zeros_like(x), [(3, 4)], {"arange", "full"}, set()),
    "pad_crop": (lambda x: F.pad(x * 2, (-1, 2)).exp(), [(3, 4)], {"constant_pad_nd"},
                 {"constant_pad_nd"}),
}


def _check(fn, shapes, fwd_ops, bwd_ops, dtype=torch.float64, rtol=None, atol=None):
    torch.manual_seed(0)
    inputs = [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes]
    same = [t.detach().clone().requires_grad_() for t in inputs]
    compiled = torch.compile(fn, backend="fusion_cache")
    got, want = compiled(*inputs), fn(*same)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    want = list(want) if isinstance(want, (list, tuple)) else [want]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
    # a random weighting of the outputs, so every gradient path carries distinct values
    weights = [torch.randn_like(w) for w in want]
    sum(((g * k).sum() for g, k in zip(got, weights)), torch.zeros((), dtype=dtype)).backward()
    sum(((w * k).sum() for w, k in zip(want, weights)), torch.zeros((), dtype=dtype)).backward()
    for a, b in zip(inputs, same):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=rtol, atol=atol)
    reports = dynamo_backend.reports()
    fused = {k: set() for k in ("forward", "backward")}
    for r in reports:
        fused[r["graph"]] |= set(r["fused_ops"])
    assert fwd_ops <= fused["forward"], (fused, [r["eager_ops"] for r in reports])
    assert bwd_ops <= fused["backward"], (fused, [r["eager_ops"] for r in reports])
    return reports


@pytest.mark.parametrize("name", sorted(CASES))
def test_lowering_matches_eager(name):
    fn, shapes, fwd_ops, bwd_ops = CASES[name]
    _check(fn, shapes, fwd_ops, bwd_ops)


def test_a_region_without_tensor_inputs_stays_eager():
    """Creation ops alone would run where no input tells the device: eager keeps them."""
    out = torch.compile(lambda: torch.arange(6) * 2 + 1, backend="fusion_cache")()
    torch.testing.assert_close(out, torch.arange(6) * 2 + 1)
    (report,) = dynamo_backend.reports()
    assert report["regions"] == 0
    assert "no tensor input" in " ".join(report["eager_reasons"].values())


# ---- composites: batch norm in training, nll_loss, log_softmax, gelu, silu ----------------


def _bn_train(x, w, b):
    rm, rv = torch.zeros(x.shape[1], dtype=x.dtype), torch.ones(x.shape[1], dtype=x.dtype)
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
    return y.relu() + x, rm * 1, rv * 1  # the updated running statistics are outputs too


COMPOSITES = {
    "batch_norm_training": (_bn_train, [(4, 3, 5, 5), (3,), (3,)],
                            {"_native_batch_norm_legit_functional"},
                            {"native_batch_norm_backward"}),
    "log_softmax_nll_mean": (lambda x: F.nll_loss(F.log_softmax(x * 2, -1),
                                                  torch.tensor([1, 0, 4, -100, 2])),
                             [(5, 6)], {"_log_softmax", "nll_loss_forward"},
                             {"nll_loss_backward", "_log_softmax_backward_data"}),
    "cross_entropy_sum_weight": (lambda x, w: F.cross_entropy(
        x * 2, torch.tensor([3, 0, 3, 1]), weight=w.detach().abs() + 0.1, reduction="sum"),
        [(4, 5), (5,)], {"nll_loss_forward"}, {"nll_loss_backward"}),
    "nll_none_ignore": (lambda x: F.nll_loss(x.exp(), torch.tensor([0, 2, 1]), reduction="none",
                                             ignore_index=2), [(3, 4)], {"nll_loss_forward"},
                        {"nll_loss_backward"}),
    "gelu_erf": (lambda x: F.gelu(x * 2) * 3, [(4, 7)], {"gelu"}, {"gelu_backward"}),
    "gelu_tanh": (lambda x: F.gelu(x * 2, approximate="tanh") * 3, [(4, 7)], {"gelu"},
                  {"gelu_backward"}),
    "silu": (lambda x, y: F.silu(x * 2) * y, [(4, 7), (4, 7)], {"silu"}, {"silu_backward"}),
}


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_composite_lowering_matches_eager(name):
    fn, shapes, fwd_ops, bwd_ops = COMPOSITES[name]
    _check(fn, shapes, fwd_ops, bwd_ops)


@pytest.mark.parametrize("name", ["gelu_tanh", "silu", "log_softmax_nll_mean"])
def test_reduced_precision_composites(name):
    fn, shapes, fwd_ops, bwd_ops = COMPOSITES[name]
    _check(fn, shapes, fwd_ops, bwd_ops, dtype=torch.bfloat16, rtol=2e-2, atol=2e-2)


def test_cuda_regions_leave_out_ops_no_gpu_scheduler_runs(monkeypatch):
    """On CUDA graphs (fake CUDA tensors here) an op whose fusion ops no scheduler of this
    build runs stays eager with the reason, instead of sending its region to the reference
    evaluator; once a scheduler takes them, it fuses."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusion_cache.frontends import fx_support

    def fn(x):
        a, b = (x * 2).split([2, 4], 1)
        return a.exp(), torch.cat([b.sin(), b], 0) + 1

    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(4, 6, device="cuda")
    for runs in (False, True):
        monkeypatch.setattr(fx_support, "gpu_schedules", lambda op, runs=runs: runs)
        report = dynamo_backend.fuse_graph(make_fx(fn, tracing_mode="fake")(x), "forward")
        if runs:
            assert {"split_with_sizes", "cat"} <= set(report["fused_ops"]), report
        else:
            assert "no GPU scheduler" in str(report["eager_ops"]["cat"])
            assert "split_with_sizes" not in report["fused_ops"]


# ---- library ops as ATen segments: GEMMs and attention -------------------------------------

_needs_aten = pytest.mark.skipif(
    not hasattr(__import__("fusion_cache.frontend.ops", fromlist=["Operators"]).Operators,
                "matmul"), reason="this build's frontend has no fd.ops.matmul/sdpfa_fwd yet")


def _mlp(x, w1, b1, w2):
    return F.linear(F.gelu(F.linear(x * 2, w1, b1), approximate="tanh"), w2) + x


def _attention(x, wqkv):
    b, t, c = x.shape
    q, k, v = F.linear(x, wqkv).split(c, dim=2)
    q, k, v = (y.view(b, t, 2, c // 2).transpose(1, 2) for y in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return y.transpose(1, 2).reshape(b, t, c) * 2


LIBRARY = {
    "mm_chain": (lambda x, w: torch.relu(x @ w) @ w.t() * 3, [(4, 6), (6, 6)], {"mm"}, {"mm"}),
    "bmm": (lambda x, y: torch.bmm(x.exp(), y) + 1, [(2, 3, 4), (2, 4, 5)], {"bmm"}, {"bmm"}),
    "mlp_linear_bias_gelu": (_mlp, [(2, 3, 8), (16, 8), (16,), (8, 16)], {"addmm", "mm", "gelu"},
                             {"mm", "gelu_backward"}),
    "attention": (_attention, [(2, 4, 8), (24, 8)],
                  {"_scaled_dot_product_flash_attention_for_cpu", "mm"},
                  {"_scaled_dot_product_flash_attention_for_cpu_backward", "mm"}),
}


@_needs_aten
@pytest.mark.parametrize("name", sorted(LIBRARY))
def test_library_lowering_matches_eager(name):
    fn, shapes, fwd_ops, bwd_ops = LIBRARY[name]
    dtype = torch.float32 if name == "attention" else torch.float64  # flash: no f64 CPU kernel
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else {}
    reports = _check(fn, shapes, fwd_ops, bwd_ops, dtype=dtype, **tol)
    forward = next(r for r in reports if r["graph"] == "forward")
    # one region holds the GEMMs and the work around them; attention ends its region (Note
    # [Region cuts] in dynamo_backend.py): what follows it is a second one
    assert forward["regions"] == (2 if name == "attention" else 1), forward


@_needs_aten
def test_addmm_of_a_transposed_weight_is_a_linear():
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusion_cache.frontends.fx_region import RegionCall

    x, w, b = torch.randn(4, 8), torch.randn(16, 8), torch.randn(16)
    gm = make_fx(lambda x, w, b: F.gelu(F.linear(x, w, b)))(x, w, b)
    dynamo_backend.fuse_graph(gm, "forward")
    (region,) = [n.target for n in gm.graph.nodes if isinstance(n.target, RegionCall)]
    fd, _ = next(iter(region._definitions.values()))
    assert [r.name for r in fd.records if r.kind == "op"].count("linear") == 1
    torch.testing.assert_close(gm(x, w, b)[0] if isinstance(gm(x, w, b), tuple) else gm(x, w, b),
                               F.gelu(F.linear(x, w, b)))  # fmt: skip


def _regions_of(fn, inputs):
    """`fn` traced to an aten graph on fake tensors (torch's meta kernels: cuDNN attention
    has no CPU kernel to trace with) and partitioned; the graph and its report."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, tracing_mode="fake")(*inputs)
    report = dynamo_backend.fuse_graph(gm, "forward")
    return gm, report


def _causal_reference(q, k, v, scale):
    """Attention by the formula, in float64: output and the rows' log-sum-exp."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) * scale
    keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
    scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1, keepdim=True)


@_needs_aten
def test_cudnn_attention_and_its_backward_lower_as_aten_segments():
    """The cuDNN variant (what torch picks on an H100) lowers onto its own ATen op, with the
    work around it in the same region; on the CPU the op's rule runs torch's CPU kernel, so
    the region's output, log-sum-exp ([N, H, L, 1], as cuDNN's) and gradients are checked
    against attention written out."""
    cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention
    backward = torch.ops.aten._scaled_dot_product_cudnn_attention_backward
    scale = 0.3
    gen = torch.Generator().manual_seed(0)
    q, k, v, go = (torch.randn(2, 3, 6, 4, generator=gen) for _ in range(4))

    def forward(q, k, v):
        out, lse, _, _, _, _, seed, offset, _ = cudnn(q * 2, k, v, None, True, 0.0, True, False,
                                                    scale=scale)  # fmt: skip
        return out * 3, lse, seed, offset

    gm, report = _regions_of(forward, (q, k, v))
    assert report["fused_ops"].get("_scaled_dot_product_cudnn_attention") == 1, report
    # the scaling after attention is a region of its own (Note [Region cuts])
    assert report["regions"] == 2 and not report["eager_ops"], report
    out, lse, seed, offset = gm(q, k, v)
    want_out, want_lse = _causal_reference(q * 2, k, v, scale)
    torch.testing.assert_close(out.double(), want_out * 3, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)

    def grads(go, q, k, v, out, lse, seed, offset):
        dq, dk, dv = backward(go * 0.5, q, k, v, out, lse, seed, offset, None, None, None, 6, 6,
                              0.0, True, scale=scale)  # fmt: skip
        return dq + 1, dk, dv * 2

    q2 = q * 2
    forward_gm = gm
    gm, report = _regions_of(grads, (go, q2, k, v, out / 3, lse, seed, offset))
    assert report["fused_ops"].get("_scaled_dot_product_cudnn_attention_backward") == 1, report
    dq, dk, dv = gm(go, q2, k, v, out / 3, lse, seed, offset)
    qr, kr, vr = (t.double().requires_grad_() for t in (q2, k, v))
    _causal_reference(qr, kr, vr, scale)[0].backward(go.double() * 0.5)
    for got, want in ((dq - 1, qr.grad), (dk, kr.grad), (dv / 2, vr.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    # last: a plan made with stub launches stays in its executor's cache
    assert "aten:sdpa_cudnn_fwd" in _gpu_plan(forward_gm, (q, k, v), "sdpa_cudnn_fwd")
    assert "aten:sdpa_cudnn_bwd" in _gpu_plan(gm, (go, q2, k, v, out / 3, lse, seed, offset),
                                              "sdpa_cudnn_bwd")  # fmt: skip


@_needs_aten
def test_efficient_attention_with_a_mask_and_its_backward_lower_as_aten_segments():
    """Memory-efficient attention (what torch picks for a mask) lowers onto its own ATen op
    with the mask taken along; its log-sum-exp is padded to 32-row tiles as the CUDA
    kernel's. Checked against attention written out."""
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention
    backward = torch.ops.aten._scaled_dot_product_efficient_attention_backward
    scale = 0.4
    gen = torch.Generator().manual_seed(1)
    q, k, v, go = (torch.randn(2, 3, 6, 4, generator=gen) for _ in range(4))
    mask = torch.randn(2, 3, 6, 6, generator=gen)

    def reference(q, k, v, mask):
        scores = q.double() @ k.double().transpose(-2, -1) * scale + mask.double()
        return torch.softmax(scores, -1) @ v.double(), torch.logsumexp(scores, -1)

    def forward(q, k, v, mask):
        out, lse, seed, offset = efficient(q * 2, k, v, mask + 1, True, 0.0, False, scale=scale)
        return out * 3, lse, seed, offset

    gm, report = _regions_of(forward, (q, k, v, mask))
    assert report["fused_ops"].get("_scaled_dot_product_efficient_attention") == 1, report
    assert not report["eager_ops"], report
    out, lse, seed, offset = gm(q, k, v, mask)
    want_out, want_lse = reference(q * 2, k, v, mask + 1)
    torch.testing.assert_close(out.double(), want_out * 3, rtol=1e-5, atol=1e-5)
    assert lse.shape == (2, 3, 32)
    torch.testing.assert_close(lse[..., :6].double(), want_lse, rtol=1e-5, atol=1e-5)

    def grads(go, q, k, v, mask, out, lse, seed, offset):
        dq, dk, dv, _ = backward(go * 0.5, q, k, v, mask, out, lse, seed, offset, 0.0,
                                 [True, True, True, False], False, scale=scale)  # fmt: skip
        return dq + 1, dk, dv * 2

    q2, m2 = q * 2, mask + 1
    inputs = (go, q2, k, v, m2, out / 3, lse, seed, offset)
    gm_bwd, report = _regions_of(grads, inputs)
    assert report["fused_ops"].get("_scaled_dot_product_efficient_attention_backward") == 1
    dq, dk, dv = gm_bwd(*inputs)
    qr, kr, vr = (t.double().requires_grad_() for t in (q2, k, v))
    reference(qr, kr, vr, m2)[0].backward(go.double() * 0.5)
    for got, want in ((dq - 1, qr.grad), (dk, kr.grad), (dv / 2, vr.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    # last: a plan made with stub launches stays in its executor's cache
    assert "aten:sdpa_efficient_fwd" in _gpu_plan(gm, (q, k, v, mask), "sdpa_efficient_fwd")
    assert "aten:sdpa_efficient_bwd" in _gpu_plan(gm_bwd, inputs, "sdpa_efficient_bwd")


def _gpu_plan(gm, inputs, op: str) -> str:
    """The plan the GPU path makes of the graph's region holding `op` (for the h100 profile,
    kernels compiled, launches stubbed): its segments' description."""
    from benchmarks.host_region import stub_launches
    from fusion_cache.frontends.fx_region import RegionCall
    from fusion_cache.runtime.executor import executor_for

    regions = [n.target for n in gm.graph.nodes if isinstance(n.target, RegionCall)]
    for region in regions:
        region._sequences.clear()
        region._last = None
    with stub_launches():
        gm(*inputs)
    (fd,) = [fd for region in regions for fd, _ in region._definitions.values()
             if any(r.name == op for r in fd.records)]
    (plan,) = executor_for(fd).plans.values()
    return plan.description


_needs_indexing = pytest.mark.skipif(
    not hasattr(__import__("fusion_cache.frontend.ops", fromlist=["Operators"]).Operators,
                "index_put_accumulate"), reason="this build's frontend has no gathers/scatters")


@_needs_indexing
@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_embedding_and_its_backward(padding_idx, dtype):
    idx = torch.tensor([[1, 2, 4, 2], [0, 2, 1, 1]])

    def fn(w, x):
        return F.embedding(idx, w * 1.5, padding_idx=padding_idx) * x

    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
    _check(fn, [(5, 3), (2, 4, 3)], {"embedding"}, {"embedding_dense_backward"}, dtype=dtype,
           **tol)  # fmt: skip


# ---- convolution and its backward as ATen segments ------------------------------------------

# name -> (module, input shape): groups, stride, padding, dilation, bias, transposed
CONVS = {
    "conv2d_bias": (lambda: torch.nn.Conv2d(4, 6, 3, padding=1), (2, 4, 7, 7)),
    "conv2d_stride_dilation_groups": (
        lambda: torch.nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2, bias=False),
        (2, 4, 9, 8)),
    "conv1d_depthwise": (lambda: torch.nn.Conv1d(3, 6, 5, padding=2, groups=3), (2, 3, 11)),
    "conv_transpose2d": (
        lambda: torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1,
                                         groups=2), (2, 4, 5, 6)),
    "conv3d": (lambda: torch.nn.Conv3d(2, 3, (2, 3, 3), stride=(1, 2, 1)), (1, 2, 4, 6, 5)),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_convolution_and_its_backward_lower_into_regions(name):
    """A convolution between pointwise work: the region holds the work before it and the
    convolution (Note [Region cuts]), the backward region convolution_backward with the
    gradient's pointwise work; outputs and every gradient (input, weight, bias) as eager's."""
    make, shape = CONVS[name]
    torch.manual_seed(0)
    conv = make().double()

    def fn(x, w, *bias):
        y = torch.ops.aten.convolution(torch.tanh(x * 2), w, bias[0] if bias else None,
                                       conv.stride, conv.padding, conv.dilation,
                                       conv.transposed, conv.output_padding, conv.groups)
        return torch.sigmoid(y) * 3

    shapes = [shape, tuple(conv.weight.shape)] + ([tuple(conv.bias.shape)] if conv.bias
                                                   is not None else [])  # fmt: skip
    _check(fn, shapes, {"convolution", "tanh"}, {"convolution_backward", "tanh_backward"})


def test_convolution_backward_without_the_input_gradient():
    """A first layer's backward asks for no input gradient (output_mask [False, True,
    True]): the region returns the weight's and bias's, eager gets None for the input's."""
    torch.manual_seed(1)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    w = torch.randn(5, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    w2, b2 = (t.detach().clone().requires_grad_() for t in (w, b))

    def fn(x, w, b):
        return torch.relu(F.conv2d(x, w * 2, b, padding=1)).sum()

    torch.compile(fn, backend="fusion_cache")(x, w, b).backward()
    fn(x, w2, b2).backward()
    torch.testing.assert_close(w.grad, w2.grad)
    torch.testing.assert_close(b.grad, b2.grad)
    backward = next(r for r in dynamo_backend.reports() if r["graph"] == "backward")
    assert "convolution_backward" in backward["fused_ops"], backward


def test_convolution_segments_are_aten_calls():
    """precompile (h100) of a region's definition: the convolutions and convolution_backward
    are ATen segments, the batch norm and activations around them generated kernels."""
    from fusion_cache import FusionDefinition
    from fusion_cache.runtime.executor import executor_for

    def meta(*shape):
        return torch.empty(shape, device="meta")

    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=True)
        w = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=True)
        go = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=True)
        h = fd.ops.relu(fd.ops.mul(x, 2.0))
        y = fd.ops.convolution(h, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        fd.add_output(fd.ops.sum(y, [0, 2, 3]))
        gx, gw, gb = fd.ops.convolution_backward(fd.ops.mul(go, 0.5), h, w, [1, 1], [1, 1],
                                                 [1, 1], False, [0, 0], 1, [True, True, True])
        fd.add_output(fd.ops.mul(gx, x))
        fd.add_output(gw)
        fd.add_output(gb)
    fd.precompile([meta(8, 16, 32, 32), meta(32, 16, 3, 3), meta(8, 32, 32, 32)], target="h100")
    plan = executor_for(fd).last_plan
    kinds = [s.scheduler for s in plan.segments]
    assert kinds.count("aten") == 2 and "aten:convolution[" in plan.description, plan.description
    assert "aten:convolution_backward[" in plan.description, plan.description
    assert all(k is not None for k in kinds), kinds
