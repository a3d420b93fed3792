"""Normalizations along a strided reduced dim, as softmax over a middle dim (Note [Column
norms] in schedulers/reduction/column_norm_plan.py): threads own VEC columns, TY thread rows
and CLUSTER blocks share the reduced dim, and every thread keeps its RT rows of each input in
registers; each stage's reductions fold over the thread rows (Note [Row fold]) and then over
the cluster's blocks through distributed shared memory, so the data is read once and the
outputs written once."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from fusion_cache.frontend.dtypes import DataType

from ..cuda_ops import ELEMENT_BYTES, MEMORY_TYPE, REGISTER_TYPE, convert
from ..kernel_ir import ReductionProgram, needed
from ..prelude import prelude_source
from ..stmt_cuda import render_stmt, scalar_arg_types, stored_form
from .common import (
    accumulate_stmt,
    accumulator_type,
    ident,
    identity_of,
    kernel_params,
    op_functor,
    render_row_division,
    row_divisions,
    row_level_stmts,
    softmax_reductions,
)
from .outer_kernel import _fold_columns, _fold_smem
from .variants import ColumnNormVariant, OuterVariant

COLUMN_NORM_NAME = "fc_column_norm"

# Note [Whole column tiles]: where a tile of 16-byte columns over the whole reduced dim fits
# one block's shared memory (softmax of [B, 4096, I] over dim 1: 4096 rows of 16 bytes, 64
# KB), the block needs no cluster: no exchange, no cluster barrier, and a block of any SM
# can take any tile (clusters of 16 fit 7 a wave, 112 of the 132 SMs of an H100). Rows in
# smem (Note [Column rows in smem]) with colnorm.cluster 1; two knobs keep its loads in
# flight. colnorm.chunks: the thread's copies are committed in groups, and softmax's max
# and sum are folded in one pass as each group lands (the thread's max raised and its sum
# rescaled once a group), instead of a pass for each after every copy landed; the block
# then folds the maxima and the rescaled sums. colnorm.refill: a resident wave of blocks
# loops over tiles with one buffer; each slot is refilled with the next tile's row as soon
# as the output pass has written its row, so the next tile's 64 KB are loading while this
# one's outputs go out, and the first pass of the next tile waits group by group again.
# Every slot is the thread's own (it copies and reads back only those), so waiting for
# its own copies is all the synchronisation the rows need. Both work in clusters too: after
# the chunked pass the blocks' (max, sum) pairs go through one exchange (Note [Online
# column softmax]); refilled clusters push them through mbarriers (Note [Column exchange]).
#
# Measured, softmax [32, 4096, 512] over dim 1: one block a tile of the whole reduced dim
# lost 2-3x (H100, sweep-whole_tiles.json, 2026-11-27 10:14, ceiling 3011 GB/s: bf16
# 595-930 GB/s, f32 411-1220, the default 1882-1894 and 2030-2039), whatever its pipeline:
# 4096 rows of 64 KB leave 16 bytes a row (32 with one block an SM), so each load and store
# is half a sector, scattered over 4096 rows; the width of a row, not the bytes in flight,
# bound it. Clusters of 4 and 8 with 64- and 128-byte rows won over clusters of 16
# (sweep-whole_tiles2.json on an H200, sweep-whole_tiles3.json on an H100), and the
# refilled wave lost everywhere (H200: bf16 1191-1765 against 1996-2013, f32 1712-2574
# against 2037-2049; not profiled). Those three runs used kernels compiled on a CPU machine
# by a newer NVRTC, which gave the old f32 default 146 registers instead of 128 (one block
# an SM instead of two). With the lean softmax below, pushed partials and no end barrier,
# 128-byte rows (64 bf16 columns, clusters of 8) won for both dtypes; the refilled wave
# and clusters looping over 8-row tiles with two buffers lost again (bf16 2009 and
# 2003-2098 against 2278 for 32-column tiles, probe-lean-*.txt round 3). colnorm.deep in
# schedulers/reduction/column_norm_plan.py has the figures. What is left for bf16 is the
# tile's own: a block copying one 64 KB tile in and out, no math, moved 2637 GB/s (88% of
# the H100's copy), the softmax 2584, and loading the next tile while storing this one
# (refill, the looping clusters) lost more to its barriers and smaller tiles than it hid.
#
# Note [Lean column softmax]: the deep tiles of bf16 softmax over dim 1 of [32, 4096, 512]
# ran 2012 GB/s where a copy of the same tiles (a probe kernel, not kept: load the tile,
# store it, no math) ran 2104 with their 64-byte rows and 2422 with 128-byte ones, and the
# f32 tiles of twice the bytes a value ran 2614 (copy 2733): for 16-bit rows the
# instructions, about 37 a value (4728 a thread of NVRTC 13.5's SASS), held the time more
# than the memory. So (colnorm.lean; on for 16-bit rows and deep tiles) the softmax is
# written in fewer: a bf16 column's max two columns an instruction (max.NaN.bf16x2 on the
# words read from shared memory: exact), the sum's terms and the chunks' rescales as
# flushed exp2 of one fma (Note [Flushed softmax terms]: the column's sum holds the max's
# own 1, so a term or a rescaled sum under 2^-126 cannot change it), and the output
# exp(x - M) / S as one fc_exp2_biased of (x - M)*log2(e) + 64 - log2(S) (lg2.approx of S
# once a column: no division and no subnormal fix-ups around MUFU.EX2; subnormal outputs
# stay). 16-bit outputs take x*log2(e) + c, M folded into c: its rounding, under |M| *
# 2^-23 of the exponent, is far below their half ulp. Deep tiles of 128-byte rows: bf16 2632
# instructions a thread instead of 4640, f32 1688 instead of 2648. H100, kernels compiled on its machine, interleaved rounds (benchmarks/results/
# probe-lean-nvidia-h100-80gb-hbm3.txt): 32-column deep tiles 2012 -> 2193 GB/s (round
# 2), M folded 2201; f32 deep tiles 2614 -> 2652; round 4 (final plans): bf16 2584, 2568
# without M folded, f32 2774 against 2745. The one-exchange cluster path (Note [Online
# column softmax]) with rows in smem takes the same lines: bf16 clusters of 16 2128 ->
# 2290 (87 registers instead of 60, four blocks an SM still).


def column_norm_arg_types(program: ReductionProgram, v: ColumnNormVariant) -> tuple[str, ...]:
    idx = "i32" if v.index_type == "int" else "i64"
    per = ("ptr",) + (idx,) * (v.i_rank + 1)
    count = len(program.accesses) + len(program.stores)
    return per * count + (idx,) * (v.i_rank + 1) + scalar_arg_types(program)


def render_column_norm(program: ReductionProgram, v: ColumnNormVariant) -> str:
    return _ColumnNorm(program, v).render()


class _ColumnNorm:
    def __init__(self, program: ReductionProgram, v: ColumnNormVariant) -> None:
        self.program, self.v = program, v
        self.dtypes = {s.var: s.dtype for s in program.stmts}
        self.n_acc = len(program.accesses)
        self.inner = f"_s{v.i_rank - 1}"
        self.L: list[str] = []
        self.kept: list[str] = []  # column-level values kept a column: var -> var_c[FC_VEC]
        self.divisions = row_divisions(program)
        self.sites = 0  # cluster exchanges so far (each its own pair of mbarriers)
        self.reused: dict[str, str] = {}  # var -> its value kept from an earlier pass
        # Note [Lean column softmax]: var -> its line, "" for the ones another line reads through
        self.lean_lines: dict[str, str] = {}
        self.pushed = (v.persistent or v.push or v.refill) and v.cluster > 1  # Note [Column exchange]
        self.smem_declared = False  # Note [Column rows in smem]: fc_rows declared
        # the fold's shared-memory shape, as an outer kernel of the same threads has it
        self.fold = OuterVariant(v.tx, v.ty, v.vec, 1, v.index_type, (), ())
        # Note [Whole column tiles]: the groups (first, last + 1 row) a thread's copies land in
        per = -(-v.rows // max(1, v.chunks)) if v.chunks and not v.persistent else v.rows
        self.groups = [(lo, min(v.rows, lo + per)) for lo in range(0, v.rows, per)]

    def render(self) -> str:
        program, v, L = self.program, self.v, self.L
        L += [prelude_source("core", "math", "reduce"), f"typedef {v.index_type} idx_t;",
              f"#define FC_VEC {v.vec}", f"#define FC_TX {v.tx}", f"#define FC_TY {v.ty}",
              f"#define FC_RT {v.rows}", f"#define FC_CLUSTER {v.cluster}"]  # fmt: skip
        extra = ["idx_t cols", "idx_t N"] + [f"idx_t n{d}" for d in range(1, v.i_rank)]
        dims = " __cluster_dims__(FC_CLUSTER, 1, 1)" if v.cluster > 1 else ""
        bounds = f"{v.tx * v.ty}, {v.min_blocks}" if v.min_blocks else f"{v.tx * v.ty}"
        L.append(f'extern "C" __global__ void{dims} __launch_bounds__({bounds}) '
                 f"{COLUMN_NORM_NAME}(")  # fmt: skip
        L.append("    " + ",\n    ".join(kernel_params(program, v.i_rank, extra)) + ") {")
        types = set()
        for r in program.reductions:
            types.add(REGISTER_TYPE[r.dtype] if r.op == "welford" else accumulator_type(r))
        for t in sorted(types):
            L.append(f"  __shared__ __align__(16) {t} smem_{ident(t)}[{_fold_smem(self.fold, t, v.fold_bytes)}];")
        whole = softmax_reductions(program) if v.chunks and v.rows_in_smem and not v.persistent else None
        if v.persistent:
            self.tile_loop_head()
        elif v.refill:
            self.refill_loop_head(waits=not whole)
        else:
            L.append("  const idx_t tile = blockIdx.x / FC_CLUSTER;")
            L.append("  const unsigned rank = " + ("fc_cluster_rank();" if v.cluster > 1 else "0;"))
            L.append("  const idx_t cb = (tile * FC_TX + threadIdx.x) * FC_VEC;")
            L.append("  const bool col_ok = cb < cols;")
            self.column_offsets()
            L.append("  const idx_t k_base = (idx_t)rank * FC_TY * FC_RT + threadIdx.y;")
            if v.push and v.cluster > 1:  # Note [Column exchange]: mbarriers, one tile's worth
                self.bars_at = len(L)
                L.append("  fc_cluster_bars_init(fc_xbars, FC_SITES);")
                L.append("  const unsigned iter = 0, buf = 0;")
            self.load_rows()
            if v.push and v.cluster > 1:  # every peer's mbarriers exist; the loads overlapped that
                L.append('  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");')
            if v.rows_in_smem and not whole:  # Note [Column rows in smem]: the thread's own copies landed
                L.append("  fc_cp_async_wait<0>();")
        self.column_stage(0)
        online = softmax_reductions(program) if v.online and v.cluster > 1 and not whole else None
        for stage in range(1, program.stages + 1):
            if online and stage == 1:
                self.online_stages(*online)
            elif whole and stage == 1:
                self.chunked_softmax_stages(*whole)
            elif not ((online or whole) and stage == 2):
                self.reduce_stage(stage)
            self.column_stage(stage)
        self.write_outputs()
        if v.persistent or v.refill:
            L.append("  }")
        if self.pushed:
            L[self.bars_at:self.bars_at] = [
                f"#define FC_SITES {2 * max(1, self.sites)}",
                "  __shared__ __align__(8) unsigned long long fc_xbars[FC_SITES];"]
        if v.cluster > 1 and (v.end_sync or not self.pushed):  # peers may still read this block's partials
            L.append("  fc_cluster_sync();")
        L.append("}")
        return "\n".join(L) + "\n"

    def column_offsets(self) -> None:
        """Note [Middle reductions]: column c's offset in each tensor."""
        L = self.L
        L.append(f"  idx_t col[{self.n_acc + len(self.program.stores)}];")
        L.append("  {")
        L.extend(self.offset_lines("col_ok ? cb : 0", "col"))
        L.append("  }")

    def offset_lines(self, c: str, off: str) -> list[str]:
        """Column `c`'s offset in each tensor, into `off`."""
        program, v = self.program, self.v
        tensors = [f"a{i}" for i in range(self.n_acc)] + [f"o{k}" for k in range(len(program.stores))]
        out = [f"    idx_t rest = {c};"]
        for d in range(v.i_rank - 1, 0, -1):
            out.append(f"    const idx_t i{d} = rest % n{d}; rest /= n{d};")
        out.append("    const idx_t i0 = rest;")
        for t, name in enumerate(tensors):
            out.append(f"    {off}[{t}] = {' + '.join(f'i{d} * {name}_s{d}' for d in range(v.i_rank))};")
        return out

    def tile_loop_start(self) -> int:
        """What every loop over tiles of columns starts with: the block's rank and first row,
        the tile count and step, the column offsets' lambda, the first tile, and a cluster's
        mbarriers; the number of offsets a column has."""
        program, v, L = self.program, self.v, self.L
        n = self.n_acc + len(program.stores)
        L.append("  const unsigned rank = " + ("fc_cluster_rank();" if v.cluster > 1 else "0;"))
        L.append("  const idx_t k_base = (idx_t)rank * FC_TY * FC_RT + threadIdx.y;")
        L.append("  const idx_t tiles = (cols + FC_TX * FC_VEC - 1) / (FC_TX * FC_VEC);")
        L.append("  const idx_t tile_step = gridDim.x / FC_CLUSTER;")
        L.append(f"  auto column_offsets = [&](idx_t c, idx_t (&off)[{n}]) {{")
        L.extend("  " + x for x in self.offset_lines("c", "off"))
        L.append("  };")
        L.append("  idx_t tile = blockIdx.x / FC_CLUSTER;")
        if v.cluster > 1:  # Note [Column exchange]: the mbarriers, before any block sends
            self.bars_at = len(L)
            L.append("  fc_cluster_bars_init(fc_xbars, FC_SITES);")
        return n

    def tile_columns(self, n: int, indent: str, tile: str) -> None:
        """The thread's first column of tile `tile` (an expression), whether it is inside
        the row, and its `n` offsets, declared at `indent`."""
        self.L += [f"{indent}const idx_t cb = ({tile} * FC_TX + threadIdx.x) * FC_VEC;",
                   f"{indent}const bool col_ok = cb < cols;",
                   f"{indent}idx_t col[{n}];",
                   f"{indent}column_offsets(col_ok ? cb : 0, col);"]

    def first_tile_then_loop(self, n: int, load_first: Callable[[], None]) -> None:
        """The first tile's columns and rows (`load_first` writes the loads), a cluster's
        wait for its peers' mbarriers, and the head of the loop over tiles."""
        L = self.L
        L.append("  {")
        self.tile_columns(n, "    ", "tile")
        load_first()
        L.append("  }")
        if self.v.cluster > 1:  # every peer's mbarriers exist: the first tile's loads overlapped that
            L.append('  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");')
        L.append("  for (unsigned iter = 0; tile < tiles; tile += tile_step, ++iter) {")
        L.append("  const unsigned buf = iter & 1u;")

    def tile_loop_head(self) -> None:
        """Note [Column tiles in flight]: a cluster stays resident and takes every so many
        tiles of columns; the rows of its next tile are loaded into a second set of
        registers while it folds, exchanges and stores the current one, so that an SM's
        loads do not wait for its blocks' barriers and stores. Partials are pushed to every
        peer with st.async (Note [Column exchange]) into slots that alternate between
        tiles, each pair with its mbarriers: a block sends tile t+2's partials only after it
        has all of tile t+1's, which each peer sends after reading tile t's."""
        v, L = self.v, self.L
        n = self.tile_loop_start()
        if v.rows_in_smem:
            self.smem_tile_loop_head(n)
            return
        L.extend(f"  {self.row_type(i)} x{i}_n[FC_RT];" for i in v.cached)
        self.first_tile_then_loop(n, lambda: self.load_rows("_n", declared=True))
        self.tile_columns(n, "  ", "tile")
        for i in v.cached:
            L.append(f"  {self.row_type(i)} x{i}[FC_RT];")
            L.append("#pragma unroll")
            L.append(f"  for (int it = 0; it < FC_RT; ++it) x{i}[it] = x{i}_n[it];")
        L.append("  if (tile + tile_step < tiles) {  // the next tile's rows, in flight meanwhile")
        self.tile_columns(n, "    ", "(tile + tile_step)")
        self.load_rows("_n", declared=True)
        L.append("  }")

    def smem_tile_loop_head(self, n: int) -> None:
        """Note [Column rows in smem], clusters looping over tiles: two buffers of slots, the
        next tile's rows copied into one while the current one's are read from the other.
        Each thread reads back only its own slots, and only after its copies of that tile
        completed (cp.async.wait_group 1 leaves the next tile's group in flight)."""
        L = self.L
        self.declare_smem_rows()
        self.first_tile_then_loop(n, lambda: self.copy_rows_to_smem("0"))
        L.append("  if (tile + tile_step < tiles) {  // the next tile's rows, in flight meanwhile")
        self.tile_columns(n, "    ", "(tile + tile_step)")
        self.copy_rows_to_smem("(buf ^ 1u)", commit=False)
        L.append("  }")
        L.append("  fc_cp_async_commit();  // possibly empty: the wait below counts groups")
        L.append("  fc_cp_async_wait<1>();")
        self.tile_columns(n, "  ", "tile")

    def group_ends(self) -> str:
        """True at the last row of each group of the thread's copies (`it` is unrolled)."""
        return " || ".join(f"it == {hi - 1}" for _, hi in self.groups)

    def refill_loop_head(self, waits: bool) -> None:
        """Note [Whole column tiles]: a resident wave of blocks, each taking every so many
        tiles of columns with the whole reduced dim in its shared memory, one buffer. The
        first tile's rows are copied in here; each later tile's are copied into a slot as
        soon as the output pass has written that slot's row (refill_lines), so the next
        tile's loads are in flight while the current one's outputs go out. `waits`: wait for
        all of the tile's copies at the top (else the first pass waits group by group)."""
        L = self.L
        n = self.tile_loop_start()
        self.declare_smem_rows()
        self.first_tile_then_loop(n, lambda: self.copy_rows_to_smem())
        self.tile_columns(n, "  ", "tile")
        L.append("  const idx_t cb_next = ((tile + tile_step) * FC_TX + threadIdx.x) * FC_VEC;")
        L.append("  const bool next_ok = tile + tile_step < tiles && cb_next < cols;")
        L.append(f"  idx_t col_next[{n}];")
        L.append("  column_offsets(next_ok ? cb_next : 0, col_next);")
        if waits:
            L.append("  fc_cp_async_wait<0>();")

    def refill_lines(self) -> list[str]:
        """Row `it` of the next tile copied into the thread's slots of row `it`, after the
        output pass stored that row: its store took the values read from those slots, so
        the read is done before the copy is issued. Every group of rows is committed, empty
        or not, so that the next tile's waits count the same groups; after the last tile
        none is issued, so that no copy is in flight when the block exits."""
        v = self.v
        out = ["if (next_ok) {", "  const idx_t k = k_base + (idx_t)it * FC_TY;",
               "  const bool ok_next = k < N;"]  # fmt: skip
        for n, i in enumerate(v.cached):
            out.append(f"  fc_cp_async16(&fc_rows[{n} * FC_RT * FC_TY * FC_TX + (it * FC_TY + "
                       f"threadIdx.y) * FC_TX + threadIdx.x], a{i} + (ok_next ? col_next[{i}] + "
                       f"k * a{i}_k : 0), ok_next);")  # fmt: skip
        out.append("}")
        out.append(f"if ({self.group_ends()}) fc_cp_async_commit();")
        return out

    def row_type(self, i: int) -> str:
        mt = MEMORY_TYPE[self.program.accesses[i].dtype]
        return f"fc_vec<{mt}, FC_VEC>" if self.v.modes[i] != "bcast" else mt

    def load_rows(self, suffix: str = "", declared: bool = False) -> None:
        """Every element-level input's RT rows of the thread's columns, all loads at once,
        into x{i}{suffix}."""
        program, v, L = self.program, self.v, self.L
        if v.rows_in_smem:
            assert not suffix, "rows in smem: one tile a block"
            self.copy_rows_to_smem()
            return
        if not declared:
            L.extend(f"  {self.row_type(i)} x{i}{suffix}[FC_RT];" for i in v.cached)
        L.append("#pragma unroll")
        L.append("  for (int it = 0; it < FC_RT; ++it) {")
        L.append("    const idx_t k = k_base + (idx_t)it * FC_TY;")
        L.append("    const bool ok = col_ok && k < N;")
        for i in v.cached:
            at = f"col[{i}] + k * a{i}_k"
            mt = MEMORY_TYPE[program.accesses[i].dtype]
            x = f"x{i}{suffix}"
            if v.modes[i] == "vec":
                L.append(f"    {x}[it] = fc_load_vec_if<FC_VEC, {v.load_hint}>(a{i} + {at}, ok);")
            elif v.modes[i] == "bcast":
                L.append(f"    {x}[it] = ok ? a{i}[{at}] : {mt}();")
            else:
                L.append("#pragma unroll")
                L.append(f"    for (int j = 0; j < FC_VEC; ++j) {x}[it][j] = "
                         f"ok ? a{i}[{at} + j * a{i}{self.inner}] : {mt}();")  # fmt: skip
        L.append("  }")

    def copy_rows_to_smem(self, buffer: str = "0", commit: bool = True) -> None:
        """Note [Column rows in smem]: each thread copies its RT row vectors of every
        cached input with cp.async into x{i}_s, slot (it, ty, tx), and later reads back only
        its own slots (so waiting for its own copies is all the synchronisation needed).
        The rows hold no registers while in flight or between passes: the thread keeps only
        its columns' state, so more blocks fit an SM than with the rows in registers (Note
        [Column norms]: bf16 softmax over dim 1 was capped at three blocks of 256 an SM).
        A warp reads 32 consecutive 16-byte slots: no bank conflicts."""
        v, L = self.v, self.L
        self.declare_smem_rows()
        L.append("  {")
        for n, i in enumerate(v.cached):
            L.append(f"  uint4* const x{i}_s = fc_rows + {buffer} * fc_rows_buf + {n} * FC_RT * FC_TY * FC_TX;")
        L.append("#pragma unroll")
        L.append("  for (int it = 0; it < FC_RT; ++it) {")
        L.append("    const idx_t k = k_base + (idx_t)it * FC_TY;")
        L.append("    const bool ok = col_ok && k < N;")
        for i in v.cached:
            L.append(f"    fc_cp_async16(&x{i}_s[(it * FC_TY + threadIdx.y) * FC_TX + threadIdx.x], "
                     f"a{i} + (ok ? col[{i}] + k * a{i}_k : 0), ok);")  # fmt: skip
        grouped = commit and len(self.groups) > 1
        if grouped:  # Note [Whole column tiles]: a group of the thread's rows at a time
            L.append(f"    if ({self.group_ends()}) fc_cp_async_commit();")
        L.append("  }")
        L.append("  }")
        if commit and not grouped:
            L.append("  fc_cp_async_commit();")

    def declare_smem_rows(self) -> None:
        v, L = self.v, self.L
        if not self.smem_declared:
            self.smem_declared = True
            bufs = "[2]" if v.persistent else ""
            L.append(f"  extern __shared__ uint4 fc_rows[];  // {bufs}[cached][RT][TY][TX] 16-byte slots")
            L.append(f"  const unsigned fc_rows_buf = {len(v.cached)} * FC_RT * FC_TY * FC_TX;")

    def smem_row_reads(self) -> list[str]:
        """Row `it` of each cached input read back from its shared-memory slots."""
        buffer = "buf" if self.v.persistent else "0"
        out = []
        for n, i in enumerate(self.v.cached):
            out.append(f"const uint4* const x{i}_s = fc_rows + {buffer} * fc_rows_buf + "
                       f"{n} * FC_RT * FC_TY * FC_TX;")  # fmt: skip
            vt = f"fc_vec<{MEMORY_TYPE[self.program.accesses[i].dtype]}, FC_VEC>"
            out.append(f"const {vt} x{i}_r = *reinterpret_cast<const {vt}*>("
                       f"&x{i}_s[(it * FC_TY + threadIdx.y) * FC_TX + threadIdx.x]);")  # fmt: skip
        return out

    def elem_load(self, i: int) -> str:
        """Element j of row it of access i; a bf16 one as a float read through its 32-bit
        word (fc_bf16_at)."""
        if self.v.modes[i] == "bcast":
            return f"x{i}[it]"
        row = f"x{i}_r" if self.v.rows_in_smem else f"x{i}[it]"
        if MEMORY_TYPE[self.program.accesses[i].dtype] == "fc_bf16" and self.v.vec % 2 == 0:
            return f"fc_bf16_at({row}, j)"
        return f"{row}[j]"

    def col_load(self, i: int) -> str:
        return f"a{i}[col[{i}] + j * a{i}{self.inner}]"

    def restore(self) -> list[str]:
        """The column-level values so far, for column j."""
        dt = self.dtypes
        return [f"const {self._ctype(var)} {var} = {var}_c[j];" for var in self.kept
                if var in dt or var in self._reds]

    @property
    def _reds(self) -> dict:
        return {r.var: r for r in self.program.reductions}

    def _ctype(self, var: str) -> str:
        r = self._reds.get(var)
        if r is not None:
            return accumulator_type(r)
        return REGISTER_TYPE[self.dtypes[var]]

    def element_loop(self, targets: list[str], body: list[str], after: Sequence[str] = (),
                     before: Sequence[str] = (), rows: tuple[int, int] | None = None) -> None:  # fmt: skip
        """For each of the thread's rows (those of `rows`, first and last + 1, where given)
        and columns: the statements `targets` need, then `body`; `before` and `after` once a
        row, around its columns."""
        L = self.L
        stmts, _ = needed(self.program, targets)
        # Note [Row divisors]: a division by a column's value is a multiplication by its
        # reciprocal, computed once a column
        divs = sorted({self.divisions[st.var] for st in stmts if st.var in self.divisions
                       and self.divisions[st.var][0] in self.kept and st.var not in self.lean_lines})  # fmt: skip
        for y, ct in divs:
            L.append(f"  fc_divisor<{ct}> {y}_dv[FC_VEC];")
            L.append("#pragma unroll")
            L.append(f"  for (int j = 0; j < FC_VEC; ++j) {y}_dv[j] = fc_divisor_of(({ct}){y}_c[j]);")
        reciprocal = {y for y, _ in divs}
        L.append("#pragma unroll")
        L.append("  for (int it = 0; it < FC_RT; ++it) {" if rows is None
                 else f"  for (int it = {rows[0]}; it < {rows[1]}; ++it) {{")  # fmt: skip
        L.append("    const bool ok = col_ok && k_base + (idx_t)it * FC_TY < N;")
        if self.v.rows_in_smem:
            L.extend("    " + x for x in self.smem_row_reads())
        L.extend("    " + x for x in before)
        L.append("#pragma unroll")
        L.append("    for (int j = 0; j < FC_VEC; ++j) {")
        L.extend("      " + x for x in self.restore())
        L.extend(f"      const fc_divisor<{ct}> {y}_d = {y}_dv[j];" for y, ct in divs)
        L.extend("      " + x for x in (self.render_element(st, reciprocal) for st in stmts) if x)
        L.extend("      " + x for x in body)
        L.append("    }")
        L.extend("    " + x for x in after)
        L.append("  }")

    def render_element(self, st, reciprocal: set) -> str:
        dtypes = self.dtypes
        if st.var in self.lean_lines:  # Note [Lean column softmax]
            return self.lean_lines[st.var]
        if st.var in self.reused:  # Note [Online column softmax]: exp(x - M) from the sum pass
            return f"const {REGISTER_TYPE[dtypes[st.var]]} {st.var} = {self.reused[st.var]};"
        if st.var in self.divisions and self.divisions[st.var][0] in reciprocal:
            return render_row_division(st, dtypes)
        return render_stmt(st, dtypes, self.elem_load)

    def masked_accumulate(self, r, acc: str) -> str:
        """acc folded with reduction r's input where the row is in range. Fewer instructions
        lost on the H100 (benchmarks/sweeps/layouts2_r1.json and _r3_softmax.json,
        2026-11-26): a select instead of the branch (`ok ? x : identity`, 4 fewer an element
        of bf16 softmax over dim 1) 1757 -> 1610 GB/s, f32 2643 -> 2007 (92 -> 128 and 146
        -> 173 registers); the block sums' exp as one ex2.approx.ftz (exact there: the sum
        holds exp(0) = 1; 19% fewer instructions) bf16 1760 -> 1690 (122 registers)."""
        return "if (ok) " + accumulate_stmt(r, r.input, self.dtypes, acc)

    def combine(self, var: str, ctype: str, op: str) -> None:
        """var[FC_VEC] of every thread row and every block of the cluster, folded in a fixed
        order; every thread gets the totals of its columns."""
        v, L = self.v, self.L
        L.append(f"  fc_fold_rows<FC_TX, FC_TY, FC_VEC, {_fold_columns(self.fold, ctype, self.v.fold_bytes)}>({var}, "
                 f"{op}, smem_{ident(ctype)});")  # fmt: skip
        if v.cluster == 1:
            return
        self.exchange([var], ctype, ["#pragma unroll",
                                     f"for (int s = 1; s < FC_CLUSTER; ++s) p0[0] = {op}(p0[0], p0[s]);",
                                     f"total_{var}[c] = p0[0];"])  # fmt: skip

    def exchange(self, values: list[str], ctype: str, fold: list[str]) -> None:
        """Note [Column exchange]: the block's partials `values` (arrays of FC_VEC, after
        fc_fold_rows) to every block of the cluster; then one thread a column c gathers
        column c's partials of every block, p{k}[rank] for values[k], and `fold` writes its
        totals total_{var}[c]; every thread reads its columns' totals. Every thread reading
        every partial itself moved TY times the bytes through distributed shared memory,
        one dependent load at a time: softmax bf16 [32, 4096, 512] over dim 1 ran at 119
        GB/s on the H100, 4% of the ceiling. Clusters looping over tiles (Note [Column
        tiles in flight]) push the partials with st.async to every peer, counted on the
        peer's mbarrier: a cluster barrier's release would wait for the previous tile's
        stores, still in flight. A block whose mbarrier completed holds every peer's last
        partials, so no peer touches its shared memory again and pushing blocks exit without
        the cluster barrier (colnorm.end_sync puts it back): the blocks of a cluster no
        longer wait for its slowest one's stores. bf16 softmax [32, 4096, 512] over dim 1,
        H100, kernels compiled on its machine (probe-lean-nvidia-h100-80gb-hbm3.txt, round
        3): 2195 -> 2278 GB/s in 32-column deep tiles; f32 clusters looping over tiles 2641
        -> 2648."""
        L = self.L
        pushed = self.pushed
        site = self.sites
        self.sites += 1
        for var in values:
            L.append(f"  __shared__ {ctype} part_{var}[FC_TX * FC_VEC];")
            L.append(f"  __shared__ {ctype} total_{var}[FC_TX * FC_VEC];")
            if pushed:
                # one tile a block uses buffer 0 only
                slots = 2 if self.v.persistent or self.v.refill else 1
                L.append(f"  __shared__ {ctype} slot_{var}[{slots}][FC_CLUSTER][FC_TX * FC_VEC];")
        L.append("  if (threadIdx.y == 0) {")
        L.append("#pragma unroll")
        L.append("    for (int j = 0; j < FC_VEC; ++j) {")
        L.extend(f"      part_{var}[threadIdx.x * FC_VEC + j] = {var}[j];" for var in values)
        L.append("    }")
        L.append("  }")
        if pushed:
            bar = f"fc_xbars[{2 * site} + buf]"
            size = f"FC_CLUSTER * FC_TX * FC_VEC * {4 * len(values)}"
            L.append("  if (threadIdx.x == 0 && threadIdx.y == 0)")
            L.append("    asm volatile(\"mbarrier.arrive.expect_tx.relaxed.cta.shared::cta.b64 _, [%0], %1;\"")
            L.append(f"                 ::\"r\"(fc_smem_addr(&{bar})), \"r\"((unsigned)({size})) : \"memory\");")
            L.append("  __syncthreads();")
            L.append("  for (int q = threadIdx.y * FC_TX + threadIdx.x; q < FC_CLUSTER * FC_TX * FC_VEC; "
                     "q += FC_TX * FC_TY) {")  # fmt: skip
            L.append("    const int c = q % (FC_TX * FC_VEC), peer = q / (FC_TX * FC_VEC);")
            L.extend(f"    fc_send_remote(&slot_{var}[buf][rank][c], part_{var}[c], peer, &{bar});"
                     for var in values)  # fmt: skip
            L.append("  }")
            L.append(f"  while (!fc_bar_try_wait(fc_smem_addr(&{bar}), (iter >> 1) & 1u)) {{")
            L.append("  }")
        else:
            L.append("  fc_cluster_sync();")
        L.append("  for (int c = threadIdx.y * FC_TX + threadIdx.x; c < FC_TX * FC_VEC; "
                 "c += FC_TX * FC_TY) {")  # fmt: skip
        L.append("    " + " ".join(f"{ctype} p{k}[FC_CLUSTER];" for k in range(len(values))))
        L.append("#pragma unroll")
        L.append("    for (unsigned r = 0; r < FC_CLUSTER; ++r) {")
        for k, var in enumerate(values):
            L.append(f"      p{k}[r] = slot_{var}[buf][r][c];" if pushed
                     else f"      p{k}[r] = fc_load_remote(&part_{var}[c], r);")  # fmt: skip
        L.append("    }")
        L.extend("    " + x for x in fold)
        L.append("  }")
        L.append("  __syncthreads();")
        L.append("#pragma unroll")
        L.append("  for (int j = 0; j < FC_VEC; ++j) {")
        L.extend(f"    {var}[j] = total_{var}[threadIdx.x * FC_VEC + j];" for var in values)
        L.append("  }")

    def online_stages(self, r1, r2) -> None:
        """Note [Online column softmax]: stages 1 and 2 of softmax (a column's max m, then the
        sum of exp(x - m)) with one cluster exchange instead of two. Each block folds its
        own max m_b over its thread rows and its sum s_b of exp(x - m_b); the exchange
        carries both, and one thread a column folds them in rank order: M = max m_b, S =
        sum of s_b * exp(m_b - M), a block whose rows are all -inf (or absent) adding 0.
        The second cluster barrier waited for every block's first fold: one less a column
        tile, where each blocks all of its SM's loads behind it."""
        L = self.L
        ctype = accumulator_type(r1)
        for r in (r1, r2):
            L.append(f"  {ctype} {r.var}_c[FC_VEC];")
            L.append("#pragma unroll")
            L.append(f"  for (int j = 0; j < FC_VEC; ++j) {r.var}_c[j] = {identity_of(r)};")
        lean = self.v.lean and not self.v.reuse_exp  # Note [Lean column softmax]
        packed = self.packed_max_access(r1) if lean else None
        if packed is not None:
            self.packed_max(r1, packed, (0, self.v.rows))
        else:
            self.element_loop([r1.input], [self.masked_accumulate(r1, f"{r1.var}_c[j]")])
        et = REGISTER_TYPE[self.dtypes[r2.input]]
        for r in (r1, r2):
            if r is r2:  # the block's sum, from the block's max
                self.kept.append(r1.var)
                keep = [f"{r2.input}_e[it][j] = {r2.input};"] if self.v.reuse_exp else []
                if keep:
                    L.append(f"  {et} {r2.input}_e[FC_RT][FC_VEC];")
                if lean:
                    self.lean_lines = self.flushed_sum_terms(r1, r2)
                self.element_loop([r2.input], [self.masked_accumulate(r2, f"{r2.var}_c[j]"),
                                               *keep])  # fmt: skip
                self.lean_lines = {}
            L.append(f"  fc_fold_rows<FC_TX, FC_TY, FC_VEC, {_fold_columns(self.fold, ctype, self.v.fold_bytes)}>("
                     f"{r.var}_c, {op_functor(r)}, smem_{ident(ctype)});")  # fmt: skip
        m = f"{r1.var}_c"
        if self.v.reuse_exp:  # the block's max, before the exchange makes it the column's
            L.append(f"  {ctype} {r1.var}_b[FC_VEC];")
            L.append("#pragma unroll")
            L.append(f"  for (int j = 0; j < FC_VEC; ++j) {r1.var}_b[j] = {m}[j];")
        self.exchange_max_and_sum(r1, r2)
        self.kept.append(r2.var)
        if lean:
            self.lean_lines = self.folded_outputs(r1, r2)
        if self.v.reuse_exp:
            # exp(x - M) = exp(x - m_b) * exp(m_b - M); a block whose rows are all -inf kept
            # NaNs (-inf - -inf), where exp(x - M) is 0
            b = f"{r1.var}_b"
            L.append(f"  {ctype} {b}_f[FC_VEC];")
            L.append("#pragma unroll")
            L.append(f"  for (int j = 0; j < FC_VEC; ++j) {b}_f[j] = exp2f(({b}[j] - {m}[j]) * "
                     "1.4426950408889634f);")  # fmt: skip
            e = f"{r2.input}_e[it][j]"
            self.reused[r2.input] = f"({b}[j] == {identity_of(r1)} ? ({et})0 : {e} * {b}_f[j])"

    def chunked_softmax_stages(self, r1, r2) -> None:
        """Note [Whole column tiles]: stages 1 and 2 of softmax over a block holding the whole
        reduced dim, in one pass over the thread's rows as their groups land: each group
        raises the thread's max m and rescales its sum s of exp(x - m) to it; then the block
        folds the maxima, rescales each thread's s to the column's max M and folds the sums.
        A thread whose rows so far are all -inf holds no sum (its exp(-inf - -inf) terms
        are NaN), and adds 0 wherever its max is -inf."""
        L = self.L
        ctype = accumulator_type(r1)
        m, t, none = f"{r1.var}_c", f"{r2.var}_c", identity_of(r1)
        log2e = "1.4426950408889634f"
        # Note [Lean column softmax]: a sum rescaled by less than 2^-126 is one the column's
        # sum (1 or more: the max's own term) cannot hold, so the rescales flush too
        exp2 = "fc_exp2_flushed" if self.v.lean else "exp2f"
        for r in (r1, r2):
            L.append(f"  {ctype} {r.var}_c[FC_VEC];")
            L.append("#pragma unroll")
            L.append(f"  for (int j = 0; j < FC_VEC; ++j) {r.var}_c[j] = {identity_of(r)};")
        for g, rows in enumerate(self.groups):
            L.append(f"  fc_cp_async_wait<{len(self.groups) - 1 - g}>();  // rows {rows[0]} to "
                     f"{rows[1] - 1} of the thread landed")  # fmt: skip
            L.append("  {")
            L.append(f"  {ctype} {r1.var}_p[FC_VEC];")
            L.append("#pragma unroll")
            L.append(f"  for (int j = 0; j < FC_VEC; ++j) {r1.var}_p[j] = {m}[j];")
            packed = self.packed_max_access(r1) if self.v.lean else None
            if packed is not None:
                self.packed_max(r1, packed, rows)
            else:
                self.element_loop([r1.input], [self.masked_accumulate(r1, f"{m}[j]")], rows=rows)
            L.append("#pragma unroll")
            L.append(f"  for (int j = 0; j < FC_VEC; ++j) {t}[j] = {r1.var}_p[j] == {none} ? "
                     f"({ctype})0 : {t}[j] * {exp2}(({r1.var}_p[j] - {m}[j]) * {log2e});")  # fmt: skip
            if r1.var not in self.kept:
                self.kept.append(r1.var)
            if self.v.lean:  # the sum's terms flushed (Note [Flushed softmax terms])
                self.lean_lines = self.flushed_sum_terms(r1, r2)
            self.element_loop([r2.input], [self.masked_accumulate(r2, f"{t}[j]")], rows=rows)
            self.lean_lines = {}
            L.append("  }")
        L.append(f"  {ctype} {r1.var}_t[FC_VEC];")
        L.append("#pragma unroll")
        L.append(f"  for (int j = 0; j < FC_VEC; ++j) {r1.var}_t[j] = {m}[j];")
        for r, acc in ((r1, m), (r2, t)):
            if r is r2:  # the thread's sum, rescaled to the column's max
                L.append("#pragma unroll")
                L.append(f"  for (int j = 0; j < FC_VEC; ++j) {t}[j] = {r1.var}_t[j] == {none} ? "
                         f"({ctype})0 : {t}[j] * {exp2}(({r1.var}_t[j] - {m}[j]) * {log2e});")  # fmt: skip
            L.append(f"  fc_fold_rows<FC_TX, FC_TY, FC_VEC, {_fold_columns(self.fold, ctype, self.v.fold_bytes)}>("
                     f"{acc}, {op_functor(r)}, smem_{ident(ctype)});")  # fmt: skip
        if self.v.cluster > 1:  # the blocks' (max, sum) pairs, as Note [Online column softmax]
            self.exchange_max_and_sum(r1, r2)
        self.kept.append(r2.var)
        if self.v.lean:
            self.lean_lines = self.folded_outputs(r1, r2)

    def packed_max_access(self, r1) -> int | None:
        """Note [Lean column softmax]: the cached bf16 access whose widened values the max
        folds, where its rows are read as whole 32-bit words from shared memory."""
        by_var = {st.var: st for st in self.program.stmts}
        st = by_var.get(r1.input)
        if st is not None and st.op == "cast" and st.dtype is DataType.Float:
            st = by_var.get(st.operands[0])
        if st is None or st.op != "load":
            return None
        i = st.operands[0]
        ok = (i in self.v.cached and self.v.modes[i] == "vec" and self.v.vec % 2 == 0
              and self.v.rows_in_smem and self.program.accesses[i].dtype is DataType.BFloat16)  # fmt: skip
        return i if ok else None

    def packed_max(self, r1, i: int, rows: tuple[int, int]) -> None:
        """The max of rows `rows` of bf16 access `i`, two columns an instruction, folded into
        the thread's float maxima afterwards (exact: a max of bf16 values is one of them)."""
        L, h = self.L, f"{r1.var}_h"
        L.append(f"  unsigned {h}[FC_VEC / 2];")
        L.append("#pragma unroll")
        L.append(f"  for (int q = 0; q < FC_VEC / 2; ++q) {h}[q] = 0xff80ff80u;  // -inf, -inf")
        L.append("#pragma unroll")
        L.append(f"  for (int it = {rows[0]}; it < {rows[1]}; ++it) {{")
        L.append("    const bool ok = col_ok && k_base + (idx_t)it * FC_TY < N;")
        L.extend("    " + x for x in self.smem_row_reads())
        L.append(f"    const unsigned* const w = reinterpret_cast<const unsigned*>(x{i}_r.v);")
        L.append("#pragma unroll")
        L.append(f"    for (int q = 0; q < FC_VEC / 2; ++q) if (ok) {h}[q] = fc_max_bf16x2({h}[q], w[q]);")
        L.append("  }")
        L.append("#pragma unroll")
        L.append(f"  for (int j = 0; j < FC_VEC; ++j) {r1.var}_c[j] = {op_functor(r1)}({r1.var}_c[j], "
                 f"__uint_as_float((j & 1) ? ({h}[j >> 1] & 0xffff0000u) : ({h}[j >> 1] << 16)));")  # fmt: skip

    def flushed_sum_terms(self, r1, r2) -> dict[str, str]:
        """Note [Lean column softmax]: the sum pass's exp(x - m) as exp2 of x*log2(e) -
        m*log2(e), flushed (Note [Flushed softmax terms]); the x - m it read is not computed."""
        by_var = {st.var: st for st in self.program.stmts}
        sub = by_var[r2.input].operands[0]
        return {sub: "", r2.input: (f"const float {r2.input} = fc_exp2_flushed(fmaf({r1.input}, "
                                    f"1.4426950408889634f, {r1.var} * -1.4426950408889634f));")}  # fmt: skip

    def folded_outputs(self, r1, r2) -> dict[str, str]:
        """Note [Lean column softmax]: exp(x - M) / S as 2^((x - M)*log2(e) - log2(S)), where
        the program divides the sum's terms by the sum and reads them nowhere else."""
        program, L = self.program, self.L
        by_var = {st.var: st for st in program.stmts}
        e, sub = r2.input, by_var[r2.input].operands[0]
        readers = [st for st in program.stmts if e in st.operands or sub in st.operands]
        divs = [st for st in readers if st.op in ("div", "truediv")]
        if (len(readers) != 3 or len(divs) != 1 or tuple(divs[0].operands) != (e, r2.var)
                or divs[0].dtype is not DataType.Float or divs[0].compute is not DataType.Float
                or any(s.var in (e, sub) for s in program.stores)):  # fmt: skip
            return {}
        # 16-bit outputs: the exponent as one fma of x, M*log2(e) folded into the constant
        # (its rounding, under |M| * 2^-23, far below their half ulp of 2^-9)
        narrow = all(ELEMENT_BYTES[s.dtype] == 2 for k, s in enumerate(program.stores)
                     if not program.store_rowlevel[k])  # fmt: skip
        less_m = f" - {r1.var}_c[j] * 1.4426950408889634f" if narrow else ""
        L.append(f"  float {r2.var}_o[FC_VEC];  // 64 - log2(S): fc_exp2_biased takes 2^(y - 64)")
        L.append("#pragma unroll")
        L.append(f"  for (int j = 0; j < FC_VEC; ++j) {r2.var}_o[j] = 64.0f - __log2f({r2.var}_c[j]){less_m};")
        d, x = divs[0].var, r1.input if narrow else f"{r1.input} - {r1.var}"
        return {sub: "", e: "", d: (f"const float {d} = fc_exp2_biased(fmaf({x}, 1.4426950408889634f, "
                                    f"{r2.var}_o[j]));")}  # fmt: skip

    def exchange_max_and_sum(self, r1, r2) -> None:
        """Note [Online column softmax]: each block's max m_b and sum s_b of exp(x - m_b)
        through one exchange, folded in rank order: M = max m_b, S = sum of s_b * exp(m_b -
        M), a block whose rows are all -inf (or absent) adding 0."""
        ctype = accumulator_type(r1)
        m, t = f"{r1.var}_c", f"{r2.var}_c"
        self.exchange([m, t], ctype, [
            f"{ctype} top = p0[0];",
            "#pragma unroll",
            f"for (int r = 1; r < FC_CLUSTER; ++r) top = {op_functor(r1)}(top, p0[r]);",
            f"{ctype} total = {identity_of(r2)};",
            "#pragma unroll",
            "for (int r = 0; r < FC_CLUSTER; ++r)",
            f"  total = {op_functor(r2)}(total, p0[r] == {identity_of(r1)} ? ({ctype})0 : "
            "p1[r] * exp2f((p0[r] - top) * 1.4426950408889634f));",
            f"total_{m}[c] = top;",
            f"total_{t}[c] = total;"])  # fmt: skip

    def reduce_stage(self, stage: int) -> None:
        """The stage's reductions over every row of the thread's columns, combined."""
        program, L, dtypes = self.program, self.L, self.dtypes
        reds = [r for r in program.reductions if r.stage == stage]
        body = []
        for r in reds:
            if r.op == "welford":  # Note [Two-pass Welford]: sums of values, then of deviations
                rt = REGISTER_TYPE[r.dtype]
                L.append(f"  {rt} {r.var}_s[FC_VEC] = {{}};")
                body.append(f"if (ok) {r.var}_s[j] += {convert(r.input, dtypes[r.input], r.dtype)};")
            else:
                L.append(f"  {accumulator_type(r)} {r.var}_c[FC_VEC];")
                L.append("#pragma unroll")
                L.append(f"  for (int j = 0; j < FC_VEC; ++j) {r.var}_c[j] = {identity_of(r)};")
                body.append(self.masked_accumulate(r, f"{r.var}_c[j]"))
        self.element_loop([r.input for r in reds], body)
        welford = [r for r in reds if r.op == "welford"]
        for r in reds:
            if r.op != "welford":
                self.combine(f"{r.var}_c", accumulator_type(r), op_functor(r))
        if welford:
            body = []
            for r in welford:
                rt = REGISTER_TYPE[r.dtype]
                self.combine(f"{r.var}_s", rt, f"fc_op_sum<{rt}>()")
                L.append(f"  {rt} {r.var}_d[FC_VEC] = {{}};")
                x = convert(r.input, dtypes[r.input], r.dtype)
                body.append(f"if (ok) {{ const {rt} d = {x} - {r.var}_s[j] / ({rt})N; "
                            f"{r.var}_d[j] += d * d; }}")  # fmt: skip
            self.element_loop([r.input for r in welford], body)
            for r in welford:
                rt = REGISTER_TYPE[r.dtype]
                self.combine(f"{r.var}_d", rt, f"fc_op_sum<{rt}>()")
                L.append(f"  {accumulator_type(r)} {r.var}_c[FC_VEC];")
                L.append("#pragma unroll")
                L.append(f"  for (int j = 0; j < FC_VEC; ++j) {{ {r.var}_c[j].mean = {r.var}_s[j] / "
                         f"({rt})N; {r.var}_c[j].m2 = {r.var}_d[j]; {r.var}_c[j].count = (int)N; }}")  # fmt: skip
        self.kept += [r.var for r in reds]

    def column_stage(self, stage: int) -> None:
        """The column-level statements computed after `stage`'s reductions, kept a column."""
        program, L = self.program, self.L
        lines = row_level_stmts(program, stage, self.dtypes, self.col_load)
        stage_of = dict(program.stage_of)
        defined = [s.var for s in program.stmts if s.op != "reduce"
                   and s.var not in program.element_vars and stage_of[s.var] == stage]  # fmt: skip
        if not defined:
            return
        for var in defined:
            L.append(f"  {REGISTER_TYPE[self.dtypes[var]]} {var}_c[FC_VEC];")
        L.append("#pragma unroll")
        L.append("  for (int j = 0; j < FC_VEC; ++j) {")
        L.extend("    " + x for x in self.restore())
        L.extend("    " + x for x in lines)
        L.extend(f"    {var}_c[j] = {var};" for var in defined)
        L.append("  }")
        self.kept += defined

    def write_outputs(self) -> None:
        program, v, L, dtypes = self.program, self.v, self.L, self.dtypes
        n_acc = self.n_acc
        elem = [(k, s) for k, s in enumerate(program.stores) if not program.store_rowlevel[k]]
        if elem:
            body = []
            for k, s in elem:
                value = stored_form(program, dtypes, s.var, s.dtype)
                if v.modes[n_acc + k] == "vec":
                    body.append(f"o{k}_v[j] = {value};")
                else:
                    body.append(f"if (ok) o{k}[col[{n_acc + k}] + j * o{k}{self.inner} + "
                                f"(k_base + (idx_t)it * FC_TY) * o{k}_k] = {value};")  # fmt: skip
            # each row's vectors stored as soon as they are computed: no array of the
            # thread's outputs stays live (81 -> 64 registers for softmax bf16, so two
            # blocks of 512 threads fit an SM)
            before, after = [], []
            for k, s in elem:
                if v.modes[n_acc + k] == "vec":
                    before.append(f"fc_vec<{MEMORY_TYPE[s.dtype]}, FC_VEC> o{k}_v;")
                    after.append(f"if (ok) fc_store_vec_hint<FC_VEC, {v.store_hint}>(o{k} + "
                                 f"col[{n_acc + k}] + (k_base + (idx_t)it * FC_TY) * o{k}_k, o{k}_v);")  # fmt: skip
            if self.v.refill:  # Note [Whole column tiles]: the row's slots are free now
                after += self.refill_lines()
            self.element_loop([s.var for _, s in elem], body, after, before)
        elif self.v.refill:
            L.append("#pragma unroll")
            L.append("  for (int it = 0; it < FC_RT; ++it) {")
            L.extend("    " + x for x in self.refill_lines())
            L.append("  }")
        rows = [(k, s) for k, s in enumerate(program.stores) if program.store_rowlevel[k]]
        if rows:
            L.append("  if (threadIdx.y == 0 && rank == 0 && col_ok) {")
            L.append("#pragma unroll")
            L.append("    for (int j = 0; j < FC_VEC; ++j) {")
            L.extend("      " + x for x in self.restore())
            for k, s in rows:
                L.append(f"      o{k}[col[{n_acc + k}] + j * o{k}{self.inner}] = "
                         f"{stored_form(program, dtypes, s.var, s.dtype)};")  # fmt: skip
            L.append("    }")
            L.append("  }")
