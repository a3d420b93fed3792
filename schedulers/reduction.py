"""Reduction and normalization scheduling.

Note [Reduction loop space]: the loop space is the shape of the reductions' inputs (all
reductions of a fusion reduce the same axes K of tensors of one shape); the other dims I
index rows. Walking back from the outputs as the pointwise scheduler does, each value is
either *row-level* (a function of I only: reduction results and what follows from them) or
*element-level* (depends on K too). Reductions come in stages: a reduction whose input needs
another's result (softmax's sum needs the max) runs one stage later. An inner kernel gives
each row to TX threads (TY rows per block), keeps the row's loads in registers when they fit
and makes one pass over the row per stage, plus a last pass for element-level outputs: the
input is read from memory once. An outer kernel (K strided, I contiguous) gives columns to
threads and splits K over blocks, with a second kernel combining the partial results.

A reshape before the reductions (a prologue) is read through strides as in the pointwise
scheduler (Note [Reshape frames] in views.py). A reshape of a reduction's result, or of any
value computed from one, is refused: its rows would be regrouped, which one kernel's row
assignment cannot follow, so the segmenter cuts the fusion there.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from codegen.kernel_ir import Reduction, ReductionProgram, Stmt, Store
from fusion_cache.frontend.dtypes import DataType, is_complex, is_float
from fusion_cache.frontend.records import Record
from fusion_cache.frontend.values import TensorInfo
from fusion_cache.ir.output_layout import output_stride_orders, strides_for

from .base import SchedulerRefused
from .pointwise import _Lowering
from .tuning import knob

NAME = "reduction"
REDUCTIONS = {"sum", "prod", "max", "min", "var", "var_mean", "welford"}


class _ReductionLowering(_Lowering):
    def __init__(self, fd: Any, producers: dict, input_pos: dict, rank: int,
                 reduced: tuple[int, ...]) -> None:  # fmt: skip
        super().__init__(fd, producers, input_pos)
        self.rank = rank
        self.reduced = reduced
        self.reductions: list[Reduction] = []
        self.loop_state: int = -1

    def op(self, rec: Record, out_map: tuple, index: int | None = None) -> str:
        if rec.name == "iota":  # index accesses are the pointwise kernel's alone
            raise SchedulerRefused(f"iota ({rec.outputs[0]}) in a reduction kernel")
        if rec.name not in REDUCTIONS:
            return super().op(rec, out_map, index)
        if self.frame:
            raise SchedulerRefused(
                f"reshape (T{self.frame[-1].state}) of a value computed from {rec.name} "
                f"({rec.outputs[0]}): a reshape after a reduction regroups its rows"
            )
        src = rec.args[0]
        info = self.info(src.index)
        if info.ndim != self.rank:
            raise SchedulerRefused(f"{rec.name} reduces a rank-{info.ndim} tensor, the loop has {self.rank}")
        axes = tuple(sorted({d % self.rank for d in rec.kw("dims")}))
        if axes != self.reduced:
            raise SchedulerRefused(f"reductions over different dims {list(axes)} and {list(self.reduced)}")
        keep = rec.kw("keepdim", False)
        kept = [d for d in range(self.rank) if d not in axes]
        expect = tuple(None if (keep and d in axes) else d for d in (range(self.rank) if keep else kept))
        if tuple(out_map) != expect:
            raise SchedulerRefused(f"the result of {rec.name} ({rec.outputs[0]}) is read through a view")
        x = self.tensor(src.index, tuple(range(self.rank)))
        if self.loop_state < 0:
            self.loop_state = src.index
        out_dtype = self.info(rec.outputs[0].index).dtype
        if rec.name in ("sum", "prod", "max", "min"):
            acc = self.new_var()
            self.stmts.append(Stmt(acc, out_dtype, "reduce", (x,), out_dtype, (("op", rec.name),)))
            self.reductions.append(Reduction(acc, rec.name, x, out_dtype, 0))
            return acc
        if not is_float(info.dtype):
            raise SchedulerRefused(f"{rec.name} of {info.dtype!r}")
        acc_dtype = DataType.Double if info.dtype is DataType.Double else DataType.Float
        w = self.new_var()
        self.stmts.append(Stmt(w, acc_dtype, "reduce", (x,), acc_dtype, (("op", "welford"),)))
        self.reductions.append(Reduction(w, "welford", x, acc_dtype, 0))
        outs = {}
        if rec.name in ("var", "var_mean"):
            corr = float(rec.kw("correction"))
            outs[rec.outputs[0].index] = self.emit(info.dtype, "welford_var", (w,), acc_dtype,
                                                   (("correction", corr),))  # fmt: skip
        if rec.name == "var_mean":
            outs[rec.outputs[1].index] = self.emit(info.dtype, "welford_mean", (w,), acc_dtype)
        if rec.name == "welford":
            outs[rec.outputs[0].index] = self.emit(info.dtype, "welford_mean", (w,), acc_dtype)
            outs[rec.outputs[1].index] = self.emit(info.dtype, "welford_m2", (w,), acc_dtype)
            outs[rec.outputs[2].index] = self.emit(DataType.Int, "welford_count", (w,), acc_dtype)
        for idx, var in outs.items():
            self.memo[self.key(idx, out_map)] = var
        return outs[rec.outputs[0].index if index is None else index]


def _loop_space(fd: Any) -> tuple[int, tuple[int, ...]]:
    found = None
    for r in fd._records:
        if r.kind == "op" and r.name in REDUCTIONS:
            info = fd._infos[r.args[0].index]
            key = (info.ndim, tuple(sorted({d % max(info.ndim, 1) for d in r.kw("dims")})))
            if found is not None and key != found:
                raise SchedulerRefused(f"reductions over different loop spaces {found} and {key}")
            found = key
    if found is None:
        raise SchedulerRefused("the fusion has no reduction")
    if not found[1]:
        raise SchedulerRefused("a reduction over no dims")
    return found


def lower_reduction(fd: Any) -> ReductionProgram:
    rank, reduced = _loop_space(fd)
    producers = {o.index: r for r in fd._records if r.kind == "op" for o in r.outputs}
    input_pos = {ref.index: i for i, ref in enumerate(fd.input_refs())}
    low = _ReductionLowering(fd, producers, input_pos, rank, reduced)
    kept = [d for d in range(rank) if d not in reduced]
    stores, maps = [], []
    for r, order in zip(fd.output_records(), output_stride_orders(fd)):
        idx = r.args[0].index
        info = fd._infos[idx]
        if not isinstance(info, TensorInfo) or is_complex(info.dtype):
            raise SchedulerRefused(f"output {r.args[0]} is not a real tensor")
        if info.ndim == rank:
            omap = tuple(None if (d in reduced and info.shape[d] == 1) else d for d in range(rank))
        elif info.ndim == len(kept):
            omap = tuple(kept)
        else:
            raise SchedulerRefused(f"output {r.args[0]} of rank {info.ndim} fits neither the loop nor a row")
        var = low.tensor(idx, omap)
        alias = r.kw("alias_input")
        stores.append(Store(var, idx, info.dtype, None if alias is None else input_pos[alias.index],
                            order))  # fmt: skip
        maps.append(omap)
    # which values depend on K, and after which stage each can be computed
    element: set[str] = set()
    stage: dict[str, int] = {}
    reductions = []
    red_by_var = {r.var: r for r in low.reductions}
    for st in low.stmts:
        if st.op == "load":
            acc = low.accesses[st.operands[0]]
            if any(m in reduced for m in acc.loop_map if m is not None):
                element.add(st.var)
            stage[st.var] = 0
        elif st.op == "reduce":
            src = st.operands[0]
            if src not in element:
                raise SchedulerRefused(f"a reduction of a value that does not vary along {list(reduced)}")
            stage[st.var] = stage[src] + 1
            reductions.append(Reduction(st.var, red_by_var[st.var].op, src, st.dtype, stage[st.var]))
        else:
            ops = [o for o in st.operands if isinstance(o, str)]
            if any(o in element for o in ops):
                element.add(st.var)
            stage[st.var] = max((stage[o] for o in ops), default=0)
    rowlevel = tuple(s.var not in element for s in stores)
    for s, om, row in zip(stores, maps, rowlevel):
        if not row and any(m is None for m in om):
            raise SchedulerRefused(f"output {s.state} varies along reduced dims it does not have")
        if row and any(m in reduced for m in om if m is not None):
            # a per-row value spread over the reduced dims: cheaper to hand the row value to
            # a pointwise consumer than to write it out at full size here
            raise SchedulerRefused(f"output {s.state} broadcasts a per-row value over the "
                                   "reduced dims")  # fmt: skip
    return ReductionProgram(
        rank, reduced, tuple(low.accesses), tuple(low.stmts), tuple(reductions), tuple(stores),
        rowlevel, tuple(maps), tuple(sorted(low.scalar_inputs.items())),
        tuple(sorted(low.host_scalars.items())),
        tuple(s.state for s in stores), low.loop_state, frozenset(element), tuple(stage.items()),
        tuple(low.views.items()),
    )  # fmt: skip


# ---- planning -----------------------------------------------------------------------------


class _Shape:
    """Shape and strides of a tensor that does not exist yet (a fresh output), row-major or
    in a stride order (Note [Output layouts])."""

    def __init__(self, shape: Sequence[int], order: Sequence[int] = ()) -> None:
        from .layout import row_major

        self.shape = tuple(shape)
        self.dense = tuple(strides_for(shape, order)) if order else None
        self._strides = row_major(shape) if not order else [
            0 if n == 1 else x for n, x in zip(shape, self.dense)]

    def stride(self, d: int) -> int:
        return self._strides[d]


def _check_fit(program: ReductionProgram, tensors: Sequence[Any], maps: Sequence[tuple],
               loop: tuple[int, ...]) -> None:  # fmt: skip
    """Sizes must agree with the loop where they are mapped. A reshape's output that does
    not has regrouped the loop's dims, e.g. merged a reduced dim into a kept one."""
    for k, (t, m) in enumerate(zip(tensors, maps)):
        for i, d in enumerate(m):
            if d is None or t.shape[i] in (1, loop[d]):
                continue
            frames = program.accesses[k].frames if k < len(program.accesses) else ()
            if frames:
                raise SchedulerRefused(
                    f"reshape (T{frames[0].state}) gives shape {list(t.shape)} where the loop is "
                    f"{list(loop)}: it mixes reduced and kept dims"
                )
            raise SchedulerRefused(f"a tensor of shape {list(t.shape)} does not fit the loop "
                                   f"{list(loop)}")  # fmt: skip


def _store_refs(count: int, accumulate: tuple[int, ...]) -> list:
    """Where each store's pointer comes from: the next output, or for a store summed into
    column partials, the next workspace."""
    from .base import ArgRef

    refs, outs = [], 0
    for k in range(count):
        if k in accumulate:
            refs.append(ArgRef("workspace", accumulate.index(k)))
        else:
            refs.append(ArgRef("output", outs))
            outs += 1
    return refs


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _row_threads(nv: int, vec: int, per_thread: int, most: int) -> int:
    """Threads a row of `nv` vectors gets in one block."""
    if (vec >= 8 or per_thread >= 4) and nv <= 128:
        # short rows: a few threads a row with four loads each in flight; one load a
        # thread leaves 16-bit rows latency-bound. Pure f32 sums do best with two (one
        # warp a row); f32 rows that keep more also take four: softmax, layer and rms
        # norm f32 262144x256 +1% on the H100 (2842 -> 2870 GB/s, 2856 -> 2883, 2865 ->
        # 2884; benchmarks/results/sweep-short_rows_tx.json)
        return _next_pow2(-(-nv // 4))
    if nv <= 32:
        return _next_pow2(nv)
    return min(most, max(32, (-(-nv // per_thread) + 31) // 32 * 32))


def _cluster_size(n: int, nv: int, per_thread: int, narrow: bool, cached: int, partials: int,
                  program: ReductionProgram, pure: bool, k2: bool,
                  profile: Any) -> tuple[int, int]:  # fmt: skip
    """(blocks of a cluster sharing each row, most threads a block) (Note [Cluster rows] in
    codegen/prelude/reduce.cuh) for rows of n elements, nv vectors. The fewest blocks, up
    to 8, whose slices fit 512 threads keeping `per_thread` vectors of each cached input
    and column partial in registers; then twice as many: slices for 256 threads beat
    slices for 512 (softmax bf16 1024x65536: 2010 GB/s in clusters of 8, 1847 in clusters
    of 4 on the H100, benchmarks/results/sweep-rows.json), while a row of 16384 ran best in
    one block (sweep-pipeline). Column partials double only from 4 (layer norm backward
    bf16 4096x16384: 2298 -> 2615 GB/s in 8 blocks, rms norm's 2449 -> 2712, f32 +1-2%;
    from 2 they lost up to 40%, 65536x1024 in 4; sweep-partials2.json). A slice may take
    1024 threads (64 registers each) only where one input is kept and nothing else: layer
    norm's Welford and two-input rows spilled there and ran at half the speed. A row whose
    slices still do not fit is read in passes by 8 blocks (below). One block a row reads
    those where clusters gained nothing: pure reductions read each value once anyway
    (var_mean bf16 256x262144: 2095 GB/s in one block a row, 1978 in clusters of 8), but
    for Welford rows that a cluster keeps in registers (two passes of sums) and plain
    reductions of long rows (below). Batch norm's channels (two reduced dims) take the
    widest cluster their cached slices fit, or one block.
    Column partials of rows too long to cache: see Note [Partials of long rows]."""
    welford = any(r.op == "welford" for r in program.reductions)
    # a pure 32-bit Welford gains from clusters, where the cached slices turn it into two
    # cheap passes of sums (Note [Two-pass Welford]; var_mean f32 1024x65536: 2449 GB/s a
    # block a row, 2643 in clusters of 8 on the H100, benchmarks/results/sweep-misc_inner.json;
    # 16-bit rows one block keeps lost 12%, see below for those it cannot)
    two_pass = pure and welford and not narrow
    # plain reductions (sum, max, min, prod) of rows of 16384 and more: eight blocks a row
    # keep more loads in flight than one (measured with sums on the H100: f32 4096x16384
    # 2740 -> 2878 GB/s, 1024x65536 2691 -> 2756, 256x262144 2630 -> 2703; bf16 4096x16384
    # 2569 -> 2718, 1024x65536 2558 -> 2576; bf16 256x262144 lost 4%;
    # sweep-pure_clusters.json, sweep-last_rows.json, sweep-bf16_rows.json)
    long_plain = not welford and n >= 16384 and (not narrow or n <= 65536)
    # a 16-bit Welford row one block cannot keep but 8 blocks of 256 threads can: two passes
    # of sums from registers (var_mean bf16 1024x65536: 2147 -> 2470 GB/s on the H100; rows
    # one block keeps gained nothing in 2 blocks, rows of 262144 lost 6% in 8 and 9% in 16;
    # benchmarks/results/sweep-bf16_rows.json)
    narrow_two_pass = (welford and narrow and nv > 512 * per_thread
                       and -(-nv // 8) <= 256 * per_thread)  # fmt: skip
    if profile.supports_clusters and pure and cached and (long_plain or narrow_two_pass):
        return 8, 512
    if not profile.supports_clusters or (pure and not two_pass) or cached == 0:
        return 1, 512
    kept = cached + partials
    cluster = 1
    while cluster < 8 and -(-nv // cluster) * kept > 512 * per_thread:
        cluster *= 2
    if cluster == 1 and partials and not k2 and -(-nv // 2) >= (128 if narrow else 64):
        # column partials of a row one block holds still take two blocks a row where each
        # keeps a warp of threads with two vectors: one resident wave of 2-block clusters
        # (Note [One wave of partials]) beat four blocks an SM: layer norm backward bf16
        # 16384x4096 2140 -> 2375 GB/s on the H100, 65536x1024 2387 -> 2522, f32 16384x4096
        # 2672 -> 2768, rms norm's 1-2%; rows of 256 lost half (sweep-partials_cluster2.json).
        # Since 16-bit rows take blocks of 512 threads, those of 1024 do best in one block
        # again: layer norm backward bf16 65536x1024 2615 -> 2704, rms norm's 2668 -> 2750
        # (sweep-bwd_wide_blocks.json)
        return 2, 512
    if cluster == 1:
        return 1, 512
    wide = profile.max_cluster
    if k2:
        # a channel kept in the registers of the widest cluster is read once: batch norm
        # f32 32x256x56x56 1714 -> 2365 GB/s in clusters of 16 on the H100 (2298 in 8),
        # 256x64x28x28 1376 -> 1943, bf16 +9% and +12%; read in passes by a cluster it ran
        # at a third of that (benchmarks/results/sweep-channels_long.json)
        fits = -(-nv // wide) * kept <= 512 * per_thread and not partials
        return (wide, 512) if fits else (1, 512)
    if not partials and narrow and cluster == 8 and wide > 8 and (
            -(-nv // 8) * kept > 512 * per_thread >= -(-nv // wide) * kept):  # fmt: skip
        # 16-bit rows whose slices would need 1024 threads (or 64 values a thread) in 8
        # blocks take 16 blocks of 512 threads, two an SM: softmax bf16 256x262144 1762 ->
        # 1926 GB/s on the H100, layer norm's 1764 -> 1853 (sweep-channels_long.json)
        return wide, 512
    if not partials or cluster >= 4:
        cluster = min(8, 2 * cluster)
    most = 1024 if kept == 1 and not welford else 512
    if -(-nv // cluster) * kept > most * per_thread * (2 if partials else 1):
        if two_pass and -(-nv // wide) * kept <= 512 * per_thread:
            # a 32-bit Welford row the widest cluster holds: its two passes of sums from
            # registers (var_mean f32 256x262144: 2385 -> 2821 GB/s on the H100 in clusters
            # of 16, 2666 in 8; benchmarks/results/sweep-last_rows.json)
            return wide, 512
        if pure:  # read once anyway: one block a row
            return 1, 512
        # Note [Partials of long rows]: where the cached slices do not fit even 8 blocks,
        # the row is read from memory in each pass (the second mostly from L2, which holds
        # the rows a wave of clusters works on; or from shared memory where two copies of
        # a slice fit there, Note [Rows in shared memory]) and only the column partials stay in
        # registers, over 8 blocks where each reads at most 8 vectors a thread a pass (64
        # KiB) and the partials fit, else over the widest cluster the GPU runs. Since a
        # launch is one resident wave (Note [One wave of partials]), this beats a row and
        # a column kernel for 16-bit rows too. On the H100: rms norm backward bf16
        # 256x262144 (one partial) 1329 -> 1588 GB/s in clusters of 8, 1372 in 16; layer
        # norm backward's two partials 1284 -> 1398 in 16; f32 rows (16 vectors a thread
        # in 8 blocks) ran best in 16: rms norm's 1788 against 1648 in 8
        # (benchmarks/results/sweep-narrow_partials.json, sweep-wave_rules.json)
        fits = [b for b in (8, wide) if -(-nv // b) * partials <= 512 * per_thread * 2]
        if partials and fits:
            return (8 if 8 in fits and -(-nv // 8) <= 512 * 8 else fits[-1]), 512
        # other rows too long for a cluster's registers are still shared by 8 blocks: a wave
        # of clusters then works on few enough rows that passes after the first read them
        # from L2 (layer norm f32 256x262144: 1842 -> 2101 GB/s, the row kernel of rms norm
        # backward bf16 split in two: 1235 -> 1332, layer norm backward's 1175 -> 1256;
        # sixteen blocks did no better; benchmarks/results/sweep-reread*.json)
        reread = knob("inner.reread", 8)
        if reread and not partials:
            return min(reread, wide), 512
        return 1, 512  # column partials may hold 64 values a thread (see plan_reduction)
    if partials and narrow and cluster == 8 and profile.max_cluster > 8 and (
            -(-nv // 8) * kept > 512 * per_thread):  # fmt: skip
        # 16-bit rows whose cached slices and partials need 512 threads in each of 8 blocks
        # take 16 blocks of 256 threads instead: two blocks an SM, so one block's loads
        # run while the other waits at its row's barriers (layer norm backward bf16
        # 1024x65536: 1144 -> 1331 GB/s, rms norm's 1326 -> 1468; f32 rows gained nothing;
        # benchmarks/results/sweep-partials16.json)
        return profile.max_cluster, 256
    return cluster, most


def dependent_launch(profile: Any) -> bool:
    """Whether a kernel that reads the previous one's partials is launched to start while
    that one runs (Note [Dependent launch] in codegen/prelude/core.cuh): sm_90 and up. On
    the H100, same run: sums over dim 0 split over a finish kernel bf16 +2.2 to +2.4% (bf16
    16384x4096 2378 -> 2436 GB/s), f32 +1.2 to +1.3%, layer and rms norm backward with a
    column-sum finish -0.1 to +1.2% (benchmarks/results/sweep-dependent.json)."""
    return profile.arch >= 90 and bool(knob("launch.dependent", True))


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
    return 512 // threads if v.acc else 0


def plan_reduction(program: ReductionProgram, values: Sequence[Any], env: dict,
                   profile: Any, accumulate: tuple[int, ...] = (),
                   finish: tuple[str, ...] = ()) -> Any:  # fmt: skip
    """The launch for these inputs. `accumulate`: element-level stores summed over rows
    into per-block column partials instead of written (Note [Column partials]); they get
    workspaces of [blocks, N] partials, in order, and no outputs. `finish`: the memory
    types of the column sums, which the kernel may add up itself (Note [Finish in the row
    kernel]); its launch is then cooperative and takes their outputs and a barrier."""
    from .base import ArgRef, KernelLaunch, LaunchSpec, OutputSpec
    from .layout import access_strides, collapse, index_type
    from .views import describe_views, resolve_access

    rank, K = program.rank, program.reduced
    loop = tuple(env[program.loop_state])
    seen = [resolve_access(values[a.input_pos], a, env) for a in program.accesses]
    tensors: list[Any] = [t for t, _ in seen]
    maps = [m for _, m in seen]
    outputs = []
    for k, st in enumerate(program.stores):
        shape = tuple(env[st.state])
        if st.alias_input is not None:
            # in place, as batch norm's running statistics: one value per row, written
            # by one thread after the row is reduced
            target = values[st.alias_input]
            if tuple(target.shape) != shape or not program.store_rowlevel[k]:
                raise SchedulerRefused(f"output {st.state} is written in place but varies "
                                       "along the reduced dims")  # fmt: skip
            outputs.append(OutputSpec(shape, st.dtype, st.alias_input))
            tensors.append(target)
        else:
            fresh = _Shape(shape, st.stride_order)
            if k not in accumulate:
                outputs.append(OutputSpec(shape, st.dtype, None, fresh.dense))
            tensors.append(fresh)
        maps.append(program.output_maps[k])
    strides = [access_strides(t, m, rank) for t, m in zip(tensors, maps)]
    _check_fit(program, tensors, maps, loop)
    if not accumulate and any(loop[d] == 0 for d in range(rank) if d not in K):
        # no rows: every output is empty (element-level ones span the loop too)
        return LaunchSpec(NAME, tuple(outputs), (), (), "empty")
    kept_dims = [d for d in range(rank) if d not in K]
    k_sizes, k_strides = collapse(loop, strides, K)
    if len(k_sizes) > 2:
        raise SchedulerRefused(f"the reduced dims {list(K)} form {len(k_sizes)} strided runs; "
                               "at most two are scheduled")  # fmt: skip
    k2 = len(k_sizes) == 2  # Note [Two reduced dims]
    N = k_sizes[0] * k_sizes[-1] if k2 else k_sizes[0]
    ks = [s[-1] for s in k_strides]
    k0s = [s[0] for s in k_strides]
    i_sizes, i_strides = collapse(loop, strides, kept_dims)
    rows = 1
    for n in i_sizes:
        rows *= n
    if rows == 0 or N == 0:
        # rows over nothing: the executor plans the fusion with the reductions replaced by
        # their identities (Note [Empty reductions] in fusion_cache/ir/empty_reductions.py)
        raise SchedulerRefused("empty reduction")
    n_acc = len(program.accesses)
    elem = [i for i, a in enumerate(program.accesses) if ks[i] != 0]
    ptrs = [values[a.input_pos].data_ptr() for a in program.accesses] + [0] * len(program.stores)
    written = {st.alias_input for st in program.stores if st.alias_input is not None}
    for i, a in enumerate(program.accesses):
        if a.input_pos in written and ks[i] != 0:
            raise SchedulerRefused(f"input {a.input_pos} is read along the reduced dims and "
                                   "written in place")  # fmt: skip
    primary = max(elem, key=lambda i: values[program.accesses[i].input_pos].numel()) if elem else None
    pure = all(program.store_rowlevel) and program.stages == 1
    # outer kernels suit pure reductions whose reduced dim is strided; anything else takes
    # the inner kernel, with strided loads where the reduced dim is not contiguous
    inner = k2 or primary is None or ks[primary] == 1 or not pure or len(i_sizes) != 1 or (
        i_strides[primary][0] != 1)
    sm = profile.sm_count
    scalars = [ArgRef("scalar", pos) for pos, _ in program.scalar_inputs]
    scalars += [env[state] for state, _ in program.host_scalars]
    from codegen.cuda_ops import ELEMENT_BYTES

    if inner and primary is not None and ks[primary] not in (0, 1) and not pure:
        # a row whose elements are strided apart is read uncoalesced, once per stage:
        # outer reductions and a pointwise kernel (segments) read it coalesced instead
        raise SchedulerRefused("a normalization along a strided dim (outer normalization) is "
                               "not scheduled as one kernel")  # fmt: skip
    if inner:
        from codegen.reduction_cuda import (
            INNER_NAME,
            InnerVariant,
            acc_type,
            inner_arg_types,
            one_exchange,
            render_inner,
        )

        moving = [program.accesses[i].dtype for i in elem]
        moving += [s.dtype for k, s in enumerate(program.stores)
                   if not program.store_rowlevel[k] and k not in accumulate]  # fmt: skip
        vec = max(1, min(8, 16 // max((ELEMENT_BYTES[d] for d in moving), default=4)))
        while vec > 1 and k_sizes[-1] % vec:
            vec //= 2
        modes = []
        for k in range(len(tensors)):
            is_store = k >= n_acc
            if is_store and k - n_acc in accumulate:
                modes.append("vec")  # kept in registers: no memory access to shape
                continue
            rowlevel = program.store_rowlevel[k - n_acc] if is_store else ks[k] == 0
            dt = program.stores[k - n_acc].dtype if is_store else program.accesses[k].dtype
            if rowlevel:
                modes.append("row")
            elif ks[k] == 1 and ptrs[k] % (vec * ELEMENT_BYTES[dt]) == 0 and all(
                x % vec == 0 for x in i_strides[k]
            ) and (not k2 or k0s[k] % vec == 0):
                modes.append("vec")
            else:
                modes.append("strided")
        if vec > 1 and any(m == "strided" for m in modes):
            vec = 1
            modes = ["row" if m == "row" else "strided" for m in modes]
        nv = -(-N // vec)
        # about 32 values per thread and row (8 float4 or 4 bf16x8 vectors), at most 512
        # threads a row so a thread keeps up to 128 registers; pure sums, maxima and minima
        # keep two vectors (more threads a row, more loads in flight: sum f32 16384x4096
        # 2735 -> 2843 GB/s on the H100, bf16 2572 -> 2659; benchmarks/results/sweep-pure_small.json)
        welford = any(r.op == "welford" for r in program.reductions)
        per_thread = max(1, knob("inner.values", 2 * vec if pure and not welford else 32) // vec)
        # registers hold the loads that differ per row; weights shared by rows hit in L1/L2
        # (a single row's strides collapse to 0: all of its loads are its own)
        cached = tuple(sorted({s.operands[0] for s in program.stmts
                               if s.op == "load" and s.var in program.element_vars
                               and (any(i_strides[s.operands[0]]) or rows == 1)}))  # fmt: skip
        narrow = any(ELEMENT_BYTES[d] < 4 for d in moving)
        cluster, most = _cluster_size(N, nv, per_thread, narrow, len(cached), len(accumulate),
                                      program, pure, k2, profile)  # fmt: skip
        if (cluster == 1 and profile.supports_clusters and not pure and not accumulate
                and nv >= 4096 and 2 * rows <= sm):  # fmt: skip
            # so few long rows that a block each leaves half the SMs idle (batch norm of 64
            # channels: 64 blocks on 132 SMs): two blocks a row, in a cluster
            cluster = 2
        weight_ins = [i for i in range(n_acc) if i not in cached and modes[i] != "row"
                      and not any(i_strides[i])]  # fmt: skip
        # plain sums over rows whose weights (rms norm's) go to shared memory in 8 or 16
        # blocks take 16 of half the threads, the weight slice in shared memory, two blocks
        # an SM where it fits: one block's loads run while the other waits at its row's
        # barriers. On the H100 rms norm f32 256x262144 2634 -> 2737 GB/s, 1024x65536 2821
        # -> 2916, bf16 1024x65536 2770 -> 2797, bf16 256x262144 (read twice by 8 blocks
        # before, below) 2503 -> 2534; layer norm's Welford rows gained 1.5% in bf16 and lost
        # 5% in f32 (benchmarks/results/sweep-f32_sixteen.json, sweep-bf16_sixteen.json,
        # sweep-bf16_long16.json)
        weight_slice = sum(-(-N // 16) * ELEMENT_BYTES[program.accesses[i].dtype] for i in weight_ins)
        weighted16 = (cluster in (8, 16) and profile.max_cluster >= 16 and not (welford or pure or k2)
                      and not accumulate and bool(cached) and bool(weight_ins)
                      and all(modes[i] == "vec" and vec * ELEMENT_BYTES[program.accesses[i].dtype] == 16
                              for i in weight_ins)
                      and 2 * (weight_slice + profile.smem_reserved_per_block) <= profile.smem_per_sm)  # fmt: skip
        # other single stages of plain sums over a 16-bit row that would take 16 blocks: 8
        # blocks reading it again from L2 in the second pass beat 16 keeping it in registers
        # (rms norm bf16 256x262144 with its weight read from L2: 2268 -> 2425 GB/s on the
        # H100; softmax's three passes and layer norm's Welford lost; benchmarks/results/
        # sweep-f32_long.json, sweep-channels_long.json)
        reread_row = (cluster > 8 and narrow and not k2 and not accumulate and not weighted16
                      and program.stages == 1 and not welford)  # fmt: skip
        if reread_row:
            cluster = 8
        if weighted16:
            cluster = 16
        forced_cluster = knob("inner.cluster", None)
        cluster = forced_cluster or cluster

        def split_row(cluster: int, most: int, kept: int) -> tuple[int, int]:
            """(threads a row, vectors each) of a block's slice of the row; `kept`: values
            of a vector a thread keeps in registers"""
            nv_block = -(-nv // cluster)  # vectors of a row in one block's slice
            widest = most if cluster > 1 else 512
            tx = knob("inner.tx", _row_threads(nv_block, vec, per_thread, widest))
            if cluster > 1:
                tx = max(tx, cluster)  # a row's threads hand out the cluster's partials, one each
            iters = -(-nv_block // tx)
            while accumulate and iters * vec * kept > 64 and tx < 512:
                # the cached row and the column partials share the registers: more threads a
                # row, fewer values each, so two blocks fit on an SM
                tx = min(512, 2 * tx)
                iters = -(-nv_block // tx)
            return tx, iters

        tx, iters = split_row(cluster, most, len(cached) + len(accumulate))
        budget = 128 if tx <= 256 else 64  # values a thread keeps, under its register cap
        row_inputs = cached
        # 16-bit rows with one column partial (rms norm backward) over the widest clusters
        # ran faster from shared memory (Note [Rows in shared memory]) than from registers:
        # 1024x65536 2373 -> 2585 GB/s on the H100; layer norm's two partials lost 18%
        # (registers ran short), rows of fewer blocks up to 27%
        # (benchmarks/results/sweep-smem_rows.json, sweep-smem_rows2.json)
        # So did forward 16-bit rows with weights (layer and rms norm) whose slices of 16
        # take 512 threads of 4 vectors: rms norm bf16 256x262144 2548 -> 2622, layer
        # norm's 2132 -> 2246; rms norm's 1024x65536 (128 threads a row) lost 4%, softmax
        # (no weights) moved within 1%, f32 rows lost 14-16%, clusters of 8 3-14%
        # (sweep-fwd_smem.json, sweep-fwd_smem2.json)
        smem_first = narrow and cluster >= 16 and knob("inner.smem_rows", True) and (
            len(accumulate) == 1 or (not accumulate and bool(weight_ins)
                                     and -(-nv // cluster) >= 512 * 4))  # fmt: skip
        if iters * vec * max(len(cached), 1) > 64 or program.stages == 0 or not knob(
                "inner.cache", not (reread_row or smem_first)) or (
                accumulate and iters * vec * (len(cached) + len(accumulate)) > budget):  # fmt: skip
            # column partials keep the fixed steps (a thread sums the same columns every
            # row) and read the row from memory in each pass instead
            iters, cached = (iters if accumulate else 0), ()

        def chunks16(inputs: Sequence[int], iters: int) -> bool:  # 16-byte vectors cp.async copies
            return iters > 0 and profile.arch >= 80 and all(
                modes[i] == "vec" and vec * ELEMENT_BYTES[program.accesses[i].dtype] == 16
                for i in inputs)  # fmt: skip

        def smem_room(tx: int, ty: int) -> int:  # what stages may take beside the partials' tables
            tables = {acc_type(program.stores[k].dtype) for k in accumulate}  # one a type
            return profile.smem_per_block_optin - 1024 - sum(
                ty * tx * vec * (8 if t == "double" else 4) for t in tables)  # fmt: skip

        def stages_bytes(inputs: Sequence[int], tx: int, ty: int, iters: int) -> int:
            return 2 * len(inputs) * ty * iters * tx * 16  # two stages of 16-byte chunks

        rows_in_smem = False
        if (row_inputs and not cached and profile.supports_clusters
                and knob("inner.smem_rows", bool(accumulate) or smem_first)):  # fmt: skip
            # or the row stays in shared memory, pipelined (Note [Rows in shared memory]),
            # where two stages of the block's slice fit beside the partials' table, in the
            # widest cluster if the planned one's slices are too big. On the H100 rms norm
            # backward bf16 256x262144 1603 -> 2172 GB/s, layer norm's 1415 -> 1528. Where
            # the slices of all the row's inputs do not fit twice (f32 rows of 262144), the
            # first input's do and the others are read in each pass: rms norm backward f32
            # 1804 -> 2136, layer norm's 1875 -> 1916. Measured with clusters only: GPUs
            # without them keep reading the row in each pass
            # (benchmarks/results/sweep-smem_rows*.json, sweep-smem_some.json)
            widths = [cluster] + ([profile.max_cluster] if not forced_cluster
                                  and profile.max_cluster > cluster else [])  # fmt: skip
            choices = [(staged, c) for staged in [row_inputs] + (
                [row_inputs[:1]] if len(row_inputs) > 1 and knob("inner.smem_some", True) else [])
                for c in widths]  # fmt: skip
            for staged, c in choices:
                c_tx, c_iters = split_row(c, 512, len(accumulate))
                c_ty = max(1, knob("inner.threads", 256) // c_tx)
                fits = stages_bytes(staged, c_tx, c_ty, c_iters) <= smem_room(c_tx, c_ty)
                if fits and chunks16(staged, c_iters) and c_iters * vec * len(accumulate) <= 64:
                    cluster, tx, iters, cached, rows_in_smem = c, c_tx, c_iters, staged, True
                    break
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
        block = 512 if short or wide else 256
        ty = max(1, knob("inner.threads", block) // tx)
        if iters == 0 and nv >= 4096 and rows < 2 * sm:
            # few long rows (batch norm's channels) leave SMs idle: a wider block per row
            # keeps more loads in flight on the SMs that have one
            tx, ty = 1024, 1
        # Note [Row pipeline]: 16-byte chunks of the cached inputs go through shared memory.
        # Measured on the H100 (benchmarks/results/sweep-pipeline.json), it paid where a block
        # loops over many row groups (column partials: layer norm backward f32 16384x4096
        # 2265 -> 2611 GB/s). It also paid for 32-bit forward rows while their kernels ran
        # twice today's instructions; since Note [Two-pass Welford] and the packed row loads
        # it costs them 3-8% (layer norm f32 4096x16384: 2875 GB/s without, 2730 with;
        # softmax f32 4096x16384: 2927 and 2788; sweep-twopass.json), and column partials
        # 0-3% (rms norm backward f32 65536x1024: 2818 without, 2726 with; sweep-unroll.json).
        # Since the cluster exchange needs no fence (Note [Cluster exchange]), the row-level
        # loads come ahead too and the weights stay in registers (Note [Weights in
        # registers]), 16-bit column partials gain: layer norm backward bf16 1024x65536 1868
        # -> 2231 GB/s on the H100, 16384x4096 2377 -> 2576, rms norm's 1024x65536 2038 ->
        # 2373, 4096x16384 within 2% either way (all in clusters); 32-bit ones lost up to
        # 14% and forward rows up to 14%
        # (sweep-pipeline_rows.json, sweep-pipeline_async.json)
        # 16-bit rows of 1024 with partials in one block of 512 threads gain too: layer norm
        # backward bf16 65536x1024 2397 -> 2704, rms norm's 2453 -> 2750; rows of 256 lost
        # 1% (sweep-bwd_wide_blocks.json)

        # forward rows over the widest clusters with no weights (softmax) hold one row a
        # cluster at a time, and gain from loading the next meanwhile: softmax bf16
        # 256x262144 2259 -> 2393 GB/s (layer norm, with weights, lost 2%;
        # sweep-pure_clusters.json, sweep-pipeline_async.json)
        wide_rows = (not accumulate and not pure and not k2 and cluster >= 16
                     and not weight_ins)  # fmt: skip
        can_pipeline = bool(cached) and chunks16(cached, iters)
        pipeline = can_pipeline and (rows_in_smem or bool(knob("inner.pipeline", wide_rows or (
            bool(accumulate) and narrow and (cluster > 1 or nv >= 128)))))  # fmt: skip
        room = smem_room(tx, ty)
        stage_bytes = stages_bytes(cached, tx, ty, iters) if pipeline else 0
        if stage_bytes > room:
            pipeline, stage_bytes = False, 0
        assert pipeline or not rows_in_smem, "a row kept in shared memory is pipelined"
        # Note [Weights loaded once]: 32-bit column partials gained 0.2-1.7% (layer norm
        # backward f32 4096x16384 2628 -> 2672 GB/s on the H100); 16-bit ones lost up to 2%
        # unless pipelined (above), forward rows up to 25% (the weights' registers cost them
        # occupancy; benchmarks/results/sweep-weights.json). Streaming hints (load.hint)
        # leave weights cached in L1 but gained nothing there either. Rows read in each pass
        # are untried. Beside a row in shared memory, weights load once where their
        # registers and the partials' take at most 80 of the 128 a thread of 512 has: rms
        # norm backward f32 256x262144 2043 -> 2136 GB/s with them, layer norm's (two
        # partials, f32 weights: 96) 1916 -> 1864 and spilled (sweep-smem_some.json)
        weight_regs = sum(iters * vec * ELEMENT_BYTES[program.accesses[i].dtype] // 4
                          for i in weight_ins)  # fmt: skip
        roomy = not rows_in_smem or iters * vec * len(accumulate) + weight_regs <= 80
        # Note [Rows in shared memory]: a forward row kept there with two exchanges a row (a
        # Welford's mean, then its variance) loads its weights once into registers, which
        # its kernel can spare (40 a thread), and swaps partials through mbarriers (Note
        # [Cluster exchange]): layer norm bf16 256x262144 2245 -> 2417 GB/s on the H100;
        # weights alone ran 2144, mbarriers alone 2109 against 2246. Rms norm's one
        # exchange a row lost 1-3% either way (sweep-fwd_weights_regs.json, sweep-fwd_smem.json)
        two_exchanges = rows_in_smem and welford and not accumulate
        exchange_async = bool(knob("inner.exchange_async", not rows_in_smem or two_exchanges))
        merge = knob("inner.merge", True)
        # Note [Deferred row end] (codegen/prelude/reduce.cuh): a row in shared memory with
        # one exchange ends in the next iteration, after the next row's first pass, where a
        # third stage fits. On the H100 layer norm backward bf16 256x262144 1513 -> 1791
        # GB/s, rms norm's 2174 -> 2225, rms norm bf16 2607 -> 2681; rms norm backward bf16
        # 1024x65536 within 0.2%. Rows of which only some inputs are staged lost 21% (f32
        # 262144: layer norm backward 1917 -> 1512, rms norm's 2104 -> 1634): their other
        # inputs, read again a row later, fell out of L2 (benchmarks/results/sweep-defer.json);
        # loaded evict-last, then evict-first in the deferred pass, and dx stored evict-first,
        # they still lost 20% (layer norm backward f32 2094 -> 1673, rms norm's 2229 -> 1811;
        # sweep-defer_reread.json, code since removed). Nor is x read from L2 what holds
        # those rows back undeferred: copied by the first pass to shared memory for the last,
        # it lost 8% and 3% (layer norm backward f32 2080 -> 1916, rms norm's 2220 -> 2147;
        # sweep-keep.json, code since removed), nor copied ahead (cp.async) to one buffer
        # for the next row's first pass: 2071 -> 1523 and 2239 -> 1699 (sweep-first_pass.json,
        # code since removed). Through mbarriers instead of the cluster barrier, the deferred
        # rows lost 1-13% (layer norm backward bf16 1853 -> 1611; sweep-defer_exchange.json,
        # code since removed)
        whole_row = len(cached) == len(row_inputs)
        defer = (rows_in_smem and cluster > 1 and not exchange_async and one_exchange(program, merge)
                 and bool(knob("inner.defer", whole_row)) and stage_bytes * 3 // 2 <= room)  # fmt: skip
        if defer:
            stage_bytes = stage_bytes * 3 // 2
        # deferred forward rows with weights (rms norm's) load them once too: rms norm bf16
        # 256x262144 2700 -> 2787 GB/s on the H100 (benchmarks/results/sweep-defer_more.json)
        hoist = knob("inner.hoist", (bool(accumulate) and bool(cached) and (pipeline or not narrow)
                                     and roomy)
                     or ((two_exchanges or defer) and not accumulate and bool(weight_ins)))  # fmt: skip
        # Note [Weights kept in L2]: inputs every row reads again (layer norm's weight and
        # bias) load with an L2 evict-last policy (createpolicy, sm_80 on), so the rows
        # streaming past do not push them out of L2 between the rows that read them. On the
        # H100 layer norm f32 256x262144 (2 MiB of weights, read again by each of the 16
        # clusters for each of its rows) 2272 -> 2574 GB/s; no case of the 43 whose kernels
        # load weights lost more than 0.5% (benchmarks/results/sweep-weights_l2.json). The
        # same marks left by torch.compile's kernels (Triton's evict_last on weights) were
        # why that case ran 13% faster once torch.compile had run it in the process
        # (benchmarks/order_effect.py)
        # Note [Weights loaded once]: or in shared memory, where the row is cached, not
        # pipelined, and the weights' 16-byte chunks fit; the copies land while the first
        # row loads and reduces. Forward rows split over clusters of up to 8 gained (on the
        # H100 layer norm f32 1024x65536 2522 -> 2731 GB/s, bf16 2501 -> 2624, rms norm bf16
        # 2708 -> 2785); rows of one block -7% to +2% (rms norm f32 4096x16384 2915 -> 2698),
        # clusters of 16 -8%, column partials up to -17% (sweep-weights_smem2.json). Shared
        # memory, not a register bound, then sets the blocks an SM
        weight_bytes = len(weight_ins) * ty * iters * tx * 16
        hoist_smem = bool(knob("inner.hoist_smem", (1 < cluster <= 8 or weighted16) and not accumulate)) and bool(
            weight_ins) and bool(cached) and not pipeline and chunks16(weight_ins, iters) and (
            weight_bytes <= room)  # fmt: skip
        if hoist_smem:
            stage_bytes = weight_bytes
        # Note [Finish in the row kernel]: on sm_90, where a cooperative launch of clusters
        # was seen to hold (benchmarks/results/cooperative-probe-*.txt), for column sums of
        # at most two tiles of 32 columns an SM: on the H100 rms norm backward bf16
        # 262144x256 2659 -> 2725 GB/s, 16384x4096 2672 -> 2700, layer norm's 2604 -> 2674
        # and 2628 -> 2645, f32 within 1%; longer rows, whose finish a few resident blocks
        # take in many steps, lost 4-15% (1024x65536, 256x262144; sweep-fused_finish.json)
        few_tiles = -(-N // 32) * len(finish) <= 2 * sm
        fused_finish = (bool(finish) and profile.arch >= 90 and profile.fused_finish and few_tiles
                        and bool(knob("finish.fused", True)))  # fmt: skip
        variant = InnerVariant(len(i_sizes), tx, ty, vec, iters, cached, index_type(loop, strides),
                               tuple(modes), tuple(tuple(x != 0 for x in s) for s in i_strides),
                               k2, tuple(accumulate), cluster=cluster, pipeline=pipeline,
                               rows_in_smem=rows_in_smem,
                               load_hint=knob("load.hint", 3 if pure else 0),
                               store_hint=knob("store.hint", 0),
                               weight_hint=knob("load.weights", 4 if profile.arch >= 80 else 0),
                               unroll=knob("inner.unroll", _unroll(vec)) if iters == 0 else 1,
                               merge=merge,
                               weights="shared" if hoist_smem else "registers" if hoist else "",
                               exchange_async=exchange_async, defer=defer,
                               alternate=bool(knob("inner.alternate", bool(accumulate))),
                               finish=finish if fused_finish else ())  # fmt: skip
        # blocks an SM the kernel asks for, unless its shared memory holds fewer (layer norm
        # f32 1024x65536 spilled, asking 4 with 64 KiB of weights a block)
        min_blocks = _min_blocks(program, variant)
        per_block = weight_bytes + profile.smem_reserved_per_block
        if hoist_smem and min_blocks * per_block > profile.smem_per_sm:
            min_blocks = 0
        variant = replace(variant, min_blocks=knob("inner.min_blocks", min_blocks))
        args: list = []
        ref_of = _store_refs(len(program.stores), accumulate)
        for k in range(len(tensors)):
            args.append(ArgRef("input", program.accesses[k].input_pos) if k < n_acc
                        else ref_of[k - n_acc])  # fmt: skip
            args += list(i_strides[k]) + [ks[k]] + ([k0s[k]] if k2 else [])
        args += [rows, N, *i_sizes, *([k_sizes[-1]] if k2 else []), *scalars]
        # pure reductions: a block a row group (sum f32 262144x256 2610 -> 2705 GB/s); kernels
        # with outputs along the row keep the capped grid, which did as well or better
        waves = 0 if pure else 32
        if pipeline:  # blocks that stay resident and loop: as many as shared memory holds
            waves = max(1, min(profile.smem_per_sm // (stage_bytes + profile.smem_reserved_per_block),
                               profile.max_threads_per_sm // (tx * ty)))  # fmt: skip
        waves = knob("inner.waves", waves)
        # groups: blocks (clusters) a launch gets, each taking every so many row groups
        groups = max(1, min(-(-rows // ty), sm * waves // cluster if waves else 2**31 // cluster))
        workspaces: tuple = ()
        wave = 0
        if accumulate or (pipeline and cluster > 1):
            # enough blocks to fill the GPU; each adds a row of partials to sum later.
            # Note [One wave of partials]: clusters keeping column partials loop over their
            # row groups, so the grid is exactly the clusters the GPU holds at once: one
            # more than that starts a second wave that runs nearly alone. On the H100 (14
            # clusters of 16 resident at two blocks an SM), layer norm backward bf16
            # 1024x65536 ran 1314 GB/s in 33 clusters, 1625 in 14 and 1131 in 16; f32
            # 256x262144 (7 resident) 1569 in 33, 1769 in 7, 1307 in 8; clusters of 4 (62
            # resident) 1497 in 132, 1883 in 60, 1285 in 64 (sweep-groups_wave.json).
            # The profile's estimate plans; on a GPU the runtime asks the driver and plans
            # again with its count as the profile's measured_wave (the kernels stay the
            # same). Blocks without a cluster
            # keep four an SM, whole waves already. Pipelined clusters (Note [Row
            # pipeline]) loop over their row groups too: one wave of those as well
            if accumulate:
                groups = sm * 4 // cluster
            if cluster > 1:
                per_sm = max(1, variant.min_blocks) if accumulate else waves
                wave = groups = profile.measured_wave or profile.resident_clusters(cluster, per_sm)
            elif variant.finish:  # one resident wave of blocks, as the driver will count them
                wave = groups = profile.measured_wave or sm * max(1, variant.min_blocks)
            override = knob("inner.groups", None)
            groups = max(1, min(-(-rows // ty), override or groups))
            if override or groups < wave:
                wave = 0  # set by hand, or fewer row groups than a wave: nothing to fit
        if accumulate:
            from codegen.reduction_cuda import acc_type

            workspaces = tuple((groups * N, DataType.Double if acc_type(program.stores[k].dtype)
                                == "double" else DataType.Float) for k in accumulate)  # fmt: skip
        blocks = groups * cluster
        kernel = KernelLaunch(INNER_NAME, render_inner(program, variant), (blocks, 1, 1),
                              (tx, ty, 1), inner_arg_types(program, variant), tuple(args),
                              stage_bytes, cooperative=bool(variant.finish))  # fmt: skip
        return LaunchSpec(NAME, tuple(outputs), workspaces, (kernel,),
                          variant.describe() + describe_views(program.views, env), wave)

    if accumulate:
        raise SchedulerRefused("column partials ride on the inner kernel only")
    # outer: columns are the (single, collapsed) row dim, contiguous in the primary input
    from codegen.reduction_cuda import (
        FINISH_NAME,
        OUTER_NAME,
        OuterVariant,
        outer_arg_types,
        render_outer,
    )

    if not all(program.store_rowlevel) or program.stages != 1:
        raise SchedulerRefused("an outer reduction with element-level outputs or several stages")
    if len(i_sizes) != 1 or i_strides[primary][0] != 1:
        raise SchedulerRefused("the kept dims of an outer reduction are not contiguous")
    cols = i_sizes[0]
    # the vector width of the tensors that move along the columns (a per-row value read by
    # every column, as rms norm's rstd in a column sum, is one load a row)
    widest = max((ELEMENT_BYTES[t.dtype] for k, t in enumerate(program.accesses)
                  if i_strides[k][0] != 0), default=4)  # fmt: skip
    vec = max(1, 16 // widest)
    while vec > 1 and cols % vec:
        vec //= 2
    modes = []
    for k in range(len(tensors)):
        s = i_strides[k][0]
        # a vector of VEC columns is one aligned load when every row starts aligned
        dt = program.accesses[k].dtype if k < n_acc else program.stores[k - n_acc].dtype
        aligned = ptrs[k] % (vec * ELEMENT_BYTES[dt]) == 0 and ks[k] % vec == 0
        modes.append("bcast" if s == 0 else "vec" if s == 1 and aligned else "strided")
    tx = knob("outer.tx", min(32, max(1, _next_pow2(-(-cols // vec)))))
    col_blocks = -(-cols // (tx * vec))
    # blocks of 128 threads where the columns alone give four blocks an SM (sum over dim 0
    # bf16 256x262144: 2418 GB/s against 2216 with 256; f32 2631 and 2588), 256 otherwise:
    # with fewer blocks, 128 threads left the SMs short of loads in flight (bf16
    # 1024x65536: 1715 against 2349; benchmarks/results/sweep-long_bwd.json), and two sums
    # a column did better with 256 (layer norm backward bf16 256x262144: 1256 -> 1283,
    # sweep-reread_bwd.json)
    small_blocks = col_blocks >= 4 * sm and len(program.reductions) == 1
    ty = knob("outer.ty", max(1, min(32, (128 if small_blocks else 256) // tx)))
    # four vectors in flight a thread, and a split aiming at two blocks an SM: sum over
    # dim 0 bf16 262144x256 1629 -> 1996 GB/s, f32 2378 -> 2497 (sweep-explore)
    unroll = knob("outer.unroll", 4)
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
                           knob("load.hint", 3), cluster)  # fmt: skip
    base: list = []
    for k in range(len(tensors)):
        base.append(ArgRef("input", program.accesses[k].input_pos) if k < n_acc
                    else ArgRef("output", k - n_acc))  # fmt: skip
        base += [i_strides[k][0], ks[k]]
    base += [cols, N]
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
        # combining partials is latency-bound: up to 16 thread rows share a column's
        # partials, four or more each (Note [Outer finish]). On the H100 sum over dim 0 f32
        # 262144x256 (256 partials) 2577 GB/s with 16 rows, 2568 with 32, 2490 folding one
        # column a thread in blocks of 128; bf16 2277, 2260 and 2147; with 16 partials
        # (16384x4096) all within 0.5% (benchmarks/results/sweep-finish_rows.json)
        rows = knob("outer.finish_ty", max(1, min(16, split // 4)))
        finish = replace(variant, tx=knob("outer.finish_tx", 32), ty=rows, vec=1)
        kernels.append(KernelLaunch(FINISH_NAME, render_outer(program, finish, True),
                                    (-(-cols // finish.tx), 1, 1), (finish.tx, finish.ty, 1), types,
                                    tuple(base + work_args + scalars),
                                    dependent=dependent_launch(profile)))  # fmt: skip
    return LaunchSpec(NAME, tuple(outputs), tuple(workspaces), tuple(kernels),
                      variant.describe() + describe_views(program.views, env))
