"""A row kernel's fixed facts, decided first: the vector width, how each tensor is read along
the row, the values a thread keeps, which inputs the row caches and which are weights every
row reads again; and how a row (or a cluster block's slice of it) splits over threads."""
from __future__ import annotations

from dataclasses import dataclass

from codegen.cuda_ops import ELEMENT_BYTES, RANDOM_STMTS

from ..tuning import knob
from .problem import Problem, next_pow2
from .row_resize import gathered_modes


@dataclass(frozen=True)
class RowShape:
    p: Problem
    vec: int
    modes: tuple[str, ...]  # per access then per store, along the row: 'vec', 'strided', 'row'
    nv: int  # vectors a row
    welford: bool
    per_thread: int  # vectors a thread keeps of a row (registers)
    cached: tuple[int, ...]  # the accesses a row would keep (its own loads, not weights)
    narrow: bool  # some tensor moving along the row has 16-bit elements
    weight_ins: tuple[int, ...]  # element-level inputs every row reads again (the weights)
    widest: int  # bytes of the widest element moving along the row

    # Note [Small row blocks]: rows of at most 128 elements (one 16-byte vector a thread at
    # most 32 threads a row) with outputs along them (softmax, layer and rms norm) take blocks
    # of 64 threads, one vector and two rows a thread (Note [Rows a thread]), a block a row
    # tile: as torch.compile's Triton kernels run them (XBLOCK 8 or 32, two warps, a program a
    # tile), where blocks of 512 threads looped over a capped grid and trailed them by 2-3%.
    # H200, one run (sweep-shortrows2.json, 2026-11-27 10:29 UTC, ceiling 4248 GB/s), this
    # layout against three runs of the old one, torch.compile in the same run: softmax f32
    # 2097152x32 4110 against 3960-3962 (compile 4074), layer norm 4080 against 3986-4007
    # (4047); f32 524288x128 4099 against 3936-3956 (4085) and 4076 against 3951-3978 (4113);
    # bf16 524288x128 3894 against 3778-3844 (3802) and 3889 against 3784-3788 (3931); layer
    # norm bf16 2097152x32 3898 against 3885-3891 (3951). The same small blocks looping over
    # the capped grid ran 3857 (so the gain is a block a tile); one row a thread (Triton's
    # XBLOCK 8 on the H100) 3297, four rows 4069. H100, one call (10:41 UTC, ceiling 2994):
    # this layout against the old one +1.1 to +2.9% on the eight short cases of the layouts
    # family (sweep-shortrows3.json: softmax f32 x32 2928 against 2840, layer norm bf16 x128
    # 2838 against 2758), and in benchmarks.run's three rounds at 0.987-0.999x torch.compile
    # (shortrows-run-nvidia-h100-80gb-hbm3.txt; before, 0.97-0.98x). Rows of 256 keep their
    # layout (64-thread blocks of four vectors a thread gained 2% there on the H200, once).
    def small_blocks(self, cluster: int) -> bool:
        """Note [Small row blocks]: whether rows of at most 128 elements with outputs along
        them take blocks of 64 threads, one vector and two rows a thread, a block a row tile."""
        p = self.p
        program = p.program
        return (cluster == 1 and not p.pure and not p.accumulate and not p.finish and not p.k2
                and p.resize is None and not all(program.store_rowlevel) and p.N <= 128
                and self.vec * self.widest == 16 and all(m != "strided" for m in self.modes)
                and not any(s.op in RANDOM_STMTS for s in program.stmts))  # fmt: skip

    def split_row(self, cluster: int, most: int, kept: int) -> tuple[int, int]:
        """(threads a row, vectors each) of a block's slice of the row; `kept`: values
        of a vector a thread keeps in registers"""
        nv, vec = self.nv, self.vec
        nv_block = -(-nv // cluster)  # vectors of a row in one block's slice
        widest = most if cluster > 1 else 512
        default = _row_threads(nv_block, vec, self.per_thread, widest)
        if self.small_blocks(cluster):
            default = next_pow2(nv_block)  # one vector a thread (Note [Small row blocks])
        elif cluster == 1 and nv_block <= 8 and not self.p.pure and not self.p.accumulate:
            # rows of at most 8 vectors: two vectors a thread. One thread a row of 32 bf16
            # values made each warp load 32 rows' 16-byte pieces 64 bytes apart; two threads
            # read 32 consecutive bytes each: softmax bf16 2097152x32 2144 -> 2835 GB/s on
            # the H100, layer norm 1952 -> 2850, f32 (four threads) 2590 -> 2901 and 2760 ->
            # 2920 (benchmarks/sweeps/layouts_perf.json, H100, 2026-11-26)
            default = next_pow2(-(-nv_block // 2))
        tx = knob("inner.tx", default)
        if cluster > 1:
            tx = max(tx, cluster)  # a row's threads hand out the cluster's partials, one each
        iters = -(-nv_block // tx)
        while self.p.accumulate and iters * vec * kept > 64 and tx < 512:
            # the cached row and the column partials share the registers: more threads a
            # row, fewer values each, so two blocks fit on an SM
            tx = min(512, 2 * tx)
            iters = -(-nv_block // tx)
        return tx, iters


def read_row_shape(p: Problem) -> RowShape:
    program, accumulate, ks, k0s, i_strides = p.program, p.accumulate, p.ks, p.k0s, p.i_strides
    n_acc = p.n_acc
    moving = [program.accesses[i].dtype for i in p.elem]
    moving += [s.dtype for k, s in enumerate(program.stores)
               if not program.store_rowlevel[k] and k not in accumulate]  # fmt: skip
    widest = max((ELEMENT_BYTES[d] for d in moving), default=4)
    vec = max(1, min(8, 16 // widest))
    while vec > 1 and p.k_sizes[-1] % vec:
        vec //= 2
    modes = []
    for k in range(len(p.tensors)):
        is_store = k >= n_acc
        if is_store and k - n_acc in accumulate:
            modes.append("vec")  # kept in registers: no memory access to shape
            continue
        rowlevel = program.store_rowlevel[k - n_acc] if is_store else ks[k] == 0
        dt = program.stores[k - n_acc].dtype if is_store else program.accesses[k].dtype
        if rowlevel:
            modes.append("row")
        elif ks[k] == 1 and p.ptrs[k] % (vec * ELEMENT_BYTES[dt]) == 0 and all(
            x % vec == 0 for x in i_strides[k]
        ) and (not p.k2 or k0s[k] % vec == 0):
            modes.append("vec")
        else:
            modes.append("strided")
    if vec > 1 and any(m == "strided" for m in modes):
        vec = 1
        modes = ["row" if m == "row" else "strided" for m in modes]
    windowed = set()
    if p.resize is not None:  # read element by element: by index, or in a window along K
        modes, windowed = gathered_modes(p, modes)
    nv = -(-p.N // vec)
    # about 32 values per thread and row (8 float4 or 4 bf16x8 vectors), at most 512
    # threads a row so a thread keeps up to 128 registers; pure sums, maxima and minima
    # keep two vectors (more threads a row, more loads in flight: sum f32 16384x4096
    # 2735 -> 2843 GB/s on the H100, bf16 2572 -> 2659; benchmarks/results/sweep-pure_small.json)
    welford = any(r.op == "welford" for r in program.reductions)
    # registers hold the loads that differ per row; weights shared by rows hit in L1/L2
    # (a single row's strides collapse to 0: all of its loads are its own)
    cached = tuple(sorted({s.operands[0] for s in program.stmts
                           if s.op == "load" and s.var in program.element_vars
                           and (any(i_strides[s.operands[0]]) or p.rows == 1)
                           and s.operands[0] not in windowed}))  # fmt: skip
    values = 2 * vec if p.pure and not welford else 32
    narrow = any(ELEMENT_BYTES[d] < 4 for d in moving)
    if (narrow and all(program.store_rowlevel) and program.stages > 1 and not welford
            and len(cached) == 1):  # fmt: skip
        # 16-bit rows whose outputs are all row-level (cross-entropy's loss and log-sum-exp)
        # keep 64 values a thread, the 32 registers 32 floats take: their passes cost a few
        # instructions a value, the row's reductions and exchanges a few hundred a thread, so
        # fewer threads a row ran faster (in clusters of 4 instead of 8): cross-entropy bf16
        # 8192x50304 2420 -> 2913 GB/s on the H100 (benchmarks/sweeps/ce.json)
        values = 64
    if any(s.op in RANDOM_STMTS for s in program.stmts) and len(cached) > 1:
        # Note [Random rows in registers]: the numbers a row draws are kept for its later
        # passes beside the inputs it caches: half the values a thread
        values = 16
    per_thread = max(1, knob("inner.values", values) // vec)
    weight_ins = tuple(i for i in range(n_acc) if i not in cached and modes[i] != "row"
                       and not any(i_strides[i]) and i not in windowed)  # fmt: skip
    return RowShape(p, vec, tuple(modes), nv, welford, per_thread, cached, narrow, weight_ins,
                    widest)


# Note [Random rows in registers]: dropout + residual + layer norm (bf16 [16384, 4096]) keeps
# x and h of a row (32 values each a thread, 16 registers each), the 32 uniforms it drew
# (float, 32 registers: Philox runs once a row, not once a pass) and the residual: ptxas gave
# it 105 registers, so one block of 512 threads an SM (16 warps), where layer norm alone
# keeps one input in 58 registers and runs two blocks. It read and wrote each byte once and
# still ran at 69% of the copy ceiling on the H100 (2077 GB/s): while a block reduces, draws
# or stores, no other block's loads are in flight. With 16 values a thread (256x2 threads,
# two vectors each) the same kernel takes 64 registers and two blocks share an SM: 2370 GB/s
# against 2080 with 32 values in one H100 run (12:04 UTC, copy ceiling 2966), 80% of it.
# That kernel was bound by its instructions, not memory: Nsight Compute (H100) saw the issue
# slots 68% busy, the ALU pipe 68%, 50% occupancy and 67 instructions an element, DRAM at
# 67%; the same kernel with a hash of the index for Philox ran at 96% of the ceiling and
# with one Philox round instead of ten at 87%. Philox itself (some 10 instructions an
# element, a call giving 4 numbers) stays, as the numbers must; what went is around it: the
# lanes draw by place (Note [Philox lanes], on by default: no 64-bit index, group compare
# or word pick an element), the mask is stored by the pass that draws it (Note [Stores in
# the first pass]) as bytes of a word (Note [Mask words]), and uniforms in [0, 1) skip the
# affine map. 40 registers now: three blocks of 512 threads an SM (row_plan._min_blocks).
# H100, same run (15:10 UTC, ceiling 3000): 2847 GB/s (95%) against 2370 for the kernel
# before; 2820 without mask words, 2498 without lanes (64 registers, two blocks).
def _row_threads(nv: int, vec: int, per_thread: int, most: int) -> int:
    """Threads a row of `nv` vectors gets in one block."""
    if (vec >= 8 or per_thread >= 4) and nv <= 128:
        # short rows: a few threads a row with four loads each in flight; one load a
        # thread leaves 16-bit rows latency-bound. Pure f32 sums do best with two (one
        # warp a row); f32 rows that keep more also take four: softmax, layer and rms
        # norm f32 262144x256 +1% on the H100 (2842 -> 2870 GB/s, 2856 -> 2883, 2865 ->
        # 2884; benchmarks/results/sweep-short_rows_tx.json)
        return next_pow2(-(-nv // 4))
    if nv <= 32:
        return next_pow2(nv)
    return min(most, max(32, (-(-nv // per_thread) + 31) // 32 * 32))
