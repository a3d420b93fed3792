"""Plans of the row-sums kernels (codegen/row_sums_cuda.py): an index_put_accumulate into a
constant fill, as an embedding's gradient is, where results may depend on the order of adds.

Note [Row sums]: out [V, H] = fill + the rows of value [N, H] added at index [N]. The ordered
kernel (Note [Deterministic scatter]) scans the whole index once per block of output rows,
309 MB of L2 reads for an embedding's gradient of 50304 x 768 from 8192 tokens, where the op
must move 90 MB. Here each token claims its row (compare-and-swap on an int per row): the
first becomes the row's owner, and only the tokens that find their row taken add their
values, atomically, to a float row of sums kept at the owner's position (a workspace of
[N, H], touched only at shared rows). The last kernel writes every output row once: the
fill, plus the owner's values read from the input, plus the sums where the row is shared.
So the output is written once, the values read about once, and atomics touch only repeated
tokens. Which token owns a row and the order of the atomic adds vary between runs, so a
row named by several tokens may differ in its last bits from run to run (docs/ops.md);
FUSION_CACHE_DETERMINISTIC=1 takes the ordered kernel instead. These four kernels are
rows.chain False; the default is the row chains' split walk (Note [Split walk], [Walk adds]).

Fewer kernels lost on the H100 (2026-11-26, embedding 50304 x 768 bf16 from 8192 tokens, same
runs; the code is in commit 83b32d2): one cooperative kernel with a grid barrier between the
claims and the rows, 1335 GB/s against these kernels' 1833; two kernels on words kept between
runs (claims tagged with the run instead of a fill, the other tokens' adds in the claim
kernel), 1481 against 1805. Both spent about 11 us more; why was not found.

Note [Row chains] (knob rows.chain): three kernels instead of four. A fill sets a head word a
row to -1; each token pushes itself on its row's list (next[t] = atomicExch(head[r], t)); the
rows kernel adds, for each output row, the values of the tokens on its list, loading the next
token's values before adding the current one's. No float workspace, no atomic adds, no add
kernel; a row's sum is in list order, which varies between runs as the owner does above. A row
named by k tokens walks a list of k: a hot row costs its threads k dependent loads.
H100 (2026-11-27, sweep of benchmarks/sweeps/resize_round5.json, embedding 50304 x 768 bf16
from 8192 uniform tokens, same run): 2148-2239 GB/s across rows.units 1/2/4 and rows.early,
against 1827 for the four kernels (1.22x; kernel_times with events: link 13.7 + walk 42.0 us
against claim 14.2 + add 15.8 + out 41.8). This walk (rows.slab_walk 0) was not the default;
the slab walk is (Note [Slab walk]). Then: a list is a pointer chase, each
step an L2 round trip, so a padding row or a frequent token (hundreds of the 8192) would cost
its threads hundreds of microseconds where the atomic adds above take a few; no hot-row
timing was made. rows.bound = K bounds the lists (timed since: Note [Slab walk]): a count word a
row gives each token its place; the first K push themselves on the list, the next takes a
slot of float sums (zeroed by the fill) and publishes it, and the later ones wait for it and
add their values there with vector atomics; the rows kernel adds a hot row's slot. It costs
the link kernel a second atomic round trip. rows.early alone: 1783 against 1827 (no gain).

Note [Slab walk] (knob rows.slab_walk = U, with rows.chain): the rows kernel of the row
chains as blocks of whole rows, U * 256 units (row, 16-byte column vector) or fewer a block
of 256 threads. The walk above is latency-bound, not bandwidth-bound: each thread loads its
row's head word and only then stores, and a block holding a named row (about a third of
blocks, with 15% of rows named) waits two or three dependent round trips more, so too few
stores are in flight per SM. Here a block loads its rows' head words once (one load a row,
into shared memory, listing its named rows there), stores the fill to every unit of the rows
no token names, all issued before anything else is waited on, and then each warp takes a
named row, a lane up to four units of it, each list step loading a token's values with its
next token. Hot rows keep rows.bound's slots (Note [Row chains]): a padding row of 2048
tokens walks a list of `bound` and adds one slot of sums.

Until 2026-11-27 13:10 UTC the default (now rows.split False, rows.bound 16: Note [Split
walk] holds the default since) was rows.chain with rows.bound 16, rows.slab_walk 8, rows.kept,
rows.warp_adds and rows.early (rows.chain False gives the four kernels of Note [Row sums]):
two kernels, link and slab walk. Measured on embedding_bwd bf16 50304 x 768 from 8192 tokens, uniform and padded
(2048 on row 0), GB/s under do_bench, every figure against the four kernels of the same run:
(benchmarks/results/: sweep-embedding_slab_walk*.json, kernel-times-embedding-slab-walk.txt)
- H100 80GB HBM3 (2026-11-27 10:16 UTC, ceiling 3013, sweep-embedding_slab_walk.json):
  uniform 2182-2188 (bound 16, kept, no warp adds) against 1837-1840, 2244 unbounded; without
  kept words 2075-2116; the old walk 2151 (unbounded) and 1984 (bound 16). Padded: 445-453
  (warp adds did not exist yet) against 996-998. kernel_times (events): link 5.5 + slab walk
  38.0 us against fill 3.5 + claim 10.2 + add 7.4 + out 40.1.
- H200 (2026-11-27 10:31 UTC, ceiling 4249, sweep-embedding_slab_walk2.json; the round
  asked for an H100): uniform 2760 (twice) against 2225-2251, torch.compile 798, eager
  395; padded 1648-1650 against 1095-1098, torch.compile 686, eager 415 (bound 4: padded
  1718, uniform 2760). kernel_times: uniform link 5.5 + slab walk 29.9 = 35.4 us against
  67.5; padded link 26.4 + slab walk 30.3 = 56.7 against fill 3.3 + claim 12.8 + add 56.2 +
  out 26.7 = 98.9.
  Worse there: 4 units a thread 2550, 16 units 2728, persistent blocks (rows.slab_persist 2
  and 4) 2069 and 2550, registers bounded for 5 blocks an SM 2526 (uniform; padded likewise).
Still short of issue 27's 90% (H100: 72-73% of the ceiling; H200: 65%). Unbounded lists are
3-4% faster on uniform tokens (one atomic a token instead of two) but a padding row walks its
whole list.

Note [Fill first] (knob rows.fill_first, with the slab walk; off): the walk stores the fill
to every unit of its rows before it waits for the link kernel (launched dependent, the link
letting it be placed at once with rows.early), then loads the head words and stores the
named rows again, after a barrier of the block, so their sums land last. The link's time and
the head loads' latency hide behind 77 MB of stores that wait on nothing; the named rows
(about 15% of 77 MB) are written twice. H100 (2026-11-27 12:2x UTC, sweep-embedding_round8):
uniform 2183 GB/s against 2170-2173 for the default of the same run, padded 1396-1423 against
1402-1409: no gain, so the link is not what the walk waits for. Nsight Compute of the slab
walk alone (same card, uniform tokens): 33.7 us, DRAM 61% of peak (2.05 TB/s), 58 registers
(4 blocks an SM, 50% theoretical occupancy, 35% achieved), 19 cycles a warp between issues:
the walk is bound by its blocks' latency chain (head words, then gathers, then stores) at
the occupancy its registers allow, not by bandwidth or by the link (Note [Split walk]).

Note [Matched places] (knob rows.link_match, with rows.warp_adds): the lanes of a link warp
that name one row (__match_any_sync) take their places with one atomic add of their count,
and only the group's first lane past the bound waits for the row's slot (the others take it
by shuffle), where every token of a padding row added one to the same count word and spun on
the same slot word. H100 (2026-11-27 12:4x UTC, sweep-embedding_round9): padded 1404 -> 1470
GB/s (bound 16), 1525 (bound 4), 1518 (bound 8); uniform 2140-2143 against 2166-2171 (-1%).
kernel_times, padded: link 27.4 -> 24.4 us, walk 38.6 -> 36.3 with bound 4 (the hot list of 4,
not 16, a serial walk of DRAM round trips in one warp). The padded link stays long: its 2032
tokens past the bound are in 8 blocks (a padded sequence's last 256 positions) whose 64 warps
each add 32 tokens, four loaded at a time (rows.link_ahead 8 or 16: 820-1266 GB/s, registers
past 113 spill). Note [Walk adds] moves those adds off the critical path.

Note [Split walk] (knob rows.split, with kept words and warp adds; the default): the rows
kernel as two kinds of blocks of one grid (codegen/row_split_cuda.py). The link lists the
named rows (the token at a row's place 0 appends it, a warp's with one atomic; Note [Matched
places] then always on); named blocks, spread evenly over the grid, take a listed row a
warp (its head and slot words read and set back, its list and slot added); fill blocks read
their slab's count words and store the fill to the rows no token names, no gather in them.
Each word has one reader, which sets it back (Note [Kept words]). Uniform tokens gain nothing
from it (H100, sweep-embedding_round10: 2111-2117 GB/s against 2161-2166; Nsight Compute of
the split walk: 34.7 us, DRAM 59%, achieved occupancy 41% against the slab walk's 33.7 us,
61%, 35%): blocks that never gather are not faster, so the walk's latency chain was not what
bounds it. Its worth is Note [Walk adds].

Note [Walk adds] (knob rows.walk_adds, with rows.split; the default, with rows.bound 4): the
link no longer adds the tokens past their row's bound; it lists them with their slots (a
warp's with one atomic) and raises each slot's pending count by its tokens. The split walk's
first HB blocks (a warp CH = 8 listed tokens at a time, min(N / (8 CH), 2 SMs) blocks) add
them to the slots as the link's warps did (Note [Warp adds]: runs on one slot summed in
registers, one vector atomic a column vector a run), fence, and lower the pending counts; the
named warp of a hot row waits (its lane 0 spinning, then a fence) for its slot's count to come
back to -1 before adding the slot. The hot blocks come first in the grid, so they are placed
before any named block that could wait for them (as the link's waits for a slot, this leans
on blocks being placed in index order). A padding row's 2032 tokens past the bound are added
by 254 warps beside the fill's stores, not by the link's 64 warps before the walk can start.
H100 (2026-11-27 ~13:00 UTC, sweep-embedding_round10.json, copy ceiling 3000 GB/s, eager
368-396, every figure against the old default of the same run): padded 1923 GB/s (64% of the
ceiling; 1932 with rows.sorted) against 1402-1409 (+37%), 1680 with bound 16, 1561 split
without walk adds, 1521 with matched places and bound 4 on the slab walk; uniform 2114
against 2161-2166 (-2.3%: matched places -1%, the split blocks -1%). bound 4 (the lists of a
padding row walked by one warp, a DRAM round trip a token) is the new rows.bound default.
Registers: the hot blocks' adds take LV 1 (a column pass of 32 vectors a warp) so the walk
stays at 64 registers, 4 blocks an SM; rows.slab_blocks 5 (48, spills): uniform 1810,
padded 1713. kernel_times (events around each launch) read 65-77 us for these two kernels
where do_bench reads 42-47: the events serialize the dependent launch; compare with do_bench.

Note [Sorted lists] (knob rows.sorted, bounds up to 32): the walk reads a named row's list
into the warp (lane k its k-th token, the head token's first values loaded beside the first
next word, so a row of one token waits no longer), ranks the tokens by shuffles and adds them
in token order: a row named at most `bound` times gets the same bits on every run, whatever
order the link's atomics gave its list (tests/test_row_sums.py checks the bits against sums
in token order). Rows past the bound still add a slot of atomic sums. H100 (sweep-embedding_
round9): uniform 2062-2065 against 2166-2171 (-5%: 74 registers, 3 blocks an SM, and a list's
pointer chase before its values), padded (bound 4) 1492 against 1525; off.

Note [Kept words] (knob rows.kept, with the slab walk): the fill kernel goes. The words are
made -1 (a hot row's sums 0) once, where the plan's scratch is made (LaunchSpec.
workspace_fills; the scratch is kept per stream, Note [Scratch per stream], and a CUDA
graph's capture fills its own), and the slab walk sets back what it read: a named row's head
(and count and slot) words to -1, a slot's sums to 0 as it adds them, block 0 the slots-used
counter. Each row is read by one block only (blocks of whole rows), so no block resets a
word another still reads. Two kernels, link then walk; a run stopped between them (a failed
launch) would leave words set, which only a device error, that ends the context, does.

Note [Warp adds] (knob rows.warp_adds, with rows.bound): the bounded link adds a token past
its row's bound to the row's slot with one thread's 96 vector atomics (768 floats), so a
padding row of 2048 tokens puts 2000 x 768 atomic adds on 768 addresses: its link kernel took
160.1 us of 198.3 (kernel_times, H100, 2026-11-27 10:16 UTC, slab walk with kept words), the
whole op 445-453 GB/s against the four kernels' 996-998. Here the warp adds its tokens past
the bound together: a lane takes up to four column vectors of each, four tokens' values
loaded before any is added, and a run of tokens on one slot (a padded batch's whole warps)
is summed in registers and added with one vector atomic a column vector: 32 times fewer
atomics on a packed padding row, the same count on a row whose tokens are spread.

Note [Row slabs] (knob rows.slab, off until a GPU run decides): every output row written once,
every sum in an order the index alone fixes, so the result is the same on every run (the
deterministic switch keeps these kernels where the knob is on). A reset kernel zeroes a few
words; then a block a slab of rows.slab_rows output rows reads the whole index (every block
the same bytes: L1 and L2 serve them), counts its rows' tokens, lists in index order the
tokens of its rows named at most rows.slab_most times, and writes each row: the fill plus its
tokens' values added in index order, cast once; rows no token names get the fill. A row named
more often is hot: the slab appends it to a hot list and a third kernel splits it over index
segments (a block a segment and hot row, a partial row of float sums each, summed warp by warp
in order), the last of the row's blocks adding the partials in segment order, so a padding row
of thousands of tokens costs no warp more than its segment's share. No atomics touch values;
the index is read by every slab (V / rows.slab_rows times, from cache).

Note [Owned rows] (knob rows.owned; off, slower on the H100): one kernel, no workspace,
no link and no wait between kernels (codegen/row_owned_cuda.py). The grid is one wave
(rows.owned_blocks an SM, rows.owned_threads a block); a block owns R consecutive output
rows, reads the whole index into registers (16 ids a thread at most: 8192 int64 ids are 64 KB,
from L2 after the first block, 17 MB of L2 reads over 264 blocks), counts its rows' tokens,
lists them in token order in shared memory and writes each of its rows once, a warp a row:
the fill, or the fill plus its tokens' values added in token order (so a row's sum has the
same bits on every run and as a sequential sum). A run of 32 aligned tokens on one row (a
padding row's) makes the row hot; every block finds the same hot rows from the same index,
so the slices of a hot row (64 bytes of columns each, a 2048-token row is 3 MB of reads, too
much for one SM) are summed by the grid's last blocks, each its slice's tokens split over its
warps and the partials added in warp order, with no word passed between blocks; the owner
skips the row. With rows.owned_slice_rows D the rows are dealt so that a block summing
slices owns D rows fewer a slice (the partition too is computed alike in every block).
Rows named often without runs stay with their owner's warp. Refused (the default plan then,
the reason in its description) where the index does not fit the registers or the list of N
tokens the 48 KB of shared memory.
H100 (2026-11-27 16:00 UTC, sweep-embedding_owned-nvidia-h100-80gb-hbm3.json, copy ceiling
3002 GB/s, against the default's 2091-2125 uniform and 1926-1931 padded in the same run):
uniform 1896 (rows.owned alone), 2000 (rows.owned_early 64, slice rows 32), 1856 (early 64),
1886 (one block an SM), 1891 (store.hint 1); padded 1663, 1797, 1611, 1793, 1644, and 1788
with slice rows 32 alone. Off: the index read and the counts before any store, in every
block of a single wave at once, cost more than the link and the gap between two kernels.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from codegen import row_owned_cuda as ow
from codegen import row_slabs_cuda as sl
from codegen import row_split_cuda as sp
from codegen import row_sums_cuda as rs
from codegen.cuda_ops import ELEMENT_BYTES
from fusion_cache.frontend.dtypes import DataType

from .base import ArgRef, KernelLaunch, LaunchSpec, OutputSpec, SchedulerRefused
from .reduction.finish import dependent_launch
from .tuning import knob, overriding

SUM_DTYPES = (DataType.Float, DataType.Half, DataType.BFloat16)  # summed in float


def row_sums_refusal(program: Any) -> str | None:
    """Why the row-sums kernels cannot take `program` whatever the sizes (None: they can)."""
    if program.op != "index_put_accumulate" or program.fill is None:
        return "not an accumulate into a constant fill"
    if program.dtype not in SUM_DTYPES:
        return f"sums of {program.dtype!r} (floats, halves and bfloat16s are summed in float)"
    if program.index_read is None or program.source_read is None:
        return "the index or the values are computed in the fusion, not read from memory"
    if program.source_dtype not in SUM_DTYPES:
        return f"values of {program.source_dtype!r}"
    return None


def plan_row_sums(program: Any, values: Any, env: dict, profile: Any,
                  slabs: bool = False) -> LaunchSpec:  # fmt: skip
    """`slabs`: the row slabs (Note [Row slabs]), where slabs_fit says they may."""
    from .scatter_deterministic import _Read

    index = _Read(program.index_read, values, env, program.index_state)
    value = _Read(program.source_read, values, env, program.source_state)
    out_shape = tuple(env[program.out_state])
    out_dtype = program.final_dtype or program.dtype
    n, v = index.shape[0], out_shape[0]
    h = math.prod(out_shape[1:])
    if max(n, v) >= 2**31 - 1:
        raise SchedulerRefused(f"{program.op}: {n} tokens into {v} rows (owners are 32-bit)")
    rest = len(out_shape) - 1
    vstrides = [0 if value.shape[d] == 1 else value.strides[d] for d in range(len(value.shape))]
    vw = _vector_width(out_dtype, program.source_dtype, value, vstrides, values, out_shape)
    index_type = "int" if max(v * h, n * h, _reach(value.shape, vstrides)) < 2**31 else "long long"
    outputs = (OutputSpec(out_shape, out_dtype),)
    work = ((2 * v, DataType.Int32), (max(1, n * h), DataType.Float))
    kernels = []
    blocks = lambda count: (max(1, -(-count // rs.BLOCK)), 1, 1)  # noqa: E731
    block = (rs.BLOCK, 1, 1)
    it = "i32" if index_type == "int" else "i64"
    rest_args: list = []
    rest_types: tuple = ()
    if vw == 1:
        for d in range(rest):
            rest_args += [out_shape[1 + d], vstrides[1 + d]]
        rest_types = (it,) * (2 * rest)
    hv = h // vw
    dep = dependent_launch(profile)  # each kernel readied while the one before it runs
    chain = bool(knob("rows.chain", True))  # Note [Slab walk]: the default
    early = dep and bool(knob("rows.early", chain))
    if knob("rows.owned", False):  # Note [Owned rows]
        owned = _plan_owned(program, index, value, out_shape, out_dtype, index_type, rest_args,
                            rest_types, vw, profile.sm_count)  # fmt: skip
        if isinstance(owned, LaunchSpec):
            return owned
        with overriding({"rows.owned": False}):
            spec = plan_row_sums(program, values, env, profile, slabs)
        return replace(spec, description=f"{spec.description}; owned rows refused: {owned}")
    if slabs:
        return _plan_slabs(program, index, value, out_shape, out_dtype, index_type, rest_args,
                           rest_types, vw, dep, profile)  # fmt: skip
    if chain:
        return _plan_chains(program, index, value, out_shape, out_dtype, index_type, rest_args,
                            rest_types, vw, dep, early, profile.sm_count)  # fmt: skip
    kernels.append(KernelLaunch(rs.FILL_NAME, rs.render_fill(index_type, early), blocks(2 * v),
                                block, ("ptr", it), (ArgRef("workspace", 0), 2 * v)))  # fmt: skip
    if n and h:
        what = f"{program.op} (T{program.out_state})"
        zw = 4 if h % 4 == 0 else 1
        kernels.append(KernelLaunch(
            rs.CLAIM_NAME, rs.render_claim(program.index_dtype, index_type, what, zw, dep, early),
            blocks(n), block, ("ptr", "ptr", "ptr", it, it, it, it),
            (ArgRef("workspace", 0), ArgRef("workspace", 1), index.ref, _s(index, 0), n, v, h),
            dependent=dep))
        kernels.append(KernelLaunch(
            rs.ADD_NAME, rs.render_add(program.index_dtype, program.source_dtype, rest, vw,
                                       index_type, dep, early),
            blocks(n * hv), block, ("ptr", "ptr", "ptr", it, "ptr", it, *rest_types, it, it, it),
            (ArgRef("workspace", 0), ArgRef("workspace", 1), index.ref, _s(index, 0), value.ref,
             _s(value, 0), *rest_args, n, h, hv), dependent=dep))  # fmt: skip
    if v and h:
        kernels.append(KernelLaunch(
            rs.OUT_NAME, rs.render_out(out_dtype, program.source_dtype, rest, vw, index_type,
                                        dep and bool(n and h)),
            blocks(v * hv), block, ("ptr", "ptr", "ptr", "ptr", it, *rest_types, it, it, it, "f32"),
            (ArgRef("output", 0), ArgRef("workspace", 0), ArgRef("workspace", 1), value.ref,
             _s(value, 0), *rest_args, v, h, hv, float(program.fill)),
            dependent=dep and bool(n and h)))  # fmt: skip
    return LaunchSpec("scatter", outputs, work, tuple(kernels),
                      f"{program.op} row sums from {program.fill!r} (Note [Row sums]), "
                      f"vw={vw}, cast to {out_dtype!r}")  # fmt: skip


def slabs_fit(program: Any, env: dict) -> bool:
    """Note [Row slabs]: asked for (the knob rows.slab; the path is deterministic, so it also
    serves FUSION_CACHE_DETERMINISTIC), the row-sums kernels' conditions met, and the slabs'
    index reads (every slab reads the whole index, from cache) at most the output's bytes
    or 4 MB:
    an embedding's gradient 50304 x 768 bf16 from 8192 tokens reads 25 MB of index for 77 MB
    of output in slabs of 128 rows; with 8x the tokens the atomics' kernels take it."""
    if not knob("rows.slab", False) or row_sums_refusal(program) is not None:
        return False
    if program.index_read is None or program.source_read is None:
        return False
    out = tuple(env[program.out_state])
    v, n = out[0], math.prod(env[program.index_state])
    h = math.prod(out[1:])
    if max(n, v) >= 2**31 - 1:
        return False
    slabs = -(-v // max(1, int(knob("rows.slab_rows", 64))))
    out_bytes = ELEMENT_BYTES[program.final_dtype or program.dtype]
    # (or 4 MB, which the caches serve in a few microseconds)
    return slabs * n * ELEMENT_BYTES[program.index_dtype] <= max(v * h * out_bytes, 2**22)


def _plan_slabs(program: Any, index: Any, value: Any, out_shape: tuple, out_dtype: DataType,
                index_type: str, rest_args: list, rest_types: tuple, vw: int, dep: bool,
                profile: Any) -> LaunchSpec:  # fmt: skip
    """Note [Row slabs]: a reset of the hot-row words, the slabs, the hot rows."""
    n, v = index.shape[0], out_shape[0]
    h = math.prod(out_shape[1:])
    hv = h // vw
    rest = len(out_shape) - 1
    if n * max(1, abs(_s(index, 0))) >= 2**31 - 1 and index_type == "int":
        index_type = "long long"
    it = "i32" if index_type == "int" else "i64"
    rows = max(1, int(knob("rows.slab_rows", 64)))
    most = max(1, int(knob("rows.slab_most", 16)))
    seg = max(sl.WARPS * 8, -(-n // sl.MAX_SEGMENTS))  # positions a hot block adds
    segments = max(1, -(-n // seg))
    max_hot = max(1, n // (most + 1))  # a hot row has more than `most` tokens
    parts = max(1, min(n, max_hot * segments))  # partial rows: segments naming a hot row
    blocks = lambda count: (max(1, -(-count // sl.BLOCK)), 1, 1)  # noqa: E731
    block = (sl.BLOCK, 1, 1)
    what = f"{program.op} (T{program.out_state})"
    rows_args = (index.ref, _s(index, 0), value.ref, _s(value, 0), *rest_args)
    rows_types = ("ptr", it, "ptr", it, *rest_types)
    kernels = [KernelLaunch(sl.RESET_NAME, sl.render_reset(index_type), blocks(max(2, max_hot)),
                            block, ("ptr", it), (ArgRef("workspace", 0), max_hot))]
    if v and h:
        kernels.append(KernelLaunch(
            sl.ROWS_NAME, sl.render_rows(out_dtype, program.index_dtype, program.source_dtype,
                                         rest, vw, index_type, what, rows, most),
            (-(-v // rows), 1, 1), block, ("ptr", "ptr", *rows_types, it, it, it, it, "f32"),
            (ArgRef("output", 0), ArgRef("workspace", 0), *rows_args, n, v, h, hv,
             float(program.fill)), dependent=dep))  # fmt: skip
    if v and h and n:
        spread = max(1, min(max_hot, -(-2 * profile.sm_count // segments), 65535))
        kernels.append(KernelLaunch(
            sl.HOT_NAME, sl.render_hot(out_dtype, program.index_dtype, program.source_dtype,
                                       rest, vw, index_type),
            (segments, spread, 1), block,
            ("ptr", "ptr", "ptr", *rows_types, it, it, it, it, "i32", "i32", "f32"),
            (ArgRef("output", 0), ArgRef("workspace", 0), ArgRef("workspace", 1), *rows_args,
             n, h, hv, seg, segments, max_hot, float(program.fill)), dependent=dep))  # fmt: skip
    work = ((sl.words(max_hot, segments), DataType.Int32), (parts * max(1, h), DataType.Float))
    return LaunchSpec("scatter", (OutputSpec(out_shape, out_dtype),), work, tuple(kernels),
                      f"{program.op} row slabs of {rows} from {program.fill!r} (Note [Row "
                      f"slabs]), vw={vw}, cast to {out_dtype!r}")  # fmt: skip


def _plan_owned(program: Any, index: Any, value: Any, out_shape: tuple, out_dtype: DataType,
                index_type: str, rest_args: list, rest_types: tuple, vw: int,
                sms: int) -> LaunchSpec | str:  # fmt: skip
    """Note [Owned rows]: one kernel, a block R output rows; or why not (the index does not
    fit the registers, the list shared memory)."""
    n, v = index.shape[0], out_shape[0]
    h = math.prod(out_shape[1:])
    hv = h // vw
    threads = max(32, min(1024, int(knob("rows.owned_threads", 512)) // 32 * 32))
    threads = min(threads, max(32, -(-n // 32) * 32))  # a few tokens: an id a thread
    per = max(1, -(-n // threads))
    if per > ow.MAX_IDS:
        return f"{n} tokens: more than {ow.MAX_IDS} ids a thread of {threads}"
    blocks = max(1, int(knob("rows.owned_blocks", 2)))
    grid = max(1, min(blocks * sms, v))  # one wave
    slice_rows = max(0, int(knob("rows.owned_slice_rows", 0)))
    rows = -(-v // grid) + (v // grid if slice_rows else 0) + 1  # a block's most rows
    sv = 4 if hv >= 4 else 1  # column vectors a hot slice (64 bytes of bf16 or f32)
    if ow.shared_bytes(threads, rows, n, per, sv, vw) > ow.SHARED_BYTES:
        return (f"{n} tokens and {rows} rows a block: {ow.shared_bytes(threads, rows, n, per, sv, vw)}"
                f" bytes of shared memory")  # fmt: skip
    if max(1, n) << max(1, (rows - 1).bit_length()) >= 2**31:
        return f"{n} tokens of {rows} rows a block: a list entry past 31 bits"
    if not (v and h):
        return "an empty output"
    it = "i32" if index_type == "int" else "i64"
    lv = max(1, min(int(knob("rows.owned_lv", 3)), -(-hv // 32)))
    early = max(0, int(knob("rows.owned_early", 0)))
    what = f"{program.op} (T{program.out_state})"
    source = ow.render_owned(out_dtype, program.index_dtype, program.source_dtype,
                             len(out_shape) - 1, vw, index_type, what, threads, rows, n, per, lv,
                             max(1, int(knob("rows.owned_ahead", 1))), sv, early,
                             max(1, int(knob("rows.owned_hot_ahead", 4))), slice_rows,
                             int(knob("store.hint", 0)), blocks if threads * blocks <= 2048 else 0)
    launch = KernelLaunch(ow.OWNED_NAME, source, (grid, 1, 1), (threads, 1, 1),
                          ("ptr", "ptr", it, "ptr", it, *rest_types, it, it, it, it, "f32"),
                          (ArgRef("output", 0), index.ref, _s(index, 0), value.ref, _s(value, 0),
                           *rest_args, n, v, h, hv, float(program.fill)))  # fmt: skip
    return LaunchSpec("scatter", (OutputSpec(out_shape, out_dtype),), (), (launch,),
                      f"{program.op} owned rows from {program.fill!r} (Note [Owned rows]), "
                      f"{grid} blocks of {threads}, vw={vw}, cast to {out_dtype!r}")


def _plan_chains(program: Any, index: Any, value: Any, out_shape: tuple, out_dtype: DataType,
                 index_type: str, rest_args: list, rest_types: tuple, vw: int, dep: bool,
                 early: bool, sms: int) -> LaunchSpec:  # fmt: skip
    """Note [Row chains]: three kernels on a head word a row and a next word a token; two
    where the slab walk keeps the words between runs (Note [Kept words])."""
    n, v = index.shape[0], out_shape[0]
    h = math.prod(out_shape[1:])
    hv = h // vw
    it = "i32" if index_type == "int" else "i64"
    blocks = lambda count: (max(1, -(-count // rs.BLOCK)), 1, 1)  # noqa: E731
    block = (rs.BLOCK, 1, 1)
    linked = bool(n and h)
    bound = max(0, int(knob("rows.bound", 4)))  # list places a row (0: unbounded)
    units, slab = _walk_units(max(1, hv), bool(bound))
    kept = bool(slab and knob("rows.kept", True))
    if bound:
        return _plan_bounded(program, index, value, out_shape, out_dtype, index_type, rest_args,
                             rest_types, vw, dep, early, units, bound, slab, kept, sms)  # fmt: skip
    kernels = [] if kept else [
        KernelLaunch(rs.FILL_NAME, rs.render_fill(index_type, early and linked), blocks(v), block,
                     ("ptr", it), (ArgRef("workspace", 0), v))]  # fmt: skip
    if linked:
        what = f"{program.op} (T{program.out_state})"
        wait = dep and bool(kernels)
        kernels.append(KernelLaunch(
            rs.LINK_NAME, rs.render_link(program.index_dtype, index_type, what, wait, early),
            blocks(n), block, ("ptr", "ptr", "ptr", it, it, it),
            (ArgRef("workspace", 0), ArgRef("workspace", 1), index.ref, _s(index, 0), n, v),
            dependent=wait))  # fmt: skip
    if v and h:
        wait = dep and bool(kernels)
        kernels.append(KernelLaunch(
            rs.SLAB_WALK_NAME if slab else rs.WALK_NAME,
            _render_walk(out_dtype, program.source_dtype, len(out_shape) - 1, vw, index_type,
                         wait, units, slab, hv, False, kept),
            _walk_grid(v, hv, units, slab, sms), block,
            ("ptr", "ptr", "ptr", "ptr", it, *rest_types, it, it, it, "f32"),
            (ArgRef("output", 0), ArgRef("workspace", 0), ArgRef("workspace", 1), value.ref,
             _s(value, 0), *rest_args, v, h, hv, float(program.fill)), dependent=wait))  # fmt: skip
    work = ((max(1, v), DataType.Int32), (max(1, n), DataType.Int32))
    return LaunchSpec("scatter", (OutputSpec(out_shape, out_dtype),), work, tuple(kernels),
                      f"{program.op} row chains from {program.fill!r} (Note [Row chains]), "
                      f"{_walk_words(units, slab, kept)}vw={vw}, cast to {out_dtype!r}",
                      workspace_fills=(-1, None) if kept else ())  # fmt: skip


def _plan_bounded(program: Any, index: Any, value: Any, out_shape: tuple, out_dtype: DataType,
                  index_type: str, rest_args: list, rest_types: tuple, vw: int, dep: bool,
                  early: bool, units: int, bound: int, slab: int, kept: bool,
                  sms: int) -> LaunchSpec:  # fmt: skip
    """Note [Row chains], bounded: lists of at most `bound` tokens, the rest of a hot row's
    tokens added to a slot of float sums. Words: head [V], count [V], slot [V], slots used."""
    n, v = index.shape[0], out_shape[0]
    h = math.prod(out_shape[1:])
    hv = h // vw
    rest = len(out_shape) - 1
    it = "i32" if index_type == "int" else "i64"
    blocks = lambda count: (max(1, -(-count // rs.BLOCK)), 1, 1)  # noqa: E731
    block = (rs.BLOCK, 1, 1)
    linked = bool(n and h)
    # Note [Split walk]: with kept words and the warp adds, the link lists the named rows;
    # the slab walk's own knobs (fill first, persistent blocks) take the slab walk
    split = bool(slab and kept and knob("rows.warp_adds", True) and knob("rows.split", True)
                 and not knob("rows.fill_first", False) and not knob("rows.slab_persist", 0))
    named = min(n, v) if split else 0  # the list of named rows, after two counters
    hot_rows = max(1, n // (bound + 1))  # at most n / (bound + 1) hot rows
    # Note [Walk adds]: then a counter, the hot tokens and their slots, a pending count a slot
    walk_adds = split and bool(n) and bool(knob("rows.walk_adds", True))
    words = 3 * v + 1 + (named + 1 if split else 0) + (1 + 2 * n + hot_rows if walk_adds else 0)
    sums = hot_rows * h
    kernels = [] if kept else [
        KernelLaunch(rs.FILL_NAME, rs.render_fill_bounded(index_type, early and linked),
                     blocks(max(words, sums)), block, ("ptr", it, "ptr", it),
                     (ArgRef("workspace", 0), words, ArgRef("workspace", 2), sums))]  # fmt: skip
    if linked:
        what = f"{program.op} (T{program.out_state})"
        wait = dep and bool(kernels)
        if knob("rows.warp_adds", True):  # Note [Warp adds]
            link = rs.render_link_warp_adds(program.index_dtype, program.source_dtype, rest, vw,
                                            index_type, what, bound, hv, wait, early,
                                            max(1, int(knob("rows.link_ahead", 4))),
                                            split or bool(knob("rows.link_match", False)),
                                            split, walk_adds)
        else:
            link = rs.render_link_bounded(program.index_dtype, program.source_dtype, rest, vw,
                                          index_type, what, bound, wait, early)
        link_block = min(rs.BLOCK, max(32, int(knob("rows.link_block", rs.BLOCK)) // 32 * 32))
        kernels.append(KernelLaunch(
            rs.LINK_NAME, link,
            (max(1, -(-n // link_block)), 1, 1), (link_block, 1, 1),
            ("ptr", "ptr", "ptr", "ptr", it, "ptr", it, *rest_types, it, it, it),
            (ArgRef("workspace", 0), ArgRef("workspace", 1), ArgRef("workspace", 2), index.ref,
             _s(index, 0), value.ref, _s(value, 0), *rest_args, n, v, h), dependent=wait))
    if v and h and split:
        wait = dep and bool(kernels)
        hot = sp.hot_blocks(n, sms) if walk_adds else 0
        kernels.append(KernelLaunch(
            sp.SPLIT_WALK_NAME,
            sp.render_split_walk(out_dtype, program.source_dtype, rest, vw, index_type, hv,
                                 wait, units, int(knob("store.hint", 0)),
                                 int(knob("rows.slab_blocks", 0)), sorted_lists(True), hot),
            (hot + sp.named_blocks(named) + -(-v // slab), 1, 1), block,
            ("ptr", "ptr", "ptr", "ptr", "ptr", it, *rest_types, it, it, it, "f32", "i32",
             *(("i32",) if hot else ())),
            (ArgRef("output", 0), ArgRef("workspace", 0), ArgRef("workspace", 2),
             ArgRef("workspace", 1), value.ref, _s(value, 0), *rest_args, v, h, hv,
             float(program.fill), named, *((n,) if hot else ())), dependent=wait))  # fmt: skip
    elif v and h:
        wait = dep and bool(kernels)
        kernels.append(KernelLaunch(
            rs.SLAB_WALK_NAME if slab else rs.WALK_NAME,
            _render_walk(out_dtype, program.source_dtype, rest, vw, index_type, wait, units,
                         slab, hv, True, kept),
            _walk_grid(v, hv, units, slab, sms), block,
            ("ptr", "ptr", "ptr", "ptr", "ptr", it, *rest_types, it, it, it, "f32"),
            (ArgRef("output", 0), ArgRef("workspace", 0), ArgRef("workspace", 2),
             ArgRef("workspace", 1), value.ref, _s(value, 0), *rest_args, v, h, hv,
             float(program.fill)), dependent=wait))  # fmt: skip
    work = ((words, DataType.Int32), (max(1, n), DataType.Int32), (sums, DataType.Float))
    return LaunchSpec("scatter", (OutputSpec(out_shape, out_dtype),), work, tuple(kernels),
                      f"{program.op} row chains of at most {bound} from {program.fill!r} (Note "
                      f"[Row chains]), {'split ' if split else ''}"
                      f"{_walk_words(units, slab, kept)}vw={vw}, cast to "
                      f"{out_dtype!r}{', hot tokens added in the walk' if walk_adds else ''}",
                      workspace_fills=(-1, None, 0.0) if kept else ())  # fmt: skip


def _walk_units(hv: int, bounded: bool) -> tuple[int, int]:
    """(units a walk thread takes, rows of a block's slab or 0): rows.slab_walk units (8 by
    default) in a slab walk (Note [Slab walk]), at most 8192 words of shared memory; with
    rows.slab_walk 0, the walk of rows.units."""
    units = max(0, int(knob("rows.slab_walk", 8)))
    if not units:
        return max(1, int(knob("rows.units", 1))), 0
    while units > 1 and rs.slab_rows_of(hv, units) * (3 if bounded else 2) > 8192:
        units //= 2
    return units, rs.slab_rows_of(hv, units)


def _walk_grid(v: int, hv: int, units: int, slab: int, sms: int) -> tuple[int, int, int]:
    """A block `units` units a thread, or (the slab walk) a block `slab` whole rows, or
    rows.slab_persist blocks an SM taking the slabs in turn."""
    threads = -(-v * hv // units)
    count = -(-v // slab) if slab else -(-threads // rs.BLOCK)
    persist = int(knob("rows.slab_persist", 0)) if slab else 0
    return (max(1, min(count, persist * sms) if persist else count), 1, 1)


def _render_walk(out_dtype: DataType, value_dtype: DataType, rest: int, vw: int,
                 index_type: str, dep: bool, units: int, slab: int, hv: int, bounded: bool,
                 kept: bool) -> str:  # fmt: skip
    """The rows kernel of the row chains: the slab walk (Note [Slab walk], its stores'
    cache hint store.hint) where `slab`, else the walk of `units` units a thread."""
    if slab:
        return rs.render_slab_walk(out_dtype, value_dtype, rest, vw, index_type, hv, dep, units,
                                   bounded, kept, int(knob("store.hint", 0)),
                                   int(knob("rows.slab_blocks", 0)),
                                   bool(knob("rows.slab_persist", 0)),
                                   bool(knob("rows.fill_first", False)),
                                   sorted_lists(bounded))  # fmt: skip
    return rs.render_walk(out_dtype, value_dtype, rest, vw, index_type, dep, units, bounded)


def sorted_lists(bounded: bool) -> bool:
    """Note [Sorted lists] (knob rows.sorted): lists bounded at 32 tokens or fewer, summed in
    token order."""
    return bounded and 0 < int(knob("rows.bound", 4)) <= 32 and bool(knob("rows.sorted", False))


def _walk_words(units: int, slab: int, kept: bool) -> str:
    if not slab:
        return ""
    return (f"slab walk of {slab} rows a block ({units} units a thread)"
            f"{', words kept between runs' if kept else ''}, ")  # fmt: skip


def _s(t: Any, d: int) -> int:
    return 0 if t.shape[d] == 1 else t.strides[d]


def _reach(shape: tuple, strides: list) -> int:
    return 1 + sum((n - 1) * abs(s) for n, s in zip(shape, strides))


def _vector_width(out_dtype: DataType, value_dtype: DataType, value: Any, strides: list,
                  values: Any, out_shape: tuple) -> int:  # fmt: skip
    """Columns a thread takes: 16 bytes of the output where the value rows are contiguous
    (their dims after the first collapse to one of stride 1) and aligned; else one."""
    rest_shape, rest_strides = value.shape[1:], strides[1:]
    if tuple(rest_shape) != tuple(out_shape[1:]):  # broadcast along a row
        return 1
    h = math.prod(out_shape[1:])
    expect = 1
    for n, s in reversed(list(zip(rest_shape, rest_strides))):
        if n != 1 and s != expect:
            return 1
        expect *= n
    ptr = values[value.ref.index].data_ptr()
    vw = max(1, 16 // ELEMENT_BYTES[out_dtype])
    while vw > 1 and (h % vw or strides[0] % vw or ptr % (vw * ELEMENT_BYTES[value_dtype])):
        vw //= 2
    return vw
