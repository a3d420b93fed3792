"""Render a pointwise program and its variant as one CUDA C++ kernel.

The kernel is a grid-stride loop over the collapsed loop space; each thread handles VEC
consecutive elements of the innermost dim. Each input access loads a whole vector (`vec`),
one element reused VEC times (`bcast`, inner stride 0), or VEC strided elements.

Note [Broadcast rows] (knob pointwise.rows): a thread's UNROLL vectors may instead be rows
of the outermost dim, c0 = group * UNROLL + u at the same inner position, so an access dead
along that dim (RoPE's cos and sin tables, broadcast over batch and heads) is loaded once for
all of them: fewer L2 reads per byte of memory moved.
"""
from __future__ import annotations

from dataclasses import dataclass

from .cuda_ops import ELEMENT_BYTES, MEMORY_TYPE, prelude_features, random_setup
from .kernel_ir import PointwiseProgram
from .prelude import prelude_source
from .resize_cuda import (
    ResizeVariant,
    gathered_vector,
    loop_coords,
    resize_arg_types,
    resize_params,
    resize_stmt,
    scalar_load,
    scatter_store,
    vector_load,
)
from .stmt_cuda import render_stmt, scalar_arg_types, scalar_params, stored_form

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
    # reads through windows and by index (codegen/resize_cuda.py); load modes then also
    # 'strided' under a window, 'gather', 'vgather' and 'dead' (nothing to read)
    resize: ResizeVariant | None = None
    # Note [Paired halves]: per access, what each half of the innermost dim reads: 'load',
    # 'dead' (outside its window: zeros) or (access, half) whose vector it is; None: unpaired
    pair: tuple | None = None
    pair_guards: tuple | None = None  # per guard, per half: True/False where known, else None
    # Note [Broadcast rows]: the UNROLL vectors of a thread are rows of the outermost dim (the
    # loop covers n0 / UNROLL of them), so accesses dead along it are loaded once for all
    rows: bool = False

    def describe(self) -> str:
        tuned = (f" block={self.block} unroll={self.unroll} hints={self.load_hint}{self.store_hint}"
                 if (self.block, self.unroll, self.load_hint, self.store_hint) != (BLOCK, 1, 0, 0)
                 else "")  # fmt: skip
        extra = self.resize.describe() if self.resize is not None else ""
        if self.rows:
            extra += f" rows={self.unroll}"
        if self.pair is not None:
            extra += " pair=" + ",".join("/".join(
                m if isinstance(m, str) else f"a{m[0]}.{m[1]}" for m in p) for p in self.pair)
        return (f"rank={self.rank} vec={self.vec} index={self.index_type} "
                f"loads={','.join(self.load_modes)} stores={','.join(self.store_modes)}{tuned}"
                f"{extra}")  # fmt: skip


def arg_types(program: PointwiseProgram, variant: PointwiseVariant) -> tuple[str, ...]:
    idx = "i32" if variant.index_type == "int" else "i64"
    per_tensor = ("ptr",) + (idx,) * variant.rank
    per_index = (idx,) * variant.rank  # Note [Index accesses]: strides, no pointer
    scalars = scalar_arg_types(program)
    extra = resize_arg_types(variant.resize, idx) if variant.resize is not None else ()
    tensors = [per_index if a.virtual else per_tensor for a in program.accesses]
    tensors += [per_tensor] * len(program.stores)
    return (tuple(t for group in tensors for t in group) + (idx,) * (variant.rank + 1) + scalars
            + extra)  # fmt: skip


def render_pointwise(program: PointwiseProgram, variant: PointwiseVariant) -> str:
    R, V, U = variant.rank, variant.vec, variant.unroll
    rv = variant.resize
    features = prelude_features(program.stmts, program.stores) + (("index",) if rv is not None else ())
    P = 2 if variant.pair is not None else 1
    lines: list[str] = [prelude_source("core", "math", *features), f"#define FC_VEC {V}",
                        f"#define FC_UNROLL {U}", ""]  # fmt: skip
    if P > 1:  # Note [Paired halves]: a slot per vector and half
        lines[-1:-1] = [f"#define FC_SLOTS {U * P}"]
    slots = "FC_SLOTS" if P > 1 else "FC_UNROLL"
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
    if rv is not None:
        params += resize_params(rv)
    lines.append(f"typedef {variant.index_type} idx_t;")
    lines.append(f'extern "C" __global__ void __launch_bounds__({variant.block}) {KERNEL_NAME}(')
    lines.append("    " + ",\n    ".join(params) + ") {")
    # Each iteration a thread takes UNROLL vectors a block apart: their loads are all issued
    # before any is used, so a compute-heavy body still keeps memory busy.
    lines += ["  " + c for c in caches]
    per = "" if variant.rows else " * FC_UNROLL"  # Note [Broadcast rows]: one vector of a row group
    lines.append(f"  const idx_t step = (idx_t)gridDim.x * blockDim.x * FC_VEC{per};")
    lines.append(f"  for (idx_t base0 = ((idx_t)blockIdx.x * blockDim.x{per} + threadIdx.x)"
                 " * FC_VEC; base0 < numel; base0 += step) {")  # fmt: skip
    for prefix, i, _dtype, _ in tensors:
        lines.append(f"    idx_t {prefix}{i}_off[{slots}];")
    if rv is not None:  # the coordinates window tests and positions read in the j loop
        lines += [f"    idx_t cc{d}[{slots}];" for d in range(R)]
    # an input also written in place must not be read through the read-only path
    load = ("fc_load_vec<FC_VEC>" if program.has_alias
            else f"fc_load_vec_hint<FC_VEC, {variant.load_hint}>")  # fmt: skip
    for i, acc in enumerate(program.accesses):
        mode, mt = variant.load_modes[i], MEMORY_TYPE[acc.dtype]
        if mode in ("vec", "vgather"):
            lines.append(f"    fc_vec<{mt}, FC_VEC> a{i}_v[{slots}];")
        elif mode == "bcast":
            lines.append(f"    {mt} a{i}_b[{slots}];")
    lines.append("#pragma unroll")
    lines.append(f"    for (int {'uu' if P > 1 else 'u'} = 0; {'uu' if P > 1 else 'u'} < FC_UNROLL; "
                 f"++{'uu' if P > 1 else 'u'}) {{")  # fmt: skip
    uvar = "uu" if P > 1 else "u"
    lines.append(f"      const idx_t base = base0 + (idx_t){_next(variant, uvar)};")
    lines.append("      idx_t rem = base < numel ? base : 0;")
    last = f"c{R - 1}" if P == 1 else "cl"  # paired: the coordinate in the first half
    for d in range(R - 1, 0, -1):
        lines.append(f"      const idx_t {last if d == R - 1 else f'c{d}'} = rem % n{d}; rem /= n{d};")
    row = f"rem * FC_UNROLL + {uvar}" if variant.rows else "rem"
    lines.append(f"      const idx_t {last if R == 1 else 'c0'} = {row};")
    for half in range(P):
        lines += _slot_loads(program, variant, tensors, load, half)
    lines.append("    }")
    if _gathers_ahead(variant):
        lines += _gathers_first(program, variant)
    lines.append("#pragma unroll")
    lines.append(f"    for (int {'uu' if P > 1 else 'u'} = 0; {'uu' if P > 1 else 'u'} < FC_UNROLL; "
                 f"++{'uu' if P > 1 else 'u'}) {{")  # fmt: skip
    lines.append(f"      if (base0 + (idx_t){_next(variant, uvar)} >= numel) break;")
    for half in range(P):
        lines += _slot_body(program, variant, half)
    lines.append("    }")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _slot_loads(program: PointwiseProgram, variant: PointwiseVariant, tensors: list, load: str,
                half: int) -> list[str]:  # fmt: skip
    """Offsets, coordinates and loads ahead of the math, for slot u (a vector; paired, a
    vector and a half: Note [Paired halves])."""
    R, rv, P = variant.rank, variant.resize, 2 if variant.pair is not None else 1
    pad = "      "
    lines: list[str] = []
    if P > 1:
        pad = "        "
        lines += ["      {", f"{pad}const int u = uu * 2 + {half};",
                  f"{pad}const idx_t c{R - 1} = cl + {half} * n{R - 1};"]  # fmt: skip
    live = list(variant.live_dims)
    for k, (prefix, i, _dtype, _) in enumerate(tensors):
        terms = [f"c{d} * {prefix}{i}_s{d}" for d in range(R) if live[k][d]] or ["0"]
        if rv is not None and prefix == "a" and rv.offsets[i]:
            terms.append(f"a{i}_o")
        lines.append(f"{pad}{prefix}{i}_off[u] = {' + '.join(terms)};")
    if rv is not None:
        lines += [f"{pad}cc{d}[u] = c{d};" for d in range(R)]
    for i, acc in enumerate(program.accesses):
        mode = variant.load_modes[i]
        windowed = rv is not None and rv.preds[i]
        if P > 1 and variant.pair[i][half] != "load":
            continue  # zeros, or another access's vector (Note [Paired halves])
        if shares_rows(variant, i):  # Note [Broadcast rows]: the first row's load serves all
            lines.append(f"{pad}if ({'uu' if P > 1 else 'u'} == 0)")
        if mode == "vec" and windowed:
            vl = vector_load(rv, i, R, acc.dtype, variant.load_hint, program.has_alias)
            lines.append(f"{pad}a{i}_v[u] = {vl};")
        elif mode == "vec":
            lines.append(f"{pad}a{i}_v[u] = {load}(a{i} + a{i}_off[u]);")
        elif mode == "bcast" and windowed:
            lines.append(f"{pad}a{i}_b[u] = {scalar_load(rv, i, R, acc.dtype, 'bcast')};")
        elif mode == "bcast":
            lines.append(f"{pad}a{i}_b[u] = a{i}[a{i}_off[u]];")
    if P > 1:
        lines.append("      }")
    return lines


def _gathers_ahead(variant: PointwiseVariant) -> bool:
    """Note [Gathers ahead]: with several vectors a thread, the vector gathers are issued for
    all of them before any is used; a gather waits on its index's load, and issued in turn
    after the previous vector's math and stores, the gathers of one thread never overlap."""
    return variant.unroll > 1 and "vgather" in variant.load_modes and variant.pair is None


def _gathers_first(program: PointwiseProgram, variant: PointwiseVariant) -> list[str]:
    """Note [Gathers ahead]: per vector, the statements its vector gathers' index values and
    window tests need (at the vector's first element), then the gathers."""
    rv, R = variant.resize, variant.rank
    gathers = [st for st in program.stmts
               if st.op == "load" and variant.load_modes[st.operands[0]] == "vgather"]
    needed = set()
    for st in gathers:
        needed.update(rv.gathers[st.operands[0]])
    for st in reversed(program.stmts):
        if st.var in needed:
            needed.update(o for o in st.operands if isinstance(o, str))
    lines = ["#pragma unroll", "    for (int u = 0; u < FC_UNROLL; ++u) {",
             "      if (base0 + (idx_t)u * blockDim.x * FC_VEC >= numel) break;"]  # fmt: skip
    lines += [f"      const idx_t c{d} = cc{d}[u];" for d in range(R)]
    lines.append("      const int j = 0;")
    for st in program.stmts:
        if st.var in needed:
            lines.append("      " + _render_stmt(program, variant, st).replace("\n", "\n      "))
        elif st in gathers:
            load = gathered_vector(rv, st.operands[0], R, variant.load_hint, program.has_alias)
            lines.append("      " + load.replace("if (j == 0) ", ""))
    lines.append("    }")
    return lines


def _slot_body(program: PointwiseProgram, variant: PointwiseVariant, half: int) -> list[str]:
    """The math and stores of slot u."""
    R, rv, P = variant.rank, variant.resize, 2 if variant.pair is not None else 1
    pad = "      " if P == 1 else "        "
    lines: list[str] = []
    if P > 1:
        lines += ["      {", f"{pad}const int u = uu * 2 + {half};"]
    for i, st in enumerate(program.stores):
        if variant.store_modes[i] == "vec":
            lines.append(f"{pad}fc_vec<{MEMORY_TYPE[st.dtype]}, FC_VEC> o{i}_v;")
    if rv is not None:
        lines += [f"{pad}const idx_t c{d} = cc{d}[u];" for d in range(R)]
    lines.append("#pragma unroll")
    lines.append(f"{pad}for (int j = 0; j < FC_VEC; ++j) {{")
    inner = pad + "  "
    for stmt in program.stmts:
        text = _render_stmt(program, variant, stmt, half)
        lines.append(inner + text.replace("\n", "\n" + inner))
    dtypes = {s.var: s.dtype for s in program.stmts}
    for i, st in enumerate(program.stores):
        # a float cast down to the stored dtype is stored from the float: rounded once
        value = stored_form(program, dtypes, st.var, st.dtype)
        if variant.store_modes[i] == "vec":
            lines.append(f"{inner}o{i}_v[j] = {value};")
        elif variant.store_modes[i] in ("scatter", "atomic"):
            mode = variant.store_modes[i]
            lines.append(inner + scatter_store(rv, i, R, value, mode == "atomic"))
        else:
            lines.append(f"{inner}o{i}[o{i}_off[u] + j * o{i}_s{R - 1}] = {value};")
    lines.append(f"{pad}}}")
    for i in range(len(program.stores)):
        if variant.store_modes[i] == "vec":
            lines.append(f"{pad}fc_store_vec_hint<FC_VEC, {variant.store_hint}>"
                         f"(o{i} + o{i}_off[u], o{i}_v);")  # fmt: skip
    if P > 1:
        lines.append("      }")
    return lines


def _render_stmt(program: PointwiseProgram, variant: PointwiseVariant, stmt, half: int = 0) -> str:
    rv, R = variant.resize, variant.rank

    def load(i: int) -> str:
        if program.accesses[i].virtual:  # Note [Index accesses]: the element's index
            return f"(long long)(a{i}_off[u] + j * a{i}_s{variant.rank - 1})"
        mode = variant.load_modes[i]
        if variant.pair is not None:  # Note [Paired halves]
            seen = variant.pair[i][half]
            if seen == "dead":
                return f"fc_zero<{MEMORY_TYPE[program.accesses[i].dtype]}>()"
            if seen != "load":
                first = "" if shares_rows(variant, seen[0]) else "uu * 2 + "
                return f"a{seen[0]}_v[{first}{seen[1]}][j]"
        slot = "u"
        if shares_rows(variant, i):  # Note [Broadcast rows]: the first row's slot
            slot = str(half) if variant.pair is not None else "0"
        if mode in ("vec", "vgather"):
            if MEMORY_TYPE[program.accesses[i].dtype] == "fc_bf16" and variant.vec % 2 == 0:
                return f"fc_bf16_at(a{i}_v[{slot}], j)"  # a float through its 32-bit word
            return f"a{i}_v[{slot}][j]"
        if mode == "bcast":
            return f"a{i}_b[{slot}]"
        if mode == "dead":
            return f"fc_zero<{MEMORY_TYPE[program.accesses[i].dtype]}>()"
        if rv is not None:
            return scalar_load(rv, i, R, program.accesses[i].dtype, mode)
        return f"a{i}[a{i}_off[u] + j * a{i}_s{R - 1}]"

    if variant.pair_guards is not None and stmt.op == "guard":
        known = variant.pair_guards[dict(stmt.attrs)["guard"]][half]
        if known is not None:  # Note [Paired halves]: decided by the half
            return f"const bool {stmt.var} = {'true' if known else 'false'};"
    if rv is not None:
        text = resize_stmt(rv, stmt, loop_coords(R, True), program.checks)
        if text is not None:
            return text
        if stmt.op == "load" and variant.load_modes[stmt.operands[0]] == "vgather" and (
                not _gathers_ahead(variant)):  # fmt: skip
            first = gathered_vector(rv, stmt.operands[0], R, variant.load_hint, program.has_alias)
            return first + "\n" + render_stmt(stmt, {s.var: s.dtype for s in program.stmts}, load)
    return render_stmt(stmt, {s.var: s.dtype for s in program.stmts}, load)


def _next(variant: PointwiseVariant, uvar: str) -> str:
    """The offset in the loop's space of a thread's vector `uvar` from its first."""
    return "0" if variant.rows else f"{uvar} * blockDim.x * FC_VEC"


def shares_rows(variant: PointwiseVariant, i: int) -> bool:
    """Note [Broadcast rows]: access i reads the same vector for every row of a thread (dead
    along the outermost dim and read without a window, which could test that dim)."""
    return (variant.rows and not variant.live_dims[i][0]
            and variant.load_modes[i] in ("vec", "bcast")
            and not (variant.resize is not None and variant.resize.preds[i]))


def vector_width(dtypes) -> int:
    widest = max((ELEMENT_BYTES[d] for d in dtypes), default=4)
    return max(1, min(8, 16 // widest))
