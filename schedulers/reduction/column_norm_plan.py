"""Normalizations along a strided reduced dim (softmax over a middle dim).

Note [Column norms]: a fusion with element-level outputs or several stages whose reduced
dim is strided and whose innermost kept dim is contiguous (softmax of [B, R, I] over R)
would read its rows with strided loads once a stage in the row kernel. Here, as in the outer
kernel, threads own VEC columns (the kept elements, Note [Middle reductions]), TY thread
rows and a cluster of CLUSTER blocks share the reduced dim, and each thread loads its RT
rows of every input read along it into registers once, all loads in flight together. Each
stage's reductions fold over the thread rows (Note [Row fold]) and then over the cluster's
blocks through distributed shared memory, every block folding the partials in rank order
(the same bits in all of them; one thread a column reads them, Note [Column exchange]);
softmax's max and sum share one exchange (Note [Online column softmax]); 32-bit rows keep
a resident wave of clusters loading each next tile ahead (Note [Column tiles in flight]),
16-bit ones push their partials through mbarriers. The column-level
statements follow, and the last pass writes the outputs from registers, a row at a time.
The input is read once and the output written once. Blocks of 32 thread rows (else 64) in
the smallest cluster whose threads keep at most `colnorm.values` registers of values is taken; a
reduced dim too long for the widest cluster is left to the segmenter (a reduction and a
pointwise kernel).
"""
from __future__ import annotations

import math

from codegen.cuda_ops import ELEMENT_BYTES, RANDOM_STMTS
from codegen.kernel_ir import has_index_statements
from codegen.reduction.column_norm import (
    COLUMN_NORM_NAME,
    column_norm_arg_types,
    render_column_norm,
)
from codegen.reduction.common import softmax_reductions
from codegen.reduction.variants import ColumnNormVariant

from ..base import ArgRef, KernelLaunch, LaunchSpec
from ..layout import index_type
from ..tuning import knob
from ..views import describe_views
from .lowering import NAME
from .problem import Problem


def column_norm(p: Problem) -> LaunchSpec | str:
    """The plan, or why this normalization is not one column kernel."""
    program, profile = p.program, p.profile
    if p.k2 or p.accumulate or p.finish:
        return "an outer normalization over two reduced runs or with column partials"
    if any(st.alias_input is not None for st in program.stores):
        return "an outer normalization written in place"
    if any(st.op in RANDOM_STMTS for st in program.stmts):
        return "an outer normalization drawing random numbers"
    if has_index_statements(program):
        # the column kernel renders no window guards, positions or checked indices
        return "an outer normalization reading pads, cats or gathers"
    if p.i_strides[p.primary][-1] != 1:
        return "an outer normalization whose kept dims are not contiguous"
    cached = tuple(i for i in p.elem)
    moving = [program.accesses[i].dtype for i in cached]
    moving += [s.dtype for k, s in enumerate(program.stores) if not program.store_rowlevel[k]]
    widest = max(ELEMENT_BYTES[d] for d in moving)
    n_inner = p.i_sizes[-1]
    vec = knob("colnorm.vec", max(1, 16 // widest))
    while vec > 1 and n_inner % vec:
        vec //= 2
    modes = []
    for k, s in enumerate(p.i_strides):
        dt = program.accesses[k].dtype if k < p.n_acc else program.stores[k - p.n_acc].dtype
        aligned = p.ptrs[k] % (vec * ELEMENT_BYTES[dt]) == 0 and p.ks[k] % vec == 0 and all(
            x % vec == 0 for x in s[:-1])  # fmt: skip
        modes.append("bcast" if s[-1] == 0 else "vec" if s[-1] == 1 and aligned else "strided")
    narrow = any(ELEMENT_BYTES[program.accesses[i].dtype] < 4 for i in cached)
    # Note [Column rows in smem] (codegen/reduction/column_norm.py): 16-bit rows are copied to
    # shared memory by cp.async, one tile a block, in blocks of 64-byte rows asking for four
    # an SM. bf16 softmax [32, 4096, 512] over dim 1 on the H100 (benchmarks/results/
    # sweep-layouts6.json, 2026-11-27, ceiling 2994 GB/s): 1984 GB/s (4x32 threads, 66
    # registers; 1978 asking for eight) against 1905-1914 for the rows in registers (8x32
    # threads, three blocks an SM); 128-byte rows in smem 1891, clusters looping over tiles
    # in smem 1505-1562. f32 kept its rows in registers: in smem 2413-2435 against 2652-2658.
    # The exps kept (colnorm.reuse_exp) take registers: those keep the rows there too
    reuse_exp = bool(knob("colnorm.reuse_exp", False))
    smem = bool(knob("colnorm.smem", narrow and not reuse_exp)) and profile.arch >= 80 and all(
        modes[i] == "vec" and vec * ELEMENT_BYTES[program.accesses[i].dtype] == 16
        for i in cached)  # cp.async: sm_80 on  # fmt: skip
    # a row of the tile 128 bytes wide (whole lines; 64 for rows in smem), at most a warp of
    # threads, fewer where the kept run is shorter
    tx = knob("colnorm.tx", max(1, min((64 if smem else 128) // (vec * widest), 32,
                                       _pow2_at_least(-(-n_inner // vec)))))
    # registers of kept values a thread (16-bit values two to a register): 8 rows of 16
    # bytes. bf16 softmax [32, 4096, 512] over dim 1 kept 4 rows a thread in blocks of 512
    # at 1087 GB/s on the H100, 8 rows in blocks of 256 at 1630 (f32 2280 with 8 rows;
    # benchmarks/sweeps/layouts_perf.json, H100, 2026-11-26)
    budget = knob("colnorm.values", 32)
    words = sum(ELEMENT_BYTES[program.accesses[i].dtype] for i in cached) * vec / 4
    choice = None
    # blocks of 256 threads first (two or three an SM beside the cluster's barriers), then 512
    for ty in (32, 64):
        widths = (1, 2, 4, 8, 16) if profile.supports_clusters else (1,)
        for cluster in [c for c in widths if c <= profile.max_cluster]:
            rows = -(-p.N // (ty * cluster))
            if choice is None and tx * ty <= 1024 and rows * words <= budget:
                choice = (cluster, ty, rows)
    forced = knob("colnorm.cluster", None), knob("colnorm.ty", None)
    if forced != (None, None):
        cluster = forced[0] or (choice[0] if choice else profile.max_cluster)
        ty = forced[1] or (choice[1] if choice else 32)
        choice = (cluster, ty, -(-p.N // (ty * cluster)))
    if choice is None:
        widest = profile.max_cluster if profile.supports_clusters else 1
        return (f"an outer normalization of {p.N} rows keeps more than {budget} values a "
                f"thread in clusters of {widest}")  # fmt: skip
    cluster, ty, rows = choice
    # Note [Whole column tiles] (codegen/reduction/column_norm.py): a softmax over a reduced
    # dim long enough for clusters of 8 or more takes tiles of 128-byte rows (64 columns of
    # 16-bit values, 32 of 32-bit ones) in blocks of 256 threads holding 16 rows a thread in
    # shared memory (64 KB), copied in four groups, and as many blocks a cluster as the
    # reduced dim needs (8 for softmax [32, 4096, 512] over dim 1), pushing their partials
    # (Note [Column exchange]), the softmax lean (Note [Lean column softmax]). H100, kernels
    # compiled on its machine, five interleaved rounds (benchmarks/results/probe-lean-
    # nvidia-h100-80gb-hbm3.txt, round 4, 2026-11-27 13:20, ceiling 3005 GB/s): bf16 2584
    # GB/s (86%) against 2285 for 32-column tiles in clusters of 4 and 2012 for those before
    # this Note's lean math and pushes (the old default); f32 2774 (92%) against 2656 for its
    # clusters of 16 looping over tiles in registers (the old default) and 2691 with the end
    # barrier. A copy of the same tiles (load, store, no math) ran 2637 and 2756: bf16 is
    # within 2% of what one 64 KB tile a block moves. Kernels compiled on a CPU machine by a
    # newer NVRTC gave the old f32 kernel 146 registers instead of 128 (sweep-whole_tiles3.json).
    # Half the tile (8 rows a thread, clusters of 16, 32 KB) and more blocks an SM lost on the
    # H100 (2026-11-27 21:28, sweep-mid_softmax_deep_rows.json): 2289-2491 GB/s at 3 and 4
    # blocks, 1723-1831 at 6, against 2568-2584 for this default in the same run. Nor did the
    # other knobs of this tile (2026-11-28 00:11, sweep-mid_softmax_deep_knobs.json, default
    # 2571-2590): 2, 8 or 16 chunks 2589 / 2551 / 2472, cache hints 2565-2590, fold bytes
    # 2513-2561, 2 or 4 blocks an SM asked 2570 / 2574, the end barrier 2446, the softmax not
    # lean 2168, refilled 1579
    staged_ok = profile.arch >= 80 and all(
        modes[i] == "vec" and vec * ELEMENT_BYTES[program.accesses[i].dtype] == 16 for i in cached)
    deep = (bool(knob("colnorm.deep", True)) and bool(knob("colnorm.smem", True))
            and forced == (None, None) and cluster >= 8 and staged_ok and not reuse_exp
            and softmax_reductions(program) is not None)  # fmt: skip
    if deep:
        deep_tx = knob("colnorm.tx", max(1, min(128 // (vec * widest), _pow2_at_least(-(-n_inner // vec)))))
        deep_ty = max(1, 256 // deep_tx)
        deep_cluster = _pow2_at_least(-(-p.N // (deep_ty * knob("colnorm.deep_rows", 16))))
        deep = deep_cluster <= profile.max_cluster
        if deep:
            tx, ty, cluster, smem = deep_tx, deep_ty, deep_cluster, True
            rows = -(-p.N // (ty * cluster))
    # blocks of 512 threads ask for two an SM, so that one block's loads overlap the other's
    # exchanges and stores (64 registers a thread; softmax bf16 took 81 and held one); 16-bit
    # rows in blocks of 256 for three: bf16 softmax [32, 4096, 512] over dim 1 took 93
    # registers and two blocks an SM, 1740 GB/s on the H100, 80 (4 bytes spilled) and three
    # 1906 (torch.compile 1416; four of vec 4 at 64 registers 1850, two of 512 threads at
    # vec 4 1635, 8-byte vectors 1235; benchmarks/sweeps/layouts3.json, 2026-11-27)
    min_blocks = knob("colnorm.min_blocks", 3 if deep else 4 if smem else 2 if tx * ty >= 512 else
                      3 if narrow and tx * ty == 256 else 0)  # fmt: skip
    # Note [Column tiles in flight] (codegen/reduction/column_norm.py): 32-bit rows loop
    # over tiles, the next one's rows loaded while the current one ends (softmax f32 [32,
    # 4096, 512] over dim 1: 2267 -> 2643 GB/s on the H100); 16-bit ones took 190 registers
    # that way, one block an SM (bf16 1633 -> 783), and push their partials through
    # mbarriers instead of a cluster barrier (Note [Column exchange]; 1633 -> 1757; f32
    # 2489). benchmarks/sweeps/layouts_perf3.json, 2026-11-26
    persistent = bool(knob("colnorm.persistent", not narrow and not deep)) and cluster > 1
    # Note [Whole column tiles] (codegen/reduction/column_norm.py): rows in smem, one buffer
    refill = bool(knob("colnorm.refill", False)) and smem and (
        len(cached) * rows * ty * tx * 16 <= 160 * 1024)
    persistent = persistent and not refill
    # rows in smem: dynamic shared memory, two buffers where clusters loop over tiles (the
    # exchange's static arrays take up to about 18 KB more)
    staged = len(cached) * rows * ty * tx * 16 * (2 if persistent else 1)
    smem = smem and staged <= 160 * 1024
    push = bool(knob("colnorm.push", narrow or deep)) and cluster > 1
    per_sm = knob("colnorm.blocks_per_sm", max(1, min_blocks))
    chunks = max(0, min(int(knob("colnorm.chunks", 4 if deep else 0)), rows)) if (
        smem and not persistent) else 0  # fmt: skip
    # Note [Lean column softmax]: the chunked pass, or one exchange of a cluster's (max, sum)
    online = bool(knob("colnorm.online", True))
    # Note [Row fold]: rows in smem, one tile a block: the fold's shared memory halved (more
    # rounds of it) until the blocks asked for fit an SM. bf16 softmax [32, 4096, 512] over
    # dim 1 in 64-column deep tiles (clusters of 8) held two blocks an SM with its 9 KB
    fold_bytes = 16384
    while smem and not persistent and fold_bytes > 2048 and min_blocks * (
            staged + _static_smem(program, tx, ty, vec, cluster, fold_bytes, 2 if refill else 1)
            + profile.smem_reserved_per_block) > profile.smem_per_sm:  # fmt: skip
        fold_bytes //= 2
    fold_bytes = int(knob("colnorm.fold_bytes", fold_bytes))
    lean = bool(knob("colnorm.lean", narrow or deep)) and softmax_reductions(program) is not None and (
        chunks > 0 or (online and cluster > 1 and smem))  # fmt: skip
    variant = ColumnNormVariant(len(p.i_sizes), tx, ty, vec, rows, cluster,
                                index_type(p.loop, p.strides), tuple(modes), cached,
                                knob("load.hint", 0), knob("store.hint", 0),
                                min_blocks, online,
                                persistent, push, reuse_exp and not smem, smem, chunks,
                                refill, lean, end_sync=bool(knob("colnorm.end_sync", not (push or persistent or refill))),
                                fold_bytes=fold_bytes)  # fmt: skip
    args: list = []
    for k in range(len(p.tensors)):
        args.append(ArgRef("input", program.accesses[k].input_pos) if k < p.n_acc
                    else ArgRef("output", k - p.n_acc))  # fmt: skip
        args += [*p.i_strides[k], p.ks[k]]
    cols = math.prod(p.i_sizes)
    args += [cols, p.N, *p.i_sizes[1:], *p.scalars]
    tiles = groups = -(-cols // (tx * vec))
    wave = 0
    if persistent:  # one resident wave of clusters, each taking every so many tiles
        wave = profile.measured_wave or profile.resident_clusters(cluster, per_sm)
        groups = min(tiles, wave)
        wave = wave if groups == wave and not profile.measured_wave else 0
    elif refill:  # one resident wave of blocks (clusters), each taking every so many tiles,
        # as many an SM as its shared memory holds: a block past the wave would wait for a
        # whole loop of another to end
        block = staged + _static_smem(program, tx, ty, vec, cluster) + profile.smem_reserved_per_block
        per_sm = max(1, min(per_sm, profile.smem_per_sm // block))
        groups = min(tiles, profile.resident_clusters(cluster, per_sm) if cluster > 1
                     else profile.sm_count * per_sm)  # fmt: skip
    kernel = KernelLaunch(COLUMN_NORM_NAME, render_column_norm(program, variant),
                          (groups * cluster, 1, 1), (tx, ty, 1),
                          column_norm_arg_types(program, variant), tuple(args),
                          staged if smem else 0)  # fmt: skip
    return LaunchSpec(NAME, tuple(p.outputs), (), (kernel,),
                      variant.describe() + describe_views(program.views, p.env), wave)


def _static_smem(program, tx: int, ty: int, vec: int, cluster: int, fold_bytes: int = 16384,
                 slots: int = 2) -> int:  # fmt: skip
    """About the bytes of static shared memory a column norm block declares: the row fold's
    (Note [Row fold]) for its widest accumulator within `fold_bytes`, and each exchanged
    value's partials, totals and `slots` slots of every peer's (Note [Column exchange])."""
    size = max([24 if r.op == "welford" else 8 if ELEMENT_BYTES.get(r.dtype, 4) == 8 else 4
                for r in program.reductions] or [4])  # fmt: skip
    fold_columns = vec
    while fold_columns > 1 and (tx * ty * fold_columns + max(tx * ty, tx * fold_columns)) * size > fold_bytes:
        fold_columns //= 2
    fold = (tx * ty * fold_columns + max(tx * ty, tx * fold_columns)) * size
    exchanged = len(program.reductions) * (2 + slots * cluster) * tx * vec * size if cluster > 1 else 0
    return fold + exchanged + 256


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
