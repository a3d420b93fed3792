"""Clusters of blocks sharing a row (Note [Cluster rows] in codegen/prelude/reduce.cuh): how
many, how their blocks exchange row partials (Note [Cluster exchange]) and whether a row
ends after the next one's first pass (Note [Deferred row end]); and how many blocks or
clusters a row kernel's launch gets (Note [One wave of partials])."""
from __future__ import annotations

from typing import Any

from codegen.cuda_ops import ELEMENT_BYTES
from codegen.kernel_ir import ReductionProgram
from codegen.reduction.cluster_exchange import one_exchange
from codegen.reduction.variants import InnerVariant

from ..tuning import knob
from .row_shape import RowShape


def choose_cluster(rs: RowShape) -> tuple[int, int, bool, bool, int | None]:
    """(blocks a row, most threads a block, weighted16, reread_row, the inner.cluster
    override): the cluster the row's size and its cached inputs ask for, adjusted for
    few long rows, rows with weights and 16-bit rows read twice."""
    p, vec, modes, nv, narrow, welford = rs.p, rs.vec, rs.modes, rs.nv, rs.narrow, rs.welford
    program, profile, accumulate, pure, k2 = p.program, p.profile, p.accumulate, p.pure, p.k2
    cached, weight_ins, N, rows, sm = rs.cached, rs.weight_ins, p.N, p.rows, p.sm
    cluster, most = _cluster_size(N, nv, rs.per_thread, narrow, len(cached), len(accumulate),
                                  program, pure, k2, profile)  # fmt: skip
    if (cluster == 1 and profile.supports_clusters and not pure and not accumulate
            and nv >= 4096 and 2 * rows <= sm):  # fmt: skip
        # so few long rows that a block each leaves half the SMs idle (batch norm of 64
        # channels: 64 blocks on 132 SMs): two blocks a row, in a cluster
        cluster = 2
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
    return cluster, most, weighted16, reread_row, forced_cluster


def plan_exchange(rs: RowShape, cluster: int, cached: tuple[int, ...], rows_in_smem: bool,
                  stage_bytes: int, room: int) -> tuple[bool, bool, bool, bool]:  # fmt: skip
    """(two exchanges a row, exchange through mbarriers, merged row reductions, deferred
    row end) of a row kept in `cached` (rs.cached: all of its inputs)."""
    program, accumulate, welford, row_inputs = rs.p.program, rs.p.accumulate, rs.welford, rs.cached
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
    return two_exchanges, exchange_async, merge, defer


# Note [Balanced row loops]: the capped grid (32 blocks an SM) gives softmax f32 2097152x32's
# 16384 row groups to 4224 blocks, 3712 of them taking 4 and 512 taking 3, so the last blocks
# to start run a whole row group longer than most. With inner.balance the grid is the fewest
# blocks taking the same number each (4096 of 4). A knob, off: it did not gain (H100,
# sweep-shortrows1.json: 2861 GB/s against 2887-2889; 2857-2879 with other row layouts).
def launch_groups(rs: RowShape, v: InnerVariant, stage_bytes: int,
                  tiles: bool = False) -> tuple[int, int]:  # fmt: skip
    """(groups, wave): the blocks (clusters) a launch gets, each taking every so many row
    groups, and the resident wave they were fitted to (0: none). `tiles`: a block a row
    group by default (Note [Small row blocks])."""
    p = rs.p
    profile, accumulate, rows, sm = p.profile, p.accumulate, p.rows, p.sm
    pipeline, cluster, tx, ty = v.pipeline, v.cluster, v.tx, v.ty
    # pure reductions: a block a row group (sum f32 262144x256 2610 -> 2705 GB/s); kernels
    # with outputs along the row keep the capped grid, which did as well or better. So do
    # row-level outputs of several stages: cross-entropy bf16 8192x50304 2913 -> 2992 GB/s
    # (benchmarks/sweeps/ce.json, H100)
    waves = 0 if all(p.program.store_rowlevel) or tiles else 32
    if pipeline:  # blocks that stay resident and loop: as many as shared memory holds
        waves = max(1, min(profile.smem_per_sm // (stage_bytes + profile.smem_reserved_per_block),
                           profile.max_threads_per_sm // (tx * ty)))  # fmt: skip
    waves = knob("inner.waves", waves)
    # groups: blocks (clusters) a launch gets, each taking every so many row groups; a thread
    # of several rows (Note [Rows a thread]) makes a block's step rows_a_thread groups
    row_groups = -(-rows // (ty * v.rows_a_thread))
    groups = max(1, min(row_groups, sm * waves // cluster if waves else 2**31 // cluster))
    if knob("inner.balance", False) and groups < row_groups:
        # Note [Balanced row loops]: as many blocks as give each the same number of row groups
        groups = -(-row_groups // -(-row_groups // groups))
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
            per_sm = max(1, v.min_blocks) if accumulate else waves
            wave = groups = profile.measured_wave or profile.resident_clusters(cluster, per_sm)
        elif v.finish:  # one resident wave of blocks, as the driver will count them
            wave = groups = profile.measured_wave or sm * max(1, v.min_blocks)
        override = knob("inner.groups", None)
        groups = max(1, min(row_groups, override or groups))
        if override or groups < wave:
            wave = 0  # set by hand, or fewer row groups than a wave: nothing to fit
    return groups, wave


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
