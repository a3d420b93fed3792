"""How a row kernel's inputs travel: kept in shared memory instead of registers (Note [Rows
in shared memory]), copied ahead through shared memory (Note [Row pipeline]), weights
loaded once into registers or shared memory (Note [Weights loaded once]) and kept in L2
(Note [Weights kept in L2])."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from codegen.cuda_ops import ELEMENT_BYTES
from codegen.reduction.common import acc_type

from ..tuning import knob
from .row_shape import RowShape


def chunks16(rs: RowShape, inputs: Sequence[int], iters: int) -> bool:
    """Whether cp.async can copy these inputs: 16-byte vectors, sm_80 on."""
    program, vec, modes = rs.p.program, rs.vec, rs.modes
    return iters > 0 and rs.p.profile.arch >= 80 and all(
        modes[i] == "vec" and vec * ELEMENT_BYTES[program.accesses[i].dtype] == 16
        for i in inputs)  # fmt: skip


def smem_room(rs: RowShape, tx: int, ty: int) -> int:
    """What stages may take of a block's shared memory beside the partials' tables."""
    program, profile, vec = rs.p.program, rs.p.profile, rs.vec
    tables = {acc_type(program.stores[k].dtype) for k in rs.p.accumulate}  # one a type
    return profile.smem_per_block_optin - 1024 - sum(
        ty * tx * vec * (8 if t == "double" else 4) for t in tables)  # fmt: skip


def stages_bytes(inputs: Sequence[int], tx: int, ty: int, iters: int) -> int:
    return 2 * len(inputs) * ty * iters * tx * 16  # two stages of 16-byte chunks


def smem_rows_first(rs: RowShape, cluster: int) -> bool:
    """Whether the row goes to shared memory before registers are tried."""
    accumulate, narrow, nv, weight_ins = rs.p.accumulate, rs.narrow, rs.nv, rs.weight_ins
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
    return smem_first


def stage_rows(rs: RowShape, cluster: int, forced_cluster: int | None, cached: tuple[int, ...],
               smem_first: bool) -> tuple[int, int, int, tuple[int, ...]] | None:  # fmt: skip
    """(cluster, threads a row, vectors each, the inputs staged) of a row kept in shared
    memory, where registers do not keep it (`cached` empty); None: it is not."""
    profile, accumulate, vec, row_inputs = rs.p.profile, rs.p.accumulate, rs.vec, rs.cached
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
            c_tx, c_iters = rs.split_row(c, 512, len(accumulate))
            c_ty = max(1, knob("inner.threads", 256) // c_tx)
            fits = stages_bytes(staged, c_tx, c_ty, c_iters) <= smem_room(rs, c_tx, c_ty)
            if fits and chunks16(rs, staged, c_iters) and c_iters * vec * len(accumulate) <= 64:
                return c, c_tx, c_iters, staged
    return None


def plan_pipeline(rs: RowShape, cluster: int, cached: tuple[int, ...], iters: int,
                  rows_in_smem: bool, tx: int, ty: int) -> tuple[bool, int, int]:  # fmt: skip
    """(pipelined, its stages' bytes, the shared memory stages may take)."""
    p, narrow, nv, weight_ins = rs.p, rs.narrow, rs.nv, rs.weight_ins
    accumulate, pure, k2 = p.accumulate, p.pure, p.k2
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
    can_pipeline = bool(cached) and chunks16(rs, cached, iters)
    pipeline = can_pipeline and (rows_in_smem or bool(knob("inner.pipeline", wide_rows or (
        bool(accumulate) and narrow and (cluster > 1 or nv >= 128)))))  # fmt: skip
    room = smem_room(rs, tx, ty)
    stage_bytes = stages_bytes(cached, tx, ty, iters) if pipeline else 0
    if stage_bytes > room:
        pipeline, stage_bytes = False, 0
    assert pipeline or not rows_in_smem, "a row kept in shared memory is pipelined"
    return pipeline, stage_bytes, room


def weight_hint(profile: Any) -> int:
    """The cache hint of inputs every row reads again."""
    # Note [Weights kept in L2]: inputs every row reads again (layer norm's weight and
    # bias) load with an L2 evict-last policy (createpolicy, sm_80 on), so the rows
    # streaming past do not push them out of L2 between the rows that read them. On the
    # H100 layer norm f32 256x262144 (2 MiB of weights, read again by each of the 16
    # clusters for each of its rows) 2272 -> 2574 GB/s; no case of the 43 whose kernels
    # load weights lost more than 0.5% (benchmarks/results/sweep-weights_l2.json). The
    # same marks left by torch.compile's kernels (Triton's evict_last on weights) were
    # why that case ran 13% faster once torch.compile had run it in the process
    # (benchmarks/order_effect.py)
    return knob("load.weights", 4 if profile.arch >= 80 else 0)


def plan_weights(rs: RowShape, cluster: int, cached: tuple[int, ...], iters: int, tx: int,
                 ty: int, rows_in_smem: bool, pipeline: bool, two_exchanges: bool, defer: bool,
                 weighted16: bool, room: int) -> tuple[str, int]:  # fmt: skip
    """(where weights load once: "registers", "shared" memory, or "" every row; the shared
    memory they take there)."""
    program, accumulate, vec, narrow = rs.p.program, rs.p.accumulate, rs.vec, rs.narrow
    weight_ins = rs.weight_ins
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
    # deferred forward rows with weights (rms norm's) load them once too: rms norm bf16
    # 256x262144 2700 -> 2787 GB/s on the H100 (benchmarks/results/sweep-defer_more.json)
    hoist = knob("inner.hoist", (bool(accumulate) and bool(cached) and (pipeline or not narrow)
                                 and roomy)
                 or ((two_exchanges or defer) and not accumulate and bool(weight_ins)))  # fmt: skip
    # Note [Weights loaded once]: or in shared memory, where the row is cached, not
    # pipelined, and the weights' 16-byte chunks fit; the copies land while the first
    # row loads and reduces. Forward rows split over clusters of up to 8 gained (on the
    # H100 layer norm f32 1024x65536 2522 -> 2731 GB/s, bf16 2501 -> 2624, rms norm bf16
    # 2708 -> 2785); rows of one block -7% to +2% (rms norm f32 4096x16384 2915 -> 2698),
    # clusters of 16 -8%, column partials up to -17% (sweep-weights_smem2.json). Shared
    # memory, not a register bound, then sets the blocks an SM
    weight_bytes = len(weight_ins) * ty * iters * tx * 16
    hoist_smem = bool(knob("inner.hoist_smem", (1 < cluster <= 8 or weighted16) and not accumulate)) and bool(
        weight_ins) and bool(cached) and not pipeline and chunks16(rs, weight_ins, iters) and (
        weight_bytes <= room)  # fmt: skip
    return ("shared" if hoist_smem else "registers" if hoist else ""), weight_bytes
