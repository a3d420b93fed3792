"""Reshapes on the GPU: symbolic reshapes read through strides in one pointwise or reduction
kernel, equal to eager, one plan per size pattern; reshapes that are no view of their input
are cut out by the segmenter or refused with a message that names them."""
import warnings

import pytest
import torch

from fusion_cache import DataType, FusionCache, FusionDefinition
from fusion_cache.runtime.executor import FusionUnsupportedError, executor_for
from fusion_cache.runtime.plans import LaunchPlan

pytestmark = pytest.mark.gpu

TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}
SUM_TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
DTYPES = [torch.float32, torch.bfloat16]
DT = {torch.float32: DataType.Float, torch.bfloat16: DataType.BFloat16}


def rand(*shape, dtype=torch.float32, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=gen, device="cuda").to(dtype)


def counters():
    return dict(FusionCache.get().stats())


def delta(before, *names):
    now = counters()
    return {n: now[n] - before[n] for n in names}


def check(got, want, tol):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


def up(fd, x, dtype):
    return fd.ops.cast(x, DataType.Float) if dtype is not torch.float32 else x


def down(fd, x, dtype):
    return fd.ops.cast(x, DT[dtype]) if dtype is not torch.float32 else x


# ---- pointwise: one definition, sizes from a vector of scalar inputs -----------------------


def vector_reshape(dtype):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DT[dtype])
        z = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DT[dtype])
        sizes = [fd.define_scalar(dtype=DataType.Int) for _ in range(3)]
        y = fd.ops.reshape(fd.ops.exp(up(fd, x, dtype)), fd.define_vector(sizes))
        fd.add_output(down(fd, y * up(fd, z, dtype), dtype))
    return fd


def vector_eager(x, z, *new):
    return [(torch.exp(x.float()).reshape(new) * z.float()).to(x.dtype)]


PATTERNS = [
    ("keep", (64, 96, 128), (64, 96, 128)),
    ("merge", (64, 96, 128), (6144, 128, 1)),
    ("split", (6144, 128, 1), (64, 96, 128)),
    ("mixed", (6144, 64, 2), (64, 96, 128)),
    ("merge_split", (64, 96, 128), (96, 64, 128)),
    ("odd_merge", (3, 5, 7), (15, 7, 1)),
    ("infer", (6144, 128, 1), (64, 96, -1)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_symbolic_reshape_patterns(dtype):
    fd = vector_reshape(dtype)
    descriptions = {}
    for k, (name, shape, new) in enumerate(PATTERNS):
        x = rand(*shape, dtype=dtype, seed=2 * k)
        z = rand(*x.reshape(new).shape, dtype=dtype, seed=2 * k + 1)
        inputs = [x, z, *new]
        before = counters()
        check(fd.execute(inputs), vector_eager(*inputs), TOL[dtype])
        assert delta(before, "plan_cache_misses", "kernel_launches", "reference_runs") == {
            "plan_cache_misses": 1, "kernel_launches": 1, "reference_runs": 0}, name
        plan = executor_for(fd).last_plan
        assert isinstance(plan, LaunchPlan) and plan.spec.scheduler == "pointwise"
        descriptions[name] = plan.spec.description.split("; ", 1)[1]
        # the same sizes again: the plan is found, nothing is analysed again
        before = counters()
        check(fd.execute(inputs), vector_eager(*inputs), TOL[dtype])
        assert delta(before, "plan_cache_hits", "plan_cache_misses") == {
            "plan_cache_hits": 1, "plan_cache_misses": 0}, name
    distinct = [descriptions[n] for n in ("keep", "merge", "split", "mixed", "merge_split")]
    assert len(set(distinct)) == 5, descriptions
    assert descriptions["odd_merge"] == descriptions["merge"]  # same regrouping, other sizes


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sizes_from_scalar_handles_and_size_ops(dtype):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DT[dtype])
        b = fd.define_tensor(shape=[-1], contiguity=True, dtype=DT[dtype])
        heads = fd.define_scalar(dtype=DataType.Int)
        rows = fd.ops.mul(fd.ops.size(x, 0), fd.ops.size(x, 1))
        y = fd.ops.reshape(up(fd, x, dtype), new_shape=[rows, heads, -1])
        bias = fd.ops.broadcast_in_dim(up(fd, b, dtype), shape=fd.ops.shape(y), broadcast_dims=[2])
        fd.add_output(down(fd, fd.ops.relu(y + bias), dtype))
    for heads in (4, 8):
        x = rand(4, 32, 512, dtype=dtype, seed=heads)
        b = rand(512 // heads, dtype=dtype, seed=heads + 1)
        before = counters()
        got = fd.execute([x, b, heads])
        want = torch.relu(x.float().reshape(128, heads, -1) + b.float()).to(dtype)
        check(got, [want], TOL[dtype])
        assert delta(before, "kernel_launches", "reference_runs") == {
            "kernel_launches": 1, "reference_runs": 0}


def test_static_and_nested_reshapes():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        m = fd.define_tensor(shape=[-1, -1, -1], contiguity=True, dtype=DataType.Float)
        inner = fd.ops.permute(fd.ops.reshape(x, [2, 3, -1]), [1, 0, 2])
        fd.add_output(fd.ops.exp(fd.ops.reshape(inner * m, [3, 2, 2, -1])))
    x, m = rand(2, 3000, seed=1), rand(3, 2, 1000, seed=2)
    before = counters()
    want = torch.exp((x.reshape(2, 3, -1).permute(1, 0, 2) * m).reshape(3, 2, 2, -1))
    check(fd.execute([x, m]), [want], 1e-5)
    assert delta(before, "kernel_launches", "reference_runs") == {
        "kernel_launches": 1, "reference_runs": 0}


# ---- layouts -----------------------------------------------------------------------------------


def test_strided_input_whose_reshape_is_a_view():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.reshape(x, [2, 3, -1]) * 3.0)
    x = rand(4000, 6, seed=3).t()  # [6, 4000] with strides (1, 6): splitting dim 0 is a view
    before = counters()
    check(fd.execute([x]), [x.reshape(2, 3, -1) * 3.0], 1e-6)
    assert delta(before, "kernel_launches", "reference_runs", "segmented_runs") == {
        "kernel_launches": 1, "reference_runs": 0, "segmented_runs": 0}


def test_strided_input_merged_after_an_op_runs_as_two_kernels():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.reshape(fd.ops.exp(x), [-1]) * 2.0)
    x = rand(4000, 6, seed=4).t()  # merging [6, 4000] is no view: exp writes a fresh tensor
    before = counters()
    check(fd.execute([x]), [torch.exp(x).reshape(-1) * 2.0], 1e-5)
    assert delta(before, "kernel_launches", "reference_runs", "segmented_runs") == {
        "kernel_launches": 2, "reference_runs": 0, "segmented_runs": 1}


def merged_input():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        fd.add_output(fd.ops.reshape(x, [-1]) * 2.0)
    return fd


def test_input_merged_without_a_view_names_the_reshape():
    x = rand(4000, 6, seed=5).t()
    with pytest.raises(FusionUnsupportedError, match=r"reshape \(T\d+\).*\[6, 4000\] to \[24000\]"):
        merged_input().execute([x])


def test_input_merged_without_a_view_is_right_with_fallback(monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DISABLE_FALLBACK", "0")
    x = rand(4000, 6, seed=5).t()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = merged_input().execute([x])
    check(got, [x.reshape(-1) * 2.0], 1e-6)


# ---- reductions ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch,heads,dim", [(256, 8, 128), (7, 3, 1000), (33, 16, 64)])
def test_heads_sum(dtype, batch, heads, dim):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DT[dtype])
        h = fd.define_scalar(dtype=DataType.Int)
        y = fd.ops.reshape(up(fd, x, dtype), [fd.ops.size(x, 0), h, -1])
        fd.add_output(down(fd, fd.ops.sum(y, [-1]), dtype))
    x = rand(batch, heads * dim, dtype=dtype, seed=6)
    before = counters()
    want = x.float().reshape(batch, heads, -1).sum(-1).to(dtype)
    check(fd.execute([x, heads]), [want], SUM_TOL[dtype])
    assert executor_for(fd).scheduler == "reduction"
    assert delta(before, "kernel_launches", "reference_runs", "plan_cache_misses") == {
        "kernel_launches": 1, "reference_runs": 0, "plan_cache_misses": 1}
    before = counters()
    check(fd.execute([x, heads]), [want], SUM_TOL[dtype])
    assert delta(before, "plan_cache_hits")["plan_cache_hits"] == 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("new", [(64, 4096), (256, 1024), (1024, 256), (16384, 16)])
def test_softmax_over_a_reshaped_tensor(dtype, new):
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DT[dtype])
        s0, s1 = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        y = fd.ops.reshape(up(fd, x, dtype), fd.define_vector([s0, s1]))
        m = fd.ops.broadcast(fd.ops.max(y, [1]), [False, True])
        e = fd.ops.exp(y - m)
        fd.add_output(down(fd, e / fd.ops.broadcast(fd.ops.sum(e, [1]), [False, True]), dtype))
    x = rand(64, 4096, dtype=dtype, seed=7)
    before = counters()
    want = torch.softmax(x.float().reshape(new), -1).to(dtype)
    check(fd.execute([x, *new]), [want], SUM_TOL[dtype])
    assert delta(before, "kernel_launches", "reference_runs") == {
        "kernel_launches": 1, "reference_runs": 0}


def test_outer_sum_after_a_merge_split():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        rows = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.sum(fd.ops.reshape(x, [rows, -1]), [0]))
    x = rand(4096, 96, seed=8)
    before = counters()
    check(fd.execute([x, 8192]), [x.reshape(8192, -1).sum(0)], 1e-3)
    assert executor_for(fd).scheduler == "reduction"
    assert delta(before, "reference_runs")["reference_runs"] == 0


def test_reshape_after_a_reduction_runs_as_segments():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        groups = fd.define_scalar(dtype=DataType.Int)
        grouped = fd.ops.reshape(fd.ops.sum(x, [1]), [groups, -1])
        fd.add_output(fd.ops.max(grouped, [1]))
    assert any("reshape" in r.reason for r in executor_for(fd).refusals if r.scheduler == "reduction")
    x = rand(96, 1000, seed=9)
    before = counters()
    check(fd.execute([x, 12]), [x.sum(1).reshape(12, -1).amax(1)], 1e-4)
    assert delta(before, "kernel_launches", "reference_runs") == {
        "kernel_launches": 2, "reference_runs": 0}
