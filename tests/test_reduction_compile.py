"""Without a GPU: the reduction scheduler takes each pattern and every kernel variant it
makes compiles with NVRTC for sm_80 and sm_90."""
import dataclasses

import pytest
import torch
from fusion_patterns import define, layer_norm, reduce_op, rms_norm, softmax, sum_max_min, var_mean

from fusion_cache import DataType, FusionDefinition
from fusion_cache.runtime.executor import executor_for
from schedulers.device import profile_by_name
from schedulers.tuning import overriding


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


CASES = [
    ("sum_inner", reduce_op("sum", [-1]), 2, lambda dt: [meta(64, 1000, dtype=dt)]),
    ("sum_outer", reduce_op("sum", [0]), 2, lambda dt: [meta(4097, 256, dtype=dt)]),
    ("max_keepdim", reduce_op("max", [1], keepdim=True), 2, lambda dt: [meta(7, 65537, dtype=dt)]),
    ("min_two_dims", reduce_op("min", [1, 2]), 3, lambda dt: [meta(8, 9, 33, dtype=dt)]),
    ("prod_outer", reduce_op("prod", [0]), 2, lambda dt: [meta(1000, 7, dtype=dt)]),
    ("var_mean", var_mean([-1]), 2, lambda dt: [meta(31, 4096, dtype=dt)]),
    ("var_mean_outer", var_mean([0], correction=0), 2, lambda dt: [meta(4096, 64, dtype=dt)]),
    ("softmax", softmax(), 2, lambda dt: [meta(5, 262144, dtype=dt)]),
    ("log_softmax", softmax(log=True), 3, lambda dt: [meta(2, 3, 1000, dtype=dt)]),
    ("layer_norm", layer_norm(), 2, lambda dt: [meta(32, 1024, dtype=dt), meta(1024, dtype=dt),
                                                meta(1024, dtype=dt)]),  # fmt: skip
    ("rms_norm", rms_norm(), 2, lambda dt: [meta(16, 4097, dtype=dt), meta(4097, dtype=dt)]),
    ("sum_max_min", sum_max_min([-1]), 2, lambda dt: [meta(3, 65537, dtype=dt)]),
]
FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("target", ["a100", "h100"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name,pattern,rank,inputs", CASES, ids=[c[0] for c in CASES])
def test_reduction_kernels_compile(name, pattern, rank, inputs, dtype, target):
    fd = define(pattern[0], dtype, rank)
    refs = fd.precompile(inputs(dtype), target=target)
    assert refs and all(r.arch == (80 if target == "a100" else 90) for r in refs)
    assert executor_for(fd).scheduler == "reduction"


@pytest.mark.parametrize("target, dependent", [("h100", True), ("a100", False)])
def test_finish_kernels_start_while_the_partials_run_on_hopper(target, dependent):
    # Note [Dependent launch]: a split over 64 blocks a column takes a finish kernel, which
    # waits in the kernel for the partials and is launched dependent where sm_90 has it
    fd = define(reduce_op("sum", [0])[0], torch.float32, 2)
    with overriding({"outer.cluster": 0}):
        refs = fd.precompile([meta(65536, 1024)], target=target)
    kernels = executor_for(fd).last_plan.spec.kernels
    assert [k.dependent for k in kernels] == [False, dependent]
    assert "fc_wait_prior_grid();" in refs[1].source


def test_integer_sum_compiles():
    fd = define(reduce_op("sum", [1])[0], torch.int32, 2)
    assert fd.precompile([meta(100, 300, dtype=torch.int32)], target="h100")


def test_one_kernel_for_many_rows():
    from fusion_cache import FusionCache

    fd = define(softmax()[0], torch.float32, 2)
    before = FusionCache.get().stats()["kernels_compiled"]
    for rows in range(1, 60, 3):
        fd.precompile([meta(rows, 4096)], target="h100")
    assert FusionCache.get().stats()["kernels_compiled"] - before <= 2


def test_refusal_names_reasons():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], contiguity=True, dtype=DataType.Float)
        fd.add_output(fd.ops.sum(x, dims=[0]))
        fd.add_output(fd.ops.sum(x, dims=[1]))
    refs = fd.precompile([meta(8, 8)], target="h100")
    # the reduction scheduler refuses two loop spaces and says so; row sums with column
    # sums of the same rows are the inner-outer scheduler's
    ex = executor_for(fd)
    assert any("reductions over different" in str(r) for r in ex.refusals)
    assert ex.scheduler == "inner_outer"
    # Note [Finish in the row kernel]: on an H100 the column sums end in the row kernel
    assert [r.name for r in refs] == ["fc_inner_reduction"]
    refs = fd.precompile([meta(8, 8)], target="a100")
    assert [r.name for r in refs] == ["fc_inner_reduction", "fc_column_finish"]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_one_stages_reductions_combine_together(dtype):
    # Note [Merged row reductions]: sum, max and min of one row share one block combine
    # and one cluster exchange, each slot with its own op
    fd = define(sum_max_min([-1])[0], dtype, 2)
    fd.precompile([meta(3, 65537, dtype=dtype)], target="h100")
    source = executor_for(fd).last_plan.spec.kernels[0].source
    acc = "double" if dtype == torch.float64 else "float"
    assert (f"fc_op_multi<{acc}, fc_op_sum<{acc}>, fc_op_max<{acc}>, fc_op_min<{acc}>>"
            in source)  # fmt: skip
    assert source.count("fc_cluster_reduce_async<FC_CLUSTER>(") == 1  # Note [Cluster exchange]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [262144, 1000003])
def test_rows_too_long_for_a_clusters_registers_still_take_8_blocks(n, dtype):
    # layer norm's Welford rows of 262144 do not fit 512-thread slices of 8 blocks; they
    # are still shared by 8 blocks so that later passes read them from L2 (a million odd
    # values, one at a time, do not fit registers even then: read from memory in each pass).
    # 16-bit rows of 262144 fit 512-thread slices of 16 blocks, which the H100 runs
    fd = define(layer_norm()[0], dtype, 2)
    fd.precompile([meta(40, n, dtype=dtype), meta(n, dtype=dtype), meta(n, dtype=dtype)],
                  target="h100")  # fmt: skip
    spec = executor_for(fd).last_plan.spec
    blocks = 16 if dtype == torch.bfloat16 and n == 262144 else 8
    assert f"clusters of {blocks}" in spec.description
    assert f"#define FC_CLUSTER {blocks}" in spec.kernels[0].source
    assert ("uncached" in spec.description) == (n % 2 == 1)


@pytest.mark.parametrize("rows,n,cluster", [(512, 4096, None), (512, 16384, None), (64, 65536, 8),
                                            (64, 262144, 8), (64, 16384, 2), (64, 1024, None)])
def test_long_rows_take_clusters_where_the_gpu_has_them(rows, n, cluster):
    # Note [Cluster rows]: a row that does not fit one block's registers is split over a
    # thread-block cluster on sm_90; an A100 has none and reads such rows twice instead. So
    # few long rows that one block each would leave half the SMs idle (64 on 132) take two
    fd = define(softmax()[0], torch.float32, 2)
    fd.precompile([meta(rows, n)], target="h100")
    plan = executor_for(fd).last_plan
    kernel = plan.spec.kernels[0]
    assert ("__cluster_dims__" in kernel.source) == (cluster is not None)
    if cluster:
        assert f"clusters of {cluster}" in plan.spec.description
        assert kernel.grid[0] % cluster == 0
    fd.precompile([meta(64, n)], target="a100")
    assert "__cluster_dims__" not in executor_for(fd).last_plan.spec.kernels[0].source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [4096, 16384, 65536, 262144])
def test_sums_of_long_rows_take_clusters_of_8(n, dtype):
    # rows of 16384 and more are summed by 8 blocks a row on sm_90, but for 16-bit rows
    # over 65536; shorter rows and GPUs without clusters take a block a row
    fd = define(reduce_op("sum", [-1])[0], dtype, 2)
    fd.precompile([meta(64, n, dtype=dtype)], target="h100")
    clustered = n >= 16384 and (dtype == torch.float32 or n <= 65536)
    assert ("clusters of 8" in executor_for(fd).last_plan.spec.description) is clustered
    fd.precompile([meta(64, n, dtype=dtype)], target="a100")
    assert "clusters" not in executor_for(fd).last_plan.spec.description


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n,cluster", [(16384, 1), (65536, 8), (262144, 1)])
def test_16_bit_welford_rows_8_blocks_keep_take_a_cluster(n, cluster, dtype):
    # var_mean of 16-bit rows: rows one block keeps take one, rows a cluster of 8 keeps in
    # registers take it (two passes of sums), longer rows a block a row read once
    fd = define(var_mean([-1])[0], dtype, 2)
    fd.precompile([meta(64, n, dtype=dtype)], target="h100")
    spec = executor_for(fd).last_plan.spec
    assert ("clusters of 8" in spec.description) is (cluster == 8), spec.description
    assert ("uncached" in spec.description) is (n == 262144), spec.description


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_softmax_over_the_widest_clusters_loads_the_next_row_ahead(dtype):
    # Note [Row pipeline]: softmax rows over clusters of 16 (bf16 rows of 262144) copy the
    # next row into shared memory while this one runs; layer norm's (weights) do not
    fd = define(softmax()[0], dtype, 2)
    fd.precompile([meta(64, 262144, dtype=dtype)], target="h100")
    spec = executor_for(fd).last_plan.spec
    wide = dtype == torch.bfloat16
    assert ("clusters of 16, pipelined" in spec.description) is wide, spec.description
    assert ("fc_cp_async16(&fc_stage[" in spec.kernels[0].source) is wide
    fd = define(layer_norm()[0], dtype, 2)
    fd.precompile([meta(64, 262144, dtype=dtype), meta(262144, dtype=dtype), meta(262144, dtype=dtype)],
                  target="h100")  # fmt: skip
    # layer norm's (weights) only where its bf16 row stays in shared memory (Note [Rows in
    # shared memory]), read there in each pass
    description = executor_for(fd).last_plan.spec.description
    assert ("pipelined, 1 row input in shared memory" in description) is wide, description



@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", ["sum", "var_mean"])
def test_outer_split_combines_in_a_cluster_on_sm90(name, dtype):
    # Note [Cluster columns]: a column split over 2 to 8 blocks is one kernel on sm_90,
    # its partials folded through distributed shared memory; an A100 runs a second kernel
    pattern = reduce_op("sum", [0]) if name == "sum" else var_mean([0], correction=0)
    for target, kernels in (("h100", 1), ("a100", 2)):
        fd = define(pattern[0], dtype, 2)
        refs = fd.precompile([meta(1000, 300, dtype=dtype)], target=target)
        spec = executor_for(fd).last_plan.spec
        assert len(refs) == len(spec.kernels) == kernels, spec.description
        assert ("in a cluster" in spec.description) == (target == "h100")
        if target == "h100":
            assert "__cluster_dims__(1, FC_SPLIT, 1)" in spec.kernels[0].source
            assert not spec.workspaces
        else:  # Note [Outer finish]: thread rows share a column's partials, 4 or more each
            split = spec.kernels[0].grid[1]
            assert spec.kernels[1].block == (32, max(1, min(16, split // 4)), 1), spec.kernels[1].block
            assert spec.kernels[1].grid == (10, 1, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [65536, 262144])
def test_weighted_sums_of_long_rows_take_16_blocks_with_weights_in_shared_memory(n, dtype):
    # rms norm rows that 8 blocks would keep (or 8 read twice, 16-bit rows of 262144) take
    # 16 blocks of half the threads on the H100, the weight slice in shared memory; layer
    # norm's Welford rows do not. A single row has no weights to share (its weight is one
    # of its own loads): 8 blocks, which read one of 262144 twice. Clusters of 16
    # (non-portable) are never planned for the A100
    fd = define(rms_norm()[0], dtype, 2)
    fd.precompile([meta(64, n, dtype=dtype), meta(n, dtype=dtype)], target="h100")
    spec = executor_for(fd).last_plan.spec
    if dtype == torch.bfloat16 and n == 262144:  # Note [Rows in shared memory]: the row instead
        kept = "clusters of 16, barrier exchange, pipelined, deferred row end, 1 row input in shared memory"
        assert kept in spec.description, spec.description
    else:
        assert "clusters of 16, weights in shared memory" in spec.description, spec.description
    assert "#define FC_CLUSTER 16" in spec.kernels[0].source
    fd.precompile([meta(1, n, dtype=dtype), meta(n, dtype=dtype)], target="h100")
    spec = executor_for(fd).last_plan.spec
    assert "clusters of 8" in spec.description, spec.description
    assert ("uncached" in spec.description) is (n == 262144), spec.description
    fd = define(layer_norm()[0], dtype, 2)
    fd.precompile([meta(64, n, dtype=dtype), meta(n, dtype=dtype), meta(n, dtype=dtype)],
                  target="h100")  # fmt: skip
    description = executor_for(fd).last_plan.spec.description
    wide = dtype == torch.bfloat16 and n == 262144  # Note [Cluster rows]'s 16-bit rule
    assert ("clusters of 16" in description) is wide, description
    if wide:  # Note [Rows in shared memory]: two exchanges a row, through mbarriers, and
        # the weights loaded once into registers, not into shared memory beside the row
        assert "weights in registers" in description, description
        assert "barrier exchange" not in description, description
        assert "fc_cluster_reduce_async" in executor_for(fd).last_plan.spec.kernels[0].source
    fd = define(rms_norm()[0], dtype, 2)
    fd.precompile([meta(64, n, dtype=dtype), meta(n, dtype=dtype)], target="a100")
    assert "clusters" not in executor_for(fd).last_plan.spec.description


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_outer_rows_in_range_sum_without_bounds_branches(dtype):
    # the outer kernel sums UNROLL rows of VEC columns without a bounds check each where
    # all are in range, and keeps the checked loop for the edges (rows 1000 and columns
    # 300 leave both)
    fd = define(reduce_op("sum", [0])[0], dtype, 2)
    fd.precompile([meta(1000, 300, dtype=dtype)], target="h100")
    source = executor_for(fd).last_plan.spec.kernels[0].source
    fast = "if (k0 + (FC_UNROLL - 1) * kstep < N && cb + FC_VEC <= cols) {"
    assert source.count(fast) == 1
    tail = source[source.index(fast):]
    assert tail.index("} else {") < tail.index("if (cb + j >= cols) break;")


@pytest.mark.parametrize("target,kept", [("h100", True), ("a100", True), ("sm75", False)])
def test_weights_every_row_reads_load_with_an_evict_last_policy(target, kept):
    # Note [Weights kept in L2]: layer norm's weight and bias load with hint 4 (an L2
    # evict-last policy, sm_80 on); its rows keep the plain loads. Turing has no createpolicy
    if target == "sm75":
        target = dataclasses.replace(profile_by_name("a10"), name="sm75", arch=75)
    fd = define(layer_norm()[0], torch.float32, 2)
    n = 262144
    fd.precompile([meta(64, n), meta(n), meta(n)], target=target)
    source = executor_for(fd).last_plan.spec.kernels[0].source
    body = source.split('extern "C"', 1)[1]
    assert ("fc_load_vec_if<FC_VEC, 4>(a1 + " in body) is kept  # the weight
    assert ("fc_load_vec_if<FC_VEC, 4>(a2 + " in body) is kept  # the bias
    assert "fc_load_vec_if<FC_VEC, 0>(a0 + " in body  # the row
    with overriding({"load.weights": 0}):
        executor_for(fd).plans.clear()
        fd.precompile([meta(64, n), meta(n), meta(n)], target=target)
    assert "FC_VEC, 4>" not in executor_for(fd).last_plan.spec.kernels[0].source.split('extern "C"', 1)[1]


def test_deferred_row_end_needs_one_exchange():
    # Note [Deferred row end]: under the knob, rms norm's 16-bit rows kept in shared memory
    # (one exchange a row) end deferred, and the kernel compiles for sm_90; layer norm's
    # (a Welford: two exchanges) keep their row end
    bf16 = torch.bfloat16
    with overriding({"inner.defer": True}):
        fd = define(rms_norm()[0], bf16, 2)
        assert fd.precompile([meta(40, 262144, dtype=bf16), meta(262144, dtype=bf16)], target="h100")
        assert "deferred row end" in executor_for(fd).last_plan.spec.description
        fd = define(layer_norm()[0], bf16, 2)
        fd.precompile([meta(40, 262144, dtype=bf16), meta(262144, dtype=bf16),
                       meta(262144, dtype=bf16)], target="h100")  # fmt: skip
        description = executor_for(fd).last_plan.spec.description
        assert "in shared memory" in description and "deferred" not in description, description


def test_only_plain_plans_take_the_lean_launch_path():
    # fresh outputs and plain launches: the cache hit's lean path; workspaces, or a kernel
    # launched cooperative or dependent, need the general one, which passes those flags
    from fusion_cache.runtime.plans import LaunchPlan

    fd = define(reduce_op("sum", [1])[0], torch.float32, 2)
    fd.precompile([meta(64, 1000)], target="h100")
    plain = executor_for(fd).last_plan
    assert plain.lean
    for flag in ("dependent", "cooperative"):
        kernels = tuple(dataclasses.replace(k, **{flag: True}) for k in plain.spec.kernels)
        spec = dataclasses.replace(plain.spec, kernels=kernels)
        assert not LaunchPlan(spec, plain.kernels, plain.refs, plain.slots).lean
    fd = define(reduce_op("sum", [0])[0], torch.float32, 2)
    with overriding({"outer.cluster": 0}):
        fd.precompile([meta(65536, 1024)], target="h100")
    assert not executor_for(fd).last_plan.lean  # partials and a dependent finish


def test_a_row_reduction_reading_int64_per_row_compiles():
    """A per-row int64 operand (nll_loss's targets against an iota over the classes) is
    loaded as `row_ok ? a[row] : T()`: T must be one word (int64_t, not `long long`)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        target = fd.define_tensor(shape=[-1], dtype=DataType.Int)
        classes = fd.ops.broadcast(fd.ops.iota(96, 0, 1, DataType.Int), [True, False])
        hit = fd.ops.eq(classes, fd.ops.broadcast(target, [False, True]))
        fd.add_output(fd.ops.sum(fd.ops.where(hit, x, 0.0), [1]))
    refs = fd.precompile([meta(16, 96), meta(16, dtype=torch.int64)], "h100")
    assert refs and any("int64_t" in r.source for r in refs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["softmax", "layer_norm", "var_mean"])
def test_short_rows_load_several_rows_a_thread_ahead(name, dtype):
    # Note [Rows a thread]: a thread's rows of the block's R row groups are loaded first, all
    # in flight, then each row runs from registers; the kernel compiles for sm_90 and the
    # reference path computes the same function
    build, ref = {"softmax": softmax(), "layer_norm": layer_norm(), "var_mean": var_mean([-1])}[name]
    fd = define(build, dtype, 2)
    tx = 4 if dtype == torch.bfloat16 else 8
    shapes = [(1001, 32), (32,), (32,)] if name == "layer_norm" else [(1001, 32)]
    with overriding({"inner.tx": tx, "inner.rows": 4}):
        fd.precompile([meta(*s, dtype=dtype) for s in shapes], target="h100")
    spec = executor_for(fd).last_plan.spec
    assert f"inner rows of {tx}x" in spec.description and "4 rows a thread" in spec.description
    body = spec.kernels[0].source.split('extern "C"', 1)[1]
    assert body.count("for (int rr = 0; rr < 4; ++rr)") == 2 and "a0_c[it] = a0_r[rr][it];" in body
    gen = torch.Generator().manual_seed(31)
    inputs = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    want = ref(*[t.double() for t in inputs])
    got = fd.execute(inputs)
    for g, w in zip(got, want if isinstance(want, (list, tuple)) else [want]):
        torch.testing.assert_close(g.double(), w, rtol=3e-2, atol=3e-2)


def _short_plan(knobs: dict, shape=(2097152, 32), dtype=torch.float32, build=None):
    fd = define(build or softmax()[0], dtype, 2)
    with overriding(knobs):
        fd.precompile([meta(*shape, dtype=dtype)], target="h100")
    return executor_for(fd).last_plan.spec


# the layout short rows had before Note [Small row blocks]: 4x128 threads, a capped grid
_LOOPING = {"inner.threads": 512, "inner.tx": 4, "inner.rows": 1, "inner.waves": 32}


def test_short_row_grids_count_a_threads_rows_and_balance_their_loops():
    # softmax f32 2097152x32 in 4x128 threads a block: 16384 row groups over the capped grid
    # of 4224 blocks; balanced (Note [Balanced row loops]), 4096 blocks of 4 groups each; with
    # four rows a thread a block's step is four groups, so a block a step needs 4096 blocks
    assert _short_plan(_LOOPING).kernels[0].grid == (4224, 1, 1)
    assert _short_plan({**_LOOPING, "inner.balance": True}).kernels[0].grid == (4096, 1, 1)
    spec = _short_plan({**_LOOPING, "inner.rows": 4, "inner.waves": 0})
    assert spec.kernels[0].grid == (4096, 1, 1) and "4 rows a thread" in spec.description
    spec = _short_plan({"inner.threads": 64, "inner.tx": 8, "inner.rows": 16,
                        "inner.waves": 0})  # fmt: skip
    assert spec.kernels[0].grid == (2097152 // (8 * 16), 1, 1)
    assert spec.kernels[0].block == (8, 8, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [32, 128])
def test_short_rows_take_small_blocks_a_block_a_row_tile(n, dtype):
    # Note [Small row blocks]: rows of at most 128 elements with outputs along them take
    # blocks of 64 threads, one 16-byte vector and two rows a thread, a block a row tile
    rows = 1 << 20
    nv = n // (16 // dtype.itemsize)
    for name, build in (("softmax", softmax()[0]), ("layer_norm", layer_norm()[0])):
        fd = define(build, dtype, 2)
        shapes = [(rows, n)] + ([(n,), (n,)] if name == "layer_norm" else [])
        fd.precompile([meta(*s, dtype=dtype) for s in shapes], target="h100")
        spec = executor_for(fd).last_plan.spec
        assert spec.kernels[0].block == (nv, 64 // nv, 1), spec.description
        assert spec.kernels[0].grid == (rows // (2 * 64 // nv), 1, 1)
        assert "iters 1" in spec.description and "2 rows a thread" in spec.description


def test_rows_beyond_small_blocks_keep_their_layout():
    # rows of 256, row-level outputs (var_mean) and rows too odd for 16-byte vectors keep the
    # blocks of 512 threads looping over a capped grid
    spec = _short_plan({}, shape=(262144, 256))
    assert spec.kernels[0].block == (16, 32, 1) and spec.kernels[0].grid == (4224, 1, 1)
    spec = _short_plan({}, shape=(2097152, 32), build=var_mean([-1])[0])
    assert spec.kernels[0].block[0] * spec.kernels[0].block[1] != 64
    spec = _short_plan({}, shape=(2097152, 30))
    assert "rows a thread" not in spec.description and spec.kernels[0].grid == (4224, 1, 1)


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "sum"])
def test_plain_loads_compile(name):
    # Note [Plain loads]: load.hint 5 reads the rows with the coherent ld.global; the kernels
    # compile for sm_90 (the row kernel and a sum to a scalar split over the GPU)
    build = {"softmax": softmax()[0], "layer_norm": layer_norm()[0],
             "sum": reduce_op("sum", [0])[0]}[name]  # fmt: skip
    rank = 1 if name == "sum" else 2
    fd = define(build, torch.float32, rank)
    shapes = {"softmax": [(4096, 128)], "layer_norm": [(4096, 128), (128,), (128,)],
              "sum": [(1 << 24,)]}[name]  # fmt: skip
    with overriding({"load.hint": 5}):
        refs = fd.precompile([meta(*s) for s in shapes], target="h100")
    assert any("fc_load_vec_if<FC_VEC, 5>" in r.source.split('extern "C"', 1)[1] for r in refs)
