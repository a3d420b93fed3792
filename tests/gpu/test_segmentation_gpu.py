"""Segmented fusions on the GPU: every segment a generated kernel, the whole equal to
eager, intermediates freed as the segments run."""
import pytest
import torch
from segment_patterns import (
    DTYPES,
    chain_eager,
    chain_with_boundaries,
    layer_norm_backward,
    layer_norm_backward_eager,
    layer_norm_backward_inputs,
    layer_norm_backward_with_bias_grad,
    layer_norm_backward_with_bias_grad_eager,
    max_then_scale,
    max_then_scale_eager,
    rms_norm_backward,
    rms_norm_backward_3d,
    rms_norm_backward_3d_eager,
    rms_norm_backward_3d_inputs,
    rms_norm_backward_eager,
    rms_norm_backward_inputs,
    row_sum_spread,
    row_sum_spread_eager,
    seed_002,
    seed_002_eager,
)

from fusion_cache import DataType, FusionCache, FusionDefinition
from fusion_cache.runtime.executor import executor_for

pytestmark = pytest.mark.gpu

TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def rand(*shape, dtype=torch.float32, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=gen, device="cuda").to(dtype)


def check(got, want, dtype):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=TOL[dtype], atol=TOL[dtype])


# pattern, inputs, eager oracle of each norm's backward
NORM_BACKWARD = {"layer": (layer_norm_backward, layer_norm_backward_inputs, layer_norm_backward_eager),
                 "rms": (rms_norm_backward, rms_norm_backward_inputs, rms_norm_backward_eager)}


def counters():
    return dict(FusionCache.get().stats())


def test_seed_002_runs_as_two_kernels():
    fd = seed_002()
    inputs = [rand(2, 32, seed=1), rand(2, 128, seed=2)]
    before = counters()
    check(fd.execute(inputs), seed_002_eager(*inputs), torch.float32)
    after = counters()
    assert after["segmented_runs"] - before["segmented_runs"] == 1
    assert after["kernel_launches"] - before["kernel_launches"] == 2
    assert after["reference_runs"] == before["reference_runs"]
    # the same sizes again: the parent's plan and each segment's plan are cache hits
    check(fd.execute(inputs), seed_002_eager(*inputs), torch.float32)
    assert counters()["plan_cache_hits"] - after["plan_cache_hits"] == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,k,m", [(1, 7, 1000), (7, 1000, 4097), (33, 4097, 65537)])
def test_reduction_feeding_a_differently_shaped_pointwise(dtype, rows, k, m):
    fd = max_then_scale(dtype)
    x, y = rand(rows, k, dtype=dtype, seed=3), rand(rows, m, dtype=dtype, seed=4)
    before = counters()["reference_runs"]
    check(fd.execute([x, y]), max_then_scale_eager(x, y), dtype)
    assert counters()["reference_runs"] == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,cols", [(7, 1000), (64, 4097), (1000, 256), (4096, 1024),
                                       (300, 16384), (9, 65536), (5, 65537), (3, 200001),
                                       (4, 262144)])
def test_layer_norm_backward(dtype, rows, cols):
    # the last five split each row over a thread-block cluster (Note [Cluster rows]); the
    # longest two read it in each pass (Note [Partials of long rows])
    fd = layer_norm_backward(dtype)
    inputs = layer_norm_backward_inputs(rows, cols, dtype, device="cuda", seed=5)
    before = counters()
    got = fd.execute(inputs)
    after = counters()
    assert after["reference_runs"] == before["reference_runs"]
    # a row kernel and a finish kernel, or one cooperative kernel finishing the column
    # sums itself (Note [Finish in the row kernel])
    spec = executor_for(fd).last_plan.spec
    launches = 1 if spec.kernels[0].cooperative else 2
    assert after["kernel_launches"] - before["kernel_launches"] == launches, spec.description
    # column sums over many rows accumulate in a different order than torch's
    check(got, layer_norm_backward_eager(*inputs), dtype)
    assert executor_for(fd).scheduler == "inner_outer"
    check(fd.execute(inputs), got, dtype)  # the cached plan: same partials, same order


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,cols", [(7, 1000), (1000, 4097), (2048, 4096), (300, 65537)])
def test_three_column_sums_beside_the_row_reductions(dtype, rows, cols):
    # dw, db and the sum of dx over rows, each through the block's one partials table
    fd = layer_norm_backward_with_bias_grad(dtype)
    inputs = layer_norm_backward_inputs(rows, cols, dtype, device="cuda", seed=60)
    check(fd.execute(inputs), layer_norm_backward_with_bias_grad_eager(*inputs), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,cols", [(5, 262144), (3, 200001), (40, 131072), (9, 65536), (5, 65537),
                                       (300, 4097)])
def test_rms_norm_backward(dtype, rows, cols):
    # Note [Partials of long rows]: rows too long to keep in registers beside the column
    # partials are read from memory in each pass, the partials staying in registers of a
    # cluster (one kernel and a finish)
    fd = rms_norm_backward(dtype)
    inputs = rms_norm_backward_inputs(rows, cols, dtype, device="cuda", seed=12)
    before = counters()
    got = fd.execute(inputs)
    assert counters()["reference_runs"] == before["reference_runs"]
    check(got, rms_norm_backward_eager(*inputs), dtype)
    assert executor_for(fd).scheduler == "inner_outer"
    if cols >= 131072:  # or kept in shared memory (Note [Rows in shared memory])
        description = executor_for(fd).last_plan.spec.description
        assert "read each pass" in description or "in shared memory" in description, description
    check(fd.execute(inputs), got, dtype)  # the cached plan: same partials, same order


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("b,t,c", [(8, 256, 768), (3, 5, 1000), (2, 1024, 4097)])
def test_column_sums_over_two_leading_dims(dtype, b, t, c, monkeypatch):
    # Note [Leading dims as rows]: dw and the bias gradient summed over [B, T] of a
    # [B, T, C] loop, beside the row reduction, in the inner-outer kernels
    monkeypatch.setenv("FUSION_CACHE_LEADING_ROWS", "1")  # Note [Unmeasured switches]
    fd = rms_norm_backward_3d(dtype)
    inputs = rms_norm_backward_3d_inputs(b, t, c, dtype, device="cuda", seed=31)
    before = counters()
    got = fd.execute(inputs)
    assert counters()["reference_runs"] == before["reference_runs"]
    assert executor_for(fd).scheduler == "inner_outer"
    check(got, rms_norm_backward_3d_eager(*inputs), dtype)


LONG_ROWS = [(norm, dt, rows, cols, 2) for norm in ("layer", "rms")
             for dt in (torch.float16, torch.bfloat16)
             for rows, cols in [(3, 262144), (37, 262144), (20, 131072), (9, 139264)]]
LONG_ROWS += [(norm, torch.float32, rows, 262144, 1) for norm in ("layer", "rms") for rows in (3, 37)]
# f64 only for rms norm: layer norm's oracle runs aten's backward on f32 copies, short of
# f64's tolerance, and one in f64 would not divide the pattern's f32 rstd by n in f32 as
# it does (exact only where n is a power of two; f64 rows reach shared memory at 200000)
LONG_ROWS += [("rms", torch.float64, 3, 200000, 1)]


@pytest.mark.parametrize("defer", [False, True], ids=["barrier", "deferred"])
@pytest.mark.parametrize("norm,dtype,rows,cols,staged", LONG_ROWS, ids=str)
def test_long_rows_stay_in_shared_memory(norm, dtype, rows, cols, staged, defer):
    # Note [Rows in shared memory]: rows too long for registers beside the column partials
    # are copied into shared memory a row group ahead and read there in every pass (of f32
    # rows of 262144 and f64 rows of 200000 only dy, x is read in each pass; f64 slices are
    # cut for 416 threads, not a power of two). Fewer rows than clusters, a row count that
    # leaves the last clusters short, and a row (17 x 8192) whose blocks' slices end unevenly.
    # Note [Deferred row end]: each row group's last pass after the next one's first, where
    # a third stage fits (rows of 262144 in every dtype but f64)
    from schedulers.tuning import overriding

    build, make, eager = NORM_BACKWARD[norm]
    fd = build(dtype)
    inputs = make(rows, cols, dtype, device="cuda", seed=31)
    executor_for(fd).plans.clear()  # planned again under the knob
    with overriding({"inner.defer": defer}):
        got = fd.execute(inputs)
    description = executor_for(fd).last_plan.spec.description
    kept = f"{staged} row input{'s' if staged > 1 else ''} in shared memory"
    assert "pipelined" in description and kept in description, description
    if cols == 262144:
        assert ("deferred row end" in description) is defer, description
    check(got, eager(*inputs), dtype)
    check(fd.execute(inputs), got, dtype)  # the cached plan: same partials, same order


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,cols", [(300, 16384), (200, 65536), (64, 262144)])
def test_column_partials_take_one_resident_wave(dtype, rows, cols):
    # Note [One wave of partials]: a clustered kernel keeping column partials launches
    # exactly the clusters this GPU holds at once, as the driver counts them
    fd = layer_norm_backward(dtype)
    inputs = layer_norm_backward_inputs(rows, cols, dtype, device="cuda", seed=21)
    check(fd.execute(inputs), layer_norm_backward_eager(*inputs), dtype)
    plan = executor_for(fd).last_plan
    if not hasattr(plan, "spec") or "clusters of" not in plan.spec.description:
        pytest.skip(f"not one clustered kernel with partials here: {plan.description}")
    launch = plan.spec.kernels[0]
    resident = plan.kernels[0].max_resident(launch.block, launch.shared_mem)
    cluster = plan.kernels[0].cluster_dims[0]
    assert resident > 0
    assert launch.grid[0] == cluster * min(resident, -(-rows // launch.block[1])), plan.spec.description


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_column_sums_finish_in_the_row_kernel_on_every_stream(norm):
    # Note [Finish in the row kernel]: one cooperative kernel; its grid barrier's counters
    # are per stream and left at zero, so two streams running the fusion at once and a
    # stream running it again all get torch's results
    build, make, eager = NORM_BACKWARD[norm]
    fd = build(torch.bfloat16)
    batches = [make(512, 4096, torch.bfloat16, device="cuda", seed=40 + i) for i in range(4)]
    first = fd.execute(batches[0])
    plan = executor_for(fd).last_plan
    if not plan.spec.kernels[0].cooperative:
        pytest.skip(f"no finish in the row kernel on this GPU: {plan.spec.description}")
    assert len(plan.spec.kernels) == 1, plan.spec.description
    check(first, eager(*batches[0]), torch.bfloat16)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    results = []
    for rounds in range(3):
        for i, stream in enumerate(streams):
            inputs = batches[(2 * rounds + i) % len(batches)]
            with torch.cuda.stream(stream):
                results.append((inputs, fd.execute(inputs)))
    torch.cuda.synchronize()
    for inputs, got in results:
        check(got, eager(*inputs), torch.bfloat16)
    assert len(plan.barriers) >= 3  # the default stream's and both side streams'
    assert all(int(c.abs().sum()) == 0 for c in plan.barriers.values())


def test_column_sums_finished_in_the_row_kernel_replay_in_a_cuda_graph():
    # Note [Finish in the row kernel]: the cooperative launch is captured with counters of
    # its own; each replay reads the static inputs' new values and matches torch
    fd = layer_norm_backward(torch.bfloat16)
    static = layer_norm_backward_inputs(256, 1024, torch.bfloat16, device="cuda", seed=50)
    fd.execute(static)  # compile and plan outside the capture
    assert executor_for(fd).last_plan.spec.kernels[0].cooperative
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        outs = fd.execute(static)
    for seed in (51, 52):
        fresh = layer_norm_backward_inputs(256, 1024, torch.bfloat16, device="cuda", seed=seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        check(outs, layer_norm_backward_eager(*fresh), torch.bfloat16)


def _layer_norm_backward_where_the_driver_says(monkeypatch, resident, rows, cols, seed):
    """Layer norm backward bf16 run and checked with the driver made to report `resident`
    clusters (blocks) at once, as a process given fewer SMs would hear; its plan."""
    from codegen.launch import LoadedKernel

    monkeypatch.setattr(LoadedKernel, "max_resident", lambda self, block, shared_mem=0: resident)
    fd = layer_norm_backward(torch.bfloat16)
    inputs = layer_norm_backward_inputs(rows, cols, torch.bfloat16, device="cuda", seed=seed)
    check(fd.execute(inputs), layer_norm_backward_eager(*inputs), torch.bfloat16)
    return executor_for(fd).last_plan


def test_column_sums_take_a_second_kernel_where_blocks_cannot_all_be_resident(monkeypatch):
    # Note [Finish in the row kernel]: fewer blocks than the grid's fit at once: planned
    # again with the finish kernel instead of a cooperative launch that would be refused
    plan = _layer_norm_backward_where_the_driver_says(monkeypatch, 2, 9, 4096, seed=23)
    assert [k.cooperative for k in plan.spec.kernels] == [False, False], plan.spec.description


def test_column_partials_follow_the_drivers_count_of_resident_clusters(monkeypatch):
    # Note [One wave of partials]: the planner's estimate of the clusters a wave holds is
    # replaced by the driver's count for the loaded kernel, and the grid follows it
    plan = _layer_norm_backward_where_the_driver_says(monkeypatch, 3, 64, 65536, seed=22)
    assert "clusters of" in plan.spec.description, plan.spec.description
    cluster = plan.kernels[0].cluster_dims[0]
    assert plan.spec.kernels[0].grid[0] == 3 * cluster
    assert plan.spec.workspaces[0][0] == 3 * 65536  # a row of partials a cluster


@pytest.mark.parametrize("knobs", [{"inner.cluster": 16}, {"inner.cache": False}, {"inner.groups": 3},
                                   {"inner.cache": False, "inner.smem_rows": False},
                                   {"inner.merge": False}, {"inner.hoist": True},
                                   {"inner.hoist": False}, {"load.hint": 1},
                                   {"inner.exchange_async": False},
                                   {"launch.dependent": False, "finish.fused": False}], ids=str)  # fmt: skip
@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_norm_backward_knobs_keep_results(norm, knobs):
    # column partials with a cluster of 16 (a non-portable size), rows read in each pass,
    # a few row groups, reductions combined one by one: all compute the same function
    from schedulers.tuning import overriding

    build, make, eager = NORM_BACKWARD[norm]
    fd = build(torch.float32)
    inputs = make(24, 40000, torch.float32, device="cuda", seed=13)
    with overriding(knobs):
        got = fd.execute(inputs)
    check(got, eager(*inputs), torch.float32)


def test_reshape_between_two_reductions():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        groups = fd.define_scalar(dtype=DataType.Int)
        per_row = fd.ops.sum(x, [1])
        grouped = fd.ops.reshape(per_row, [groups, -1])
        fd.add_output(fd.ops.max(grouped, [1]))
    x = rand(48, 1000, seed=6)
    before = counters()["reference_runs"]
    got = fd.execute([x, 6])
    check(got, [x.sum(1).reshape(6, -1).amax(1)], torch.float32)
    assert counters()["reference_runs"] == before
    check(fd.execute([x, 4]), [x.sum(1).reshape(4, -1).amax(1)], torch.float32)


def test_peak_memory_stays_below_the_sum_of_intermediates():
    fd = chain_with_boundaries(4)
    x = rand(4096, 4096, seed=7)  # 64 MiB per value
    fd.execute([x])  # compile and plan first
    size = x.numel() * x.element_size()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fd.execute([x])[0]
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    check([out], chain_eager(4)(x), torch.float32)
    # three intermediates and the output are four values; at most two live at once
    assert peak <= 2 * size + (1 << 20), (peak, size)


def test_segments_dump_shows_segments_and_kernels(monkeypatch, capsys):
    monkeypatch.setenv("FUSION_CACHE_DUMP", "segments")
    fd = seed_002()
    inputs = [rand(4, 32, seed=8), rand(4, 128, seed=9)]
    fd.execute(inputs)
    out = capsys.readouterr().out
    assert "2 segments" in out
    assert "fc_inner_reduction" in out and "fc_pointwise" in out


def test_explicit_segments_match_execute():
    fd = layer_norm_backward(torch.bfloat16)
    inputs = layer_norm_backward_inputs(4, 1048576, torch.bfloat16, device="cuda", seed=10)
    # rows too long for column partials even in a cluster of 16: a row and a column kernel
    segments = fd.segment(inputs)
    assert len(segments) == 2
    # running the segments by hand with the index maps gives what execute gives
    env = dict(zip(fd.inputs(), inputs))
    for seg in segments:
        smap = fd.segment_index_space_maps[seg]
        args = [env[smap[i]] for i in seg.inputs()]
        for i, value in zip(seg.outputs(), seg.execute(args)):
            env[smap[i]] = value
    by_hand = [env[i] for i in fd.outputs()]
    check(by_hand, fd.execute(inputs), torch.bfloat16)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
def test_chain_of_segments_every_float_dtype(dtype):
    fd = chain_with_boundaries(3, dtype)
    x = rand(1000, 37, dtype=dtype, seed=11)
    check(fd.execute([x]), chain_eager(3)(x), dtype)


@pytest.mark.parametrize("rows,cols", [(5, 12), (1000, 4097)])
def test_row_value_returned_at_full_size(rows, cols):
    fd = row_sum_spread(rows, cols)
    x = rand(rows, cols, seed=12)
    check(fd.execute([x]), row_sum_spread_eager(x), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(4, 6, 5, 8), (32, 64, 7, 7), (2, 3, 1, 1), (8, 16, 33, 17),
                                   (16, 8, 48, 48), (9, 5, 61, 67)])  # last two: 2 blocks a channel
@pytest.mark.parametrize("channels_last", [False, True])
def test_batch_norm_training(dtype, shape, channels_last):
    dt = DTYPES[dtype]
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1] * 4, dtype=dt)
        w, b = fd.define_tensor(shape=[-1], dtype=dt), fd.define_tensor(shape=[-1], dtype=dt)
        rm = fd.define_tensor(shape=[-1], dtype=DataType.Float)
        rv = fd.define_tensor(shape=[-1], dtype=DataType.Float)
        y, mean, invstd = fd.ops.batch_norm(x, w, b, rm, rv, fd.define_scalar(0.1),
                                            fd.define_scalar(1e-5), True, channels_last)  # fmt: skip
        for t in (y, mean, invstd):
            fd.add_output(t)
    c = shape[-1] if channels_last else shape[1]
    xs = rand(*shape, dtype=dtype, seed=13)
    w_, b_ = rand(c, dtype=dtype, seed=14), rand(c, dtype=dtype, seed=15)
    rm0, rv0 = rand(c, seed=16), rand(c, seed=17).abs() + 0.5
    rm1, rv1, rm2, rv2 = rm0.clone(), rv0.clone(), rm0.clone(), rv0.clone()
    before = counters()
    got = fd.execute([xs, w_, b_, rm1, rv1])
    after = counters()
    assert after["reference_runs"] == before["reference_runs"]
    launches = after["kernel_launches"] - before["kernel_launches"]
    # channels first: one kernel; channels last (or H = W = 1, the same layout): an outer
    # (column) Welford, then a pointwise kernel
    one_kernel = not channels_last and shape[2] * shape[3] > 1
    assert launches == 1 if one_kernel else 1 <= launches <= 4
    xt = xs.movedim(-1, 1) if channels_last else xs
    want = list(torch.native_batch_norm(xt, w_, b_, rm2, rv2, True, 0.1, 1e-5))
    if channels_last:
        want[0] = want[0].movedim(1, -1)
    check(got, want, dtype)
    torch.testing.assert_close(rm1, rm2, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rv1, rv2, rtol=1e-3, atol=1e-3)
