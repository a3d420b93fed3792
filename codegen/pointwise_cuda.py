"""Render a pointwise program and its variant as one CUDA C++ kernel.

The kernel is a grid-stride loop over the collapsed loop space; each thread handles VEC
consecutive elements of the innermost dim. Each input access loads a whole vector (`vec`),
one element reused VEC times (`bcast`, inner stride 0), or VEC strided elements.
"""
from __future__ import annotations

from dataclasses import dataclass

from .cuda_ops import ELEMENT_BYTES, MEMORY_TYPE, prelude_features, random_setup
from .kernel_ir import PointwiseProgram
from .prelude import prelude_source
from .stmt_cuda import render_stmt, scalar_arg_types, scalar_params, to_memory

KERNEL_NAME = "fc_pointwise"
# 256 threads: add of a column bf16 4096x4096 2333 -> 2425 GB/s against 128 on the H100
# (sweep-explore); never slower on the other pointwise cases
BLOCK = 256


@dataclass(frozen=True)
class PointwiseVariant:
    rank: int  # collapsed loop rank (>= 1)
    vec: int  # elements per thread along the innermost dim
    index_type: str  # 'int' or 'long long'
    load_modes: tuple[str, ...]  # per access: 'vec', 'bcast' or 'strided'
    store_modes: tuple[str, ...]  # per store: 'vec' or 'strided'
    live_dims: tuple[tuple[bool, ...], ...]  # per access then per store: stride != 0 per dim
    block: int = BLOCK  # threads a block
    unroll: int = 1  # vectors a thread loads (all of them first) per loop iteration
    load_hint: int = 0  # Note [Cache hints] (prelude/core.cuh)
    store_hint: int = 0

    def describe(self) -> str:
        tuned = (f" block={self.block} unroll={self.unroll} hints={self.load_hint}{self.store_hint}"
                 if (self.block, self.unroll, self.load_hint, self.store_hint) != (BLOCK, 1, 0, 0)
                 else "")  # fmt: skip
        return (f"rank={self.rank} vec={self.vec} index={self.index_type} "
                f"loads={','.join(self.load_modes)} stores={','.join(self.store_modes)}{tuned}")  # fmt: skip


def arg_types(program: PointwiseProgram, variant: PointwiseVariant) -> tuple[str, ...]:
    idx = "i32" if variant.index_type == "int" else "i64"
    per_tensor = ("ptr",) + (idx,) * variant.rank
    per_index = (idx,) * variant.rank  # Note [Index accesses]: strides, no pointer
    scalars = scalar_arg_types(program)
    tensors = [per_index if a.virtual else per_tensor for a in program.accesses]
    tensors += [per_tensor] * len(program.stores)
    return tuple(t for group in tensors for t in group) + (idx,) * (variant.rank + 1) + scalars


def render_pointwise(program: PointwiseProgram, variant: PointwiseVariant) -> str:
    R, V, U = variant.rank, variant.vec, variant.unroll
    features = prelude_features(program.stmts, program.stores)
    lines: list[str] = [prelude_source("core", "math", *features), f"#define FC_VEC {V}",
                        f"#define FC_UNROLL {U}", ""]  # fmt: skip
    # the loop is the outputs' shape in row-major order, so a random op of that shape (the
    # only kind the scheduler lets in) numbers its elements as the loop does
    define, caches = random_setup(program.stmts, "base0 + (idx_t)u * blockDim.x * FC_VEC + j")
    lines += define
    params: list[str] = []
    tensors = [("a", i, acc.dtype, True) for i, acc in enumerate(program.accesses)]
    tensors += [("o", i, st.dtype, False) for i, st in enumerate(program.stores)]
    for prefix, i, dtype, readonly in tensors:
        const = "const " if readonly else ""
        restrict = " __restrict__" if not program.has_alias else ""
        if not (prefix == "a" and program.accesses[i].virtual):
            params.append(" ".join((f"{const}{MEMORY_TYPE[dtype]}*{restrict}", f"{prefix}{i}")))
        params += [f"idx_t {prefix}{i}_s{d}" for d in range(R)]
    params += [f"idx_t n{d}" for d in range(R)] + ["idx_t numel"]
    params += scalar_params(program)
    lines.append(f"typedef {variant.index_type} idx_t;")
    lines.append(f'extern "C" __global__ void __launch_bounds__({variant.block}) {KERNEL_NAME}(')
    lines.append("    " + ",\n    ".join(params) + ") {")
    # Each iteration a thread takes UNROLL vectors a block apart: their loads are all issued
    # before any is used, so a compute-heavy body still keeps memory busy.
    lines += ["  " + c for c in caches]
    lines.append("  const idx_t step = (idx_t)gridDim.x * blockDim.x * FC_VEC * FC_UNROLL;")
    lines.append("  for (idx_t base0 = ((idx_t)blockIdx.x * blockDim.x * FC_UNROLL + threadIdx.x)"
                 " * FC_VEC; base0 < numel; base0 += step) {")  # fmt: skip
    live = list(variant.live_dims)
    for prefix, i, _dtype, _ in tensors:
        lines.append(f"    idx_t {prefix}{i}_off[FC_UNROLL];")
    # an input also written in place must not be read through the read-only path
    load = ("fc_load_vec<FC_VEC>" if program.has_alias
            else f"fc_load_vec_hint<FC_VEC, {variant.load_hint}>")  # fmt: skip
    for i, acc in enumerate(program.accesses):
        mode, mt = variant.load_modes[i], MEMORY_TYPE[acc.dtype]
        if mode == "vec":
            lines.append(f"    fc_vec<{mt}, FC_VEC> a{i}_v[FC_UNROLL];")
        elif mode == "bcast":
            lines.append(f"    {mt} a{i}_b[FC_UNROLL];")
    lines.append("#pragma unroll")
    lines.append("    for (int u = 0; u < FC_UNROLL; ++u) {")
    lines.append("      const idx_t base = base0 + (idx_t)u * blockDim.x * FC_VEC;")
    lines.append("      idx_t rem = base < numel ? base : 0;")
    for d in range(R - 1, 0, -1):
        lines.append(f"      const idx_t c{d} = rem % n{d}; rem /= n{d};")
    lines.append("      const idx_t c0 = rem;")
    for k, (prefix, i, _dtype, _) in enumerate(tensors):
        terms = [f"c{d} * {prefix}{i}_s{d}" for d in range(R) if live[k][d]] or ["0"]
        lines.append(f"      {prefix}{i}_off[u] = {' + '.join(terms)};")
    for i in range(len(program.accesses)):
        mode = variant.load_modes[i]
        if mode == "vec":
            lines.append(f"      a{i}_v[u] = {load}(a{i} + a{i}_off[u]);")
        elif mode == "bcast":
            lines.append(f"      a{i}_b[u] = a{i}[a{i}_off[u]];")
    lines.append("    }")
    lines.append("#pragma unroll")
    lines.append("    for (int u = 0; u < FC_UNROLL; ++u) {")
    lines.append("      if (base0 + (idx_t)u * blockDim.x * FC_VEC >= numel) break;")
    for i, st in enumerate(program.stores):
        if variant.store_modes[i] == "vec":
            lines.append(f"      fc_vec<{MEMORY_TYPE[st.dtype]}, FC_VEC> o{i}_v;")
    lines.append("#pragma unroll")
    lines.append("      for (int j = 0; j < FC_VEC; ++j) {")
    for stmt in program.stmts:
        lines.append("        " + _render_stmt(program, variant, stmt))
    for i, st in enumerate(program.stores):
        value = to_memory(st.var, st.dtype)
        if variant.store_modes[i] == "vec":
            lines.append(f"        o{i}_v[j] = {value};")
        else:
            lines.append(f"        o{i}[o{i}_off[u] + j * o{i}_s{R - 1}] = {value};")
    lines.append("      }")
    for i in range(len(program.stores)):
        if variant.store_modes[i] == "vec":
            lines.append(f"      fc_store_vec_hint<FC_VEC, {variant.store_hint}>"
                         f"(o{i} + o{i}_off[u], o{i}_v);")  # fmt: skip
    lines.append("    }")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _render_stmt(program: PointwiseProgram, variant: PointwiseVariant, stmt) -> str:
    def load(i: int) -> str:
        if program.accesses[i].virtual:  # Note [Index accesses]: the element's index
            return f"(long long)(a{i}_off[u] + j * a{i}_s{variant.rank - 1})"
        mode = variant.load_modes[i]
        if mode == "vec":
            return f"a{i}_v[u][j]"
        if mode == "bcast":
            return f"a{i}_b[u]"
        return f"a{i}[a{i}_off[u] + j * a{i}_s{variant.rank - 1}]"

    return render_stmt(stmt, {s.var: s.dtype for s in program.stmts}, load)


def vector_width(dtypes) -> int:
    widest = max((ELEMENT_BYTES[d] for d in dtypes), default=4)
    return max(1, min(8, 16 // widest))
