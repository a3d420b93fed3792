"""Reduction and normalization kernels on the GPU against torch, at odd sizes, on
non-contiguous inputs and for every float dtype."""
import pytest
import torch
from fusion_patterns import define, layer_norm, reduce_op, rms_norm, softmax, sum_max_min, var_mean

from fusion_cache import FusionCache
from fusion_cache.runtime.executor import executor_for
from schedulers.device import current_profile

pytestmark = pytest.mark.gpu

FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float64: 1e-9, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
SIZES = [1, 7, 1000, 4097, 65537]


def rand(shape, dtype, gen, noncontig=False):
    if noncontig:  # a transposed copy viewed back: same values, permuted strides
        t = torch.randn(tuple(reversed(shape)), generator=gen, device="cuda").to(dtype)
        return t.permute(*reversed(range(len(shape))))
    return torch.randn(shape, generator=gen, device="cuda").to(dtype)


@pytest.fixture
def gen():
    return torch.Generator(device="cuda").manual_seed(7)


def check(got, want, dtype, scale=1.0):
    if not isinstance(got, (list, tuple)):
        got, want = [got], [want]
    for g, w in zip(got, want):
        tol = TOL[dtype] * scale
        torch.testing.assert_close(g, w.to(g.dtype), rtol=tol, atol=tol)


def ran_kernel(fd):
    return executor_for(fd).scheduler == "reduction"


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", SIZES + [16384])  # 16-bit rows of 16384: clusters of 8
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_inner_reduction(op, n, dtype, gen):
    build, ref = reduce_op(op, [-1])
    fd = define(build, dtype, 2)
    x = rand((33, n), dtype, gen)
    check(fd.execute([x])[0], ref(x), dtype, scale=max(1.0, n ** 0.5 / 8) if op == "sum" else 1.0)
    assert ran_kernel(fd)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", SIZES + [262145])
def test_several_reductions_of_one_row(n, dtype, gen):
    # sum, max and min in one kernel, combined together (Note [Merged row reductions]),
    # in clusters for the longer rows; each as torch computes it alone
    build, ref = sum_max_min([-1])
    fd = define(build, dtype, 2)
    x = rand((9, n), dtype, gen)
    got = fd.execute([x])
    assert ran_kernel(fd)
    for g, w, scale in zip(got, ref(x), (max(1.0, n ** 0.5 / 8), 1.0, 1.0, 1.0)):
        check(g, w, dtype, scale=scale)
    assert torch.equal(got[1], x.amax(-1, keepdim=True))
    assert torch.equal(got[2], x.amin(-1, keepdim=True))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", [1, 7, 1000, 4097])
def test_outer_reduction(n, dtype, gen):
    build, ref = reduce_op("sum", [0])
    fd = define(build, dtype, 2)
    x = rand((n, 300), dtype, gen)
    check(fd.execute([x])[0], ref(x), dtype, scale=max(1.0, n ** 0.5 / 8))
    assert ran_kernel(fd)


@pytest.mark.parametrize("cluster", [1, 0], ids=["cluster", "finish_kernel"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", [7, 1000, 4097, 65537])
def test_outer_split_combines(n, dtype, cluster, gen):
    # a column's partials from several blocks (splits of 2 to 16 at these sizes), folded in
    # one thread-block cluster (Note [Cluster columns]) or by a second kernel, Welford too
    from schedulers.tuning import overriding

    build, ref = var_mean([0], correction=0)
    fd = define(build, dtype, 2)
    x = 2 + rand((n, 300), dtype, gen)
    with overriding({"outer.cluster": cluster}):
        got = fd.execute([x])
    assert ran_kernel(fd)
    want = ref(x.double())
    for g, w in zip(got, want):
        check(g, w, dtype, scale=4)
    clustered = "in a cluster" in executor_for(fd).last_plan.spec.description
    if not cluster:
        assert not clustered
    elif n == 1000 and torch.cuda.get_device_capability()[0] >= 9:
        assert clustered  # a split of 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_contiguous_inputs(dtype, gen):
    build, ref = reduce_op("sum", [-1])
    fd = define(build, dtype, 2, contiguous=False)
    x = rand((1000, 257), dtype, gen, noncontig=True)  # reduced dim strided: outer kernel
    check(fd.execute([x])[0], ref(x), dtype, scale=4)
    fd2 = define(softmax()[0], dtype, 2, contiguous=False)
    y = rand((513, 64), dtype, gen, noncontig=True)
    out = fd2.execute([y])[0]
    check(out, softmax()[1](y), dtype)


@pytest.mark.parametrize("keepdim", [False, True])
def test_keepdim_and_several_dims(keepdim, gen):
    build, ref = reduce_op("max", [1, 2], keepdim=keepdim)
    fd = define(build, torch.float32, 3)
    x = rand((6, 7, 1000), torch.float32, gen)
    check(fd.execute([x])[0], ref(x), torch.float32)


def test_integer_and_prod(gen):
    build, ref = reduce_op("sum", [1])
    fd = define(build, torch.int32, 2)
    x = torch.randint(-100, 100, (50, 333), device="cuda", dtype=torch.int32, generator=gen)
    out = fd.execute([x])[0]
    assert out.dtype == torch.int64 and torch.equal(out, ref(x))
    build, ref = reduce_op("prod", [1])
    fd = define(build, torch.float64, 2)
    y = 1 + 0.01 * rand((20, 100), torch.float64, gen)
    check(fd.execute([y])[0], ref(y), torch.float64)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", SIZES + [65536, 262144])
def test_var_mean(n, dtype, gen):
    # f32 rows of 262144 take two passes of sums in clusters of 16 (Note [Two-pass Welford]),
    # 16-bit rows of 65536 in clusters of 8
    build, ref = var_mean([-1], correction=1 if n > 1 else 0)
    fd = define(build, dtype, 2)
    x = 3 + rand((17, n), dtype, gen)
    check(fd.execute([x]), ref(x), dtype, scale=4)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", SIZES + [262144])
@pytest.mark.parametrize("log", [False, True])
def test_softmax(log, n, dtype, gen):
    build, ref = softmax(log)
    fd = define(build, dtype, 2)
    x = rand((9, n), dtype, gen)
    check(fd.execute([x])[0], ref(x), dtype, scale=2)
    assert ran_kernel(fd)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", [7, 1000, 4097, 65537])
def test_layer_norm(n, dtype, gen):
    build, ref = layer_norm()
    fd = define(build, dtype, 2)
    x, w, b = rand((13, n), dtype, gen), rand((n,), dtype, gen), rand((n,), dtype, gen)
    check(fd.execute([x, w, b]), ref(x, w, b), dtype, scale=4)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("n", [1, 1000, 4097])
def test_rms_norm(n, dtype, gen):
    build, ref = rms_norm()
    fd = define(build, dtype, 3)
    x, w = rand((3, 5, n), dtype, gen), rand((n,), dtype, gen)
    check(fd.execute([x, w])[0], ref(x, w), dtype, scale=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,n", [(3, 65536), (600, 65536), (40, 262144), (1, 131072)])
@pytest.mark.parametrize("pattern", ["softmax", "layer_norm", "rms_norm"])
def test_rows_split_over_clusters(pattern, rows, n, dtype, gen):
    """Rows too long for one block's registers are shared by a cluster of blocks (Note
    [Cluster rows]); each block reduces its slice, the cluster combines them. With 600 rows
    a cluster takes two, reusing the weights it keeps in shared memory (Note [Weights in
    registers])."""
    build, ref = {"softmax": softmax(), "layer_norm": layer_norm(), "rms_norm": rms_norm()}[pattern]
    fd = define(build, dtype, 2)
    x = 3 + rand((rows, n), dtype, gen)
    weights = {"softmax": 0, "layer_norm": 2, "rms_norm": 1}[pattern]
    inputs = [x] + [rand((n,), dtype, gen) for _ in range(weights)]
    got = fd.execute(inputs)
    want = ref(*[t.double() for t in inputs])
    for g, w in zip(got, want if isinstance(want, (list, tuple)) else [want]):
        # error against the largest value: softmax's values are ~1/n, a sum's ~3n
        err = (g.double() - w).abs().max().item()
        assert err <= TOL[dtype] * w.abs().max().item(), (pattern, err, w.abs().max().item())
    # layer norm's longer rows take 8 blocks a row too, whether or not its slices fit
    # their registers (later passes then read the row from L2); 16-bit rows of 262144
    # take 16 where the GPU runs clusters that wide. Rms norm's rows take 16 with the
    # weight slice in shared memory, but for a single row (no weight shared by rows)
    sixteen = current_profile(0).max_cluster > 8
    wide = sixteen and (n == 262144 and dtype == torch.bfloat16 and pattern != "rms_norm" or (
        pattern == "rms_norm" and rows > 1))
    description = executor_for(fd).last_plan.spec.description
    assert f"clusters of {16 if wide else 8}" in description, description
    # Note [Rows in shared memory]: 16-bit rows of 262144 with weights, read from there
    staged = wide and pattern != "softmax" and n == 262144 and dtype == torch.bfloat16
    assert ("1 row input in shared memory" in description) is staged, description
    if staged and pattern == "layer_norm":  # two exchanges a row: mbarriers, weights in registers
        assert "weights in registers" in description, description
        assert "barrier exchange" not in description, description
    for g, again in zip(got, fd.execute(inputs)):
        assert torch.equal(g, again)  # the same bits again: a fixed order of combines


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [2, 9, 40])
def test_forward_rows_end_deferred(rows, dtype, gen):
    # Note [Deferred row end]: rms norm's 16-bit rows of 262144, kept in shared memory with
    # one exchange a row, end after the next row group's first pass, their weight loaded
    # once into registers: fewer rows than clusters, some clusters with two, and every
    # cluster with several
    from schedulers.tuning import overriding

    build, ref = rms_norm()
    fd = define(build, dtype, 2)
    x, w = 3 + rand((rows, 262144), dtype, gen), rand((262144,), dtype, gen)
    executor_for(fd).plans.clear()
    with overriding({"inner.defer": True}):
        got = fd.execute([x, w])[0]
    description = executor_for(fd).last_plan.spec.description
    if current_profile(0).max_cluster > 8:
        assert "deferred row end" in description and "weights in registers" in description, description
    check(got, ref(x, w), dtype, scale=4)
    assert torch.equal(got, fd.execute([x, w])[0])  # the same bits again


def test_many_row_counts_compile_few_kernels(gen):
    fd = define(softmax()[0], torch.float32, 2)
    before = FusionCache.get().stats()["kernels_compiled"]
    for rows in range(1, 51):
        x = rand((rows, 1024), torch.float32, gen)
        check(fd.execute([x])[0], softmax()[1](x), torch.float32)
    assert FusionCache.get().stats()["kernels_compiled"] - before <= 2


REDUCTION_KNOBS = [{"inner.pipeline": True}, {"inner.cache": False}, {"inner.cluster": 2},
                   {"inner.cluster": 4, "inner.pipeline": True}, {"inner.min_blocks": 2},
                   {"inner.waves": 0, "load.hint": 3, "store.hint": 1},
                   {"inner.cache": False, "inner.unroll": 4}, {"inner.cache": False, "inner.unroll": 2},
                   {"inner.cache": False, "inner.cluster": 2},
                   {"outer.unroll": 8, "outer.blocks_per_sm": 8, "load.hint": 2},
                   {"outer.unroll": 1, "outer.tx": 8, "outer.ty": 16}, {"inner.cluster": 16},
                   {"inner.merge": False}, {"inner.alternate": True}, {"outer.cluster": 0},
                   {"outer.cluster": 0, "outer.finish_tx": 128, "outer.finish_ty": 1},
                   {"outer.cluster": 0, "outer.finish_ty": 4},
                   {"outer.cluster": 0, "launch.dependent": False}]  # fmt: skip


@pytest.mark.parametrize("knobs", REDUCTION_KNOBS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(37, 4096), (5, 16392), (300, 1000)])
@pytest.mark.parametrize("pattern", ["sum_outer", "var_mean", "softmax", "layer_norm"])
def test_tuning_knobs_keep_results(pattern, shape, dtype, knobs, gen):
    # every choice a sweep can make (Note [Tuning knobs]), the pipelined and clustered
    # kernels included, computes the same function as the default
    build, ref = {"sum_outer": reduce_op("sum", [0]), "var_mean": var_mean([-1]),
                  "softmax": softmax(), "layer_norm": layer_norm()}[pattern]  # fmt: skip
    _check_under_knobs(pattern, build, ref, shape, dtype, knobs, gen)


def _check_under_knobs(pattern, build, ref, shape, dtype, knobs, gen):
    """Run `pattern`'s fusion on fresh rows of `shape` with its plans made afresh under
    `knobs`, and check every output against the float64 reference; returns the fusion."""
    from schedulers.tuning import overriding

    fd = define(build, dtype, 2)
    rows, n = shape
    x = 3 + rand((rows, n), dtype, gen)
    inputs = [x, rand((n,), dtype, gen), rand((n,), dtype, gen)] if pattern == "layer_norm" else [x]
    executor_for(fd).plans.clear()
    with overriding(knobs):
        got = fd.execute(inputs)
    want = ref(*[t.double() for t in inputs])
    for g, w in zip(got, want if isinstance(want, (list, tuple)) else [want]):
        err = (g.double() - w).abs().max().item()
        assert err <= TOL[dtype] * w.abs().max().item(), (pattern, knobs, err)
    return fd


def test_clusters_the_driver_cannot_place_are_planned_again_within_8(gen, monkeypatch):
    # Note [Cluster fallback]: where the driver finds no room for one cluster of 16 (a
    # process given fewer SMs), the fusion is planned again with clusters of at most 8
    # and still runs correctly, instead of failing at launch
    if current_profile(0).max_cluster <= 8:
        pytest.skip("this GPU's profile plans no clusters wider than 8")
    from codegen.launch import LoadedKernel

    real = LoadedKernel.max_resident

    def no_room_for_16(self, block, shared_mem=0):
        return 0 if self.cluster_dims[0] * self.cluster_dims[1] > 8 else real(self, block, shared_mem)

    monkeypatch.setattr(LoadedKernel, "max_resident", no_room_for_16)
    build, ref = rms_norm()
    fd = define(build, torch.float32, 2)
    x, w = rand((19, 65536), torch.float32, gen), rand((65536,), torch.float32, gen)
    check(fd.execute([x, w])[0], ref(x, w), torch.float32, scale=4)
    description = executor_for(fd).last_plan.spec.description
    assert "clusters of 8" in description, description
    monkeypatch.undo()
    fd = define(build, torch.float32, 2)
    x = rand((21, 65536), torch.float32, gen)
    check(fd.execute([x, w])[0], ref(x, w), torch.float32, scale=4)
    assert "clusters of 16" in executor_for(fd).last_plan.spec.description


@pytest.mark.parametrize("knobs", [{"inner.rows": 4}, {"inner.tx": 4, "inner.rows": 4},
                                   {"inner.tx": 8, "inner.rows": 2, "inner.threads": 1024}],
                         ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(70001, 32), (1001, 24)], ids=str)
@pytest.mark.parametrize("pattern", ["softmax", "layer_norm", "var_mean"])
def test_short_rows_several_rows_a_thread(pattern, shape, dtype, knobs, gen):
    # Note [Rows a thread]: row counts that leave a block's last row groups partly empty
    build, ref = {"var_mean": var_mean([-1]), "softmax": softmax(),
                  "layer_norm": layer_norm()}[pattern]  # fmt: skip
    fd = _check_under_knobs(pattern, build, ref, shape, dtype, knobs, gen)
    assert "rows a thread" in executor_for(fd).last_plan.spec.description


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape", [(64, 4096), (33, 1002), (16, 999), (8, 65536)], ids=str)
def test_row_kernel_mask_words(dtype, shape, gen):
    """Note [Mask words]: bool outputs of a row kernel, one stored by its first pass (Note
    [Stores in the first pass]) and one by its last, in vectors of 1, 2, 4 and 8 bytes."""
    from fusion_cache import DataType, FusionDefinition
    from fusion_cache.frontend.dtypes import from_torch

    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=from_torch(dtype))
        xf = fd.ops.cast(x, DataType.Float)
        m = fd.ops.gt(xf, 0.0)
        s = fd.ops.sum(fd.ops.where(m, xf, 0.0), [1], keepdim=True)
        fd.add_output(m)
        fd.add_output(fd.ops.lt(xf, fd.ops.div(s, 100.0)))
        fd.add_output(s)
    x = rand(shape, dtype, gen)
    positive, below, s = fd.execute([x])
    assert executor_for(fd).scheduler == "reduction"
    xf = x.float()
    want_s = torch.where(xf > 0, xf, 0.0).sum(1, keepdim=True)
    torch.testing.assert_close(s, want_s, rtol=1e-4, atol=1e-3)
    assert torch.equal(positive, xf > 0)
    assert torch.equal(below, xf < s / 100.0)  # against the kernel's own sums: no tie to break
