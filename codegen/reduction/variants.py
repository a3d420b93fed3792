"""The launch choices a scheduler hands the reduction renderers: one variant a kernel."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_WEIGHTS_IN = {"registers": "registers", "shared": "shared memory"}


@dataclass(frozen=True)
class InnerVariant:
    i_rank: int  # collapsed row dims
    tx: int
    ty: int
    vec: int
    iters: int  # vectors per thread per row when the row's loads are cached; 0 = loop
    cached: tuple[int, ...]  # accesses held in registers (per-row data, not shared weights)
    index_type: str
    modes: tuple[str, ...]  # per access then per store, along K: 'vec', 'strided', 'row'
    live: tuple[tuple[bool, ...], ...]  # per access then per store: I stride != 0
    # Note [Two reduced dims]: the reduced dims collapse to (K0, K1) when they cannot collapse
    # to one (batch norm's N and H*W around C); element k sits at (k / K1, k % K1), and a
    # vector never straddles two K1 runs because K1 is a multiple of VEC
    k2: bool = False
    # Note [Column partials]: element-level stores summed over the rows a thread visits
    # into registers instead of written (the column sums of layer norm backward); a thread
    # keeps the same columns for every row it visits. After the row loop a block adds its
    # TY thread rows in shared memory and writes one row of a [blocks, N] buffer of
    # partials, for a finish kernel to add up in a fixed order. Needs ITERS > 0.
    acc: tuple[int, ...] = ()
    min_blocks: int = 0  # __launch_bounds__ minimum blocks an SM (0: unset)
    cluster: int = 1  # blocks of a thread-block cluster sharing each row (Note [Cluster rows])
    pipeline: bool = False  # copy the next row group to shared memory ahead (Note [Row pipeline])
    # Note [Rows in shared memory]: a pipelined row (Note [Row pipeline]) is read from its
    # shared-memory stage in every pass instead of being loaded into registers once, which
    # leaves the registers to the column partials of rows too long to keep beside them
    # (and ran long 16-bit forward rows with weights faster than registers did). Each
    # thread reads back only the chunks it copied itself, so no block barrier guards the
    # stage; the copies of the next row group land while this one is reduced, which rows
    # read from memory in each pass could not overlap. The cluster exchanges through its
    # barrier: the mbarrier exchange's registers made layer norm backward spill
    rows_in_smem: bool = False
    # Note [Finish in the row kernel]: the memory types of the column sums' outputs, in
    # `acc` order, where the kernel adds up the partials itself after a grid-wide barrier
    # (a cooperative launch, so every block is resident); () leaves that to a second kernel
    finish: tuple[str, ...] = ()
    load_hint: int = 0  # Note [Cache hints] (prelude/core.cuh)
    store_hint: int = 0
    weight_hint: int = 0  # of inputs every row reads again (Note [Weights kept in L2] in
    # schedulers/reduction/row_loads.py); 0: load_hint
    unroll: int = 1  # vectors a thread loads ahead in a pass that reads the row from memory
    merge: bool = True  # Note [Merged row reductions] (prelude/reduce.cuh)
    # Note [Weights loaded once]: with the row cached, a thread keeps the same columns of
    # every row it visits, so inputs shared by all rows (layer norm's weight) can load once,
    # before the row loop, instead of once a row from L1/L2: into "registers", or into
    # "shared" memory, each thread its own 16-byte chunks (no barrier), read there every
    # row (16-byte vectors, not pipelined); "" loads them every row
    weights: str = ""
    # Note [Cluster exchange] (prelude/reduce.cuh): a cluster's blocks swap row partials
    # through mbarriers, without the fence of a cluster barrier; False: the barrier
    exchange_async: bool = True
    # Note [Deferred row end] (prelude/reduce.cuh): with the row in shared memory and one
    # cluster exchange a row, a row group's last pass runs in the next iteration, after that
    # group's first pass: a third stage keeps its row meanwhile
    defer: bool = False
    # Note [Alternating row buffers] (prelude/reduce.cuh): one block barrier a row reduction
    alternate: bool = False
    # reads through windows and by index (codegen/resize_cuda.py), with row coordinates and
    # 'k' (the reduced one) as targets; accesses read element by element take mode 'gather'
    resize: Any = None
    # Note [Rows a thread] (row_loads.py): row groups a thread loads ahead together
    rows_a_thread: int = 1
    # Note [Philox lanes] (prelude/philox.cuh): every vector's first element index is a
    # multiple of 4 (N, VEC and the slice start are), so lane j of a vector draws by place
    rng_lanes: bool = False

    def _staged(self) -> str:
        n = len(self.cached)
        return f", {n} row input{'' if n == 1 else 's'} in shared memory" if self.rows_in_smem else ""

    def describe(self) -> str:
        return (f"inner rows of {self.tx}x{self.ty} threads, vec {self.vec}, "
                f"{'iters ' + str(self.iters) if self.iters else 'uncached'}"
                f"{', read each pass' if self.iters and not self.cached else ''}"
                f"{f', unroll {self.unroll}' if self.unroll > 1 and not self.iters else ''}"
                f", {self.index_type}"
                f"{', two reduced dims' if self.k2 else ''}"
                f"{f', clusters of {self.cluster}' if self.cluster > 1 else ''}"
                f"{', barrier exchange' if self.cluster > 1 and not self.exchange_async else ''}"
                f"{', pipelined' if self.pipeline else ''}"
                f"{f', {self.rows_a_thread} rows a thread' if self.rows_a_thread > 1 else ''}"
                f"{', deferred row end' if self.defer else ''}"
                f"{', alternating row buffers' if self.alternate and self.tx > 32 else ''}"
                f"{self._staged()}"
                f"{', weights in ' + _WEIGHTS_IN[self.weights] if self.weights and self.iters else ''}"
                f"{f', {self.min_blocks} blocks/SM' if self.min_blocks else ''}"
                f"{', Philox lanes' if self.rng_lanes else ''}"
                f"{f', hints {self.load_hint}{self.store_hint}' if self.load_hint or self.store_hint else ''}"
                f"{self.resize.describe() if self.resize is not None else ''}")  # fmt: skip


@dataclass(frozen=True)
class OuterVariant:
    tx: int
    ty: int
    vec: int
    split: int
    index_type: str
    modes: tuple[str, ...]  # per access then per store, along I: 'vec', 'strided', 'bcast'
    k_live: tuple[bool, ...]  # per access: K stride != 0
    unroll: int = 1  # rows a thread loads (all of them first) per loop iteration
    load_hint: int = 0  # Note [Cache hints] (prelude/core.cuh)
    cluster: bool = False  # the split blocks combine in one cluster (Note [Cluster columns])
    # Note [Middle reductions]: the kept dims collapse to I_RANK runs (columns are their
    # elements, vectors within the innermost run), the reduced ones to one or two (K2)
    i_rank: int = 1
    k2: bool = False

    def describe(self) -> str:
        return (f"outer {self.tx}x{self.ty} threads, vec {self.vec}, split {self.split}"
                f"{' in a cluster' if self.cluster else ''}, unroll {self.unroll}, {self.index_type}"
                f"{f', hint {self.load_hint}' if self.load_hint else ''}"
                f"{f', {self.i_rank} kept runs' if self.i_rank > 1 else ''}"
                f"{', two reduced runs' if self.k2 else ''}")  # fmt: skip


@dataclass(frozen=True)
class SplitVariant:
    """A few long rows split over the whole GPU (Note [Split rows] in
    schedulers/reduction/split_plan.py)."""

    threads: int
    vec: int
    unroll: int  # vectors a thread loads (all of them first) per loop iteration
    split: int  # blocks a row
    index_type: str
    modes: tuple[str, ...]  # per access: 'vec', 'strided' (along K) or 'row' (K stride 0)
    load_hint: int = 0  # Note [Cache hints] (prelude/core.cuh)

    def describe(self) -> str:
        return (f"split rows: {self.split} blocks a row of {self.threads} threads, vec "
                f"{self.vec}, unroll {self.unroll}, {self.index_type}"
                f"{f', hint {self.load_hint}' if self.load_hint else ''}")  # fmt: skip


@dataclass(frozen=True)
class ColumnNormVariant:
    """A normalization along a strided reduced dim (Note [Column norms] in
    schedulers/reduction/column_norm_plan.py)."""

    i_rank: int  # kept runs (Note [Middle reductions])
    tx: int  # threads along the columns, VEC columns each
    ty: int  # thread rows sharing the reduced dim
    vec: int
    rows: int  # rows of the reduced dim a thread keeps in registers (RT)
    cluster: int  # blocks sharing a tile of columns
    index_type: str
    modes: tuple[str, ...]  # per access then per store, along the columns: 'vec', 'bcast', 'strided'
    cached: tuple[int, ...]  # accesses read along the reduced dim, kept in registers
    load_hint: int = 0
    store_hint: int = 0
    min_blocks: int = 0  # blocks an SM must hold (__launch_bounds__ minimum; 0 = unset)
    online: bool = True  # softmax's two stages through one exchange (Note [Online column softmax])
    persistent: bool = False  # resident clusters loop over tiles (Note [Column tiles in flight])
    push: bool = False  # partials pushed through mbarriers, as persistent ones (Note [Column exchange])
    reuse_exp: bool = False  # softmax's exp(x - M) from the sum pass's (Note [Online column softmax])
    rows_in_smem: bool = False  # rows staged in shared memory by cp.async (Note [Column rows in smem])
    chunks: int = 0  # one block a column tile: its copies land in groups, softmax folded as they do (Note [Whole column tiles])
    refill: bool = False  # one block a column tile, looping over tiles, the next one's rows copied in as each row is written
    lean: bool = False  # softmax in fewer instructions (Note [Lean column softmax])
    end_sync: bool = True  # a cluster barrier before the blocks exit (Note [Column exchange])
    fold_bytes: int = 16384  # shared memory of the row fold at most (Note [Row fold])

    def describe(self) -> str:
        return (f"column norm: {self.tx}x{self.ty} threads, vec {self.vec}, {self.rows} rows a "
                f"thread, clusters of {self.cluster}, {self.index_type}"
                f"{'' if self.online else ', two exchanges'}"
                f"{', next tile in flight' if self.persistent else ''}"
                f"{', partials pushed' if self.push and not self.persistent else ''}"
                f"{', exps kept' if self.reuse_exp else ''}"
                f"{', rows in smem' if self.rows_in_smem else ''}"
                f"{f', {self.chunks} chunks' if self.chunks else ''}"
                f"{', refilled' if self.refill else ''}"
                f"{', lean' if self.lean else ''}"
                f"{f', {self.min_blocks} blocks/SM' if self.min_blocks else ''}"
                f"{f', {self.i_rank} kept runs' if self.i_rank > 1 else ''}")  # fmt: skip
