"""Without a GPU: fusions whose inputs and outputs disagree on their innermost dim take the
transpose scheduler; its kernels compile with NVRTC for sm_80 and sm_90; the plans compute
the right values; the shared-memory tiles have no bank conflicts; and where tiles do not
apply or do not pay the plan is the pointwise one, with the reason.

No kernel runs here, so each tiled plan is replayed on CPU (`emulate_tiles`): tile by tile,
the copies into shared memory, the V x V blocks and the copies out follow the kernel's
index math (Note [Transpose tiles]) over flat views of the real tensors, through a
swizzled shared-memory image, with the kernel's arguments (strides, sizes, tile count).
Wrong strides, a wrong swizzle or a lost tail give wrong values there, as on the GPU.
"""
import pytest
import torch
from program_replay import eval_stmts

from codegen.transpose_cuda import SmemTile, block_slot, copy_slot
from fusion_cache import DataType, FusionDefinition
from fusion_cache.frontend.dtypes import from_torch, to_torch
from fusion_cache.ir.shape_eval import runtime_shapes
from fusion_cache.runtime.executor import executor_for
from fusion_cache.runtime.plans import LaunchPlan
from schedulers.base import ArgRef
from schedulers.device import resolve_target
from schedulers.transpose import plan_tiles
from schedulers.tuning import overriding

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
TOL = {F32: 1e-5, BF16: 1.6e-2, F16: 2e-3, torch.float64: 1e-9}


def rand(shape, dtype=F32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype)


def tensor(fd, rank, dtype, order=None):
    """A contiguous input, or one laid out in `order` (nvFuser's stride_order)."""
    return fd.define_tensor(shape=[-1] * rank, contiguity=[True] * rank, dtype=from_torch(dtype),
                            stride_order=order)  # fmt: skip


def strided(shape, order, dtype=F32, seed=0):
    """A tensor of `shape` whose dim d has stride rank order[d] (0: innermost)."""
    inner_first = sorted(range(len(shape)), key=lambda d: order[d])
    dense = rand([shape[d] for d in reversed(inner_first)], dtype, seed)
    return dense.permute([len(shape) - 1 - inner_first.index(d) for d in range(len(shape))])


# ---- the replay -----------------------------------------------------------------------------


def run_stmts(program, load, values):
    """The statements as torch ops on V x V blocks; `load(k)` gives access k's block."""
    return eval_stmts(program, lambda k: load(k).to(to_torch(program.accesses[k].dtype)), values)


def emulate_tiles(program, tiling, values):
    """The outputs of a tiled plan, replayed tile by tile as the kernel runs."""
    v, args = tiling.variant, list(tiling.args)
    R, A, B, V = v.rank, v.dim_a, v.dim_b, v.vec
    n_acc = len(program.accesses)
    count = n_acc + len(program.stores)
    strides = [args[k * (R + 1) + 1:(k + 1) * (R + 1)] for k in range(count)]
    sizes = args[count * (R + 1):count * (R + 1) + R]
    ntiles = args[count * (R + 1) + R]
    outs = [torch.zeros(o.shape, dtype=to_torch(o.dtype)) if o.strides is None else
            torch.zeros(o.shape, dtype=to_torch(o.dtype)).as_strided(o.shape, o.strides)
            for o in tiling.outputs]  # fmt: skip
    flat = [values[a.input_pos].as_strided((values[a.input_pos].untyped_storage().nbytes()
                                            // values[a.input_pos].element_size(),), (1,), 0)
            for a in program.accesses] + [o.as_strided((o.numel(),), (1,), 0) for o in outs]  # fmt: skip
    dtypes = [a.dtype for a in program.accesses] + [s.dtype for s in program.stores]
    modes = list(v.load_modes) + list(v.store_modes)
    tiles = {k: v.tile_of(dtypes[k]) for k in range(count) if modes[k] == "tile"}
    smem = {k: torch.zeros(t.nbytes // t.elem_bytes, dtype=to_torch(dtypes[k]))
            for k, t in tiles.items()}  # fmt: skip
    chunks = v.tile_b // V
    outer = [d for d in range(R) if d not in (A, B)]
    tiles_a, tiles_b = -(-sizes[A] // v.tile_a), -(-sizes[B] // v.tile_b)
    j = torch.arange(V)

    def slot_of(t, row, chunk):  # element offsets of (row, chunk) chunks in a tile's image
        return ((row * chunks + (chunk ^ ((row // V) % t.lanes) * t.spread)) * V)[..., None] + j

    copies = torch.arange(v.tile_a * chunks)
    cr, cc = copy_slot(copies, chunks)
    blocks = torch.arange((v.tile_a // V) * chunks)
    r0, bc = block_slot(blocks, v.tile_a, V)
    rows = r0[:, None] + j  # [block, r]
    cols = (bc * V)[:, None] + j  # [block, j]
    for t in range(ntiles):
        rem = t
        at = rem % tiles_a * v.tile_a
        rem //= tiles_a
        bt = rem % tiles_b * v.tile_b
        rem //= tiles_b
        coord = {}
        for d in reversed(outer):
            coord[d] = rem % sizes[d] if d != outer[0] else rem
            rem //= sizes[d]
        base = [at * s[A] + bt * s[B] + sum(coord[d] * s[d] for d in outer) for s in strides]
        ok = (at + cr < sizes[A]) & (bt + cc * V < sizes[B])
        for k, tile in tiles.items():
            if k < n_acc:
                src = (base[k] + cr * strides[k][A] + cc * V)[:, None] + j
                smem[k][slot_of(tile, cr, cc)[ok]] = flat[k][src[ok]]
        inb = (at + r0 < sizes[A]) & (bt + bc * V < sizes[B])

        def elem(k, base=base):  # [block, r, j] element offsets
            return (base[k] + rows[:, :, None] * strides[k][A] + cols[:, None, :] * strides[k][B])

        def load(k, inb=inb, elem=elem):
            if modes[k] == "tile":  # chunks (r0 + r, c): V elements along B, j
                return smem[k][slot_of(tiles[k], rows, bc[:, None])][inb]
            return flat[k][elem(k)[inb]]

        env = run_stmts(program, load, values)
        for n, st in enumerate(program.stores):
            k = n_acc + n
            value = torch.as_tensor(env[st.var]).to(to_torch(st.dtype)).expand(int(inb.sum()), V, V)
            if modes[k] == "tile":
                smem[k][slot_of(tiles[k], rows, bc[:, None])[inb]] = value
            else:
                flat[k][elem(k)[inb]] = value
        for k, tile in tiles.items():
            if k >= n_acc:
                dst = (base[k] + cr * strides[k][A] + cc * V)[:, None] + j
                flat[k][dst[ok]] = smem[k][slot_of(tile, cr, cc)[ok]]
    return outs


def meta(x):
    """A meta tensor with x's strides (`to("meta")` makes expanded tensors dense)."""
    if not isinstance(x, torch.Tensor):
        return x
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")


def tiled_plan(fd, inputs, target="h100"):
    """Precompile; the fusion must take the transpose scheduler and tile."""
    refs = fd.precompile([meta(x) for x in inputs], target=target)
    ex = executor_for(fd)
    assert ex.scheduler == "transpose", ex.refusals
    plan = ex.last_plan
    assert isinstance(plan, LaunchPlan) and plan.spec.scheduler == "transpose", plan.spec.description
    assert refs[0].source.count("fc_transpose(") == 1
    env = runtime_shapes(ex.fd, inputs)
    tiling = plan_tiles(ex.program, inputs, env, resolve_target(target))
    return ex.program, tiling


def check(fd, inputs, want, target="h100"):
    program, tiling = tiled_plan(fd, inputs, target)
    got = emulate_tiles(program, tiling, inputs)
    for g, w in zip(got, want, strict=True):
        tol = TOL.get(w.dtype, 0)
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)
    for g, w in zip(fd.execute(inputs), want, strict=True):  # CPU: the reference evaluator
        torch.testing.assert_close(g, w, rtol=TOL.get(w.dtype, 0), atol=TOL.get(w.dtype, 0))
    return tiling


# ---- shape classes --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("shape", [(128, 192), (131, 77), (64, 1000)], ids=str)
def test_add_of_a_transposed_input(dtype, shape):
    with FusionDefinition() as fd:
        a, b = tensor(fd, 2, dtype), tensor(fd, 2, dtype)
        fd.add_output(fd.ops.add(fd.ops.permute(a, [1, 0]), b))
    x, y = rand(shape, dtype, 1), rand(shape[::-1], dtype, 2)
    tiling = check(fd, [x, y], [(x.t().float() + y.float()).to(dtype)])
    assert tiling.variant.load_modes == ("tile", "vec")
    odd = any(n % 2 for n in shape)
    assert (tiling.variant.vec == 1) == odd


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_batched_transpose_times_a_scalar_input(dtype):
    with FusionDefinition() as fd:
        a = tensor(fd, 3, dtype)
        s = fd.define_scalar(dtype=DataType.Double)
        y = fd.ops.mul(fd.ops.cast(fd.ops.permute(a, [0, 2, 1]), DataType.Float), s)
        fd.add_output(fd.ops.cast(y, from_torch(dtype)))
    x = rand((3, 96, 40), dtype, 3)
    tiling = check(fd, [x, 2.5], [(x.permute(0, 2, 1).float() * 2.5).to(dtype)])
    assert tiling.tiles == (6 if dtype == F32 else 3)


def test_nchw_to_nhwc_with_a_channel_bias():
    with FusionDefinition() as fd:
        x, b = tensor(fd, 4, F32), tensor(fd, 1, F32)
        y = fd.ops.permute(x, [0, 2, 3, 1])
        fd.add_output(fd.ops.relu(y + fd.ops.broadcast_in_dim(b, fd.ops.shape(y), [3])))
    x, b = rand((2, 48, 7, 9), seed=4), rand((48,), seed=5)
    tiling = check(fd, [x, b], [torch.relu(x.permute(0, 2, 3, 1) + b)])
    # H and W merge: [2, 63, 48], channels (A) against pixels (B)
    assert tiling.variant.rank == 3 and (tiling.variant.dim_a, tiling.variant.dim_b) == (2, 1)
    assert tiling.variant.load_modes == ("tile", "vec")


def test_rank_five_permute_with_outer_dims_between():
    with FusionDefinition() as fd:
        x = tensor(fd, 5, BF16)
        fd.add_output(fd.ops.neg(fd.ops.permute(x, [4, 1, 3, 2, 0])))
    x = rand((40, 2, 3, 5, 24), BF16, 6)
    tiling = check(fd, [x], [-x.permute(4, 1, 3, 2, 0)])
    assert tiling.variant.rank == 5


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_transposed_input_passed_in_with_its_stride_order(dtype):
    with FusionDefinition() as fd:
        a = tensor(fd, 2, dtype, order=[0, 1])  # column-major
        w = tensor(fd, 1, dtype)
        y = fd.ops.mul(fd.ops.cast(a, DataType.Float), fd.ops.broadcast_in_dim(w, fd.ops.shape(a), [0]))
        fd.add_output(fd.ops.cast(y, from_torch(dtype)))
    x, w = strided((200, 72), [0, 1], dtype, 7), rand((200,), dtype, 8)
    assert x.stride() == (1, 200)
    tiling = check(fd, [x, w], [(x.float() * w[:, None].float()).to(dtype)])
    assert tiling.variant.load_modes == ("tile", "elem")  # w: one value a row (along B)


def test_inputs_of_both_layouts_and_two_outputs_mixed_dtypes():
    with FusionDefinition() as fd:
        a, b = tensor(fd, 2, BF16), tensor(fd, 2, F32)
        c = tensor(fd, 2, BF16)
        at = fd.ops.cast(fd.ops.permute(a, [1, 0]), DataType.Float)
        ct = fd.ops.cast(fd.ops.permute(c, [1, 0]), DataType.Float)
        fd.add_output(fd.ops.add(at, b))
        fd.add_output(fd.ops.cast(fd.ops.mul(ct, at), DataType.BFloat16))
    x, y, z = rand((96, 160), BF16, 9), rand((160, 96), F32, 10), rand((96, 160), BF16, 11)
    xt, zt = x.t().float(), z.t().float()
    tiling = check(fd, [x, y, z], [xt + y, (zt * xt).to(BF16)])
    v = tiling.variant
    assert v.vec == 4 and v.load_modes == ("tile", "vec", "tile")  # f32 moves: 4 a vector


def test_tails_of_tiles_and_more_tiles_than_a_wave():
    with FusionDefinition() as fd:
        a = tensor(fd, 3, F32)
        fd.add_output(fd.ops.exp(fd.ops.permute(a, [0, 2, 1])))
    x = rand((5, 100, 68), seed=12)
    with overriding({"transpose.blocks_per_sm": 1}):
        fd.precompile([x.to("meta")], target="h100")
    check(fd, [x], [torch.exp(x.permute(0, 2, 1))])


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_tiles_take_a_block_each(dtype):
    """Note [Transpose tiles]: a block a tile (the GPU hands them out as blocks finish), or
    under transpose.tiles_each 0 a resident wave of blocks looping over them."""
    with FusionDefinition() as fd:
        a, b = tensor(fd, 2, dtype), tensor(fd, 2, dtype)
        fd.add_output(fd.ops.add(fd.ops.permute(a, [1, 0]), b))
    x = y = torch.empty((8192, 8192), dtype=dtype, device="meta")
    program, tiling = tiled_plan(fd, [x, y])
    assert (tiling.blocks, tiling.wave) == (tiling.tiles, 0)
    with overriding({"transpose.tiles_each": 0}):
        _, looping = tiled_plan(fd, [x, y])
    wave = resolve_target("h100").sm_count * looping.variant.min_blocks
    assert (looping.blocks, looping.wave) == (wave, wave)
    with overriding({"transpose.tiles_each": -1}):  # the wave's tiles shared out evenly
        _, even = tiled_plan(fd, [x, y])
    rounds = -(-even.tiles // wave)
    assert even.blocks == -(-even.tiles // rounds) <= wave


@pytest.mark.parametrize("knobs", [{"transpose.stages": 3}, {"transpose.vec": 2},
                                   {"transpose.tile_a": 128, "transpose.tile_b": 32},
                                   {"transpose.threads": 128}], ids=str)  # fmt: skip
def test_tuning_knobs_keep_the_values(knobs):
    with FusionDefinition() as fd:
        a, b = tensor(fd, 2, F32), tensor(fd, 2, F32)
        fd.add_output(fd.ops.sub(fd.ops.permute(a, [1, 0]), b))
    x, y = rand((136, 264), seed=13), rand((264, 136), seed=14)
    with overriding(knobs):
        tiling = check(fd, [x, y], [x.t() - y])
    for name, value in knobs.items():
        field = {"transpose.stages": "stages", "transpose.vec": "vec",
                 "transpose.tile_a": "tile_a", "transpose.tile_b": "tile_b",
                 "transpose.threads": "threads"}[name]  # fmt: skip
        assert getattr(tiling.variant, field) == value


# ---- compiles, targets, copies ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("target", ["a100", "h100"])
def test_kernels_compile_for_both_targets(dtype, target):
    with FusionDefinition() as fd:
        a, b = tensor(fd, 2, dtype), tensor(fd, 2, dtype)
        fd.add_output(fd.ops.add(fd.ops.permute(a, [1, 0]), b))
    for shape in [(256, 512), (255, 513)]:
        x, y = rand(shape, dtype), rand(shape[::-1], dtype)
        _, tiling = tiled_plan(fd, [x, y], target)
        src = executor_for(fd).last_plan.spec.kernels[0].source
        async_copies = tiling.variant.stages > 0
        assert ("fc_cp_async<" in src) == async_copies
        # 16-bit values one at a time (odd sizes) cannot be copied by cp.async
        assert async_copies == (tiling.variant.vec * x.element_size() >= 4)


def test_fifty_sizes_compile_at_most_three_kernels():
    from fusion_cache import FusionCache

    with FusionDefinition() as fd:
        a = tensor(fd, 2, F32)
        fd.add_output(fd.ops.permute(a, [1, 0]) * 2.0)
    before = FusionCache.get().stats()["kernels_compiled"]
    for n in range(1, 51):
        fd.precompile([torch.empty(64 * n, 96 + n, device="meta")], target="h100")
    # vectors of 4, 2 and 1 (the sizes' divisibility), and the pointwise kernel never
    assert FusionCache.get().stats()["kernels_compiled"] - before <= 3


# ---- untiled: the pointwise plan, with the reason ---------------------------------------------


def plan_of(fd, inputs, target="h100"):
    fd.precompile([meta(x) for x in inputs], target=target)
    return executor_for(fd).last_plan.spec


def test_attention_layout_keeps_its_innermost_dim():
    with FusionDefinition() as fd:
        x = tensor(fd, 4, BF16)
        y = fd.ops.mul(fd.ops.permute(fd.ops.cast(x, DataType.Float), [0, 2, 1, 3]), 0.125)
        fd.add_output(fd.ops.cast(y, DataType.BFloat16))
    spec = plan_of(fd, [rand((2, 64, 4, 128), BF16)])
    assert spec.scheduler == "pointwise"
    assert "not tiled: every input and output is contiguous along dim" in spec.description


def test_broadcast_only_inputs_are_not_tiled():
    with FusionDefinition() as fd:
        a = tensor(fd, 2, F32)
        col = fd.define_tensor(shape=[-1, -1], contiguity=[False, False], dtype=DataType.Float)
        fd.add_output(fd.ops.add(a, col))
    # a column expanded over the rows: contiguous along dim 0, broadcast along dim 1
    spec = plan_of(fd, [rand((256, 512)), rand((256, 1)).expand(256, 512)])
    assert spec.scheduler == "pointwise" and "broadcast along it" in spec.description


def test_small_tiles_are_not_tiled():
    with FusionDefinition() as fd:
        a = tensor(fd, 2, F32)
        fd.add_output(fd.ops.permute(a, [1, 0]) + 1.0)
    spec = plan_of(fd, [rand((4096, 4))])
    assert spec.scheduler == "pointwise" and "mostly empty" in spec.description
    assert plan_of(fd, [rand((4096, 64))]).scheduler == "transpose"


def test_plain_fusions_do_not_take_it():
    with FusionDefinition() as fd:
        a, b = tensor(fd, 2, F32), tensor(fd, 2, F32)
        fd.add_output(fd.ops.permute(fd.ops.permute(a, [1, 0]), [1, 0]) + b)
    plan_of(fd, [rand((64, 64)), rand((64, 64))])
    ex = executor_for(fd)
    assert ex.scheduler == "pointwise"
    assert "permutes cancel out" in str(ex.refusals[0])
    with FusionDefinition() as fd2:
        a = tensor(fd2, 2, F32)
        fd2.add_output(a * 2.0)
    plan_of(fd2, [rand((64, 64))])
    assert executor_for(fd2).scheduler == "pointwise"
    assert "no permute" in str(executor_for(fd2).refusals[0])


def test_open_strides_tile_only_when_transposed():
    with FusionDefinition() as fd:
        a = fd.define_tensor(shape=[-1, -1], contiguity=[False, False], dtype=DataType.Float)
        fd.add_output(fd.ops.sin(a))
    x = rand((300, 200))
    assert plan_of(fd, [x]).scheduler == "pointwise"
    check(fd, [x.t()], [torch.sin(x.t())])


# ---- shared memory: no bank conflicts ----------------------------------------------------------


def wavefronts(accesses, width):
    """Shared-memory wavefronts of one warp instruction: accesses of `width` bytes at these
    byte offsets (32 threads), split as the hardware serves them (128 bytes at a time for
    8- and 16-byte accesses), each needing as many passes as its busiest bank's distinct
    words."""
    group = 32 // (128 // max(width, 4)) if width > 4 else 1
    per = 32 // group
    passes = 0
    for g in range(group):
        words: dict[int, set] = {}
        for off in accesses[g * per:(g + 1) * per]:
            for w in range(off // 4, (off + width - 1) // 4 + 1):
                words.setdefault(w % 32, set()).add(w)
        passes += max(len(s) for s in words.values())
    return passes, group


LAYOUTS = [(vec, z, ta, tb) for vec, z, ta, tb in [
    (4, 4, 64, 64), (8, 2, 128, 128), (4, 2, 64, 64), (1, 4, 32, 32), (1, 2, 64, 64),
    (2, 4, 32, 32), (2, 2, 64, 64), (2, 8, 32, 32), (4, 4, 128, 32), (4, 4, 32, 128),
]]  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_swizzled_tiles_have_no_bank_conflicts(layout):
    vec, z, ta, tb = layout
    tile = SmemTile(vec, z, ta, tb)
    assert tile.unfit() is None
    chunks = tile.chunks
    seen = set()
    for warp in range(ta * chunks // 32):
        # copies (in and out): consecutive threads, consecutive chunks of a row
        offs = [tile.offset(*copy_slot(warp * 32 + t, chunks)) for t in range(32)]
        seen.update(offs)
        passes, group = wavefronts(offs, tile.width)
        assert passes == group, f"copies of warp {warp}: {passes} passes"
    assert seen == {k * tile.width for k in range(ta * chunks)}  # a permutation of the tile
    for warp in range(max(1, (ta // vec) * chunks // 32)):
        for r in range(vec):  # blocks: row r of each thread's V rows, one access each
            offs = [tile.offset(r0 + r, c) for r0, c in
                    (block_slot(warp * 32 + t, ta, vec) for t in range(32))]  # fmt: skip
            passes, group = wavefronts(offs, tile.width)
            assert passes == group, f"block rows of warp {warp}, r {r}: {passes} passes"


def test_the_planner_only_makes_layouts_that_fit():
    cases = [((F32, F32), (256, 512)), ((BF16, BF16), (256, 512)), ((BF16, F32), (256, 512)),
             ((F32, F32), (255, 513)), ((BF16, BF16), (255, 511)), ((F16, BF16), (130, 66))]  # fmt: skip
    for (da, db), shape in cases:
        with FusionDefinition() as fd:
            a, b = tensor(fd, 2, da), tensor(fd, 2, db)
            y = fd.ops.add(fd.ops.cast(fd.ops.permute(a, [1, 0]), DataType.Float), b)
            fd.add_output(fd.ops.cast(y, from_torch(db)))
        _, tiling = tiled_plan(fd, [rand(shape, da), rand(shape[::-1], db)])
        v = tiling.variant
        for dt in (da, db):
            assert SmemTile(v.vec, dt.itemsize, v.tile_a, v.tile_b).unfit() is None


def test_arguments_are_pointers_then_strides_then_sizes():
    with FusionDefinition() as fd:
        a = tensor(fd, 2, F32)
        fd.add_output(fd.ops.permute(a, [1, 0]))
    _, tiling = tiled_plan(fd, [rand((64, 96))])
    args = tiling.args
    assert args[0] == ArgRef("input", 0) and args[3] == ArgRef("output", 0)
    assert list(args[1:3]) == [1, 96] and list(args[4:6]) == [64, 1]
    assert list(args[6:9]) == [96, 64, tiling.tiles]


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_an_output_in_another_stride_order(dtype):
    """Note [Output layouts]: a column-major output of a row-major input is a transpose:
    the input is staged, the output stored along its own innermost dim."""
    with FusionDefinition() as fd:
        a = tensor(fd, 2, dtype)
        fd.add_output(fd.ops.mul(a, fd.define_scalar(2.0)), stride_order=[0, 1])
    x = rand((136, 200), dtype, 21)
    tiling = check(fd, [x], [x * 2])
    assert tiling.variant.load_modes == ("tile",) and tiling.variant.store_modes == ("vec",)
    assert tiling.outputs[0].strides == (1, 136)
    (got,) = fd.execute([x])  # the reference evaluator lays it out the same way
    assert got.stride() == (1, 136)


def test_outputs_of_both_layouts_and_the_stride_order_op():
    """One output row-major, one through the stride_order op in another order: the second
    goes back through a tile (`tile` stores)."""
    with FusionDefinition() as fd:
        a, b = tensor(fd, 3, BF16), tensor(fd, 3, F32)
        y = fd.ops.add(fd.ops.cast(fd.ops.permute(a, [0, 2, 1]), DataType.Float), b)
        fd.add_output(y)
        fd.add_output(fd.ops.stride_order(fd.ops.cast(fd.ops.neg(y), DataType.BFloat16),
                                          [2, 0, 1]))  # fmt: skip
    x, z = rand((3, 136, 200), BF16, 15), rand((3, 200, 136), F32, 16)
    want = x.permute(0, 2, 1).float() + z
    tiling = check(fd, [x, z], [want, (-want).to(BF16)])
    assert tiling.variant.store_modes == ("vec", "tile")


def test_random_numbers_follow_the_loop_and_bytes_are_not_tiled():
    with FusionDefinition() as fd:
        a = tensor(fd, 2, F32)
        lo, hi = fd.define_scalar(0.0), fd.define_scalar(1.0)
        at = fd.ops.permute(a, [1, 0])
        noise = fd.ops.uniform(lo, hi, fd.ops.shape(at), rng_seed=fd.define_scalar(7),
                               rng_offset=fd.define_scalar(0))  # fmt: skip
        fd.add_output(fd.ops.mul(at, noise))
    _, tiling = tiled_plan(fd, [rand((256, 520))])
    src = executor_for(fd).last_plan.spec.kernels[0].source
    assert "#define FC_ELEM_INDEX ((unsigned long long)(lin0 + " in src
    assert list(tiling.args[-2:]) == [256, 1]  # the loop [520, 256]'s row-major strides
    with FusionDefinition() as fd2:
        b = fd2.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Bool)
        fd2.add_output(fd2.ops.logical_not(fd2.ops.permute(b, [1, 0])))
    spec = plan_of(fd2, [torch.rand(256, 512) > 0.5])
    assert spec.scheduler == "pointwise" and "not DataType.Bool" in spec.description


def test_outputs_in_every_stride_order_of_four_dims():
    """Every order of a [16, 20, 24, 36] output of a row-major input, planned and replayed
    (not compiled): tiled wherever the order moves the innermost dim, right values in each."""
    import itertools

    from fusion_cache.ir.output_layout import strides_for

    x = rand((16, 20, 24, 36), seed=22)
    tiled_orders = 0
    for perm in itertools.permutations(range(4)):
        with FusionDefinition() as fd:
            t = fd.ops.mul(tensor(fd, 4, F32), fd.define_scalar(3.0))
            fd.add_output(t, stride_order=list(perm))
        ex = executor_for(fd)
        tiling = plan_tiles(ex.program, [x], runtime_shapes(ex.fd, [x]), resolve_target("h100"))
        if perm.index(0) == 3:  # the innermost dim stays dim 3: nothing to tile
            assert isinstance(tiling, str)
            continue
        tiled_orders += 1
        assert tiling.outputs[0].strides == tuple(strides_for(x.shape, perm))
        (got,) = emulate_tiles(ex.program, tiling, [x])
        torch.testing.assert_close(got, x * 3)
    assert tiled_orders == 18
