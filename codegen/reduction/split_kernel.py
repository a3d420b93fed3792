"""Reductions of a few long rows (to a scalar, or a few outputs) split over the whole GPU
(Note [Split rows] in schedulers/reduction/split_plan.py): block (s, r) reduces slice s of
row r and writes its partial to a [SPLIT, rows] workspace; the outer finish kernel
(outer_kernel.py, Note [Outer finish]) folds each row's partials in slice order and runs
the row-level statements. Both kernels take the outer kernel's arguments."""
from __future__ import annotations

from ..cuda_ops import MEMORY_TYPE, REGISTER_TYPE
from ..kernel_ir import ReductionProgram, needed
from ..prelude import prelude_source
from ..stmt_cuda import render_stmt
from .common import (
    accumulate_stmt,
    accumulator_type,
    ident,
    identity_of,
    kernel_params,
    op_functor,
    row_level_stmts,
)
from .variants import SplitVariant

SPLIT_NAME = "fc_split_reduction"


def render_split(program: ReductionProgram, v: SplitVariant) -> str:
    dtypes = {s.var: s.dtype for s in program.stmts}
    L: list[str] = [prelude_source("core", "math", "reduce"), f"typedef {v.index_type} idx_t;",
                    f"#define FC_VEC {v.vec}", f"#define FC_THREADS {v.threads}",
                    f"#define FC_UNROLL {v.unroll}"]  # fmt: skip
    work = []
    for r in program.reductions:
        rt = REGISTER_TYPE[r.dtype]
        work += ([f"{rt}* w_{r.var}_mean", f"{rt}* w_{r.var}_m2", f"int* w_{r.var}_n"]
                 if r.op == "welford" else [f"{rt}* w_{r.var}"])  # fmt: skip
    L.append(f'extern "C" __global__ void __launch_bounds__({v.threads}) {SPLIT_NAME}(')
    L.append("    " + ",\n    ".join(kernel_params(program, 1, ["idx_t cols", "idx_t N"] + work))
             + ") {")  # fmt: skip
    for t in sorted({accumulator_type(r) for r in program.reductions}):
        L.append(f"  __shared__ {t} smem_{ident(t)}[FC_THREADS / 32];")
    # slice blockIdx.x of row blockIdx.y: whole steps of the block's threads, vectors aligned
    L.append("  const idx_t row = blockIdx.y;")
    L.append("  constexpr idx_t step = (idx_t)FC_THREADS * FC_VEC;")
    L.append("  const idx_t per = ((N + step - 1) / step + gridDim.x - 1) / gridDim.x * step;")
    L.append("  const idx_t k_lo = (idx_t)blockIdx.x * per;")
    L.append("  const idx_t k_hi = k_lo + per < N ? k_lo + per : N;")
    for r in program.reductions:
        L.append(f"  {accumulator_type(r)} {r.var}_a[FC_VEC];")
        L.append("#pragma unroll")
        L.append(f"  for (int j = 0; j < FC_VEC; ++j) {r.var}_a[j] = {identity_of(r)};")
    stmts, _ = needed(program, [r.input for r in program.reductions])
    loads = sorted({s.operands[0] for s in stmts if s.op == "load"})
    # values of the row alone (a per-row input of the element work): once, before the loop
    L.extend("  " + x for x in row_level_stmts(program, 0, dtypes, lambda i: f"a{i}[row * a{i}_s0]"))
    L.append("  for (idx_t k0 = k_lo + threadIdx.x * FC_VEC; k0 < k_hi; k0 += step * FC_UNROLL) {")
    for i in loads:
        L.append(f"    fc_vec<{MEMORY_TYPE[program.accesses[i].dtype]}, FC_VEC> a{i}_u[FC_UNROLL];")
    # every load of the iteration issued before the first is used
    L.append("#pragma unroll")
    L.append("    for (int u = 0; u < FC_UNROLL; ++u) {")
    L.append("      const idx_t k = k0 + u * step;")
    L.append("      const bool ok = k < k_hi;")
    for i in loads:
        if v.modes[i] == "vec":
            L.append(f"      a{i}_u[u] = fc_load_vec_if<FC_VEC, {v.load_hint}>"
                     f"(a{i} + row * a{i}_s0 + k, ok);")  # fmt: skip
        elif v.modes[i] == "strided":
            L.append("#pragma unroll")
            L.append(f"      for (int j = 0; j < FC_VEC; ++j) a{i}_u[u][j] = "
                     f"a{i}[ok ? row * a{i}_s0 + (k + j) * a{i}_k : 0];")  # fmt: skip
    L.append("    }")

    def elem_load(i: int) -> str:
        return f"a{i}_u[u][j]"

    L.append("#pragma unroll")
    L.append("    for (int u = 0; u < FC_UNROLL; ++u) {")
    L.append("      if (k0 + u * step >= k_hi) break;")
    L.append("#pragma unroll")
    L.append("      for (int j = 0; j < FC_VEC; ++j) {")
    for st in stmts:
        L.append("        " + render_stmt(st, dtypes, elem_load))
    for r in program.reductions:
        L.append("        " + accumulate_stmt(r, r.input, dtypes, f"{r.var}_a[j]"))
    L.append("      }")
    L.append("    }")
    L.append("  }")
    # a thread's lanes in order, then the block's threads (fc_block_reduce: a fixed order)
    L.append("  const idx_t w = (idx_t)blockIdx.x * cols + row;")
    for r in program.reductions:
        t = accumulator_type(r)
        L.append(f"  {t} {r.var} = {r.var}_a[0];")
        L.append("#pragma unroll")
        L.append(f"  for (int j = 1; j < FC_VEC; ++j) {r.var} = {op_functor(r)}({r.var}, {r.var}_a[j]);")
        L.append(f"  {r.var} = fc_block_reduce({r.var}, {op_functor(r)}, smem_{ident(t)});")
        if r.op == "welford":
            L.append(f"  if (threadIdx.x == 0) {{ w_{r.var}_mean[w] = {r.var}.mean; "
                     f"w_{r.var}_m2[w] = {r.var}.m2; w_{r.var}_n[w] = {r.var}.count; }}")  # fmt: skip
        else:
            L.append(f"  if (threadIdx.x == 0) w_{r.var}[w] = {r.var};")
    L.append("}")
    return "\n".join(L) + "\n"
