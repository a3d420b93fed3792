"""ATen segments on the GPU against eager: each op alone, and the transformer blocks whose
GEMMs and attention run as torch calls between generated kernels. Fallback is disabled
(tests/conftest.py): nothing here may reach the reference evaluator."""
import pytest
import torch
import torch.nn.functional as F
from aten_patterns import VIEW_PATTERNS, attention_block, linear_bias_gelu, mlp_block, view_pattern

from fusion_cache import DataType, FusionCache, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch

pytestmark = pytest.mark.gpu
BF16 = dict(rtol=2e-2, atol=2e-2)


def stats():
    return dict(FusionCache.get().stats())


def delta(before, *names):
    now = stats()
    return tuple(now.get(n, 0) - before.get(n, 0) for n in names)


def rand(*shape, dtype=torch.bfloat16, scale=1.0, gen=None):
    return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dtype)


def tensor(fd, t):
    return fd.define_tensor(shape=[-1] * t.dim(), contiguity=True, dtype=from_torch(t.dtype))


def test_linear_bias_gelu_one_gemm_one_kernel():
    fd = linear_bias_gelu()
    x, w, b = rand(2048, 768), rand(3072, 768, scale=0.05), rand(3072)
    fd.execute([x, w, b])
    before = stats()
    (out,) = fd.execute([x, w, b])
    assert delta(before, "kernel_launches", "aten_runs", "reference_runs") == (1, 1, 0)
    torch.testing.assert_close(out, F.gelu(F.linear(x, w).float() + b.float()).bfloat16(), **BF16)


def test_mlp_block():
    fd = mlp_block()
    x, w1, b1 = rand(1024, 768), rand(3072, 768, scale=0.05), rand(3072)
    w2, b2 = rand(768, 3072, scale=0.03), rand(768)
    (out,) = fd.execute([x, w1, b1, w2, b2])
    h = F.gelu(F.linear(x, w1, b1).float()).bfloat16()
    torch.testing.assert_close(out, F.linear(h, w2, b2), **BF16)


@pytest.mark.parametrize("batch,seq,heads,dim", [(2, 256, 4, 64), (1, 1000, 12, 64)])
def test_attention_block(batch, seq, heads, dim):
    c = heads * dim
    fd = attention_block(batch, seq, heads, dim)
    ins = [rand(batch, seq, c), rand(c), rand(c), rand(3 * c, c, scale=0.05), rand(3 * c),
           rand(c, c, scale=0.05), rand(c)]  # fmt: skip
    before = stats()
    (out,) = fd.execute(ins)
    assert delta(before, "aten_runs", "reference_runs") == (3, 0)
    x, lw, lb, wqkv, bqkv, wo, bo = ins
    n = F.layer_norm(x.float(), (c,), lw.float(), lb.float(), 1e-5).bfloat16()
    qkv = F.linear(n, wqkv, bqkv).reshape(batch, seq, 3, heads, dim).permute(2, 0, 3, 1, 4)
    o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
    want = F.linear(o.permute(0, 2, 1, 3).reshape(batch, seq, c), wo, bo)
    torch.testing.assert_close(out, want, **BF16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_sdpfa_forward_backward_against_eager(dtype):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (rand(2, 4, n, 64, dtype=dtype, gen=gen) for n in (200, 300, 300))
    go = rand(2, 4, 200, 64, dtype=dtype, gen=gen)
    with FusionDefinition() as fd:
        tq, tk, tv, tg = (tensor(fd, t) for t in (q, k, v, go))
        o, lse, seed, off = fd.ops.sdpfa_fwd(tq, tk, tv, None, False, 0.125)
        dq, dk, dv = fd.ops.sdpfa_bwd(tg, tq, tk, tv, o, lse, None, False, seed, off, 0.125)
        for t in (o, dq, dk, dv):
            fd.add_output(t)
    o, dq, dk, dv = fd.execute([q, k, v, go])
    qr, kr, vr = (t.float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qr, kr, vr, scale=0.125)
    ref.backward(go.float())
    torch.testing.assert_close(o.float(), ref, **BF16)
    for got, want in zip((dq, dk, dv), (qr.grad, kr.grad, vr.grad)):
        torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_sdpa_cudnn_forward_backward_against_eager(dtype):
    """cuDNN's attention and its backward as ATen segments: the same numbers as torch's own
    cuDNN call (its log-sum-exp too), and gradients near attention in float32."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, go = (rand(2, 4, 256, 64, dtype=dtype, gen=gen) for _ in range(4))
    with FusionDefinition() as fd:
        tq, tk, tv, tg = (tensor(fd, t) for t in (q, k, v, go))
        o, lse, seed, off = fd.ops.sdpa_cudnn_fwd(tq, tk, tv, None, True, 0.125)
        dq, dk, dv = fd.ops.sdpa_cudnn_bwd(tg, tq, tk, tv, o, lse, seed, off, None, True, 0.125)
        for t in (o, lse, dq, dk, dv):
            fd.add_output(t)
    before = stats()
    o, lse, dq, dk, dv = fd.execute([q, k, v, go])
    assert delta(before, "reference_runs") == (0,)
    eager = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True,
                                                               False, scale=0.125)  # fmt: skip
    torch.testing.assert_close(o, eager[0], **BF16)
    torch.testing.assert_close(lse, eager[1], rtol=1e-3, atol=1e-3)
    qr, kr, vr = (t.float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True, scale=0.125)
    ref.backward(go.float())
    for got, want in zip((dq, dk, dv), (qr.grad, kr.grad, vr.grad)):
        torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_sdpa_efficient_with_a_mask_against_eager(dtype):
    """Memory-efficient attention with an additive mask and its backward as ATen segments:
    torch's own call's numbers, and gradients near attention in float32."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, go = (rand(2, 4, 200, 64, dtype=dtype, gen=gen) for _ in range(4))
    mask = rand(2, 4, 200, 200, dtype=dtype, gen=gen)
    with FusionDefinition() as fd:
        tq, tk, tv, tg, tm = (tensor(fd, t) for t in (q, k, v, go, mask))
        o, lse, seed, off = fd.ops.sdpa_efficient_fwd(tq, tk, tv, tm, None, False, 0.125)
        dq, dk, dv = fd.ops.sdpa_efficient_bwd(tg, tq, tk, tv, tm, o, lse, seed, off, None,
                                               False, 0.125)  # fmt: skip
        for t in (o, lse, dq, dk, dv):
            fd.add_output(t)
    before = stats()
    o, lse, dq, dk, dv = fd.execute([q, k, v, go, mask])
    assert delta(before, "reference_runs") == (0,)
    eager = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, mask, True, 0.0,
                                                                   False, scale=0.125)  # fmt: skip
    torch.testing.assert_close(o, eager[0], **BF16)
    torch.testing.assert_close(lse, eager[1], rtol=1e-3, atol=1e-3)
    qr, kr, vr = (t.float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask.float(), scale=0.125)
    ref.backward(go.float())
    for got, want in zip((dq, dk, dv), (qr.grad, kr.grad, vr.grad)):
        torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2)


def test_sdpfa_dropout_follows_torch_manual_seed():
    q = rand(2, 4, 128, 64)
    with FusionDefinition() as fd:
        t = tensor(fd, q)
        o, lse, seed, off = fd.ops.sdpfa_fwd(t, t, t, 0.5, False, None)
        fd.add_output(o)
        fd.add_output(seed)
    torch.manual_seed(7)
    a, sa = fd.execute([q])
    b, _ = fd.execute([q])
    torch.manual_seed(7)
    c, sc = fd.execute([q])
    assert torch.equal(a, c) and not torch.equal(a, b) and torch.equal(sa, sc)


def test_matmul_grouped_mm_topk_argsort_cumsum_against_eager():
    a, b = rand(96, 128), rand(128, 64)
    offs = torch.tensor([32, 64, 96], dtype=torch.int32, device="cuda")
    w3 = rand(3, 128, 64)
    x = rand(64, 1000, dtype=torch.float32)
    with FusionDefinition() as fd:
        ta, tb, to, tw, tx = (tensor(fd, t) for t in (a, b, offs, w3, x))
        fd.add_output(fd.ops.matmul(ta, tb))
        fd.add_output(fd.ops.grouped_mm(ta, tw, to))
        fd.add_output(fd.ops.cumsum(tx, 1))
        fd.add_output(fd.ops.argsort(tx, 1, descending=True, stable=True))
        values, indices = fd.ops.topk(tx, 10, dim=1, largest=True, sorted=True)
        fd.add_output(values)
        fd.add_output(indices)
    before = stats()
    mm, gmm, cs, order, values, indices = fd.execute([a, b, offs, w3, x])
    assert delta(before, "reference_runs") == (0,)
    torch.testing.assert_close(mm, a @ b, **BF16)
    torch.testing.assert_close(gmm, torch._grouped_mm(a, w3, offs=offs), **BF16)
    torch.testing.assert_close(cs, torch.cumsum(x, 1), rtol=1e-4, atol=1e-3)
    assert torch.equal(order, torch.argsort(x, dim=1, descending=True, stable=True))
    want_v, want_i = torch.topk(x, 10, dim=1, sorted=True)
    assert torch.equal(values, want_v) and torch.equal(indices, want_i)


def test_scaled_mm_float8_against_eager():
    a = rand(64, 128, dtype=torch.float32).to(torch.float8_e4m3fn)
    b = rand(64, 128, dtype=torch.float32).to(torch.float8_e4m3fn).t()  # column-major
    sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(2.0, device="cuda")
    with FusionDefinition() as fd:
        ta, tsa, tsb = tensor(fd, a), tensor(fd, sa), tensor(fd, sb)
        tb = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float8_e4m3fn,
                              stride_order=[0, 1])  # fmt: skip
        out, _, _ = fd.ops.scaled_mm(ta, tb, tsa, tsb, dtype=DataType.BFloat16)
        fd.add_output(out)
    (out,) = fd.execute([a, sa, sb, b])  # in definition order
    want = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_bmm_and_its_epilogue_against_eager():
    a, b = rand(8, 128, 64), rand(8, 64, 96, scale=0.1)
    with FusionDefinition() as fd:
        y = fd.ops.bmm(tensor(fd, a), tensor(fd, b))
        fd.add_output(fd.ops.cast(fd.ops.relu(fd.ops.cast(y, DataType.Float)), DataType.BFloat16))
    fd.execute([a, b])
    before = stats()
    (out,) = fd.execute([a, b])
    assert delta(before, "kernel_launches", "aten_runs", "reference_runs") == (1, 1, 0)
    torch.testing.assert_close(out, torch.bmm(a, b).relu(), **BF16)


def test_prepared_calls_read_float_inputs_each_run():
    """Note [Prepared ATen calls]: one plan, the scale and causal flag of each run."""
    q = rand(2, 4, 128, 64)
    with FusionDefinition() as fd:
        t = tensor(fd, q)
        scale = fd.define_scalar(dtype=DataType.Double)
        causal = fd.define_scalar(dtype=DataType.Bool)
        fd.add_output(fd.ops.sdpfa_fwd(t, t, t, None, causal, scale)[0])
    for s, c in ((0.125, False), (0.3, True), (0.125, False)):
        (out,) = fd.execute([q, s, c])
        want = F.scaled_dot_product_attention(q, q, q, scale=s, is_causal=c)
        torch.testing.assert_close(out, want, **BF16)


@pytest.mark.parametrize("name", VIEW_PATTERNS)
def test_views_on_aten_results_against_eager(name):
    """Views into and out of ATen segments (tests/aten_patterns.py), twice: the second run
    replays the first (Note [Segmented replay])."""
    _, fd, inputs_of, torch_fn = view_pattern(name)
    gen = torch.Generator(device="cuda").manual_seed(2)
    for _ in range(2):
        inputs = inputs_of("cuda", gen)
        before = stats()
        outs = fd.execute(inputs)
        assert delta(before, "reference_runs") == (0,)
        want = torch_fn(*inputs)
        want = list(want) if isinstance(want, tuple) else [want]
        for got, w in zip(outs, want, strict=True):
            torch.testing.assert_close(got, w, **BF16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_convolution_forward_backward_against_eager(dtype, channels_last):
    """A convolution with batch norm's pointwise work before it, and its backward, as ATen
    segments: the same numbers as torch's own calls (cuDNN on both sides), grouped, strided."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = rand(8, 16, 32, 32, dtype=dtype, gen=gen).contiguous(memory_format=fmt)
    w = rand(32, 8, 3, 3, dtype=dtype, scale=0.1, gen=gen).contiguous(memory_format=fmt)
    b = rand(32, dtype=dtype, gen=gen)
    layout = ([2, 2], [1, 1], [1, 1], False, [0, 0], 2)
    with FusionDefinition() as fd:
        tx = fd.define_tensor(sizes=list(x.shape), strides=list(x.stride()),
                              dtype=from_torch(dtype))  # fmt: skip
        tw = fd.define_tensor(sizes=list(w.shape), strides=list(w.stride()),
                              dtype=from_torch(dtype))  # fmt: skip
        tb = tensor(fd, b)
        h = fd.ops.cast(fd.ops.relu(fd.ops.mul(fd.ops.cast(tx, DataType.Float), 2.0)),
                        from_torch(dtype))  # fmt: skip
        y = fd.ops.convolution(h, tw, tb, *layout)
        gx, gw, gb = fd.ops.convolution_backward(y, h, tw, *layout, [True, True, True])
        for t in (y, gx, gw, gb):
            fd.add_output(t)
    fd.execute([x, w, b])
    before = stats()
    y, gx, gw, gb = fd.execute([x, w, b])
    assert delta(before, "aten_runs", "reference_runs") == (2, 0)
    h = torch.relu(x.float() * 2).to(dtype)
    want = torch.ops.aten.convolution(h, w, b, *layout)
    grads = torch.ops.aten.convolution_backward(want, h, w, [32], *layout, [True, True, True])
    tol = BF16 if dtype == torch.bfloat16 else dict(rtol=1e-3, atol=1e-3)
    for got, ref in zip((y, gx, gw, gb), (want, *grads)):
        torch.testing.assert_close(got, ref, **tol)


@pytest.mark.parametrize("op", ["sdpfa_fwd", "sdpa_cudnn_fwd", "sdpa_efficient_fwd"])
@pytest.mark.parametrize("outputs", [1, 2])
def test_attention_calls_made_directly_as_in_the_environment(op, outputs):
    """Note [Prepared ATen calls]: an attention segment makes its op's call directly (no
    environment, no Interpreter); the rule on a filled environment gives the same tensors."""
    from dataclasses import replace

    from fusion_cache.runtime.aten_segments import AtenPlan
    from fusion_cache.runtime.executor import executor_for

    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (rand(2, 4, 128, 64, gen=gen) for _ in range(3))
    with FusionDefinition() as fd:
        tq, tk, tv = (tensor(fd, t) for t in (q, k, v))
        extra = (None,) if op == "sdpa_efficient_fwd" else ()
        results = getattr(fd.ops, op)(tq, tk, tv, *extra, None, True, 0.125)
        for t in results[:outputs]:
            fd.add_output(t)
    got = fd.execute([q, k, v])
    plan = executor_for(fd).last_plan
    assert isinstance(plan, AtenPlan) and plan.call.direct is not None
    in_env = replace(plan.call, direct=None)([q, k, v])
    assert len(got) == len(in_env) == outputs
    for a, b in zip(got, in_env):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.125)
    torch.testing.assert_close(got[0], want, **BF16)
