"""bmm, prepared ATen calls (Note [Prepared ATen calls]) and views on ATen segments' results,
against torch on the CPU: through the reference evaluator, and through the GPU path on the
CPU (tests/test_runtime_errors.py's cpu_as_gpu: plans for the h100 profile, ATen segments
making their torch calls, kernels run as the reference). tests/gpu/test_aten_gpu.py runs the
same fusions on the GPU."""
from dataclasses import replace

import pytest
import torch
from aten_patterns import VIEW_PATTERNS, view_pattern
from test_runtime_errors import cpu_as_gpu  # noqa: F401 - the GPU path on the CPU

from fusion_cache import DataType, FusionCache, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch
from fusion_cache.runtime.aten_segments import AtenPlan, run_aten
from fusion_cache.runtime.executor import executor_for

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def tensor(fd, t):
    return fd.define_tensor(shape=[-1] * t.dim(), contiguity=True, dtype=from_torch(t.dtype))


def aten_plans(fd):
    """The ATen plans of `fd`'s last run: its own, or its segments'."""
    plan = executor_for(fd).last_plan
    if isinstance(plan, AtenPlan):
        return [(executor_for(fd), plan)]
    return [(executor_for(s.definition), executor_for(s.definition).last_plan)
            for s in plan.segments if s.scheduler == "aten"]  # fmt: skip


def aten_runs():
    return FusionCache.get().stats().get("aten_runs", 0)


# ---- bmm ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bmm_against_torch(dtype):
    a, b = torch.randn(3, 5, 7).to(dtype), torch.randn(3, 7, 4).to(dtype)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.bmm(tensor(fd, a), tensor(fd, b)))
    (out,) = fd.execute([a, b])
    torch.testing.assert_close(out, torch.bmm(a, b), **TOL[dtype])
    assert "fd.ops.bmm(T0, T1)" in repr(fd)


@pytest.mark.parametrize("sa,sb,error", [((3, 5, 7), (7, 4), "3-D"), ((3, 5, 7), (2, 7, 4), "batch"),
                                         ((3, 5, 7), (3, 6, 4), "contracted")])  # fmt: skip
def test_bmm_refuses_what_torch_bmm_refuses(sa, sb, error):
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=list(sa), contiguity=True)
        b = fd.define_tensor(shape=list(sb), contiguity=True)
        with pytest.raises(ValueError, match=error):
            fd.ops.bmm(a, b)


def test_bmm_is_an_aten_segment_before_its_epilogue_kernel(cpu_as_gpu):  # noqa: F811
    a, b = torch.randn(4, 8, 16).bfloat16(), torch.randn(4, 16, 12).bfloat16()
    with FusionDefinition() as fd:
        y = fd.ops.bmm(tensor(fd, a), tensor(fd, b))
        fd.add_output(fd.ops.cast(fd.ops.relu(fd.ops.cast(y, DataType.Float)), DataType.BFloat16))
    before = aten_runs()
    (out,) = fd.execute([a, b])
    plan = executor_for(fd).last_plan
    assert [s.scheduler for s in plan.segments] == ["aten", "pointwise"]
    assert "aten:bmm[fusion" in plan.description and aten_runs() - before == 1
    torch.testing.assert_close(out, torch.bmm(a, b).relu(), **TOL[torch.bfloat16])


# ---- prepared ATen calls ------------------------------------------------------------------


def _single(build, *inputs):
    with FusionDefinition() as fd:
        outs = build(fd, *(tensor(fd, t) for t in inputs))
        for o in outs if isinstance(outs, tuple) else (outs,):
            fd.add_output(o)
    return fd


def _qkv(fd, x):
    """q, k, v as nvFuser's users split them: slices of one [3, B, H, T, D] tensor."""
    qkv = fd.ops.permute(fd.ops.reshape(x, [2, 16, 3, 2, 64]), [2, 0, 3, 1, 4])
    return [fd.ops.squeeze(fd.ops.slice(qkv, [i, 0, 0, 0, 0], [i + 1, 2, 2, 16, 64]), [0])
            for i in range(3)]  # fmt: skip


PREPARED = {
    "matmul_of_a_permute": (lambda fd, a: fd.ops.matmul(a, fd.ops.permute(a, [1, 0])),
                            [(16, 8)], lambda a: a @ a.t()),
    "linear_with_bias": (lambda fd, x, w, b: fd.ops.linear(x, w, b), [(2, 5, 8), (6, 8), (6,)],
                         torch.nn.functional.linear),
    "linear_without_bias": (lambda fd, x, w: fd.ops.linear(x, w), [(2, 5, 8), (6, 8)],
                            torch.nn.functional.linear),
    "bmm": (lambda fd, a, b: fd.ops.bmm(a, b), [(3, 4, 8), (3, 8, 5)], torch.bmm),
    "sdpfa_of_qkv_slices": (lambda fd, x: fd.ops.sdpfa_fwd(*_qkv(fd, x), None, True, None)[:2],
                            [(2, 16, 384)], None),
    "cumsum": (lambda fd, x: fd.ops.cumsum(x, 1), [(4, 9)], lambda x: torch.cumsum(x, 1)),
    "topk": (lambda fd, x: fd.ops.topk(x, 3, dim=1, largest=True, sorted=True), [(4, 9)],
             lambda x: torch.topk(x, 3, 1)),
    "argsort": (lambda fd, x: fd.ops.argsort(x, dim=1, descending=True, stable=True), [(4, 9)],
                lambda x: torch.argsort(x, dim=1, descending=True, stable=True)),
    "matmul_of_a_vector_slice": (
        lambda fd, a, b: fd.ops.matmul(a, fd.ops.squeeze(fd.ops.slice(b, [0, 2], [5, 3]), [1])),
        [(3, 5), (5, 4)], lambda a, b: a @ b[:, 2]),
}


def test_every_aten_op_has_the_call_a_prepared_call_makes():
    """Note [ATen calls]: a prepared call makes the op's call, and the interpreter's rule is
    made from the same call, so every op the ATen scheduler takes needs one (and nothing
    more)."""
    from fusion_cache.ir.interpret.aten import CALLS
    from fusion_cache.ir.interpret.core import RULES
    from schedulers.aten import ATEN_OPS

    assert not ATEN_OPS - CALLS.keys() and not ATEN_OPS - RULES.keys()


@pytest.mark.parametrize("name", sorted(PREPARED))
def test_prepared_call_gives_the_interpreted_run(name, cpu_as_gpu):  # noqa: F811
    """The prepared call (as_strided operands, the op's call made directly) returns what the
    interpreted run of the same records and the rule on a filled environment return, bit for
    bit, and torch's answer."""
    build, shapes, torch_fn = PREPARED[name]
    gen = torch.Generator().manual_seed(4)
    inputs = [torch.randn(*s, generator=gen) for s in shapes]
    fd = _single(build, *inputs)
    before = aten_runs()
    outs = fd.execute(inputs)
    assert aten_runs() - before == 1
    ((ex, plan),) = aten_plans(fd)
    assert plan.call is not None
    # each returns its op's outputs: the call is made directly (Note [Prepared ATen calls])
    assert plan.call.direct is not None, name
    interpreted = run_aten(ex.fd, replace(plan, call=None), inputs)
    in_env = run_aten(ex.fd, replace(plan, call=replace(plan.call, direct=None)), inputs)
    assert len(outs) == len(interpreted) == len(in_env)
    for got, want, env in zip(outs, interpreted, in_env):
        assert torch.equal(got, want) and torch.equal(env, want), name
    if torch_fn is not None:
        ref = torch_fn(*inputs)
        for got, want in zip(outs, [ref] if isinstance(ref, torch.Tensor) else ref):
            torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_prepared_call_reads_float_inputs_each_run(cpu_as_gpu):  # noqa: F811
    """A float input (the scale) is not in the plan's key: one plan, each run's value."""
    q = torch.randn(1, 2, 8, 16)
    with FusionDefinition() as fd:
        t = tensor(fd, q)
        scale = fd.define_scalar(dtype=DataType.Double)
        causal = fd.define_scalar(dtype=DataType.Bool)
        fd.add_output(fd.ops.sdpfa_fwd(t, t, t, None, causal, scale)[0])
    for s, c in ((0.3, False), (0.7, True)):
        (out,) = fd.execute([q, s, c])
        want = torch.nn.functional.scaled_dot_product_attention(q, q, q, scale=s, is_causal=c)
        torch.testing.assert_close(out, want, **TOL[torch.float32])
    assert len(executor_for(fd).plans) == 1 and executor_for(fd).last_plan.call is not None


def test_prepared_call_of_inputs_with_a_storage_offset(cpu_as_gpu):  # noqa: F811
    """as_strided counts from the run's input's own storage offset, not the planned one's."""
    fd = _single(lambda fd, a: fd.ops.matmul(a, fd.ops.permute(a, [1, 0])), torch.randn(8, 4))
    big = torch.randn(40, 4)
    for start in (0, 16, 32):  # same sizes, strides and alignment: one plan
        a = big[start:start + 8]
        (out,) = fd.execute([a])
        torch.testing.assert_close(out, a @ a.t(), **TOL[torch.float32])
    assert len(executor_for(fd).plans) == 1


@pytest.mark.parametrize("with_lse", [False, True])
def test_attention_wanted_alone_takes_torchs_backend(with_lse, cpu_as_gpu):  # noqa: F811
    """An sdpfa_fwd segment returning only the attention output calls torch's sdpa dispatcher
    on CUDA (on the CPU: the op's rule); with its logsumexp returned, flash attention."""
    from fusion_cache.ir.interpret.aten import sdpfa_fwd, sdpfa_output_only

    x = torch.randn(2, 16, 384)
    fd = _single(lambda fd, x: fd.ops.sdpfa_fwd(*_qkv(fd, x), None, True, None)[:1 + with_lse], x)
    outs = fd.execute([x])
    ((_, plan),) = aten_plans(fd)
    assert plan.call.direct[0] is (sdpfa_fwd if with_lse else sdpfa_output_only)
    q, k, v = x.reshape(2, 16, 3, 2, 64).permute(2, 0, 3, 1, 4)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(outs[0], want, **TOL[torch.float32])


def test_a_prepared_call_given_other_strides_interprets(cpu_as_gpu):  # noqa: F811
    """A replayed segment's input is another segment's result, which no plan key checked:
    where its strides are not the prepared ones, the records are interpreted."""
    a = torch.randn(8, 4)
    fd = _single(lambda fd, a: fd.ops.matmul(a, fd.ops.permute(a, [1, 0])), a)
    fd.execute([a])
    ((_, plan),) = aten_plans(fd)
    other = torch.randn(4, 8).t()  # the same sizes, column-major
    (out,) = plan.call([other])
    torch.testing.assert_close(out, other @ other.t(), **TOL[torch.float32])


def test_a_copying_reshape_keeps_the_interpreted_run(cpu_as_gpu):  # noqa: F811
    """reshape of a permuted tensor copies in torch: no as_strided makes it; the segment runs
    its records as before."""
    a = torch.randn(6, 4)
    fd = _single(lambda fd, a: fd.ops.matmul(fd.ops.reshape(fd.ops.permute(a, [1, 0]), [3, 8]),
                                             fd.ops.reshape(a, [8, 3])), a)  # fmt: skip
    (out,) = fd.execute([a])
    assert executor_for(fd).last_plan.call is None
    torch.testing.assert_close(out, a.t().reshape(3, 8) @ a.reshape(8, 3), **TOL[torch.float32])


# ---- views on ATen segments' results ------------------------------------------------------


@pytest.mark.parametrize("name", VIEW_PATTERNS)
@pytest.mark.parametrize("path", ["reference", "gpu path"])
def test_views_on_aten_results_against_torch(name, path, request):
    if path == "gpu path":
        request.getfixturevalue("cpu_as_gpu")
    _, fd, inputs_of, torch_fn = view_pattern(name)
    inputs = inputs_of("cpu", torch.Generator().manual_seed(5))
    outs = fd.execute(inputs)
    want = torch_fn(*inputs)
    want = list(want) if isinstance(want, tuple) else [want]
    assert len(outs) == len(want)
    for got, w in zip(outs, want):
        assert got.shape == w.shape, name
        torch.testing.assert_close(got.float(), w.float(), rtol=2e-2, atol=2e-2)
    if path == "gpu path":
        assert all(p.call is not None for _, p in aten_plans(fd)), name


# ---- segmented replay ---------------------------------------------------------------------


def test_a_segmented_plan_replays_its_first_run(cpu_as_gpu):  # noqa: F811
    """Note [Segmented replay]: the first run records, later runs of the plan replay (fresh
    data each time, the same torch calls and kernels, counted as before)."""
    import torch.nn.functional as F
    from aten_patterns import attention_block

    fd = attention_block(2, 16, 2, 64)
    c = 128
    gen = torch.Generator().manual_seed(6)
    for _run in range(3):
        x, lw, lb, wqkv, bqkv, wo, bo = ins = [
            torch.randn(*s, generator=gen).bfloat16() * k for s, k in (
                ((2, 16, c), 1), ((c,), 1), ((c,), 1), ((3 * c, c), 0.1), ((3 * c,), 1),
                ((c, c), 0.1), ((c,), 1))]  # fmt: skip
        stats = FusionCache.get().stats()
        before = (stats.get("aten_runs", 0), stats.get("segmented_runs", 0))
        (out,) = fd.execute(ins)
        stats = FusionCache.get().stats()
        assert (stats["aten_runs"] - before[0], stats["segmented_runs"] - before[1]) == (3, 1)
        assert len(executor_for(fd).replays) == 1
        n = F.layer_norm(x.float(), (c,), lw.float(), lb.float(), 1e-5).bfloat16()
        qkv = F.linear(n, wqkv, bqkv).reshape(2, 16, 3, 2, 64).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        want = F.linear(o.permute(0, 2, 1, 3).reshape(2, 16, c), wo, bo)
        torch.testing.assert_close(out.float(), want.float(), rtol=3e-2, atol=3e-2)


def test_the_segments_dump_keeps_the_segment_by_segment_run(cpu_as_gpu, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setenv("FUSION_CACHE_DUMP", "segments")
    FusionCache.reset()
    a, b = torch.randn(4, 8, 16), torch.randn(4, 16, 12)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.relu(fd.ops.bmm(tensor(fd, a), tensor(fd, b))))
    for _ in range(2):
        (out,) = fd.execute([a, b])
        assert "segment 0: fusion" in capsys.readouterr().out
    assert not executor_for(fd).replays
    torch.testing.assert_close(out, torch.bmm(a, b).relu())


VIEWS = {
    "transpose": (lambda x: x.t(), (6, 4), "t"),
    "permute": (lambda x: x.permute(2, 0, 1), (2, 3, 5), "permute"),
    "permute_with_unit_dims": (lambda x: x.permute(1, 0, 3, 2), (1, 3, 1, 5), "permute"),
    "view": (lambda x: x.view(6, 20), (2, 3, 4, 5), "view"),
    "slice": (lambda x: x[1:], (4, 6), None),  # another storage offset: as_strided
    "column": (lambda x: x[:, 2], (5, 4), None),
    "expand": (lambda x: x.unsqueeze(0).expand(3, 4, 6), (4, 6), None),
    "same_layout": (lambda x: x[:], (4, 6), None),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_recipe_makes_the_same_view(name):
    """A prepared operand's view method (view_recipe) gives exactly the view the records
    made (sizes, strides, offset), or there is none and as_strided makes it."""
    from fusion_cache.runtime.aten_calls import view_recipe

    make, shape, method = VIEWS[name]
    root = torch.randn(*shape)
    view = make(root)
    meta = torch.empty_strided(root.shape, root.stride(), device="meta")
    recipe = view_recipe(meta, make(meta))
    assert (recipe and recipe[0].__name__) == method, recipe
    if recipe is not None:
        got = recipe[0](root, *recipe[1])
        assert (got.shape, got.stride(), got.storage_offset()) == (
            view.shape, view.stride(), view.storage_offset())  # fmt: skip
        assert got.data_ptr() == view.data_ptr() and torch.equal(got, view)


def test_a_transposed_operand_is_made_by_its_view_method(cpu_as_gpu):  # noqa: F811
    """The GEMM of a permuted input views it in one C call (Note [Operand views]), or where
    this torch has none calls t(), not as_strided; either gives torch's answer."""
    from fusion_cache.runtime import aten_calls

    a = torch.randn(8, 4)
    fd = _single(lambda fd, a: fd.ops.matmul(a, fd.ops.permute(a, [1, 0])), a)
    (out,) = fd.execute([a])
    ((_, plan),) = aten_plans(fd)
    fn, specs, _ = plan.call.direct
    want = ((4, 8), (1, 4), 0) if aten_calls.reinterpret_tensor is not None else torch.Tensor.t
    assert [view if len(view) == 3 else view[0] for _, view in specs if view is not None] \
        == [want]  # fmt: skip
    torch.testing.assert_close(out, a @ a.t(), **TOL[torch.float32])
    b = torch.randn(8, 4)
    torch.testing.assert_close(fd.execute([b])[0], b @ b.t(), **TOL[torch.float32])
