"""Outer (dim-0) reductions: threads own VEC consecutive columns, TY threads and SPLIT
blocks share the reduced dim; the split blocks combine in one cluster (Note [Cluster
columns]) or through workspaces and a finish kernel (Note [Outer finish])."""
from __future__ import annotations

from ..cuda_ops import MEMORY_TYPE, REGISTER_TYPE, convert, prelude_features
from ..kernel_ir import ReductionProgram, needed
from ..prelude import prelude_source
from ..stmt_cuda import render_stmt, scalar_arg_types, to_memory
from .common import (
    accumulate_stmt,
    accumulator_type,
    ident,
    identity_of,
    k_offset,
    kernel_params,
    op_functor,
    row_level_stmts,
)
from .variants import OuterVariant

OUTER_NAME = "fc_outer_reduction"
FINISH_NAME = "fc_outer_finish"


def outer_arg_types(program: ReductionProgram, v: OuterVariant, finish: bool) -> tuple[str, ...]:
    idx = "i32" if v.index_type == "int" else "i64"
    # each tensor's kept strides and reduced stride(s); cols and N, and for a middle
    # reduction the kept runs' sizes but the first and K1 (Note [Middle reductions])
    per = ("ptr",) + (idx,) * (v.i_rank + 1 + v.k2)
    sizes = (idx,) * (2 + (v.i_rank - 1 + v.k2 if v.i_rank > 1 or v.k2 else 0))
    scal = scalar_arg_types(program)
    work = ("ptr",) * _work_count(program)
    return per * (len(program.accesses) + len(program.stores)) + sizes + work + scal


def _work_count(program: ReductionProgram) -> int:
    return sum(3 if r.op == "welford" else 1 for r in program.reductions)


def render_outer(program: ReductionProgram, v: OuterVariant, finish: bool) -> str:
    """finish=False: the partial kernel (and the whole job when split == 1);
    finish=True: combine `split` partials per column and run the epilogue."""
    dtypes = {s.var: s.dtype for s in program.stmts}
    features = prelude_features(program.stmts, program.stores)
    L: list[str] = [prelude_source("core", "math", "reduce", *features), f"typedef {v.index_type} idx_t;",
                    f"#define FC_VEC {v.vec}", f"#define FC_TX {v.tx}", f"#define FC_TY {v.ty}"]  # fmt: skip
    extra = ["idx_t cols", "idx_t N"]
    mid = v.i_rank > 1 or v.k2  # Note [Middle reductions]
    if mid:
        extra += [f"idx_t n{d}" for d in range(1, v.i_rank)] + (["idx_t K1"] if v.k2 else [])
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
    L.append("    " + ",\n    ".join(kernel_params(program, v.i_rank, extra + work, v.k2)) + ") {")
    if finish:  # the partials are the previous kernel's (Note [Dependent launch])
        L.append("  fc_wait_prior_grid();")
    red_types = sorted({accumulator_type(r) for r in program.reductions})
    for t in red_types:
        L.append(f"  __shared__ __align__(16) {t} smem_{ident(t)}[{_fold_smem(v, t)}];")
    L.append("  const idx_t cb = ((idx_t)blockIdx.x * FC_TX + threadIdx.x) * FC_VEC;")
    L.append("  const bool col_ok = cb < cols;")
    inner = f"_s{v.i_rank - 1}"  # the stride along the innermost kept run
    if mid:
        L += _column_offsets(program, v)
        L.append(f"  idx_t col[{len(program.accesses) + len(program.stores)}];")
        L.append("  column_offsets(col_ok ? cb : 0, col);")

    def col_load(i: int) -> str:
        if mid:
            return f"a{i}[col[{i}] + j * a{i}{inner}]"
        mode = v.modes[i]
        if mode == "bcast":
            return f"a{i}[0]"
        return f"a{i}[(cb + j) * a{i}_s0]"

    for r in program.reductions:
        L.append(f"  {accumulator_type(r)} {r.var}_a[FC_VEC];")
        L.append(f"  for (int j = 0; j < FC_VEC; ++j) {r.var}_a[j] = {identity_of(r)};")
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
            if mid:
                L += _mid_load(v, i, k_offset(f"a{i}", "k", v.k2), inner)
            elif v.modes[i] == "bcast":
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
            L.extend(pad + "    " + x for x in row_level_stmts(program, 0, dtypes, col_load))
            for st in stmts:
                L.append(pad + "    " + render_stmt(st, dtypes, elem_load))
            for r in program.reductions:
                L.append(pad + "    " + accumulate_stmt(r, r.input, dtypes, f"{r.var}_a[j]"))
            L.append(pad + "  }")
            L.append(pad + "}")

        def welford_rows(pad: str) -> None:
            """Note [Outer Welford add]: a column's UNROLL rows join its Welford state
            together (fc_welford_add: their own mean and m2, then one combine), not one
            update with a division each; columns outer, rows inner, the other reductions'
            order per accumulator unchanged."""
            L.append("#pragma unroll")
            L.append(pad + "for (int j = 0; j < FC_VEC; ++j) {")
            for r in program.reductions:
                if r.op == "welford":
                    L.append(pad + f"  {REGISTER_TYPE[r.dtype]} {r.var}_x[FC_UNROLL];")
            L.extend(pad + "  " + x for x in row_level_stmts(program, 0, dtypes, col_load))
            L.append("#pragma unroll")
            L.append(pad + "  for (int u = 0; u < FC_UNROLL; ++u) {")
            for st in stmts:
                L.append(pad + "    " + render_stmt(st, dtypes, elem_load))
            for r in program.reductions:
                if r.op == "welford":
                    L.append(pad + f"    {r.var}_x[u] = {convert(r.input, dtypes[r.input], r.dtype)};")
                else:
                    L.append(pad + "    " + accumulate_stmt(r, r.input, dtypes, f"{r.var}_a[j]"))
            L.append(pad + "  }")
            for r in program.reductions:
                if r.op == "welford":
                    L.append(pad + f"  {r.var}_a[j] = fc_welford_add<FC_UNROLL>({r.var}_a[j], {r.var}_x);")
            L.append(pad + "}")

        # where all UNROLL rows and VEC columns are in range (all but the edges), the sums
        # run without a bounds branch each: sum over dim 0 bf16 1024x65536 2367 -> 2420 GB/s
        # on the H100, 16-bit outer sums 2-3%, f32 ones +0.3% (benchmarks/results/
        # sweep-outer_unchecked.json)
        L.append("    if (k0 + (FC_UNROLL - 1) * kstep < N && cb + FC_VEC <= cols) {")
        if any(r.op == "welford" for r in program.reductions) and v.unroll & (v.unroll - 1) == 0:
            welford_rows("      ")
        else:
            sum_rows(False, "      ")
        L.append("    } else {")
        sum_rows(True, "      ")
        L.append("    }")
        L.append("  }")
        _reduce_over_rows(L, program, v)
        if v.cluster:
            _cluster_columns(L, program, dtypes, col_load, v if mid else None)
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
        L.append(f"    const {accumulator_type(r)} {r.var} = {r.var}_a[j];")
    L.extend("    " + x for x in _column_epilogue(program, dtypes, col_load, v if mid else None))
    L.append("  }")
    L.append("}")
    return "\n".join(L) + "\n"


def _column_offsets(program: ReductionProgram, v: OuterVariant) -> list[str]:
    """Note [Middle reductions]: column c's offset in each tensor, from its coordinates
    along the kept runs (innermost last)."""
    n_acc = len(program.accesses)
    tensors = [f"a{i}" for i in range(n_acc)] + [f"o{k}" for k in range(len(program.stores))]
    m = v.i_rank
    out = [f"  auto column_offsets = [&](idx_t c, idx_t (&off)[{len(tensors)}]) {{",
           "    idx_t rest = c;"]  # fmt: skip
    for d in range(m - 1, 0, -1):
        out.append(f"    const idx_t i{d} = rest % n{d}; rest /= n{d};")
    out.append("    const idx_t i0 = rest;")
    for t, name in enumerate(tensors):
        terms = " + ".join(f"i{d} * {name}_s{d}" for d in range(m))
        out.append(f"    off[{t}] = {terms};")
    out.append("  };")
    return out


def _mid_load(v: OuterVariant, i: int, k_off: str, inner: str) -> list[str]:
    """Access i's loads of row k in a middle reduction (Note [Middle reductions])."""
    at = f"col[{i}] + {k_off}"
    if v.modes[i] == "bcast":  # the same along the innermost kept run
        return [f"      a{i}_u[u] = a{i}[{at}];"]
    if v.modes[i] == "vec":
        return [f"      a{i}_u[u] = fc_load_vec_hint<FC_VEC, {v.load_hint}>(a{i} + {at});"]
    return ["#pragma unroll",
            f"      for (int j = 0; j < FC_VEC; ++j) a{i}_u[u][j] = "
            f"cb + j < cols ? a{i}[{at} + j * a{i}{inner}] : a{i}[0];"]  # fmt: skip


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
            L.append(f"        {r.var}_a[j] = {op_functor(r)}({r.var}_a[j], w_{r.var}[w]);")
    L.append("      }")
    L.append("    }")
    L.append("  }")
    _reduce_over_rows(L, program, v)


def _fold_columns(v: OuterVariant, acc_type: str, budget: int = 16384) -> int:
    """Columns of a thread folded a round by fc_fold_rows (Note [Row fold]): as many of
    FC_VEC as keep its shared memory within `budget` bytes."""
    size = 24 if "welford" in acc_type else 8 if "double" in acc_type or "int64" in acc_type else 4
    threads, s = v.tx * v.ty, v.vec
    while s > 1 and (threads * s + max(threads, v.tx * s)) * size > budget:
        s //= 2
    return s


def _fold_smem(v: OuterVariant, acc_type: str, budget: int = 16384) -> str:
    """Elements of fc_fold_rows' shared memory for accumulators of `acc_type`."""
    s = _fold_columns(v, acc_type, budget)
    return f"FC_TX * FC_TY * {s} + {max(v.tx * v.ty, v.tx * s)}"


def _reduce_over_rows(L: list[str], program: ReductionProgram, v: OuterVariant) -> None:
    """Each column's accumulators combined over the block's thread rows; every row gets them
    (Note [Row fold] in prelude/reduce.cuh)."""
    for r in program.reductions:
        t = accumulator_type(r)
        L.append(f"  fc_fold_rows<FC_TX, FC_TY, FC_VEC, {_fold_columns(v, t)}>({r.var}_a, "
                 f"{op_functor(r)}, smem_{ident(t)});")  # fmt: skip


def _column_epilogue(program: ReductionProgram, dtypes: dict, col_load,
                     mid: OuterVariant | None = None) -> list[str]:  # fmt: skip
    """Column cb + j's outputs: row-level statements read the column's accumulators."""
    out = row_level_stmts(program, 0, dtypes, col_load) + row_level_stmts(program, 1, dtypes, col_load)
    for k, st in enumerate(program.stores):
        at = (f"col[{len(program.accesses) + k}] + j * o{k}_s{mid.i_rank - 1}" if mid
              else f"(cb + j) * o{k}_s0")  # fmt: skip
        out.append(f"o{k}[{at}] = {to_memory(st.var, st.dtype)};")
    return out


def _cluster_columns(L: list[str], program: ReductionProgram, dtypes: dict, col_load,
                     mid: OuterVariant | None) -> None:  # fmt: skip
    """Note [Cluster columns]: the FC_SPLIT blocks sharing a block's columns form one
    cluster (sm_90). Each leaves its column partials in its shared memory; after a cluster
    barrier, block r folds the partials of its 1/FC_SPLIT of the columns from every block,
    in rank order, and writes those columns' outputs. A second barrier keeps every block's
    shared memory alive until its peers have read it. No workspace, no second kernel."""
    for r in program.reductions:
        L.append(f"  __shared__ {accumulator_type(r)} part_{r.var}[FC_TX * FC_VEC];")
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
    if mid is not None:  # this column's offsets (Note [Middle reductions])
        L.append(f"      idx_t col[{len(program.accesses) + len(program.stores)}];")
        L.append("      column_offsets(cb, col);")
    for r in program.reductions:
        L.append(f"      {accumulator_type(r)} {r.var} = fc_load_remote(&part_{r.var}[c], 0u);")
        L.append("      for (unsigned s = 1; s < FC_SPLIT; ++s) "
                 f"{r.var} = {op_functor(r)}({r.var}, fc_load_remote(&part_{r.var}[c], s));")  # fmt: skip
    L.extend("      " + x for x in _column_epilogue(program, dtypes, col_load, mid))
    L.append("    }")
    L.append("  }")
    L.append("  fc_cluster_sync();")
    L.append("}")
