"""The outer (dim-0) layout: columns are the kept dims, contiguous in the primary input;
threads own VEC columns, TY threads and SPLIT blocks share the reduced dim, and the split
blocks combine in one cluster (Note [Cluster columns]) or through workspaces and a finish
kernel (finish.py, Note [Outer finish]).

Note [Middle reductions]: reduced dims between kept ones ([B, R, I] over R, and their
relatives: several kept or reduced dims, reduced dims first and in the middle) are planned
as one outer reduction over every kept element as a column, as if each outer index were
its own dim-0 sum: the kept dims collapse to runs, column c sits at its coordinates along
them (the innermost last, contiguous in the primary input), and a vector of VEC columns
never leaves the innermost run (its length is a multiple of VEC). The reduced dims collapse
to one run or two (Note [Two reduced dims]). The split, cluster and finish rules are the
dim-0 sums' own, applied to the columns of every outer index together. Where the kept
dims collapse to one run, the kernel is the dim-0 one, unchanged."""
from __future__ import annotations

import math

from codegen.cuda_ops import ELEMENT_BYTES
from codegen.reduction.outer_kernel import OUTER_NAME, outer_arg_types, render_outer
from codegen.reduction.variants import OuterVariant
from fusion_cache.frontend.dtypes import DataType

from ..base import ArgRef, KernelLaunch, LaunchSpec, SchedulerRefused
from ..layout import index_type
from ..tuning import knob
from ..views import describe_views
from .finish import outer_finish
from .lowering import NAME
from .problem import Problem, next_pow2


def plan_columns(p: Problem) -> LaunchSpec:
    """The outer kernel (and its finish) of a pure, single-stage reduction whose reduced
    dims are strided and whose innermost kept run is contiguous."""
    program, profile, env, tensors, outputs = p.program, p.profile, p.env, p.tensors, p.outputs
    i_sizes, i_strides, ks, ptrs, N = p.i_sizes, p.i_strides, p.ks, p.ptrs, p.N
    n_acc, sm, primary, scalars = p.n_acc, p.sm, p.primary, p.scalars
    loop, strides = p.loop, p.strides
    if not all(program.store_rowlevel) or program.stages != 1:
        raise SchedulerRefused("an outer reduction with element-level outputs or several stages")
    if i_strides[primary][-1] != 1:
        raise SchedulerRefused("the kept dims of an outer reduction are not contiguous")
    cols = math.prod(i_sizes)
    mid = len(i_sizes) > 1 or p.k2  # Note [Middle reductions]
    # the vector width of the tensors that move along the columns (a per-row value read by
    # every column, as rms norm's rstd in a column sum, is one load a row)
    widest = max((ELEMENT_BYTES[t.dtype] for k, t in enumerate(program.accesses)
                  if i_strides[k][-1] != 0), default=4)  # fmt: skip
    vec = max(1, 16 // widest)
    while vec > 1 and i_sizes[-1] % vec:
        vec //= 2
    modes = []
    for k in range(len(tensors)):
        s = i_strides[k][-1]
        # a vector of VEC columns is one aligned load when every row starts aligned
        dt = program.accesses[k].dtype if k < n_acc else program.stores[k - n_acc].dtype
        aligned = ptrs[k] % (vec * ELEMENT_BYTES[dt]) == 0 and ks[k] % vec == 0 and all(
            x % vec == 0 for x in [*i_strides[k][:-1], *(p.k0s[k:k + 1] if p.k2 else [])])
        modes.append("bcast" if s == 0 else "vec" if s == 1 and aligned else "strided")
    welford16 = vec >= 8 and any(r.op == "welford" for r in program.reductions)
    # 16-bit Welford columns enough for three blocks an SM of half-warp rows take blocks of
    # 16 x 8 threads: var_mean bf16 over dim 1 of [64, 4096, 1024] 2654 -> 2710 GB/s on the
    # H100 (16 x 4: 2643, 16 x 16: 2306); [8, 16384, 4096], 256 such blocks, 2778 -> 2765,
    # keeps 32 x 8 (benchmarks/sweeps/layouts2_r2.json, 2026-11-26)
    narrow = welford16 and cols // (16 * vec) >= 3 * sm
    tx = knob("outer.tx", 16 if narrow else min(32, max(1, next_pow2(-(-cols // vec)))))
    col_blocks = -(-cols // (tx * vec))
    # blocks of 128 threads where the columns alone give four blocks an SM (sum over dim 0
    # bf16 256x262144: 2418 GB/s against 2216 with 256; f32 2631 and 2588), 256 otherwise:
    # with fewer blocks, 128 threads left the SMs short of loads in flight (bf16
    # 1024x65536: 1715 against 2349; benchmarks/results/sweep-long_bwd.json), and two sums
    # a column did better with 256 (layer norm backward bf16 256x262144: 1256 -> 1283,
    # sweep-reread_bwd.json)
    small_blocks = narrow or (col_blocks >= 4 * sm and len(program.reductions) == 1)
    ty = knob("outer.ty", max(1, min(32, (128 if small_blocks else 256) // tx)))
    # four vectors in flight a thread, and a split aiming at two blocks an SM: sum over
    # dim 0 bf16 262144x256 1629 -> 1996 GB/s, f32 2378 -> 2497 (sweep-explore)
    # 16-bit Welford columns: eight rows a Welford add (Note [Outer Welford add]); var_mean
    # bf16 over dim 1 of [64, 4096, 1024] 2643 -> 2705 GB/s on the H100, [8, 16384, 4096]
    # 2776 -> 2816 (benchmarks/sweeps/layouts_perf.json, H100, 2026-11-26)
    unroll = knob("outer.unroll", 8 if welford16 else 4)
    split = 1
    # 16-bit: one block an SM (bf16 1024x65536: 2258 -> 2367 GB/s, sweep-rows). Still so
    # with the finish of Note [Outer finish]: bf16 262144x256 2282 GB/s, 2261 at two an SM
    # (split 512), f32 2585 and 2535 at four (sweep-split_after_finish.json)
    want = sm * knob("outer.blocks_per_sm", 1 if vec >= 8 else 2)
    while col_blocks * split < want and N // (split * 2 * ty * unroll) >= 8:
        split *= 2
    # split blocks of one cluster combine through its shared memory (Note [Cluster columns])
    # instead of through a workspace and a second kernel: sum over dim 0 bf16 4096x16384
    # 2260 -> 2306 GB/s on the H100 (split 4), f32 16384x4096 2564 -> 2596 (split 8); clusters
    # of 16 ran 5% slower than a second kernel (benchmarks/results/sweep-cluster_cols.json)
    cluster = (1 < split <= 8 and profile.supports_clusters and bool(knob("outer.cluster", 1)))
    variant = OuterVariant(tx, ty, vec, split, index_type(loop, strides), tuple(modes),
                           tuple(x != 0 for x in ks[:n_acc]), unroll,
                           knob("load.hint", 3), cluster, len(i_sizes), p.k2)  # fmt: skip
    base: list = []
    for k in range(len(tensors)):
        base.append(ArgRef("input", program.accesses[k].input_pos) if k < n_acc
                    else ArgRef("output", k - n_acc))  # fmt: skip
        base += [*i_strides[k], ks[k], *([p.k0s[k]] if p.k2 else [])]
    base += [cols, N]
    if mid:
        base += [*i_sizes[1:], *([p.k_sizes[-1]] if p.k2 else [])]
    workspaces, work_args = [], []
    if split > 1 and not cluster:
        for r in program.reductions:
            n = split * cols
            kinds = [r.dtype, r.dtype, DataType.Int32] if r.op == "welford" else [r.dtype]
            for dt in kinds:
                work_args.append(ArgRef("workspace", len(workspaces)))
                workspaces.append((n, dt))
    else:
        work_args = [0] * sum(3 if r.op == "welford" else 1 for r in program.reductions)
    types = outer_arg_types(program, variant, False)
    kernels = [KernelLaunch(OUTER_NAME, render_outer(program, variant, False), (col_blocks, split, 1),
                            (tx, ty, 1), types, tuple(base + work_args + scalars))]  # fmt: skip
    if split > 1 and not cluster:
        kernels.append(outer_finish(p, variant, types, tuple(base + work_args + scalars)))
    return LaunchSpec(NAME, tuple(outputs), tuple(workspaces), tuple(kernels),
                      variant.describe() + describe_views(program.views, env))
