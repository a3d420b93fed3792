"""Render a pointwise program and its variant as one CUDA C++ kernel.

The kernel is a grid-stride loop over the collapsed loop space; each thread handles VEC
consecutive elements of the innermost dim. Each input access loads a whole vector (`vec`),
one element reused VEC times (`bcast`, inner stride 0), or VEC strided elements.
"""
from __future__ import annotations

from dataclasses import dataclass

from schedulers.pointwise import PointwiseProgram

from .cuda_ops import ELEMENT_BYTES, MEMORY_TYPE
from .prelude import prelude_source
from .stmt_cuda import render_stmt, scalar_arg_types, scalar_params, to_memory

KERNEL_NAME = "fc_pointwise"
BLOCK = 128


@dataclass(frozen=True)
class PointwiseVariant:
    rank: int  # collapsed loop rank (>= 1)
    vec: int  # elements per thread along the innermost dim
    index_type: str  # 'int' or 'long long'
    load_modes: tuple[str, ...]  # per access: 'vec', 'bcast' or 'strided'
    store_modes: tuple[str, ...]  # per store: 'vec' or 'strided'
    live_dims: tuple[tuple[bool, ...], ...]  # per access then per store: stride != 0 per dim

    def describe(self) -> str:
        return (f"rank={self.rank} vec={self.vec} index={self.index_type} "
                f"loads={','.join(self.load_modes)} stores={','.join(self.store_modes)}")  # fmt: skip


def arg_types(program: PointwiseProgram, variant: PointwiseVariant) -> tuple[str, ...]:
    idx = "i32" if variant.index_type == "int" else "i64"
    per_tensor = ("ptr",) + (idx,) * variant.rank
    scalars = scalar_arg_types(program)
    return (per_tensor * (len(program.accesses) + len(program.stores))
            + (idx,) * (variant.rank + 1) + scalars)  # fmt: skip


def render_pointwise(program: PointwiseProgram, variant: PointwiseVariant) -> str:
    R, V = variant.rank, variant.vec
    lines: list[str] = [prelude_source("core", "math"), f"#define FC_VEC {V}", ""]
    params: list[str] = []
    tensors = [("a", i, acc.dtype, True) for i, acc in enumerate(program.accesses)]
    tensors += [("o", i, st.dtype, False) for i, st in enumerate(program.stores)]
    for prefix, i, dtype, readonly in tensors:
        const = "const " if readonly else ""
        restrict = " __restrict__" if not program.has_alias else ""
        params.append(" ".join((f"{const}{MEMORY_TYPE[dtype]}*{restrict}", f"{prefix}{i}")))
        params += [f"idx_t {prefix}{i}_s{d}" for d in range(R)]
    params += [f"idx_t n{d}" for d in range(R)] + ["idx_t numel"]
    params += scalar_params(program)
    lines.append(f"typedef {variant.index_type} idx_t;")
    lines.append(f'extern "C" __global__ void __launch_bounds__({BLOCK}) {KERNEL_NAME}(')
    lines.append("    " + ",\n    ".join(params) + ") {")
    lines.append("  const idx_t step = (idx_t)gridDim.x * blockDim.x * FC_VEC;")
    lines.append("  for (idx_t base = ((idx_t)blockIdx.x * blockDim.x + threadIdx.x) * FC_VEC;"
                 " base < numel; base += step) {")  # fmt: skip
    lines.append("    idx_t rem = base;")
    for d in range(R - 1, 0, -1):
        lines.append(f"    const idx_t c{d} = rem % n{d}; rem /= n{d};")
    lines.append("    const idx_t c0 = rem;")
    live = list(variant.live_dims)
    for k, (prefix, i, _dtype, _) in enumerate(tensors):
        terms = [f"c{d} * {prefix}{i}_s{d}" for d in range(R) if live[k][d]] or ["0"]
        lines.append(f"    const idx_t {prefix}{i}_off = {' + '.join(terms)};")
    load = "fc_load_vec" if program.has_alias else "fc_load_vec_ro"
    for i, acc in enumerate(program.accesses):
        mode, mt = variant.load_modes[i], MEMORY_TYPE[acc.dtype]
        if mode == "vec":
            lines.append(f"    const fc_vec<{mt}, FC_VEC> a{i}_v = {load}<FC_VEC>(a{i} + a{i}_off);")
        elif mode == "bcast":
            lines.append(f"    const {mt} a{i}_b = a{i}[a{i}_off];")
    for i, st in enumerate(program.stores):
        if variant.store_modes[i] == "vec":
            lines.append(f"    fc_vec<{MEMORY_TYPE[st.dtype]}, FC_VEC> o{i}_v;")
    lines.append("#pragma unroll")
    lines.append("    for (int j = 0; j < FC_VEC; ++j) {")
    for stmt in program.stmts:
        lines.append("      " + _render_stmt(program, variant, stmt))
    for i, st in enumerate(program.stores):
        value = to_memory(st.var, st.dtype)
        if variant.store_modes[i] == "vec":
            lines.append(f"      o{i}_v[j] = {value};")
        else:
            lines.append(f"      o{i}[o{i}_off + j * o{i}_s{R - 1}] = {value};")
    lines.append("    }")
    for i in range(len(program.stores)):
        if variant.store_modes[i] == "vec":
            lines.append(f"    fc_store_vec<FC_VEC>(o{i} + o{i}_off, o{i}_v);")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _render_stmt(program: PointwiseProgram, variant: PointwiseVariant, stmt) -> str:
    def load(i: int) -> str:
        mode = variant.load_modes[i]
        if mode == "vec":
            return f"a{i}_v[j]"
        if mode == "bcast":
            return f"a{i}_b"
        return f"a{i}[a{i}_off + j * a{i}_s{variant.rank - 1}]"

    return render_stmt(stmt, {s.var: s.dtype for s in program.stmts}, load)


def vector_width(dtypes) -> int:
    widest = max((ELEMENT_BYTES[d] for d in dtypes), default=4)
    return max(1, min(8, 16 // widest))
