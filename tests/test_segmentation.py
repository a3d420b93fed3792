"""Segmentation on a machine without a GPU: the segments and index maps the segmenter
finds, their Python definitions, ahead-of-time compilation of every segment, and the
argument manager running the segments (each on the reference evaluator here) against
torch eager."""
import re

import pytest
import torch
from segment_patterns import (
    chain_eager,
    chain_with_boundaries,
    layer_norm_backward,
    layer_norm_backward_eager,
    layer_norm_backward_inputs,
    layer_norm_backward_with_bias_grad,
    max_then_scale,
    max_then_scale_eager,
    rms_norm_backward,
    rms_norm_backward_eager,
    rms_norm_backward_inputs,
    row_sum_spread,
    row_sum_spread_eager,
    seed_002,
    seed_002_eager,
)

from fusion_cache import DataType, FusionCache, FusionDefinition
from fusion_cache.runtime.executor import executor_for
from fusion_cache.runtime.segmented import run_segments


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def body(fd) -> str:
    """The definition's text without its id line."""
    return re.sub(r"nvfuser_fusion_id\d+", "nvfuser_fusion_id", repr(fd))


def run_segmented(fd, inputs):
    plan = executor_for(fd).last_plan
    return run_segments(fd, plan, inputs)


def _norm_backward(norm, rows, cols, dtype, seed=11):
    """(definition, CPU inputs, eager function) of layer or rms norm's backward."""
    if norm == "layer":
        return (layer_norm_backward(dtype), layer_norm_backward_inputs(rows, cols, dtype, seed=seed),
                layer_norm_backward_eager)  # fmt: skip
    return (rms_norm_backward(dtype), rms_norm_backward_inputs(rows, cols, dtype, seed=seed),
            rms_norm_backward_eager)  # fmt: skip


def check(got, want, tol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


# ---- seed document 002 --------------------------------------------------------------------

SEED_SEGMENT_0 = """def nvfuser_fusion_id(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False)
    T1 = fd.ops.sum(T0, dims=[1], keepdim=False, dtype=DataType.Float)
    T2 = fd.ops.broadcast(T1, is_broadcast_dim=[False, True])
    fd.add_output(T2)
"""

SEED_SEGMENT_1 = """def nvfuser_fusion_id(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False)
    T1 = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Float, is_cpu=False)
    T2 = fd.ops.add(T0, T1)
    fd.add_output(T2)
"""


def test_seed_002_gives_the_two_segments_and_maps_of_the_seed():
    fd = seed_002()
    inputs = [rand(2, 32, seed=1), rand(2, 128, seed=2)]
    segments = fd.segment(inputs, target="h100")
    assert len(segments) == 2 and fd.segments == segments
    assert body(segments[0]).strip() == SEED_SEGMENT_0.strip()
    assert body(segments[1]).strip() == SEED_SEGMENT_1.strip()
    # segment index -> original index: T0:T0, T2:T3 then T0:T1, T1:T3, T2:T4
    assert fd.segment_index_space_maps[segments[0]] == {0: 0, 2: 3}
    assert fd.segment_index_space_maps[segments[1]] == {0: 1, 1: 3, 2: 4}
    assert fd.segment_index_space_maps[1] == {0: 1, 1: 3, 2: 4}  # by position too
    check(run_segmented(fd, inputs), seed_002_eager(*inputs))
    check(fd.execute(inputs), seed_002_eager(*inputs))


def test_each_segment_repr_is_a_definition_with_the_same_id():
    fd = seed_002()
    for seg in fd.segment([rand(3, 5, seed=3), rand(3, 9, seed=4)], target="a100"):
        scope = {"FusionDefinition": FusionDefinition, "DataType": DataType}
        exec(repr(seg), scope)
        func = next(v for k, v in scope.items() if k.startswith("nvfuser_fusion_id"))
        with FusionDefinition() as again:
            func(again)
        assert again.id() == seg.id()


def test_one_kernel_fusions_are_not_segmented():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1], dtype=DataType.Float)
        m = fd.ops.max(x, [1], keepdim=True)
        e = fd.ops.exp(fd.ops.sub(x, m))
        fd.add_output(fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True)))
    assert fd.segment([rand(8, 100, seed=5)], target="h100") == []
    assert fd.segments == [] and dict(fd.segment_index_space_maps) == {}


def test_the_seed_fusion_is_one_segment_when_the_extents_agree():
    # the same definition with equal row lengths fits one reduction kernel
    fd = seed_002()
    assert fd.segment([rand(4, 64, seed=6), rand(4, 64, seed=7)], target="h100") == []


# ---- the segmenter's choices ----------------------------------------------------------------


def test_segment_set_forces_boundaries():
    fd = chain_with_boundaries(4)
    x = rand(16, 33, seed=8)
    segments = fd.segment([x], target="h100")
    assert len(segments) == 4
    check(run_segmented(fd, [x]), chain_eager(4)(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_reduction_feeding_another_extent(dtype):
    fd = max_then_scale(dtype)
    x, y = rand(6, 40, seed=9, dtype=dtype), rand(6, 72, seed=10, dtype=dtype)
    segments = fd.segment([x, y], target="h100")
    assert len(segments) == 2
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    check(run_segmented(fd, [x, y]), max_then_scale_eager(x, y), tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_layer_norm_backward_reads_its_inputs_once(dtype):
    fd = layer_norm_backward(dtype)
    inputs = layer_norm_backward_inputs(24, 80, dtype, seed=11)
    # dx's row reductions and dw, db's column sums in one row kernel (column partials)
    # and one finish kernel for both: no segments
    assert fd.segment(inputs, target="h100") == []
    assert executor_for(fd).scheduler == "inner_outer"
    names = [r.name for r in fd.precompile(inputs, target="h100")]
    # the finish inside the row kernel after a grid barrier (Note [Finish in the row kernel]),
    # launched cooperatively; GPUs before sm_90 run a finish kernel
    assert names == ["fc_inner_reduction"]
    spec = executor_for(fd).last_plan.spec
    assert spec.kernels[0].cooperative and "finished in the row kernel" in spec.description
    assert "fc_cast<" in spec.kernels[0].source and "ld.acquire.gpu" in spec.kernels[0].source
    names = [r.name for r in fd.precompile(inputs, target="a100")]
    assert names == ["fc_inner_reduction", "fc_column_finish"]
    assert not executor_for(fd).last_plan.spec.kernels[0].cooperative
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    check(fd.execute(inputs), layer_norm_backward_eager(*inputs), tol)


def test_layer_norm_backward_with_long_rows_is_a_row_and_a_column_kernel_without_clusters():
    fd = layer_norm_backward(torch.float32)
    inputs = layer_norm_backward_inputs(4, 262144, torch.float32, seed=11)
    # rows too long for one block's registers and no clusters (an A100): no column
    # partials; the segmenter splits it into a row kernel and a column kernel that
    # recomputes x-hat rather than reading it back
    segments = fd.segment(inputs, target="a100")
    plan = executor_for(fd).last_plan
    assert len(segments) == 2
    assert [s.scheduler for s in plan.segments] == ["reduction", "reduction"]
    check(run_segmented(fd, inputs), layer_norm_backward_eager(*inputs), 1e-4)


@pytest.mark.parametrize("target", ["a100", "h100"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows,cols", [(16384, 4096), (65536, 1024), (4096, 16384), (1024, 65536)])
def test_three_column_sums_fit_static_shared_memory(rows, cols, dtype, target):
    # the partials' tables of a block take one shared table a type in turn: one table each
    # overran the 48 KiB of static shared memory with three 16-bit partials
    fd = layer_norm_backward_with_bias_grad(dtype)
    meta = [torch.empty(rows, cols, dtype=dtype, device="meta")] * 2 + [
        torch.empty(rows, 1, device="meta")] * 2 + [torch.empty(cols, dtype=dtype, device="meta")]
    refs = fd.precompile(meta, target=target)  # compiles: NVRTC checks the shared memory
    tables = [r.source.count("__shared__ float part_float[FC_TY][FC_TX * FC_VEC];") for r in refs]
    assert max(tables) <= 1  # segmented plans sum the columns in a kernel of their own
    if target == "h100" and dtype != torch.float32:  # one kernel: rows and all three sums
        assert "3 column sums" in executor_for(fd).last_plan.spec.description


@pytest.mark.parametrize("norm,dtype", [("layer", torch.float32), ("layer", torch.bfloat16),
                                        ("rms", torch.float32), ("rms", torch.bfloat16)], ids=str)
def test_norm_backward_long_rows_keep_partials_in_a_cluster(norm, dtype):
    # Note [Partials of long rows]: on an H100 the column partials alone stay in registers
    # of a cluster of 16 (no segments). Note [Rows in shared memory]: a 16-bit block's slice
    # of the row (dy and x) fits shared memory twice, so it is copied there a row ahead and
    # read there in both passes; of an f32 slice only dy's fits, x is read in each pass.
    # Weights load once where registers allow: not beside layer norm's two f32 partials.
    # Note [Deferred row end]: with the whole 16-bit row staged, a third stage holds the row
    # whose last pass waits for the next row's first
    fd, inputs, eager = _norm_backward(norm, 4, 262144, dtype)
    assert fd.segment(inputs, target="h100") == []
    kernel = fd.precompile(inputs, target="h100")[0]
    assert kernel.name == "fc_inner_reduction"
    spec = executor_for(fd).last_plan.spec
    source = spec.kernels[0].source
    assert "clusters of 16" in spec.description, spec.description
    assert "__cluster_dims__(FC_CLUSTER, 1, 1)" in source and "#define FC_CLUSTER 16" in source
    assert "barrier exchange" in spec.description  # registers run short for mbarriers'
    staged = 1 if dtype == torch.float32 else 2
    kept = f"{staged} row input{'s' if staged > 1 else ''} in shared memory"
    assert kept in spec.description, spec.description
    hoisted = not (norm == "layer" and dtype == torch.float32)
    assert ("weights in registers" in spec.description) is hoisted, spec.description
    # staged inputs come from the stage in each pass and never sit in registers
    assert source.count("fc_cp_async16(&fc_stage[") == 2 * staged and "_c[it]" not in source
    slice_bytes = 16384 * (4 if dtype == torch.float32 else 2)  # a block's 1/16 of an input
    stages = 2 if dtype == torch.float32 else 3
    assert spec.kernels[0].shared_mem == stages * staged * slice_bytes
    assert ("deferred row end" in spec.description) is (stages == 3), spec.description
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    check(fd.execute(inputs), eager(*inputs), tol)


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_16_bit_rows_with_one_partial_over_16_blocks_read_shared_memory(norm):
    # Note [Rows in shared memory]: rms norm backward's bf16 rows of 65536, which a cluster
    # of 16 could keep in registers, are read from shared memory instead (measured faster);
    # layer norm's two partials leave too few registers for that and keep the row there
    fd, inputs, _ = _norm_backward(norm, 64, 65536, torch.bfloat16)
    fd.precompile(inputs, target="h100")
    description = executor_for(fd).last_plan.spec.description
    assert "clusters of 16" in description, description
    assert ("2 row inputs in shared memory" in description) is (norm == "rms"), description


def test_layer_norm_backward_rows_of_65536_share_a_cluster_on_hopper():
    # Note [Cluster rows]: on sm_90 a cluster of blocks keeps such an f32 row in registers
    # and the column partials ride along (one pass); an A100 segments it as above
    fd = layer_norm_backward(torch.float32)
    inputs = layer_norm_backward_inputs(4, 65536, torch.float32, seed=11)
    assert fd.segment(inputs, target="h100") == []
    assert executor_for(fd).scheduler == "inner_outer"
    fd.precompile(inputs, target="h100")
    assert "clusters of" in executor_for(fd).last_plan.spec.description
    assert len(fd.segment(inputs, target="a100")) == 2


def test_precompile_compiles_every_segment_without_a_gpu():
    fd = layer_norm_backward(torch.bfloat16)
    inputs = layer_norm_backward_inputs(16, 262144, torch.bfloat16, seed=12)
    before = FusionCache.get().stats()["kernels_compiled"]
    refs = fd.precompile(inputs, target="a100")  # a row and a column kernel, and finishes
    assert {r.arch for r in refs} == {80}
    assert len(refs) >= 2
    assert FusionCache.get().stats()["kernels_compiled"] - before == len(refs)
    assert fd.precompile(inputs, target="h100")[0].arch == 90


def test_segments_dump_names_segments_and_schedulers(monkeypatch, capsys):
    monkeypatch.setenv("FUSION_CACHE_DUMP", "segments")
    fd = seed_002()
    fd.precompile([rand(2, 32, seed=13), rand(2, 128, seed=14)], target="h100")
    out = capsys.readouterr().out
    assert "2 segments" in out
    assert "segment 0" in out and "segment 1" in out
    assert "reduction" in out and "pointwise" in out


def test_intermediates_die_after_their_last_reader():
    fd = chain_with_boundaries(4)
    fd.segment([rand(4, 4, seed=15)], target="h100")
    plan = executor_for(fd).last_plan
    produced = [set(s.sub.outputs) for s in plan.segments]
    for k, seg in enumerate(plan.segments[1:], start=1):
        # what the previous segment made is dropped as soon as this one has read it
        assert produced[k - 1] & set(seg.drop_after) == produced[k - 1]
    assert not set(plan.segments[-1].drop_after) & set(plan.output_states)  # returned


def test_argument_manager_frees_values(monkeypatch):
    """Count live intermediates while the chain runs: at most two at a time."""
    import fusion_cache.runtime.segmented as segmented

    fd = chain_with_boundaries(4)
    x = rand(4, 4, seed=16)
    fd.segment([x], target="h100")
    plan = executor_for(fd).last_plan
    live = []
    real_execute = FusionDefinition.execute

    def spy(self, args, **kw):
        out = real_execute(self, args, **kw)
        live.append(len(args) + len(out))
        return out

    monkeypatch.setattr(FusionDefinition, "execute", spy)
    got = segmented.run_segments(fd, plan, [x])
    check(got, chain_eager(4)(x))
    assert max(live) <= 2


def test_a_row_value_returned_at_full_size_is_written_by_a_pointwise_segment():
    # the reduction kernel writes one value per row; spreading it over the row is a
    # pointwise kernel's job (it once came out as a row-level store of a full-size output)
    fd = row_sum_spread(5, 12)
    x = rand(5, 12, seed=17)
    segments = fd.segment([x], target="h100")
    assert [s.scheduler for s in executor_for(fd).last_plan.segments] == ["reduction", "pointwise"]
    assert len(segments) == 2
    check(run_segmented(fd, [x]), row_sum_spread_eager(x))


def test_batch_norm_training_is_one_kernel_with_running_stats_in_place():
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape=[-1, -1, -1, -1], dtype=DataType.Float)
        w, b = fd.define_tensor(shape=[-1]), fd.define_tensor(shape=[-1])
        rm, rv = fd.define_tensor(shape=[-1]), fd.define_tensor(shape=[-1])
        y, mean, invstd = fd.ops.batch_norm(x, w, b, rm, rv, fd.define_scalar(0.1),
                                            fd.define_scalar(1e-5), True)  # fmt: skip
        for t in (y, mean, invstd):
            fd.add_output(t)
    inputs = [rand(4, 6, 5, 8, seed=18), rand(6, seed=19), rand(6, seed=20),
              rand(6, seed=21), rand(6, seed=22).abs() + 0.5]  # fmt: skip
    # the composite op is expanded for the schedulers: Welford over N, H, W (two reduced
    # runs around C), normalisation and the running statistics' update, all one kernel
    assert fd.segment(inputs, target="h100") == []
    refs = fd.precompile(inputs, target="h100")
    assert [r.name for r in refs] == ["fc_inner_reduction"]
    assert "two reduced dims" in executor_for(fd).last_plan.spec.description
    rm, rv = inputs[3].clone(), inputs[4].clone()
    want = torch.native_batch_norm(inputs[0], inputs[1], inputs[2], rm, rv, True, 0.1, 1e-5)
    got = fd.execute(inputs)  # the reference evaluator here: the same function
    check(got, list(want))
    check([inputs[3], inputs[4]], [rm, rv])


def test_debug_views_of_a_segmented_fusion():
    fd = seed_002()
    fd.precompile([rand(2, 32, seed=23), rand(2, 128, seed=24)], target="h100")
    text = fd.last_scheduled_fusion_ir()
    assert "2 segments" in text and "segment 1" in text
    code = fd.last_cuda_code()
    assert "fc_inner_reduction" in code and "fc_pointwise" in code


def test_the_store_records_a_segmented_plan():
    import json

    fd = seed_002()
    fd.precompile([rand(2, 32, seed=25), rand(2, 128, seed=26)], target="h100")
    (entry,) = FusionCache.get().store.plans_for(fd.id())
    plan = json.loads(entry.plan_json)
    assert plan["scheduler"] == "segmented" and entry.target == "sm_90"
    assert plan["segments"] == [s.definition.id() for s in executor_for(fd).last_plan.segments]
    assert "does not fit the loop" in plan["refused"]


def test_few_blocks_of_partials_finish_in_column_strips():
    # Note [Column strips]: a wave of clusters over rows of 262144 leaves at most 7 blocks
    # of partials on an H100; the finish then gives each thread four adjacent columns and
    # every block's partials of them. An A100's row kernel over short rows leaves a block of
    # partials per resident block, and its finish keeps tiles of 32 columns
    fd, inputs, eager = _norm_backward("layer", 40, 262144, torch.bfloat16)
    fd.precompile(inputs, target="h100")
    spec = executor_for(fd).last_plan.spec
    finish = spec.kernels[1]
    assert finish.block == (256, 1, 1) and finish.grid == (262144 // 1024, 2, 1), spec.description
    assert finish.args[-1] <= 32 and "fc_vec<A, V>" in finish.source
    fd = layer_norm_backward(torch.float32)
    small = layer_norm_backward_inputs(4096, 256, torch.float32, seed=11)
    fd.precompile(small, target="a100")
    finish = executor_for(fd).last_plan.spec.kernels[1]
    assert finish.args[-1] > 32 and finish.block[0] == 32 and "FC_ROWS" in finish.source
    check(fd.execute(small), layer_norm_backward_eager(*small), 1e-4)


@pytest.mark.parametrize("switch", ["0", "1"])
def test_peer_reductions_share_a_kernel_with_the_switch(monkeypatch, switch):
    """Note [Peer reductions]: two column sums of the same extents that read nothing of each
    other are one segment with FUSION_CACHE_PEER_REDUCTIONS=1, two without; a row sum of
    other extents stays apart either way."""
    monkeypatch.setenv("FUSION_CACHE_PEER_REDUCTIONS", switch)
    FusionCache.reset()
    with FusionDefinition() as fd:
        a, b, c = (fd.define_tensor(shape=[-1, -1], dtype=DataType.Float) for _ in range(3))
        fd.add_output(fd.ops.sum(fd.ops.mul(a, a), [0]))
        fd.add_output(fd.ops.sum(fd.ops.exp(b), [0]))
        fd.add_output(fd.ops.sum(c, [1]))
    inputs = [rand(64, 48, seed=21), rand(64, 48, seed=22), rand(5, 999, seed=23)]
    segments = fd.segment(inputs, target="h100")
    assert len(segments) == (2 if switch == "1" else 3)
    got = run_segmented(fd, inputs)
    a, b, c = inputs
    check(got, [(a * a).sum(0), b.exp().sum(0), c.sum(1)])
