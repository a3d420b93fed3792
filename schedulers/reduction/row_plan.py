"""The row (inner) layout: a row's vector width and threads, the values a thread keeps, the
cluster and shared memory choices (clusters.py, row_loads.py), the finish (finish.py), and
the launch of the row kernel they make."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from codegen.cuda_ops import RANDOM_STMTS
from codegen.kernel_ir import ReductionProgram
from codegen.reduction.common import acc_type
from codegen.reduction.row_kernel import INNER_NAME, inner_arg_types, render_inner
from codegen.reduction.variants import InnerVariant
from fusion_cache.frontend.dtypes import DataType

from ..base import ArgRef, KernelLaunch, LaunchSpec, SchedulerRefused
from ..layout import index_type
from ..resize import index_bound
from ..tuning import knob
from ..views import describe_views
from .clusters import choose_cluster, launch_groups, plan_exchange
from .finish import fused_finish
from .lowering import NAME
from .problem import Problem
from .row_loads import plan_pipeline, plan_weights, smem_rows_first, stage_rows, weight_hint
from .row_resize import row_resize
from .row_shape import read_row_shape


def plan_rows(p: Problem) -> LaunchSpec:
    """The row kernel: TX threads a row, TY rows a block, CLUSTER blocks a row."""
    program, profile, accumulate, pure, k2 = p.program, p.profile, p.accumulate, p.pure, p.k2
    N, rows, sm, i_strides = p.N, p.rows, p.sm, p.i_strides
    rs = read_row_shape(p)
    vec, nv, welford, narrow = rs.vec, rs.nv, rs.welford, rs.narrow
    cluster, most, weighted16, reread_row, forced_cluster = choose_cluster(rs)
    tx, iters = rs.split_row(cluster, most, len(rs.cached) + len(accumulate))
    budget = 128 if tx <= 256 else 64  # values a thread keeps, under its register cap
    cached = rs.cached
    smem_first = smem_rows_first(rs, cluster)
    if iters * vec * max(len(cached), 1) > 64 or program.stages == 0 or not knob(
            "inner.cache", not (reread_row or smem_first)) or (
            accumulate and iters * vec * (len(cached) + len(accumulate)) > budget):  # fmt: skip
        # column partials keep the fixed steps (a thread sums the same columns every
        # row) and read the row from memory in each pass instead
        iters, cached = (iters if accumulate else 0), ()
    rows_in_smem = False
    staged = stage_rows(rs, cluster, forced_cluster, cached, smem_first)
    if staged is not None:
        (cluster, tx, iters, cached), rows_in_smem = staged, True
    if accumulate and iters * vec * len(accumulate) > budget:
        raise SchedulerRefused("column partials need the partial sums in registers; this "
                               "row is too long")  # fmt: skip
    # not from the row count: one kernel serves every batch size. Blocks of 512 threads
    # instead of 256, measured on the H100:
    # - rows of at most 16 threads, 32 to a block: softmax, layer and rms norm, var_mean
    #   of 256 values a row +0.1-1.5% in f32 and bf16 (layer norm f32 262144x256 2882 ->
    #   2902 GB/s, var_mean bf16 2581 -> 2621); plain sums lost 1% (sum bf16 2549 ->
    #   2520; benchmarks/results/sweep-short_rows_bf16.json, sweep-short_rows_confirm.json)
    # - 16-bit rows of a warp or more, a block or a pair of them a row: rms norm backward
    #   bf16 16384x4096 2696 -> 2765, rms norm 2769 -> 2825, layer norm 2757 -> 2789, its
    #   backward 2630 -> 2670, sums +0.5-1.6%; f32 rows lost 1% (sweep-mid_rows_threads.json).
    #   In clusters of 8 or 16 only column partials kept in registers gain (layer norm
    #   backward bf16 1024x65536 2250 -> 2491); the others lost 4-12% (softmax bf16
    #   1024x65536 2768 -> 2521; sweep-wide_blocks_confirm.json). Rows in shared memory
    #   keep 256: their stages were sized for it above
    short = tx <= 16 and not accumulate and (welford or not pure)
    wide = narrow and tx >= 32 and not rows_in_smem and (cluster <= 2 or bool(accumulate))
    small = rs.small_blocks(cluster)  # Note [Small row blocks] (row_shape.py)
    block = 64 if small else 512 if short or wide else 256
    ty = max(1, knob("inner.threads", block) // tx)
    if iters == 0 and nv >= 4096 and rows < 2 * sm:
        # few long rows (batch norm's channels) leave SMs idle: a wider block per row
        # keeps more loads in flight on the SMs that have one
        tx, ty = 1024, 1
    pipeline, stage_bytes, room = plan_pipeline(rs, cluster, cached, iters, rows_in_smem, tx, ty)
    two_exchanges, exchange_async, merge, defer = plan_exchange(rs, cluster, cached, rows_in_smem,
                                                                stage_bytes, room)  # fmt: skip
    if defer:
        stage_bytes = stage_bytes * 3 // 2
    weights, weight_bytes = plan_weights(rs, cluster, cached, iters, tx, ty, rows_in_smem,
                                         pipeline, two_exchanges, defer, weighted16, room)  # fmt: skip
    hoist_smem = weights == "shared"
    if hoist_smem:
        stage_bytes = weight_bytes
    rv, resize_args = row_resize(p) if p.resize is not None else (None, [])
    itype = index_type(p.loop, p.strides) if rv is None else (
        "int" if index_bound(p.loop, p.strides, p.resize) < 2**30 else "long long")
    variant = InnerVariant(len(p.i_sizes), tx, ty, vec, iters, cached, itype,
                           rs.modes, tuple(tuple(x != 0 for x in s) for s in i_strides),
                           k2, tuple(accumulate), cluster=cluster, pipeline=pipeline,
                           rows_in_smem=rows_in_smem,
                           load_hint=knob("load.hint", 3 if pure else 0),
                           store_hint=knob("store.hint", 0),
                           weight_hint=weight_hint(profile),
                           unroll=knob("inner.unroll", _unroll(vec)) if iters == 0 else 1,
                           merge=merge, weights=weights,
                           exchange_async=exchange_async, defer=defer,
                           alternate=bool(knob("inner.alternate", bool(accumulate))),
                           finish=p.finish if fused_finish(p) else (), resize=rv,
                           rng_lanes=knob("inner.rng_lanes", True) and _rng_lanes(p, vec, rv))  # fmt: skip
    # blocks an SM the kernel asks for, unless its shared memory holds fewer (layer norm
    # f32 1024x65536 spilled, asking 4 with 64 KiB of weights a block)
    min_blocks = _min_blocks(program, variant)
    per_block = weight_bytes + profile.smem_reserved_per_block
    if hoist_smem and min_blocks * per_block > profile.smem_per_sm:
        min_blocks = 0
    variant = replace(variant, min_blocks=knob("inner.min_blocks", min_blocks))
    many = knob("inner.rows", 2 if small else 1)  # Note [Rows a thread] (row_loads.py)
    if many > 1 and iters and cached and not (pipeline or rows_in_smem or defer or accumulate
                                              or variant.finish or rv is not None) and cluster == 1:
        variant = replace(variant, rows_a_thread=many)
    groups, wave = launch_groups(rs, variant, stage_bytes, tiles=small)
    workspaces: tuple = ()
    if accumulate:
        workspaces = tuple((groups * N, DataType.Double if acc_type(program.stores[k].dtype)
                            == "double" else DataType.Float) for k in accumulate)  # fmt: skip
    blocks = groups * cluster
    kernel = KernelLaunch(INNER_NAME, render_inner(program, variant), (blocks, 1, 1),
                          (tx, ty, 1), inner_arg_types(program, variant),
                          tuple(_row_args(p) + resize_args),
                          stage_bytes, cooperative=bool(variant.finish))  # fmt: skip
    return LaunchSpec(NAME, tuple(p.outputs), workspaces, (kernel,),
                      variant.describe() + describe_views(program.views, p.env), wave)


def _row_args(p: Problem) -> list:
    """The row kernel's arguments: each tensor's pointer and strides, the sizes, the scalars."""
    program, accumulate, k2, n_acc, i_strides = p.program, p.accumulate, p.k2, p.n_acc, p.i_strides
    args: list = []
    ref_of = _store_refs(len(program.stores), accumulate)
    for k in range(len(p.tensors)):
        args.append(ArgRef("input", program.accesses[k].input_pos) if k < n_acc
                    else ref_of[k - n_acc])  # fmt: skip
        args += list(i_strides[k]) + [p.ks[k]] + ([p.k0s[k]] if k2 else [])
    args += [p.rows, p.N, *p.i_sizes, *([p.k_sizes[-1]] if k2 else []), *p.scalars]
    return args


def _store_refs(count: int, accumulate: tuple[int, ...]) -> list:
    """Where each store's pointer comes from: the next output, or for a store summed into
    column partials, the next workspace."""
    refs, outs = [], 0
    for k in range(count):
        if k in accumulate:
            refs.append(ArgRef("workspace", accumulate.index(k)))
        else:
            refs.append(ArgRef("output", outs))
            outs += 1
    return refs



def _rng_lanes(p: Problem, vec: int, rv: object) -> bool:
    """Note [Philox lanes]: whether every vector's first element index (row * N + kb) is a
    multiple of 4, so lanes may draw by place: rows and vectors of multiples of 4 (a cluster
    block's slice starts at a multiple of the vector), plain row-major indices. On by
    default since lanes also pick their words by place: dropout + residual + layer norm
    bf16 [16384, 4096] ran 2712 GB/s with lanes and 2341 without on the H100 (one run,
    14:55 UTC; 64 -> 45 registers; Note [Random rows in registers])."""
    drawn = any(s.op in RANDOM_STMTS for s in p.program.stmts)
    return drawn and p.N % 4 == 0 and vec % 4 == 0 and not p.k2 and rv is None


def _unroll(vec: int) -> int:
    """Vectors a thread loads ahead when a pass reads the row from memory: two for 32-bit rows
    (layer norm f32 256x262144: 1749 -> 1848 GB/s on the H100, sums and Welford alike or
    slightly better); one for 16-bit rows, where four cost 9% (benchmarks/results/
    sweep-unroll.json)."""
    return 2 if vec == 4 else 1


def _min_blocks(program: ReductionProgram, v: Any) -> int:
    """The __launch_bounds__ minimum of an inner kernel: for 32-bit rows of blocks under 512
    threads with a light register load, 1024 threads an SM (64 registers a thread) in
    clusters and 512 otherwise; 512 threads for kernels keeping column partials. Others say
    nothing: an explicit minimum of one block ran 16-bit and partial-sum kernels up to 30%
    slower."""
    threads = v.tx * v.ty
    values = v.iters * v.vec * max(len(v.cached), 1)
    # normalizations; plain sums did no better, nor rows of a few values a thread (softmax
    # f32 262144x256: 2646 with 4 blocks, 2775 without; benchmarks/results/sweep-rows.json).
    # Since the kernels' instructions halved (sweep-twopass.json), blocks of 512 threads do
    # as well or better without a minimum (layer norm f32 4096x16384: 2875 GB/s without, 2803
    # with 2 blocks), 16-bit rows gain nothing from one, and asking 1024 threads an SM made
    # layer norm f32 16384x4096 spill (2750 against 2902 with 512; sweep-welford_blocks.json).
    # Cluster slices want the 1024: layer norm f32 1024x65536 ran 2592 GB/s with it and 2315
    # with 512, rms norm f32 1024x65536 2832 and 2541 (H100 benchmark runs of 2026-11-23)
    light = (not v.acc and 8 < values <= 32 and not all(program.store_rowlevel)
             and v.vec <= 4 and threads < 512)  # fmt: skip
    if light:
        return (1024 if v.cluster > 1 else 512) // threads
    if _random_rows(program, v):
        # Note [Random rows in registers]: 1536 threads an SM, 40 registers each. Dropout +
        # residual + layer norm bf16 [16384, 4096] (H100, one run): 2847 GB/s asking 3 (4
        # bytes spilled), 2878 without a minimum where ptxas gave 40 registers anyway; before
        # Note [Mask words] (45 registers, two blocks unasked) 2820 against 2713
        return 3
    return 512 // threads if v.acc else 0


def _random_rows(program: ReductionProgram, v: Any) -> bool:
    """Rows of 512 threads that draw random numbers by lane (Note [Philox lanes]) beside the
    16 values a thread keeps; comparing groups takes 64 registers and spilled at 40."""
    drawn = any(s.op in RANDOM_STMTS for s in program.stmts)
    return (drawn and v.rng_lanes and v.tx * v.ty == 512 and 0 < v.iters * v.vec <= 16
            and not v.acc)  # fmt: skip

