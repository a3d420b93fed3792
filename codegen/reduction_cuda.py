"""Render reduction programs (Note [Reduction loop space]) as CUDA kernels.

Inner kernel: TX threads per row, TY rows per block; one pass over the row per reduction
stage and a last pass for element-level outputs, reading loads from registers when the row
fits (ITERS > 0), from memory (L2 in practice) otherwise.
Outer kernels: threads own VEC consecutive columns, TY threads and SPLIT blocks share the
reduced dim; with SPLIT > 1 a second kernel combines the partial results in a fixed order.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .cuda_ops import MEMORY_TYPE, REGISTER_TYPE
from .kernel_ir import ReductionProgram, needed
from .prelude import prelude_source
from .stmt_cuda import render_stmt, scalar_arg_types, scalar_params, to_memory

INNER_NAME = "fc_inner_reduction"
OUTER_NAME = "fc_outer_reduction"
FINISH_NAME = "fc_outer_finish"


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
    # schedulers/reduction.py); 0: load_hint
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
                f"{', deferred row end' if self.defer else ''}"
                f"{', alternating row buffers' if self.alternate and self.tx > 32 else ''}"
                f"{self._staged()}"
                f"{', weights in ' + _WEIGHTS_IN[self.weights] if self.weights and self.iters else ''}"
                f"{f', {self.min_blocks} blocks/SM' if self.min_blocks else ''}"
                f"{f', hints {self.load_hint}{self.store_hint}' if self.load_hint or self.store_hint else ''}")  # fmt: skip


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

    def describe(self) -> str:
        return (f"outer {self.tx}x{self.ty} threads, vec {self.vec}, split {self.split}"
                f"{' in a cluster' if self.cluster else ''}, unroll {self.unroll}, {self.index_type}"
                f"{f', hint {self.load_hint}' if self.load_hint else ''}")  # fmt: skip


_IDENTITY = {"sum": "fc_op_sum", "prod": "fc_op_prod", "max": "fc_op_max", "min": "fc_op_min"}


def _op_functor(red) -> str:
    rt = REGISTER_TYPE[red.dtype]
    if red.op == "welford":
        return f"fc_op_welford<{rt}, int>()"
    return f"{_IDENTITY[red.op]}<{rt}>()"


def _acc_type(red) -> str:
    rt = REGISTER_TYPE[red.dtype]
    return f"fc_welford<{rt}, int>" if red.op == "welford" else rt


def _accumulate(red, value: str, dtypes: dict, acc: str | None = None) -> str:
    from .cuda_ops import convert

    acc = acc or red.var
    x = convert(value, dtypes[value], red.dtype)
    if red.op == "welford":
        return f"{acc} = fc_welford_update({acc}, {x});"
    return f"{acc} = {_op_functor(red)}({acc}, {x});"


def _merged(reds, merge: bool = True) -> list[list]:
    """Reductions combined together (Note [Merged row reductions] in prelude/reduce.cuh):
    those of one scalar accumulator type; Welford triples, and all with `merge` off, go alone."""
    groups: dict[str, list] = {}
    for r in reds:
        groups.setdefault(r.var if r.op == "welford" or not merge else _acc_type(r), []).append(r)
    return list(groups.values())


def one_exchange(program: ReductionProgram, merge: bool) -> bool:
    """Whether a row's reductions travel in one exchange, after one pass (Note [Deferred row
    end] in prelude/reduce.cuh): one stage of plain reductions that combine together."""
    return (program.stages == 1 and not any(r.op == "welford" for r in program.reductions)
            and len(_merged(program.reductions, merge)) == 1)  # fmt: skip


def _row_stmts(program: ReductionProgram, stage: int, dtypes: dict, load) -> list[str]:
    stage_of = dict(program.stage_of)
    out = []
    for st in program.stmts:
        if st.op == "reduce" or st.var in program.element_vars or stage_of[st.var] != stage:
            continue
        out.append(render_stmt(st, dtypes, load))
    return out


def _row_divisions(program: ReductionProgram) -> dict[str, tuple[str, str]]:
    """Element-level float divisions by a row-level value: var -> (divisor, C type), rendered
    as multiplications by the divisor's reciprocal (Note [Row divisors], prelude/math.cuh)."""
    out = {}
    for st in program.stmts:
        if st.op not in ("div", "truediv") or st.compute is None:
            continue
        ct = REGISTER_TYPE[st.compute]
        x, y = st.operands
        if ct in ("float", "double") and x in program.element_vars and (
                y not in program.element_vars):  # fmt: skip
            out[st.var] = (y, ct)
    return out


def _stored(program: ReductionProgram, dtypes: dict, var: str, dtype) -> str:
    """The memory form of `var`. A float value cast down to the stored 16-bit dtype is stored
    from the float: rounding once more would give the same bits after two more conversions."""
    st = next(s for s in program.stmts if s.var == var)
    if st.op == "cast" and st.dtype is dtype and MEMORY_TYPE[dtype] in ("fc_half", "fc_bf16"):
        (src,) = st.operands
        if REGISTER_TYPE[dtypes[src]] == "float":
            return to_memory(src, dtype)
    return to_memory(var, dtype)


def _render_row_division(st, dtypes: dict) -> str:
    from .cuda_ops import convert
    from .stmt_cuda import decl

    x, y = st.operands
    expr = f"fc_div_by({convert(x, dtypes[x], st.compute)}, {y}_d)"
    if REGISTER_TYPE[st.compute] != REGISTER_TYPE[st.dtype]:
        expr = convert(expr, st.compute, st.dtype)
    return decl(REGISTER_TYPE[st.dtype], st.var, expr)


def acc_type(dtype) -> str:
    """The register type column partials are summed in."""
    return "double" if REGISTER_TYPE[dtype] == "double" else "float"


def _params(program: ReductionProgram, dims: int, extra: list[str], k2: bool = False,
            acc: tuple[int, ...] = ()) -> list[str]:  # fmt: skip
    params = []
    for prefix, items in (("a", program.accesses), ("o", program.stores)):
        for i, item in enumerate(items):
            ptr = (f"const {MEMORY_TYPE[item.dtype]}*" if prefix == "a" else
                   f"{acc_type(item.dtype) if i in acc else MEMORY_TYPE[item.dtype]}*")  # fmt: skip
            params.append(f"{ptr} {prefix}{i}")
            params += [f"idx_t {prefix}{i}_s{d}" for d in range(dims)] + [f"idx_t {prefix}{i}_k"]
            if k2:
                params.append(f"idx_t {prefix}{i}_k0")
    params += extra
    params += scalar_params(program)
    return params


def inner_arg_types(program: ReductionProgram, v: InnerVariant) -> tuple[str, ...]:
    idx = "i32" if v.index_type == "int" else "i64"
    per = ("ptr",) + (idx,) * (v.i_rank + 1 + v.k2)
    scal = scalar_arg_types(program)
    sizes = (idx,) * (v.i_rank + 2 + v.k2)
    finish = ("ptr",) * (len(v.finish) + 1) if v.finish else ()  # the outputs, the barrier
    return per * (len(program.accesses) + len(program.stores)) + sizes + scal + finish


def _k_offset(name: str, k: str, k2: bool, unit: bool = False) -> str:
    """Offset of reduced element `k` in tensor `name` (Note [Two reduced dims]); `unit`:
    the innermost reduced stride is 1."""
    inner = f"({k})" if unit else f"({k}) * {name}_k"
    if not k2:
        return inner
    inner = f"(({k}) % K1)" if unit else f"(({k}) % K1) * {name}_k"
    return f"(({k}) / K1) * {name}_k0 + {inner}"


def render_inner(program: ReductionProgram, v: InnerVariant) -> str:
    dtypes = {s.var: s.dtype for s in program.stmts}
    n_acc = len(program.accesses)
    L: list[str] = [prelude_source("core", "math", "reduce"), f"typedef {v.index_type} idx_t;",
                    f"#define FC_VEC {v.vec}", f"#define FC_TX {v.tx}", f"#define FC_TY {v.ty}",
                    f"#define FC_CLUSTER {v.cluster}"]  # fmt: skip
    extra = ["idx_t rows", "idx_t N"] + [f"idx_t n{d}" for d in range(v.i_rank)]
    extra += ["idx_t K1"] if v.k2 else []
    threads = v.tx * v.ty
    bounds = f"{threads}, {v.min_blocks}" if v.min_blocks > 1 else f"{threads}"
    dims = " __cluster_dims__(FC_CLUSTER, 1, 1)" if v.cluster > 1 else ""
    L.append(f'extern "C" __global__ void{dims} __launch_bounds__({bounds}) {INNER_NAME}(')
    params = _params(program, v.i_rank, extra, v.k2, v.acc)
    params += [f"{t}* __restrict__ fin{k}" for k, t in zip(v.acc, v.finish)]
    params += ["unsigned* __restrict__ fc_bar"] if v.finish else []
    L.append("    " + ",\n    ".join(params) + ") {")
    two_pass_all = [r for r in program.reductions if r.op == "welford" and v.iters > 0]
    # each stage's block reductions but the two-pass ones, as they travel together
    combined = {stage: _merged((r for r in program.reductions
                                if r.stage == stage and r not in two_pass_all), v.merge)
                for stage in range(1, program.stages + 1)}  # fmt: skip
    shared_types = {REGISTER_TYPE[r.dtype] for r in two_pass_all}
    for group in (g for groups in combined.values() for g in groups):
        ct = _acc_type(group[0])
        shared_types.add(ct if len(group) == 1 else f"fc_multi<{ct}, {len(group)}>")
    for t in sorted(shared_types):
        # Note [Alternating row buffers]: two buffers, and a count of the calls using them
        L.append(f"  __shared__ {t} smem_{_ident(t)}[{64 if v.alternate else 32}];")
        if v.alternate:
            L.append(f"  unsigned rr_{_ident(t)} = 0;")
        if v.cluster > 1:
            L.append(f"  __shared__ {t} cl_{_ident(t)}[2 * FC_TY * FC_CLUSTER];")
    L.append("  const int tx = threadIdx.x;")
    if v.cluster > 1:  # this block's slice [k_lo, k_hi) of every row (Note [Cluster rows])
        # fc_cluster_reduce hands each block its partial from one thread of the row
        L.append('  static_assert(FC_TX >= FC_CLUSTER, "a row needs a thread per block of its cluster");')
        L.append("  const unsigned cl_rank = fc_cluster_rank();")
        if v.exchange_async:  # Note [Cluster exchange]
            L.append("  __shared__ unsigned long long cl_bars[2 * FC_TY];")
            L.append("  fc_cluster_bars_init(cl_bars, 2 * FC_TY);")
            L.append("  unsigned cl_call = 0;")
        else:
            L.append("  unsigned cl_phase = 0;")
        L.append("  const idx_t chunk = ((N + FC_CLUSTER - 1) / FC_CLUSTER + FC_VEC - 1) / FC_VEC * FC_VEC;")
        L.append("  const idx_t k_lo = (idx_t)cl_rank * chunk;")
        L.append("  const idx_t k_hi = k_lo + chunk < N ? k_lo + chunk : N;")
    else:
        L.append("  const idx_t k_lo = 0, k_hi = N;")
    for k in v.acc:
        at = acc_type(program.stores[k].dtype)
        L.append(f"  {at} acc{k}[{v.iters}][FC_VEC];")
        L.append("#pragma unroll")
        L.append(f"  for (int it = 0; it < {v.iters}; ++it) for (int j = 0; j < FC_VEC; ++j) acc{k}[it][j] = 0;")
    tensors = [("a", i) for i in range(n_acc)] + [("o", i) for i in range(len(program.stores))]

    def row_offsets(row: str, pre: str, which: Sequence[int]) -> list[str]:
        """Offsets of row `row` in the tensors numbered `which`: {pre}a0_row, ..."""
        out = [f"const idx_t {pre}row = {row};", f"const bool {pre}row_ok = {pre}row < rows;",
               f"idx_t {pre}rem = {pre}row_ok ? {pre}row : 0;"]  # fmt: skip
        for d in range(v.i_rank - 1, 0, -1):
            out.append(f"const idx_t {pre}c{d} = {pre}rem % n{d}; {pre}rem /= n{d};")
        out.append(f"const idx_t {pre}c0 = {pre}rem;")
        for k in which:
            p, i = tensors[k]
            terms = [f"{pre}c{d} * {p}{i}_s{d}" for d in range(v.i_rank) if v.live[k][d]] or ["0"]
            out.append(f"const idx_t {pre}{p}{i}_row = {' + '.join(terms)};")
        return out

    def stage_chunk(slot: str, c: int) -> str:  # this thread's 16 bytes of cached input c
        return (f"fc_stage[(((({slot}) * {len(v.cached)} + {c}) * FC_TY + threadIdx.y) * {v.iters}"
                " + it) * FC_TX + tx]")  # fmt: skip

    # Note [Row pipeline]: the row-level loads (layer norm backward's mean and rstd) of the
    # next row group are loaded ahead too, into registers, so that no load of the row's own
    # waits on memory once its stage has arrived
    row_level = [i for i in range(n_acc) if v.modes[i] == "row"] if v.pipeline else []

    def prefetch(row0: str, slot: str) -> list[str]:
        """cp.async of the cached inputs of row group `row0` into stage `slot`, and loads of
        its row-level values into registers."""
        out = ["{"] + ["  " + x for x in row_offsets(f"{row0} + threadIdx.y", "p_",
                                                   [*v.cached, *row_level])]  # fmt: skip
        for i in row_level:
            mt = MEMORY_TYPE[program.accesses[i].dtype]
            out.append(f"  a{i}_next = p_row_ok ? a{i}[p_a{i}_row] : {mt}();")
        out += ["#pragma unroll", f"  for (int it = 0; it < {v.iters}; ++it) {{",
                "    const idx_t kb = k_lo + ((idx_t)it * FC_TX + tx) * FC_VEC;",
                "    const bool ok = p_row_ok && kb < k_hi;"]  # fmt: skip
        for c, i in enumerate(v.cached):
            at = _k_offset(f"a{i}", "kb", v.k2, unit=True)
            out.append(f"    fc_cp_async16(&{stage_chunk(slot, c)}, ok ? a{i} + p_a{i}_row + {at} "
                       f": a{i}, ok);")  # fmt: skip
        return out + ["  }", "}"]

    first_row0 = "(idx_t)(blockIdx.x / FC_CLUSTER) * FC_TY"
    row_step = "(idx_t)(gridDim.x / FC_CLUSTER) * FC_TY"
    loop_at = len(L)  # where weights kept in registers load, before the row loop
    if v.pipeline:
        # Note [Row pipeline]: stage slot^1 fills with the next row group while this one runs;
        # deferred (Note [Deferred row end]), a ring of three stages
        stages, after = (3, "slot == 2u ? 0u : slot + 1u") if v.defer else (2, "slot ^ 1u")
        L.append(f"  extern __shared__ uint4 fc_stage[];  // [{stages}][cached][TY][ITERS][TX] chunks")
        L.extend(f"  {MEMORY_TYPE[program.accesses[i].dtype]} a{i}_next;" for i in row_level)
        L.extend("  " + x for x in prefetch(first_row0, "0"))
        L.append("  fc_cp_async_commit();")
        L.append("  unsigned slot = 0;")
        if v.defer:  # the row group whose last pass is still to run
            L.extend(f"  {MEMORY_TYPE[program.accesses[i].dtype]} a{i}_prev = 0;" for i in row_level)
            L.append("  idx_t prev0 = 0;")
            L.append("  bool have_prev = false;")
        L.append(f"  for (idx_t row0 = {first_row0}; row0 < rows; row0 += {row_step}, slot = {after}) {{")
        L.extend(f"    const {MEMORY_TYPE[program.accesses[i].dtype]} a{i}_now = a{i}_next;"
                 for i in row_level)  # fmt: skip
        L.extend("    " + x for x in prefetch(f"row0 + {row_step}", after))
        L.append("    fc_cp_async_commit();")
        L.append("    fc_cp_async_wait<1>();")
    else:
        L.append(f"  for (idx_t row0 = {first_row0}; row0 < rows; row0 += {row_step}) {{")
    L.extend("    " + x for x in row_offsets("row0 + threadIdx.y", "", range(len(tensors))))

    def row_load(i: int) -> str:
        if i in row_level:
            return f"a{i}_now"
        return f"(row_ok ? a{i}[a{i}_row] : {MEMORY_TYPE[program.accesses[i].dtype]}())"

    def elem_load(i: int) -> str:
        if i in hoisted:
            return f"a{i}_w1[j]" if v.weights == "shared" else f"a{i}_w[it][j]"
        if cached and i in v.cached:
            return f"a{i}_s[j]" if v.rows_in_smem else f"a{i}_c[it][j]"
        return f"a{i}_l[j]"

    def fetch(i: int, kb: str, into: str) -> list[str]:
        """Statements loading the vector at `kb` of access i into `into` (an fc_vec or an
        array of FC_VEC values), zeros where !ok."""
        mt = MEMORY_TYPE[program.accesses[i].dtype]
        if v.modes[i] == "vec":
            at = _k_offset(f"a{i}", kb, v.k2, unit=True)
            hint = v.weight_hint if v.weight_hint and i in shared_by_rows else v.load_hint
            return [f"{into} = fc_load_vec_if<FC_VEC, {hint}>(a{i} + a{i}_row + {at}, ok);"]
        at = _k_offset(f"a{i}", f"{kb} + j", v.k2)
        return ["#pragma unroll",
                f"for (int j = 0; j < FC_VEC; ++j) {into}[j] = ok ? a{i}[a{i}_row + {at}] : {mt}();"]  # fmt: skip

    cached = v.iters > 0
    # element-level inputs no row stride reaches: every row reads them again (the weights)
    shared_by_rows = {i for i in range(n_acc) if v.modes[i] != "row" and not any(v.live[i])}
    # Note [Weights loaded once]
    hoisted = [i for i in sorted(shared_by_rows) if v.weights and cached and i not in v.cached]
    in_smem = v.weights == "shared" and bool(hoisted)

    def weight_chunk(w: int) -> str:  # this thread's 16 bytes of hoisted weight w, this `it`
        return f"fc_wts[((({w}) * FC_TY + threadIdx.y) * {v.iters} + it) * FC_TX + tx]"

    weights = [f"  fc_vec<{MEMORY_TYPE[program.accesses[i].dtype]}, FC_VEC> a{i}_w[{v.iters}];"
               for i in hoisted if not in_smem]  # fmt: skip
    if in_smem:
        weights.append("  extern __shared__ uint4 fc_wts[];  // [weights][TY][ITERS][TX] chunks")
    weights += ["#pragma unroll", f"  for (int it = 0; it < {v.iters}; ++it) {{",
                "    const idx_t kb = k_lo + ((idx_t)it * FC_TX + tx) * FC_VEC;",
                "    const bool ok = kb < k_hi;"]  # fmt: skip
    for w, i in enumerate(hoisted):
        if in_smem:
            at = _k_offset(f"a{i}", "kb", v.k2, unit=True)
            weights.append(f"    fc_cp_async16(&{weight_chunk(w)}, ok ? a{i} + {at} : a{i}, ok);")
        else:
            weights += [f"    {{ const idx_t a{i}_row = 0;",
                        *("      " + line for line in fetch(i, "kb", f"a{i}_w[it]")), "    }"]
    weights.append("  }")
    if in_smem:
        weights.append("  fc_cp_async_commit();  // waited for by the first pass reading them")
    L[loop_at:loop_at] = weights if hoisted else []
    if cached and not v.rows_in_smem:  # the row's own data to registers once; weights: L1/L2
        for i in v.cached:  # whole vectors: 16-bit values stay two to a register
            mt = MEMORY_TYPE[program.accesses[i].dtype]
            L.append(f"    fc_vec<{mt}, FC_VEC> a{i}_c[{v.iters}];")
        L.append("#pragma unroll")
        L.append(f"    for (int it = 0; it < {v.iters}; ++it) {{")
        if not v.pipeline:  # the pipelined copies read zeros past the row's end instead
            L.append("      const idx_t kb = k_lo + ((idx_t)it * FC_TX + tx) * FC_VEC;")
            L.append("      const bool ok = row_ok && kb < k_hi;")
        for c, i in enumerate(v.cached):
            mt = MEMORY_TYPE[program.accesses[i].dtype]
            if v.pipeline:  # arrived in shared memory (zeros past the row's end)
                L.append(f"      a{i}_c[it] = *reinterpret_cast<const fc_vec<{mt}, FC_VEC>*>"
                         f"(&{stage_chunk('slot', c)});")  # fmt: skip
            else:
                L.extend("      " + line for line in fetch(i, "kb", f"a{i}_c[it]"))
        L.append("    }")

    carried: set[str] = set()  # element values kept in registers by an earlier pass

    def element_pass(targets: list[str], body_end: list[str], carry: Sequence[str] = (),
                     pre: Sequence[str] = (), post: Sequence[str] = ()) -> None:
        """One pass over the row computing `targets`; per vector: `pre` lines, then per
        element the statements and `body_end`, then `post` lines."""
        stmts, reads = needed(program, targets, frozenset(carried))
        loads = sorted({s.operands[0] for s in stmts if s.op == "load"})
        for var in carry:
            L.append(f"    {REGISTER_TYPE[dtypes[var]]} {var}_c[{v.iters}][FC_VEC];")
        if in_smem and any(i in hoisted for i in loads):  # the weights have landed
            L.append("    fc_cp_async_wait<0>();")
        if cached:
            L.append("#pragma unroll")
            L.append(f"    for (int it = 0; it < {v.iters}; ++it) {{")
            L.append("      const idx_t kb = k_lo + ((idx_t)it * FC_TX + tx) * FC_VEC;")
        else:
            if v.unroll > 1:
                L.append(f"#pragma unroll {v.unroll}")
            L.append("    for (idx_t kb = k_lo + (idx_t)tx * FC_VEC; kb < k_hi; kb += FC_TX * FC_VEC) {")
        L.append("      const bool ok = row_ok && kb < k_hi;")
        for i in loads:
            if i in v.cached and v.rows_in_smem:  # this vector of the row, from its stage
                mt = MEMORY_TYPE[program.accesses[i].dtype]
                chunk = stage_chunk("slot", v.cached.index(i))
                L.append(f"      const fc_vec<{mt}, FC_VEC> a{i}_s = *reinterpret_cast<const "
                         f"fc_vec<{mt}, FC_VEC>*>(&{chunk});")  # fmt: skip
            elif i in hoisted and in_smem:  # this vector of the weight, from shared memory
                mt = MEMORY_TYPE[program.accesses[i].dtype]
                L.append(f"      const fc_vec<{mt}, FC_VEC> a{i}_w1 = *reinterpret_cast<const "
                         f"fc_vec<{mt}, FC_VEC>*>(&{weight_chunk(hoisted.index(i))});")  # fmt: skip
            elif not (cached and i in v.cached) and i not in hoisted:  # read as a{i}_c, a{i}_w
                mt = MEMORY_TYPE[program.accesses[i].dtype]
                L.append(f"      fc_vec<{mt}, FC_VEC> a{i}_l;")
                L.extend("      " + line for line in fetch(i, "kb", f"a{i}_l"))
        L.extend("      " + line for line in pre)
        L.append("#pragma unroll")
        L.append("      for (int j = 0; j < FC_VEC; ++j) {")
        for var in reads:
            L.append(f"        const {REGISTER_TYPE[dtypes[var]]} {var} = {var}_c[it][j];")
        for st in stmts:
            L.append("        " + (_render_row_division(st, dtypes) if st.var in divisions
                                   else render_stmt(st, dtypes, elem_load)))  # fmt: skip
        for var in carry:
            L.append(f"        {var}_c[it][j] = {var};")
        L.extend("        " + line for line in body_end)
        L.append("      }")
        L.extend("      " + line for line in post)
        L.append("    }")
        carried.update(carry)

    def carry_for(reds: list) -> list[str]:
        """Reduction inputs that later passes read again, if registers allow keeping them."""
        if not cached or v.defer:  # a deferred last pass runs after the next row's first
            return []
        later = [r.input for r in program.reductions if r.stage > reds[0].stage]
        later += [s.var for k, s in enumerate(program.stores) if not program.store_rowlevel[k]]
        reused = set()
        for t in later:
            reused.update(st.var for st in needed(program, [t])[0])
        # a cast of a cached load costs an instruction to redo; carried, it would double the
        # registers a 16-bit row takes (layer norm bf16 spilled at 64 registers)
        out = [r.input for r in reds if r.input in reused and
               any(st.op not in ("load", "cast") for st in needed(program, [r.input])[0])]  # fmt: skip
        # registers spoken for: the cached row, or for a row read from memory its column
        # partials (beside a cached row they fit: its 16-bit values pack two a register)
        budget = 64 - v.iters * v.vec * ((0 if v.rows_in_smem else len(v.cached)) or len(v.acc))
        return out if v.iters * v.vec * len(out) <= budget else []

    divisions = _row_divisions(program)

    def row_stmts(stage: int) -> None:
        """The row-level statements of `stage`, then the reciprocals of the row divisors
        they define (Note [Row divisors] in prelude/math.cuh)."""
        L.extend("    " + s for s in _row_stmts(program, stage, dtypes, row_load))
        stage_of = dict(program.stage_of)
        for y, ct in sorted(set(divisions.values())):
            if stage_of.get(y, 0) == stage and y not in program.element_vars:
                L.append(f"    const fc_divisor<{ct}> {y}_d = fc_divisor_of(({ct}){y});")

    def row_reduce(var: str, ctype: str, op: str) -> str:
        """`var` reduced over the row's threads (Note [Alternating row buffers])."""
        parity = f", (int)(rr_{_ident(ctype)}++ & 1u)" if v.alternate else ""
        return f"fc_row_reduce<FC_TX, FC_TX * FC_TY>({var}, {op}, smem_{_ident(ctype)}{parity})"

    def combine(var: str, ctype: str, op: str) -> None:
        """Reduce `var` over the row's threads, then over the cluster's blocks."""
        L.append(f"    {var} = {row_reduce(var, ctype, op)};")
        if v.cluster > 1:
            if v.exchange_async:
                L.append(f"    {var} = fc_cluster_reduce_async<FC_CLUSTER>({var}, {op}, "
                         f"cl_{_ident(ctype)}, cl_bars, cl_call++);")  # fmt: skip
            else:
                L.append(f"    {var} = fc_cluster_reduce<FC_CLUSTER>({var}, {op}, cl_{_ident(ctype)}, "
                         "cl_phase); cl_phase ^= 1u;")  # fmt: skip

    row_stmts(0)
    from .cuda_ops import convert

    # Note [Deferred row end]: the last pass of a row group sees only row-level values it
    # computes again and the one exchange's result; anything else would be the next row's
    deferred = None
    assert not v.defer or (v.pipeline and v.rows_in_smem and v.cluster > 1 and not v.exchange_async
                           and program.stages == 1 and len(combined[1]) == 1 and not two_pass_all)

    for stage in range(1, program.stages + 1):
        reds = [r for r in program.reductions if r.stage == stage]
        # Note [Two-pass Welford]: with the row in registers, var and mean are two passes of
        # plain sums: the row's sum gives its mean, then the squared deviations from it are
        # summed. Exact two-pass accuracy, and two cheap block sums instead of a tree of
        # Welford combines, each with a division (var_mean bf16 4096x16384 ran 3x the
        # instructions of torch.compile's kernel that way).
        two_pass = [r for r in reds if r in two_pass_all]
        body: list[str] = []
        pre: list[str] = []
        post: list[str] = []
        for r in reds:
            rt = REGISTER_TYPE[r.dtype]
            if r in two_pass:
                L.append(f"    {rt} {r.var}_s = ({rt})0;")
                body.append(f" {r.var}_s += {convert(r.input, dtypes[r.input], r.dtype)};")
                continue
            L.append(f"    {_acc_type(r)} {r.var} = {_identity(r)};")
            if r.op == "welford" and v.vec > 1:
                # a vector's values join the running Welford triple together: one division a
                # vector instead of one a value (a vector never straddles the row's end)
                pre.append(f"{rt} {r.var}_x[FC_VEC];")
                body.append(f" {r.var}_x[j] = {convert(r.input, dtypes[r.input], r.dtype)};")
                post.append(f"if (ok) {r.var} = fc_welford_add<FC_VEC>({r.var}, {r.var}_x);")
                continue
            body.append(" " + _accumulate(r, r.input, dtypes))
        element_pass([r.input for r in reds], ["if (ok) {", *body, "}"], carry_for(reds), pre, post)
        if two_pass:
            body = []
            for r in two_pass:
                rt = REGISTER_TYPE[r.dtype]
                combine(f"{r.var}_s", rt, f"fc_op_sum<{rt}>()")
                L.append(f"    const {rt} {r.var}_mean = {r.var}_s / ({rt})N;")
                L.append(f"    {rt} {r.var}_m2 = ({rt})0;")
                x = convert(r.input, dtypes[r.input], r.dtype)
                body.append(f" const {rt} {r.var}_d = {x} - {r.var}_mean; {r.var}_m2 += {r.var}_d * {r.var}_d;")
            element_pass([r.input for r in two_pass], ["if (ok) {", *body, "}"])
            for r in two_pass:
                rt = REGISTER_TYPE[r.dtype]
                combine(f"{r.var}_m2", rt, f"fc_op_sum<{rt}>()")
                L.append(f"    {_acc_type(r)} {r.var}; {r.var}.mean = {r.var}_mean; "
                         f"{r.var}.m2 = {r.var}_m2; {r.var}.count = (int)N;")  # fmt: skip
        for g, group in enumerate(combined[stage]):
            last = v.defer and stage == program.stages and g == len(combined[stage]) - 1
            if len(group) == 1:
                var, ctype, op = group[0].var, _acc_type(group[0]), _op_functor(group[0])
            else:
                ct, n = _acc_type(group[0]), len(group)  # Note [Merged row reductions]
                var, ctype = f"{group[0].var}_m", f"fc_multi<{ct}, {n}>"
                op = f"fc_op_multi<{ct}, {', '.join(_op_functor(r)[:-2] for r in group)}>()"
                L.append(f"    {ctype} {var} = {{{{{', '.join(r.var for r in group)}}}}};")
            if last:  # Note [Deferred row end]: the block's partial waits to be sent
                L.append(f"    {var} = {row_reduce(var, ctype, op)};")
                L.append(f"    const {ctype} fc_send = {var};")
                deferred = (ctype, op, group)
                continue
            combine(var, ctype, op)
            if len(group) > 1:
                L.extend(f"    {r.var} = {var}.v[{i}];" for i, r in enumerate(group))
        if not (v.defer and stage == program.stages):
            row_stmts(stage)

    def row_end() -> None:
        """The last pass (element-level outputs, column partials) and row-level outputs."""
        elem_stores = [(k, s) for k, s in enumerate(program.stores) if not program.store_rowlevel[k]]
        if elem_stores:
            last_pass(elem_stores)
        for k, s in enumerate(program.stores):
            if program.store_rowlevel[k]:
                first = "tx == 0 && cl_rank == 0" if v.cluster > 1 else "tx == 0"
                L.append(f"    if ({first} && row_ok) o{k}[o{k}_row] = {to_memory(s.var, s.dtype)};")

    def deferred_end(send: bool) -> None:
        """Note [Deferred row end]: the end of row group prev0, whose stage is slot_prev;
        with `send`, this row group's partial goes out once the previous one's are in."""
        ctype, op, group = deferred
        L.append("    {")
        L.append("    const unsigned slot = slot_prev;")
        L.extend(f"    const {MEMORY_TYPE[program.accesses[i].dtype]} a{i}_now = a{i}_prev;"
                 for i in row_level)  # fmt: skip
        L.extend("    " + x for x in row_offsets("prev0 + threadIdx.y", "", range(len(tensors))))
        row_stmts(0)
        L.append(f"    const {ctype} fc_recv = {exchange('receive', ctype, op)};")
        if send:
            L.append(f"    {exchange('send', ctype)};")
        if len(group) == 1:
            L.append(f"    const {ctype} {group[0].var} = fc_recv;")
        else:
            L.extend(f"    const {_acc_type(r)} {r.var} = fc_recv.v[{i}];" for i, r in enumerate(group))
        row_stmts(program.stages)
        row_end()
        L.append("    }")

    def exchange(part: str, ctype: str, op: str = "") -> str:
        """Note [Deferred row end]: this row group's partial sent, or the previous one's
        received, through the cluster barrier."""
        slots = f"cl_{_ident(ctype)}"
        if part == "send":
            return f"fc_cluster_send<FC_CLUSTER>(fc_send, {slots}, cl_phase)"
        return f"fc_cluster_receive<FC_CLUSTER>({op}, {slots}, cl_phase ^ 1u)"

    def last_pass(elem_stores: list) -> None:
        body, post = [], []
        for i in range(n_acc):
            if i not in v.cached and cached:
                L.append(f"    fc_opaque(a{i});")
        for k, s in elem_stores:
            if k in v.acc:
                body.append(f"if (ok) acc{k}[it][j] += ({acc_type(s.dtype)}){s.var};")
                continue
            if v.modes[n_acc + k] == "vec":
                body.append(f"o{k}_v[j] = {_stored(program, dtypes, s.var, s.dtype)};")
                at = _k_offset(f"o{k}", "kb", v.k2, unit=True)
                post.append(f"if (ok) fc_store_vec_hint<FC_VEC, {v.store_hint}>"
                            f"(o{k} + o{k}_row + {at}, o{k}_v);")  # fmt: skip
            else:
                at = _k_offset(f"o{k}", "kb + j", v.k2)
                body.append(f"if (ok) o{k}[o{k}_row + {at}] = {_stored(program, dtypes, s.var, s.dtype)};")
        decls = [f"fc_vec<{MEMORY_TYPE[s.dtype]}, FC_VEC> o{k}_v;" for k, s in elem_stores
                 if v.modes[n_acc + k] == "vec" and k not in v.acc]  # fmt: skip
        element_pass([s.var for _, s in elem_stores], body, pre=decls, post=post)

    if v.defer:
        ctype = deferred[0]
        L.append("    const unsigned slot_prev = slot == 0u ? 2u : slot - 1u;")
        L.append("    if (have_prev) {")
        deferred_end(send=True)
        L.append("    } else {")
        L.append(f"      {exchange('send', ctype)};")
        L.append("    }")
        L.append("    cl_phase ^= 1u;")
        L.append("    have_prev = true;")
        L.append("    prev0 = row0;")
        L.extend(f"    a{i}_prev = a{i}_now;" for i in row_level)
        L.append("  }")
        L.append("  if (have_prev) {  // the last row group's end")
        L.append("    const unsigned slot_prev = slot == 0u ? 2u : slot - 1u;")
        deferred_end(send=False)
        L.append("  }")
    else:
        row_end()
        L.append("  }")
    if v.pipeline or in_smem:  # no copy still in flight when the block ends
        L.append("  fc_cp_async_wait<0>();")
    # the block's column partials: its TY thread rows added in a fixed order, through one
    # table a type that the partials take in turn (each turn ends at a barrier): a table
    # each overran the 48 KiB of static shared memory with three bf16 partials
    for at in sorted({acc_type(program.stores[k].dtype) for k in v.acc}):
        L.append(f"  __shared__ {at} part_{_ident(at)}[FC_TY][FC_TX * FC_VEC];")
    for k in v.acc:
        at = acc_type(program.stores[k].dtype)
        part = f"part_{_ident(at)}"
        L.append("#pragma unroll")
        L.append(f"  for (int it = 0; it < {v.iters}; ++it) {{")
        L.append("    const idx_t kb = k_lo + ((idx_t)it * FC_TX + tx) * FC_VEC;")
        L.append("#pragma unroll")
        L.append(f"    for (int j = 0; j < FC_VEC; ++j) {part}[threadIdx.y][tx * FC_VEC + j] = acc{k}[it][j];")
        L.append("    __syncthreads();")
        L.append("    if (threadIdx.y == 0) {")
        L.append("#pragma unroll")
        L.append("      for (int j = 0; j < FC_VEC; ++j) {")
        L.append(f"        {at} s = {part}[0][tx * FC_VEC + j];")
        L.append(f"        for (int y = 1; y < FC_TY; ++y) s += {part}[y][tx * FC_VEC + j];")
        L.append(f"        if (kb + j < k_hi) o{k}[(idx_t)(blockIdx.x / FC_CLUSTER) * N + kb + j] = s;")
        L.append("      }")
        L.append("    }")
        L.append("    __syncthreads();")
        L.append("  }")
    if v.finish:
        _finish_in_kernel(L, program, v)
    L.append("}")
    return "\n".join(L) + "\n"


def _finish_in_kernel(L: list[str], program: ReductionProgram, v: InnerVariant) -> None:
    """Note [Finish in the row kernel]: every block has written its row of partials; all
    meet at a grid-wide barrier (safe: the launch is cooperative, so all are resident),
    then each block adds up tiles of 32 columns over the partial rows in a fixed order,
    as the finish kernel would. The barrier's counters reset themselves: the last block
    past the barrier zeroes them for the next launch on the stream."""
    L += ["  __threadfence();  // this block's partials, seen by every block after the barrier",
          "  __syncthreads();",
          "  if (tx == 0 && threadIdx.y == 0) {",
          "    atomicAdd(&fc_bar[0], 1u);",
          "    unsigned seen;",
          "    do {",
          '      asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(seen) : "l"(fc_bar));',
          "    } while (seen < gridDim.x);",
          "    if (atomicAdd(&fc_bar[1], 1u) == gridDim.x - 1) { fc_bar[0] = 0; fc_bar[1] = 0; }",
          "  }",
          "  __syncthreads();",
          "  {",
          "    const int fc_tid = threadIdx.y * FC_TX + tx, fc_lane = fc_tid % 32, fc_row = fc_tid / 32;",
          "    constexpr int FC_FROWS = FC_TX * FC_TY / 32;  // threads sharing a column's partials",
          "    const idx_t fc_groups = gridDim.x / FC_CLUSTER;  // rows of partials",
          "    const idx_t fc_tiles = (N + 31) / 32;"]  # fmt: skip
    for n, k in enumerate(v.acc):
        at = acc_type(program.stores[k].dtype)
        L += ["    {",
              f"      __shared__ {at} fc_fin[FC_FROWS][32];",
              "      // each sum's tiles start on other blocks than the previous sum's",
              f"      const idx_t fc_first = ((idx_t)blockIdx.x + gridDim.x - ({n} * fc_tiles) % gridDim.x) % gridDim.x;",
              "      for (idx_t t = fc_first; t < fc_tiles; t += gridDim.x)",
              f"        fc_sum_column_tile<FC_FROWS>(o{k}, fin{k}, N, fc_groups, t, fc_lane, fc_row, fc_fin);",
              "    }"]  # fmt: skip
    L.append("  }")


COLUMN_FINISH_NAME = "fc_column_finish"


# Note [Column strips]: with few blocks of partials (a wave of clusters over long rows: 7
# on the H100 for rows of 262144), the tiles above give each thread one partial or none,
# and the finish ran at a third of the copy ceiling (ncu: 17 us of layer norm backward bf16
# 256x262144's 224). A thread then takes four adjacent columns instead and adds all the
# blocks' partials of them in block order, several 16-byte loads in flight. On the H100
# layer norm backward bf16 256x262144 1777 -> 1840 GB/s, f32 1923 -> 1962, rms norm
# backward's 2253 -> 2290 and 2118 -> 2138; rows of 65536 within 1%
# (benchmarks/results/sweep-alternate.json, finish.strips). Rows of 16384 lost 0.6-1.0%
# (sweep-strips.json): their strips leave most SMs without a block, so strips are planned
# only where they give each SM one.
STRIP_COLUMNS = 4
STRIP_THREADS = 256


def render_column_finish(sums: Sequence[tuple[str, Any]], index_type: str, rows: int) -> str:
    """Sum [blocks, N] buffers of column partials over their blocks, in a fixed order, and
    store the sums in each output's dtype (Note [Column partials]). `sums`: (accumulator
    C type, output dtype) per buffer; blockIdx.y picks the buffer, so one launch finishes
    every column sum of a row kernel. A block takes 32 columns, read coalesced; `rows`
    threads share a column's partials, then add their sums in a fixed order. rows=0: a
    thread takes STRIP_COLUMNS columns (Note [Column strips])."""
    params = ", ".join(f"const {acc}* __restrict__ part{k}, {MEMORY_TYPE[dt]}* __restrict__ out{k}"
                       for k, (acc, dt) in enumerate(sums))  # fmt: skip
    L = [prelude_source("core"), f"typedef {index_type} idx_t;"]
    L += [f"#define FC_ROWS {rows}"] if rows else []
    L += ["template <typename A, typename M>",
          "__device__ __forceinline__ void fc_finish_columns(const A* __restrict__ part, "
          "M* __restrict__ out, idx_t N, idx_t blocks) {"]  # fmt: skip
    if rows:
        L += ["  __shared__ A sums[FC_ROWS][32];",
              "  fc_sum_column_tile<FC_ROWS>(part, out, N, blocks, (idx_t)blockIdx.x, (int)threadIdx.x,",
              "                              (int)threadIdx.y, sums);"]  # fmt: skip
        bound = "32 * FC_ROWS"
    else:
        L += [f"  fc_sum_column_strip<{STRIP_COLUMNS}>(part, out, N, blocks, "
              "(idx_t)blockIdx.x * (idx_t)blockDim.x + (idx_t)threadIdx.x);"]  # fmt: skip
        bound = str(STRIP_THREADS)
    L.append("}")
    L += [f'extern "C" __global__ void __launch_bounds__({bound}) {COLUMN_FINISH_NAME}(',
          f"    {params}, idx_t N, idx_t blocks) {{",
          "  fc_wait_prior_grid();  // the row kernel's partials (Note [Dependent launch])"]  # fmt: skip
    for k in range(len(sums)):
        L.append(f"  if (blockIdx.y == {k}) fc_finish_columns(part{k}, out{k}, N, blocks);")
    L.append("}")
    return "\n".join(L) + "\n"


def _ident(ctype: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in ctype)


# ---- outer ----------------------------------------------------------------------------------


def outer_arg_types(program: ReductionProgram, v: OuterVariant, finish: bool) -> tuple[str, ...]:
    idx = "i32" if v.index_type == "int" else "i64"
    per = ("ptr", idx, idx)
    scal = scalar_arg_types(program)
    work = ("ptr",) * _work_count(program)
    return per * (len(program.accesses) + len(program.stores)) + (idx, idx) + work + scal


def _work_count(program: ReductionProgram) -> int:
    return sum(3 if r.op == "welford" else 1 for r in program.reductions)


def render_outer(program: ReductionProgram, v: OuterVariant, finish: bool) -> str:
    """finish=False: the partial kernel (and the whole job when split == 1);
    finish=True: combine `split` partials per column and run the epilogue."""
    dtypes = {s.var: s.dtype for s in program.stmts}
    L: list[str] = [prelude_source("core", "math", "reduce"), f"typedef {v.index_type} idx_t;",
                    f"#define FC_VEC {v.vec}", f"#define FC_TX {v.tx}", f"#define FC_TY {v.ty}"]  # fmt: skip
    extra = ["idx_t cols", "idx_t N"]
    work = []
    for r in program.reductions:
        rt = REGISTER_TYPE[r.dtype]
        work += ([f"{rt}* w_{r.var}_mean", f"{rt}* w_{r.var}_m2", f"int* w_{r.var}_n"]
                 if r.op == "welford" else [f"{rt}* w_{r.var}"])  # fmt: skip
    name = FINISH_NAME if finish else OUTER_NAME
    threads = v.tx * v.ty
    dims = ""
    if v.cluster:
        L.append(f"#define FC_SPLIT {v.split}")
        dims = " __cluster_dims__(1, FC_SPLIT, 1)"
    L.append(f'extern "C" __global__ void{dims} __launch_bounds__({threads}) {name}(')
    L.append("    " + ",\n    ".join(_params(program, 1, extra + work)) + ") {")
    if finish:  # the partials are the previous kernel's (Note [Dependent launch])
        L.append("  fc_wait_prior_grid();")
    red_types = sorted({_acc_type(r) for r in program.reductions})
    for t in red_types:
        L.append(f"  __shared__ __align__(16) {t} smem_{_ident(t)}[{_fold_smem(v, t)}];")
    L.append("  const idx_t cb = ((idx_t)blockIdx.x * FC_TX + threadIdx.x) * FC_VEC;")
    L.append("  const bool col_ok = cb < cols;")

    def col_load(i: int) -> str:
        mode = v.modes[i]
        if mode == "bcast":
            return f"a{i}[0]"
        return f"a{i}[(cb + j) * a{i}_s0]"

    for r in program.reductions:
        L.append(f"  {_acc_type(r)} {r.var}_a[FC_VEC];")
        L.append(f"  for (int j = 0; j < FC_VEC; ++j) {r.var}_a[j] = {_identity(r)};")
    if not finish:
        stmts, _ = needed(program, [r.input for r in program.reductions])
        loads = sorted({s.operands[0] for s in stmts if s.op == "load"})
        # each iteration a thread loads UNROLL rows (kstep apart) before accumulating any
        L.append(f"#define FC_UNROLL {v.unroll}")
        L.append("  const idx_t kstep = (idx_t)gridDim.y * FC_TY;")
        L.append("  for (idx_t k0 = (idx_t)blockIdx.y * FC_TY + threadIdx.y; k0 < N; "
                 "k0 += kstep * FC_UNROLL) {")  # fmt: skip
        L.append("    if (!col_ok) break;")
        for i in loads:
            mt = MEMORY_TYPE[program.accesses[i].dtype]
            L.append(f"    fc_vec<{mt}, FC_VEC> a{i}_u[FC_UNROLL];" if v.modes[i] != "bcast"
                     else f"    {mt} a{i}_u[FC_UNROLL];")  # fmt: skip
        L.append("#pragma unroll")
        L.append("    for (int u = 0; u < FC_UNROLL; ++u) {")
        L.append("      const idx_t k = k0 + u * kstep < N ? k0 + u * kstep : k0;")
        for i in loads:
            if v.modes[i] == "bcast":
                L.append(f"      a{i}_u[u] = a{i}[k * a{i}_k];")
            elif v.modes[i] == "vec":
                L.append(f"      a{i}_u[u] = fc_load_vec_hint<FC_VEC, {v.load_hint}>"
                         f"(a{i} + cb + k * a{i}_k);")  # fmt: skip
            else:
                L.append("#pragma unroll")
                L.append(f"      for (int j = 0; j < FC_VEC; ++j) a{i}_u[u][j] = "
                         f"cb + j < cols ? a{i}[(cb + j) * a{i}_s0 + k * a{i}_k] : a{i}[0];")  # fmt: skip
        L.append("    }")

        def elem_load(i: int) -> str:
            return f"a{i}_u[u]" if v.modes[i] == "bcast" else f"a{i}_u[u][j]"

        def sum_rows(checked: bool, pad: str) -> None:
            L.append("#pragma unroll")
            L.append(pad + "for (int u = 0; u < FC_UNROLL; ++u) {")
            if checked:
                L.append(pad + "  if (k0 + u * kstep >= N) break;")
            L.append("#pragma unroll")
            L.append(pad + "  for (int j = 0; j < FC_VEC; ++j) {")
            if checked:
                L.append(pad + "    if (cb + j >= cols) break;")
            L.extend(pad + "    " + x for x in _row_stmts(program, 0, dtypes, col_load))
            for st in stmts:
                L.append(pad + "    " + render_stmt(st, dtypes, elem_load))
            for r in program.reductions:
                L.append(pad + "    " + _accumulate(r, r.input, dtypes, f"{r.var}_a[j]"))
            L.append(pad + "  }")
            L.append(pad + "}")

        # where all UNROLL rows and VEC columns are in range (all but the edges), the sums
        # run without a bounds branch each: sum over dim 0 bf16 1024x65536 2367 -> 2420 GB/s
        # on the H100, 16-bit outer sums 2-3%, f32 ones +0.3% (benchmarks/results/
        # sweep-outer_unchecked.json)
        L.append("    if (k0 + (FC_UNROLL - 1) * kstep < N && cb + FC_VEC <= cols) {")
        sum_rows(False, "      ")
        L.append("    } else {")
        sum_rows(True, "      ")
        L.append("    }")
        L.append("  }")
        _reduce_over_rows(L, program, v)
        if v.cluster:
            _cluster_columns(L, program, dtypes, col_load)
            return "\n".join(L) + "\n"
        L.append("  if (threadIdx.y != 0 || !col_ok) return;")
        if v.split > 1:
            L.append("  for (int j = 0; j < FC_VEC && cb + j < cols; ++j) {")
            L.append("    const idx_t w = (idx_t)blockIdx.y * cols + cb + j;")
            for r in program.reductions:
                if r.op == "welford":
                    L.append(f"    w_{r.var}_mean[w] = {r.var}_a[j].mean; w_{r.var}_m2[w] = {r.var}_a[j].m2; "
                             f"w_{r.var}_n[w] = {r.var}_a[j].count;")  # fmt: skip
                else:
                    L.append(f"    w_{r.var}[w] = {r.var}_a[j];")
            L.append("  }")
            L.append("}")
            return "\n".join(L) + "\n"
    else:
        _fold_partials(L, program, v)
        L.append("  if (threadIdx.y != 0 || !col_ok) return;")
    L.append("  for (int j = 0; j < FC_VEC; ++j) {")
    L.append("    if (cb + j >= cols) break;")
    for r in program.reductions:
        L.append(f"    const {_acc_type(r)} {r.var} = {r.var}_a[j];")
    L.extend("    " + x for x in _column_epilogue(program, dtypes, col_load))
    L.append("  }")
    L.append("}")
    return "\n".join(L) + "\n"


def _identity(r) -> str:
    """A reduction accumulator's starting value."""
    return (f"fc_welford_init<{REGISTER_TYPE[r.dtype]}, int>()" if r.op == "welford"
            else f"{_op_functor(r)}.identity()")  # fmt: skip


def _fold_partials(L: list[str], program: ReductionProgram, v: OuterVariant) -> None:
    """Note [Outer finish]: the FC_TY thread rows of a column each fold every FC_TY-th of
    its `split` partials, loads unrolled, then combine through shared memory: one thread a
    column folding all of them in turn was latency-bound (Nsight Compute: 9.8 us for 256
    partials of 256 columns, 10% of the sum over dim 0 of f32 262144x256)."""
    # no exit inside the loop: a break there kept the compiler from batching the unrolled
    # loads (one partial in flight a thread); a trip count it knows lets it issue them all
    L.append("  if (col_ok) {")
    if v.split % v.ty == 0:
        L.append("#pragma unroll")
        L.append(f"    for (int i = 0; i < {v.split // v.ty}; ++i) {{")
        L.append("      const int s = i * FC_TY + threadIdx.y;")
    else:
        L.append("#pragma unroll 4")
        L.append(f"    for (int s = threadIdx.y; s < {v.split}; s += FC_TY) {{")
    L.append("      for (int j = 0; j < FC_VEC && cb + j < cols; ++j) {")
    L.append("        const idx_t w = (idx_t)s * cols + cb + j;")
    for r in program.reductions:
        if r.op == "welford":
            rt = REGISTER_TYPE[r.dtype]
            L.append(f"        fc_welford<{rt}, int> p; p.mean = w_{r.var}_mean[w]; "
                     f"p.m2 = w_{r.var}_m2[w]; p.count = w_{r.var}_n[w];")  # fmt: skip
            L.append(f"        {r.var}_a[j] = fc_welford_combine({r.var}_a[j], p);")
        else:
            L.append(f"        {r.var}_a[j] = {_op_functor(r)}({r.var}_a[j], w_{r.var}[w]);")
    L.append("      }")
    L.append("    }")
    L.append("  }")
    _reduce_over_rows(L, program, v)


def _fold_columns(v: OuterVariant, acc_type: str) -> int:
    """Columns of a thread folded a round by fc_fold_rows (Note [Row fold]): as many of
    FC_VEC as keep its shared memory within 16 KiB."""
    size = 24 if "welford" in acc_type else 8 if "double" in acc_type or "int64" in acc_type else 4
    threads, s = v.tx * v.ty, v.vec
    while s > 1 and (threads * s + max(threads, v.tx * s)) * size > 16384:
        s //= 2
    return s


def _fold_smem(v: OuterVariant, acc_type: str) -> str:
    """Elements of fc_fold_rows' shared memory for accumulators of `acc_type`."""
    s = _fold_columns(v, acc_type)
    return f"FC_TX * FC_TY * {s} + {max(v.tx * v.ty, v.tx * s)}"


def _reduce_over_rows(L: list[str], program: ReductionProgram, v: OuterVariant) -> None:
    """Each column's accumulators combined over the block's thread rows; every row gets them
    (Note [Row fold] in prelude/reduce.cuh)."""
    for r in program.reductions:
        t = _acc_type(r)
        L.append(f"  fc_fold_rows<FC_TX, FC_TY, FC_VEC, {_fold_columns(v, t)}>({r.var}_a, "
                 f"{_op_functor(r)}, smem_{_ident(t)});")  # fmt: skip


def _column_epilogue(program: ReductionProgram, dtypes: dict, col_load) -> list[str]:
    """Column cb + j's outputs: row-level statements read the column's accumulators."""
    out = _row_stmts(program, 0, dtypes, col_load) + _row_stmts(program, 1, dtypes, col_load)
    for k, st in enumerate(program.stores):
        out.append(f"o{k}[(cb + j) * o{k}_s0] = {to_memory(st.var, st.dtype)};")
    return out


def _cluster_columns(L: list[str], program: ReductionProgram, dtypes: dict, col_load) -> None:
    """Note [Cluster columns]: the FC_SPLIT blocks sharing a block's columns form one
    cluster (sm_90). Each leaves its column partials in its shared memory; after a cluster
    barrier, block r folds the partials of its 1/FC_SPLIT of the columns from every block,
    in rank order, and writes those columns' outputs. A second barrier keeps every block's
    shared memory alive until its peers have read it. No workspace, no second kernel."""
    for r in program.reductions:
        L.append(f"  __shared__ {_acc_type(r)} part_{r.var}[FC_TX * FC_VEC];")
    L.append("  if (threadIdx.y == 0) {")
    L.append("#pragma unroll")
    L.append("    for (int j = 0; j < FC_VEC; ++j) {")
    for r in program.reductions:
        L.append(f"      part_{r.var}[threadIdx.x * FC_VEC + j] = {r.var}_a[j];")
    L.append("    }")
    L.append("  }")
    L.append("  fc_cluster_sync();")
    L.append("  {")
    L.append("    constexpr int share = (FC_TX * FC_VEC + FC_SPLIT - 1) / FC_SPLIT;")
    L.append("    const int c0 = (int)fc_cluster_rank() * share;")
    L.append("    for (int c = c0 + threadIdx.y * FC_TX + threadIdx.x; c < c0 + share && c < FC_TX * FC_VEC; "
             "c += FC_TX * FC_TY) {")  # fmt: skip
    L.append("      const idx_t cb = (idx_t)blockIdx.x * FC_TX * FC_VEC + c;")
    L.append("      const int j = 0;")
    L.append("      if (cb >= cols) break;")
    for r in program.reductions:
        L.append(f"      {_acc_type(r)} {r.var} = fc_load_remote(&part_{r.var}[c], 0u);")
        L.append("      for (unsigned s = 1; s < FC_SPLIT; ++s) "
                 f"{r.var} = {_op_functor(r)}({r.var}, fc_load_remote(&part_{r.var}[c], s));")  # fmt: skip
    L.extend("      " + x for x in _column_epilogue(program, dtypes, col_load))
    L.append("    }")
    L.append("  }")
    L.append("  fc_cluster_sync();")
    L.append("}")
