"""ATen ops (matmul, linear, sdpfa_fwd/bwd, grouped_mm, scaled_mm, cumsum, argsort, topk):
definitions, the reference against torch on the CPU, and the segment plans they make for
the h100 profile with fallback disabled (Note [ATen segments]); tests/gpu run them."""
import pytest
import torch
import torch.nn.functional as F
from aten_patterns import attention_block, linear_bias_gelu, mlp_block
from test_runtime_errors import cpu_as_gpu  # noqa: F401 - the GPU path on the CPU

from fusion_cache import DataType, FusionCache, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch
from fusion_cache.runtime.executor import executor_for

FLOATS = [torch.float32, torch.bfloat16]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
       torch.float64: dict(rtol=1e-10, atol=1e-10)}  # fmt: skip


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def rand(*shape, dtype=torch.float32, gen=None):
    return torch.randn(*shape, generator=gen).to(dtype)


def tensor(fd, t):
    return fd.define_tensor(shape=[-1] * t.dim(), contiguity=True, dtype=from_torch(t.dtype))


def run(build, inputs):
    with FusionDefinition() as fd:
        outs = build(fd, *(tensor(fd, t) for t in inputs))
        for o in outs if isinstance(outs, tuple) else (outs,):
            fd.add_output(o)
    return fd, fd.execute(inputs)


# ---- each op against torch ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("sa,sb", [((5, 7), (7, 3)), ((2, 5, 7), (7, 3)), ((7,), (7, 3)),
                                   ((4, 1, 5, 7), (3, 7, 2)), ((7,), (7,))])  # fmt: skip
def test_matmul(dtype, sa, sb):
    a, b = rand(*sa, dtype=dtype), rand(*sb, dtype=dtype)
    _, (out,) = run(lambda fd, x, y: fd.ops.matmul(x, y), [a, b])
    torch.testing.assert_close(out, torch.matmul(a, b), **TOL[dtype])


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_linear(dtype, bias):
    x, w, b = rand(3, 4, 16, dtype=dtype), rand(8, 16, dtype=dtype), rand(8, dtype=dtype)
    inputs = [x, w, b] if bias else [x, w]
    _, (out,) = run(lambda fd, *t: fd.ops.linear(*t), inputs)
    torch.testing.assert_close(out, F.linear(*inputs), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_sdpfa_forward_and_backward(dtype, causal):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (rand(2, 3, n, 16, dtype=dtype, gen=gen) for n in (10, 12, 12))
    go = rand(2, 3, 10, 16, dtype=dtype, gen=gen)
    with FusionDefinition() as fd:
        tq, tk, tv, tg = (tensor(fd, t) for t in (q, k, v, go))
        o, lse, seed, offset = fd.ops.sdpfa_fwd(tq, tk, tv, 0.0, causal, 0.3)
        dq, dk, dv = fd.ops.sdpfa_bwd(tg, tq, tk, tv, o, lse, 0.0, causal, seed, offset, 0.3)
        for t in (o, lse, dq, dk, dv):
            fd.add_output(t)
    assert seed.dtype is DataType.UInt64 and seed.ndim == 1 and offset.ndim == 0
    assert lse.dtype is DataType.Float
    o, lse, dq, dk, dv = fd.execute([q, k, v, go])
    qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal, scale=0.3)
    ref.backward(go.double())
    tol = TOL[dtype]
    torch.testing.assert_close(o.double(), ref.detach(), **tol)
    for got, want in zip((dq, dk, dv), (qr.grad, kr.grad, vr.grad)):
        torch.testing.assert_close(got.double(), want, **tol)
    scores = (qr @ kr.transpose(-1, -2) * 0.3).detach()
    if causal:
        scores = scores.masked_fill(torch.ones(10, 12).triu(1).bool(), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), rtol=1e-4, atol=1e-4)


def test_sdpfa_dropout_needs_flash_attention():
    q = rand(1, 2, 8, 16)
    with FusionDefinition() as fd:
        t = tensor(fd, q)
        fd.add_output(fd.ops.sdpfa_fwd(t, t, t, 0.1, False, None)[0])
    with pytest.raises(ValueError, match="dropout_p=0.1 needs flash attention"):
        fd.execute([q])


def test_grouped_mm_splits_rows_by_offsets():
    a, b = rand(10, 16), rand(3, 16, 8)
    offs = torch.tensor([3, 7, 10], dtype=torch.int32)
    _, (out,) = run(lambda fd, x, y, o: fd.ops.grouped_mm(x, y, o), [a, b, offs])
    want = torch.cat([a[0:3] @ b[0], a[3:7] @ b[1], a[7:10] @ b[2]])
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_scaled_mm_of_float8_with_scales_and_bias():
    gen = torch.Generator().manual_seed(2)
    a = rand(16, 32, gen=gen).to(torch.float8_e4m3fn)
    b = rand(32, 8, gen=gen).to(torch.float8_e4m3fn)
    sa, sb, bias = torch.tensor(0.5), torch.tensor(2.0), rand(8, gen=gen)
    with FusionDefinition() as fd:
        ta, tb, tsa, tsb, tbias = (tensor(fd, t) for t in (a, b, sa, sb, bias))
        out, block, gamma = fd.ops.scaled_mm(ta, tb, tsa, tsb, bias=tbias, dtype=DataType.Float)
        assert block is None and gamma is None
        fd.add_output(out)
    (out,) = fd.execute([a, b, sa, sb, bias])
    torch.testing.assert_close(out, (a.float() * 0.5) @ (b.float() * 2.0) + bias)
    assert "T5, _, _ = fd.ops.scaled_mm(" in repr(fd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool], ids=str)
def test_cumsum_argsort_topk(dtype):
    x = (rand(6, 9) * 10).to(dtype)
    with FusionDefinition() as fd:
        t = tensor(fd, x)
        fd.add_output(fd.ops.cumsum(t, 1))
        if dtype != torch.bool:
            fd.add_output(fd.ops.argsort(t, 0, descending=True, stable=True))
            values, indices = fd.ops.topk(t, 3, dim=1, largest=False, sorted=True)
            fd.add_output(values)
            fd.add_output(indices)
    outs = fd.execute([x])
    want = torch.cumsum(x, 1)
    assert outs[0].dtype == want.dtype
    torch.testing.assert_close(outs[0], want, **TOL.get(dtype, dict(rtol=0, atol=0)))
    if dtype != torch.bool:
        assert torch.equal(outs[1], torch.argsort(x, dim=0, descending=True, stable=True))
        values, indices = torch.topk(x, 3, dim=1, largest=False, sorted=True)
        assert torch.equal(outs[2], values) and torch.equal(outs[3], indices)


@pytest.mark.parametrize("build,error", [
    (lambda fd, a, b: fd.ops.matmul(a, fd.ops.cast(b, DataType.Half)), "share one dtype"),
    (lambda fd, a, b: fd.ops.linear(a, fd.ops.broadcast(b, [True, False, False])), "1 or 2"),
    (lambda fd, a, b: fd.ops.sdpfa_fwd(a, a, b), "must be 4-D"),
    (lambda fd, a, b: fd.ops.topk(a, 2.5), "k must be an Int"),
    (lambda fd, a, b: fd.ops.cumsum(a, 3), "out of range"),
])  # fmt: skip
def test_definition_errors_name_the_argument(build, error):
    with FusionDefinition() as fd:
        a, b = (fd.define_tensor(shape=[-1, -1], contiguity=True) for _ in range(2))
        with pytest.raises((TypeError, ValueError), match=error):
            build(fd, a, b)


def test_printed_definition_rebuilds_the_same_fusion():
    with FusionDefinition() as fd:
        q = fd.define_tensor(shape=[-1, -1, -1, -1], contiguity=True, dtype=DataType.BFloat16)
        o, lse, seed, offset = fd.ops.sdpfa_fwd(q, q, q, None, True, None)
        v, i = fd.ops.topk(lse, 4, dim=-1)
        fd.add_output(fd.ops.linear(o, fd.ops.squeeze(fd.ops.slice(q, [0, 0, 0, 0], [1, 1, 4, 4]),
                                                      [0, 1])))  # fmt: skip
        fd.add_output(v)
        fd.add_output(seed)
    scope: dict = {}
    exec(repr(fd), {"DataType": DataType, "FusionDefinition": FusionDefinition}, scope)
    with FusionDefinition() as again:
        next(iter(scope.values()))(again)
    assert again.id() == fd.id()


# ---- segment plans ------------------------------------------------------------------------


def _plan(fd, inputs):
    fd.precompile(inputs, target="h100")
    return executor_for(fd).last_plan


def _kinds(plan):
    return [s.scheduler for s in plan.segments]


def test_linear_bias_gelu_is_a_gemm_then_one_kernel(monkeypatch):
    fd = linear_bias_gelu()
    refs = fd.precompile([meta(8192, 768), meta(3072, 768), meta(3072)], target="h100")
    plan = executor_for(fd).last_plan
    assert _kinds(plan) == ["aten", "pointwise"] and len(refs) == 1
    assert "aten:linear[fusion" in plan.description
    text = fd.last_scheduled_fusion_ir()
    assert "ATen linear as torch.nn.functional.linear" in text
    # the GEMM's result dies after the epilogue kernel reads it
    gemm_out = plan.segments[0].sub.outputs[0]
    assert gemm_out in plan.segments[1].drop_after


def test_attention_block_keeps_layer_norm_in_a_kernel_and_views_in_the_torch_calls():
    fd = attention_block(8, 1024, 12, 64)
    c = 768
    refs = fd.precompile([meta(8, 1024, c), meta(c), meta(c), meta(3 * c, c), meta(3 * c),
                          meta(c, c), meta(c)], target="h100")  # fmt: skip
    plan = executor_for(fd).last_plan
    assert _kinds(plan) == ["reduction", "aten", "aten", "aten"] and len(refs) == 1
    assert "aten:linear" in plan.description and "aten:sdpfa_fwd" in plan.description
    # flash attention's output reaches the output projection with its own strides
    out_proj = plan.segments[3].definition
    attn_in = out_proj.input_refs()[2]
    assert out_proj._infos[attn_in.index].contiguity == (False, False, False, False)
    assert plan.segments[3].dense_inputs == ()


def test_mlp_block_runs_two_gemms_around_one_kernel():
    fd = mlp_block()
    refs = fd.precompile([meta(8192, 768), meta(3072, 768), meta(3072), meta(768, 3072),
                          meta(768)], target="h100")  # fmt: skip
    plan = executor_for(fd).last_plan
    assert _kinds(plan) == ["aten", "pointwise", "aten"] and len(refs) == 1


def test_dump_segments_names_every_aten_segment(monkeypatch, capsys):
    monkeypatch.setenv("FUSION_CACHE_DUMP", "segments")
    FusionCache.reset()
    fd = linear_bias_gelu()
    fd.precompile([meta(64, 32), meta(48, 32), meta(48)], target="h100")
    out = capsys.readouterr().out
    assert "aten:linear[fusion" in out and "ATen linear as torch.nn.functional.linear" in out


def test_reference_runs_a_segmented_fusion_with_aten_ops_on_the_cpu():
    fd = linear_bias_gelu()
    x, w, b = rand(64, 32, dtype=torch.bfloat16), rand(48, 32, dtype=torch.bfloat16), \
        rand(48, dtype=torch.bfloat16)
    (out,) = fd.execute([x, w, b])
    want = F.gelu(F.linear(x, w).float() + b.float()).bfloat16()
    torch.testing.assert_close(out, want, **TOL[torch.bfloat16])


def test_a_single_aten_op_is_one_aten_plan():
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.BFloat16)
        fd.add_output(fd.ops.matmul(a, fd.ops.permute(a, [1, 0])))
    assert fd.precompile([meta(64, 32)], target="h100") == []
    ex = executor_for(fd)
    assert ex.scheduler == "aten" and "matmul as torch.matmul with views permute" in \
        ex.last_plan.describe()


def test_segmented_runs_through_the_gpu_path(cpu_as_gpu):  # noqa: F811
    """The GPU path on the CPU (tests/test_runtime_errors.py): ATen segments make their
    torch calls (counted as aten_runs), the kernels around them run as the reference."""
    fd = attention_block(2, 16, 2, 64)
    gen = torch.Generator().manual_seed(3)
    c = 128
    ins = [rand(*s, dtype=torch.bfloat16, gen=gen) * k for s, k in (
        ((2, 16, c), 1), ((c,), 1), ((c,), 1), ((3 * c, c), 0.1), ((3 * c,), 1), ((c, c), 0.1),
        ((c,), 1))]  # fmt: skip
    before = FusionCache.get().stats().get("aten_runs", 0)
    (out,) = fd.execute(ins)
    assert FusionCache.get().stats()["aten_runs"] - before == 3
    x, lw, lb, wqkv, bqkv, wo, bo = (t.float() for t in ins)
    n = F.layer_norm(x, (c,), lw, lb, 1e-5)
    qkv = F.linear(n, wqkv, bqkv).reshape(2, 16, 3, 2, 64).permute(2, 0, 3, 1, 4)
    o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
    want = F.linear(o.permute(0, 2, 1, 3).reshape(2, 16, c), wo, bo)
    torch.testing.assert_close(out.float(), want, rtol=3e-2, atol=3e-2)
