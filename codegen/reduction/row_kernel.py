"""The row (inner) kernel: TX threads a row, TY rows a block, CLUSTER blocks a row; one pass
over the row per reduction stage and a last pass for element-level outputs and column
partials. `RowKernel` writes it; its parts live with their decisions: how the row's data
arrives (row_loads.py), the cluster's exchange and the deferred row end
(cluster_exchange.py), column partials and their finish (column_finish.py)."""
from __future__ import annotations

from collections.abc import Sequence

from fusion_cache.frontend.dtypes import DataType

from ..cuda_ops import (
    MEMORY_TYPE,
    RANDOM_STMTS,
    REGISTER_TYPE,
    convert,
    prelude_features,
    random_setup,
)
from ..kernel_ir import ReductionProgram, needed
from ..prelude import prelude_source
from ..resize_cuda import resize_arg_types, resize_params, resize_stmt
from ..stmt_cuda import render_stmt, scalar_arg_types, stored_form, to_memory
from .cluster_exchange import ClusterExchange
from .column_finish import ColumnPartials
from .common import (
    acc_type,
    accumulate_stmt,
    accumulator_type,
    ident,
    identity_of,
    k_offset,
    kernel_params,
    merged_groups,
    op_functor,
    render_row_division,
    row_divisions,
    row_level_stmts,
    softmax_reductions,
)
from .row_loads import RowLoads
from .variants import InnerVariant

INNER_NAME = "fc_inner_reduction"


def inner_arg_types(program: ReductionProgram, v: InnerVariant) -> tuple[str, ...]:
    idx = "i32" if v.index_type == "int" else "i64"
    per = ("ptr",) + (idx,) * (v.i_rank + 1 + v.k2)
    scal = scalar_arg_types(program)
    sizes = (idx,) * (v.i_rank + 2 + v.k2)
    finish = ("ptr",) * (len(v.finish) + 1) if v.finish else ()  # the outputs, the barrier
    resize = resize_arg_types(v.resize, idx) if v.resize is not None else ()
    return per * (len(program.accesses) + len(program.stores)) + sizes + scal + resize + finish


def render_inner(program: ReductionProgram, v: InnerVariant) -> str:
    return RowKernel(program, v).render()


class RowKernel(RowLoads, ClusterExchange, ColumnPartials):
    """The writer of one row kernel: the program, the variant and the lines so far."""

    first_row0 = "(idx_t)(blockIdx.x / FC_CLUSTER) * FC_TY"
    row_step = "(idx_t)(gridDim.x / FC_CLUSTER) * FC_TY"

    def __init__(self, program: ReductionProgram, v: InnerVariant) -> None:
        self.program, self.v = program, v
        self.dtypes = {s.var: s.dtype for s in program.stmts}
        self.n_acc = n_acc = len(program.accesses)
        self.L: list[str] = []
        self.two_pass_all = [r for r in program.reductions if r.op == "welford" and v.iters > 0]
        # each stage's block reductions but the two-pass ones, as they travel together
        self.combined = {stage: merged_groups((r for r in program.reductions
                                               if r.stage == stage and r not in self.two_pass_all),
                                              v.merge)
                         for stage in range(1, program.stages + 1)}  # fmt: skip
        self.tensors = [("a", i) for i in range(n_acc)] + [("o", i) for i in range(len(program.stores))]
        # Note [Row pipeline]: the row-level loads (layer norm backward's mean and rstd) of the
        # next row group are loaded ahead too, into registers, so that no load of the row's own
        # waits on memory once its stage has arrived (not those read by index or in a window)
        self.rv = rv = v.resize
        self.row_level = [i for i in range(n_acc) if v.modes[i] == "row" and (
            rv is None or not (rv.gathers[i] or rv.preds[i]))] if v.pipeline else []  # fmt: skip
        self.cached = v.iters > 0
        # element-level inputs no row stride reaches: every row reads them again (the weights)
        self.shared_by_rows = {i for i in range(n_acc) if v.modes[i] != "row" and not any(v.live[i])}
        # Note [Weights loaded once]
        self.hoisted = [i for i in sorted(self.shared_by_rows)
                        if v.weights and self.cached and i not in v.cached]  # fmt: skip
        self.in_smem = v.weights == "shared" and bool(self.hoisted)
        self.carried: set[str] = set()  # element values kept in registers by an earlier pass
        self.divisions = row_divisions(program)
        self.deferred: tuple | None = None  # Note [Deferred row end]: (ctype, op, group)
        self.early = early_stores(program, v)
        self.softmax = softmax_reductions(program)  # (max, sum of exp(x - max)) or None
        self.flushed: set[str] = set()  # exps rendered flushed (Note [Flushed softmax terms])

    def render(self) -> str:
        program, v, L = self.program, self.v, self.L
        self.signature()
        self.cluster_slice()
        self.partials_init()
        self.hoist_weights()
        many = v.rows_a_thread > 1  # Note [Rows a thread]
        if v.pipeline:
            self.pipelined_loop_head()
        elif many:
            step = f" * {v.rows_a_thread}"
            L.append(f"  for (idx_t row0 = {self.first_row0}{step}; row0 < rows; "
                     f"row0 += {self.row_step}{step}) {{")  # fmt: skip
            self.load_rows_ahead()
            L.append("#pragma unroll")
            L.append(f"  for (int rr = 0; rr < {v.rows_a_thread}; ++rr) {{")
        else:
            L.append(f"  for (idx_t row0 = {self.first_row0}; row0 < rows; row0 += {self.row_step}) {{")
        every = range(len(self.tensors))
        first_row = "row0 + (idx_t)rr * FC_TY + threadIdx.y" if many else "row0 + threadIdx.y"
        L.extend("    " + x for x in self.row_offsets(first_row, "", every))
        self.cache_row()
        self.row_stmts(0)
        # Note [Deferred row end]: the last pass of a row group sees only row-level values it
        # computes again and the one exchange's result; anything else would be the next row's
        assert not v.defer or (v.pipeline and v.rows_in_smem and v.cluster > 1 and not v.exchange_async
                               and program.stages == 1 and len(self.combined[1]) == 1
                               and not self.two_pass_all)  # fmt: skip
        self.reduce_stages()
        if v.defer:
            self.deferred_loop_end()
        else:
            self.row_end()
            L.append("  }")
            if many:
                L.append("  }")
        if v.pipeline or self.in_smem:  # no copy still in flight when the block ends
            L.append("  fc_cp_async_wait<0>();")
        self.block_partials()
        if v.finish:
            self.finish_in_kernel()
        L.append("}")
        return "\n".join(L) + "\n"

    def signature(self) -> None:
        """The prelude, the kernel's parameters and its shared buffers for row reductions."""
        program, v, L = self.program, self.v, self.L
        features = prelude_features(program.stmts, program.stores)
        features += ("index",) if self.rv is not None else ()
        L += [prelude_source("core", "math", "reduce", *features), f"typedef {v.index_type} idx_t;",
              f"#define FC_VEC {v.vec}", f"#define FC_TX {v.tx}", f"#define FC_TY {v.ty}",
              f"#define FC_CLUSTER {v.cluster}"]  # fmt: skip
        extra = ["idx_t rows", "idx_t N"] + [f"idx_t n{d}" for d in range(v.i_rank)]
        extra += ["idx_t K1"] if v.k2 else []
        threads = v.tx * v.ty
        bounds = f"{threads}, {v.min_blocks}" if v.min_blocks > 1 else f"{threads}"
        dims = " __cluster_dims__(FC_CLUSTER, 1, 1)" if v.cluster > 1 else ""
        L.append(f'extern "C" __global__ void{dims} __launch_bounds__({bounds}) {INNER_NAME}(')
        params = kernel_params(program, v.i_rank, extra, v.k2, v.acc)
        params += resize_params(self.rv) if self.rv is not None else []
        params += self.finish_params()
        L.append("    " + ",\n    ".join(params) + ") {")
        shared_types = {REGISTER_TYPE[r.dtype] for r in self.two_pass_all}
        for group in (g for groups in self.combined.values() for g in groups):
            ct = accumulator_type(group[0])
            shared_types.add(ct if len(group) == 1 else f"fc_multi<{ct}, {len(group)}>")
        for t in sorted(shared_types):
            # Note [Alternating row buffers]: two buffers, and a count of the calls using them
            L.append(f"  __shared__ {t} smem_{ident(t)}[{64 if v.alternate else 32}];")
            if v.alternate:
                L.append(f"  unsigned rr_{ident(t)} = 0;")
            L.extend(self.cluster_buffers(t))
        # random numbers (the scheduler lets them in only with the reduced dims innermost):
        # element k of row `row` is element row * N + k of the loop, row-major
        define, caches = random_setup(program.stmts, "(unsigned long long)row * N + kb + j",
                                      "j" if v.rng_lanes else None)
        L[1:1] = define
        L.extend("  " + c for c in caches)
        L.append("  const int tx = threadIdx.x;")

    def row_offsets(self, row: str, pre: str, which: Sequence[int]) -> list[str]:
        """Offsets of row `row` in the tensors numbered `which`: {pre}a0_row, ..."""
        v = self.v
        out = [f"const idx_t {pre}row = {row};", f"const bool {pre}row_ok = {pre}row < rows;",
               f"idx_t {pre}rem = {pre}row_ok ? {pre}row : 0;"]  # fmt: skip
        for d in range(v.i_rank - 1, 0, -1):
            out.append(f"const idx_t {pre}c{d} = {pre}rem % n{d}; {pre}rem /= n{d};")
        out.append(f"const idx_t {pre}c0 = {pre}rem;")
        for k in which:
            p, i = self.tensors[k]
            terms = [f"{pre}c{d} * {p}{i}_s{d}" for d in range(v.i_rank) if v.live[k][d]] or ["0"]
            if p == "a" and self.rv is not None and self.rv.offsets[i]:
                terms.append(f"a{i}_o")  # Note [Resize frames]: past a slice's start
            out.append(f"const idx_t {pre}{p}{i}_row = {' + '.join(terms)};")
        return out

    def flushed_subs(self) -> set[str]:
        """The x - m operands of the exps rendered flushed: each exp reads x and m instead."""
        by_var = {st.var: st for st in self.program.stmts}
        return {by_var[e].operands[0] for e in self.flushed}

    def coord(self, per_element: bool):
        """Coordinates of windows and positions: row dims c{d}, the reduced one (kb + j)."""

        def coord(target) -> str:
            if target == "k":
                assert per_element, "a window along the reduced dim tested once a row"
                return "(long long)(kb + j)"
            return f"(long long){target}" if isinstance(target, str) else f"(long long)c{target}"

        return coord

    def stmt(self, st, load, per_element: bool) -> str:
        """One statement; windows, positions and index checks too ("" for the x - m that a
        flushed exp reads as x*log2(e) - m*log2(e))."""
        if self.flushed and st.op == "sub" and st.var in self.flushed_subs():
            return ""
        if self.rv is not None:
            text = resize_stmt(self.rv, st, self.coord(per_element), self.program.checks)
            if text is not None:
                return text
        if st.var in self.flushed:  # Note [Flushed softmax terms]: exp2 of x*log2(e) - m*log2(e)
            x, m = self.softmax[0].input, self.softmax[0].var
            return (f"const float {st.var} = fc_exp2_flushed(fmaf({x}, 1.4426950408889634f, "
                    f"{m} * -1.4426950408889634f));")  # fmt: skip
        return render_stmt(st, self.dtypes, load)

    def element_pass(self, targets: list[str], body_end: list[str], carry: Sequence[str] = (),
                     pre: Sequence[str] = (), post: Sequence[str] = ()) -> None:  # fmt: skip
        """One pass over the row computing `targets`; per vector: `pre` lines, then per
        element the statements and `body_end`, then `post` lines."""
        program, v, L, dtypes = self.program, self.v, self.L, self.dtypes
        stmts, reads = needed(program, targets, frozenset(self.carried))
        loads = sorted({s.operands[0] for s in stmts if s.op == "load"})
        # a value two later passes read is carried once (ResNet-18's batch-norm backward named
        # one twice, and NVRTC refused the second declaration); one carried already stays
        carry = [var for var in dict.fromkeys(carry) if var not in self.carried]
        for var in carry:
            L.append(f"    {REGISTER_TYPE[dtypes[var]]} {var}_c[{v.iters}][FC_VEC];")
        if self.in_smem and any(i in self.hoisted for i in loads):  # the weights have landed
            L.append("    fc_cp_async_wait<0>();")
        if self.cached:
            L.append("#pragma unroll")
            L.append(f"    for (int it = 0; it < {v.iters}; ++it) {{")
            L.append("      const idx_t kb = k_lo + ((idx_t)it * FC_TX + tx) * FC_VEC;")
        else:
            if v.unroll > 1:
                L.append(f"#pragma unroll {v.unroll}")
            L.append("    for (idx_t kb = k_lo + (idx_t)tx * FC_VEC; kb < k_hi; kb += FC_TX * FC_VEC) {")
        L.append("      const bool ok = row_ok && kb < k_hi;")
        for i in loads:
            L.extend(self.vector_load(i))
        L.extend("      " + line for line in pre)
        L.append("#pragma unroll")
        L.append("      for (int j = 0; j < FC_VEC; ++j) {")
        for var in reads:
            L.append(f"        const {REGISTER_TYPE[dtypes[var]]} {var} = {var}_c[it][j];")
        for st in stmts:
            line = (render_row_division(st, dtypes) if st.var in self.divisions
                    else self.stmt(st, self.elem_load, True))  # fmt: skip
            if line:
                L.append("        " + line)
        for var in carry:
            L.append(f"        {var}_c[it][j] = {var};")
        L.extend("        " + line for line in body_end)
        L.append("      }")
        L.extend("      " + line for line in post)
        L.append("    }")
        self.carried.update(carry)

    def carry_for(self, reds: list) -> list[str]:
        """Reduction inputs that later passes read again, if registers allow keeping them."""
        program, v = self.program, self.v
        if not self.cached or v.defer:  # a deferred last pass runs after the next row's first
            return []
        later = [r.input for r in program.reductions if r.stage > reds[0].stage]
        early = {k for k, _ in self.early}
        later += [s.var for k, s in enumerate(program.stores)
                  if not program.store_rowlevel[k] and k not in early]  # fmt: skip
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
        out = out if v.iters * v.vec * len(out) <= budget else []
        # random numbers cost some 25 instructions an element to draw again (Philox): kept
        # whenever a later pass reads them past the values carried, so a row draws them once
        now = {st.var for st in needed(program, [r.input for r in reds])[0]}
        kept = frozenset(out) | frozenset(self.carried)
        redrawn = {st.var for t in later for st in needed(program, [t], kept)[0]}
        return out + [st.var for st in program.stmts if st.op in RANDOM_STMTS
                      and st.var in redrawn and st.var in now and st.var not in out]  # fmt: skip

    def row_stmts(self, stage: int) -> None:
        """The row-level statements of `stage`, then the reciprocals of the row divisors
        they define (Note [Row divisors] in prelude/math.cuh)."""
        program = self.program
        self.L.extend("    " + s for s in row_level_stmts(program, stage, self.dtypes, self.row_load,
                                                          lambda st, load: self.stmt(st, load, False)))
        stage_of = dict(program.stage_of)
        for y, ct in sorted(set(self.divisions.values())):
            if stage_of.get(y, 0) == stage and y not in program.element_vars:
                self.L.append(f"    const fc_divisor<{ct}> {y}_d = fc_divisor_of(({ct}){y});")

    def row_reduce(self, var: str, ctype: str, op: str) -> str:
        """`var` reduced over the row's threads (Note [Alternating row buffers])."""
        parity = f", (int)(rr_{ident(ctype)}++ & 1u)" if self.v.alternate else ""
        return f"fc_row_reduce<FC_TX, FC_TX * FC_TY>({var}, {op}, smem_{ident(ctype)}{parity})"

    def combine(self, var: str, ctype: str, op: str) -> None:
        """Reduce `var` over the row's threads, then over the cluster's blocks."""
        self.L.append(f"    {var} = {self.row_reduce(var, ctype, op)};")
        self.cluster_combine(var, ctype, op)

    def reduce_stages(self) -> None:
        """Each stage's pass over the row, its reductions combined, then the row-level
        statements that follow from them."""
        program, v, L, dtypes = self.program, self.v, self.L, self.dtypes
        for stage in range(1, program.stages + 1):
            reds = [r for r in program.reductions if r.stage == stage]
            # Note [Two-pass Welford]: with the row in registers, var and mean are two passes of
            # plain sums: the row's sum gives its mean, then the squared deviations from it are
            # summed. Exact two-pass accuracy, and two cheap block sums instead of a tree of
            # Welford combines, each with a division (var_mean bf16 4096x16384 ran 3x the
            # instructions of torch.compile's kernel that way).
            two_pass = [r for r in reds if r in self.two_pass_all]
            body: list[str] = []
            pre: list[str] = []
            post: list[str] = []
            for r in reds:
                rt = REGISTER_TYPE[r.dtype]
                if r in two_pass:
                    L.append(f"    {rt} {r.var}_s = ({rt})0;")
                    body.append(f" {r.var}_s += {convert(r.input, dtypes[r.input], r.dtype)};")
                    continue
                L.append(f"    {accumulator_type(r)} {r.var} = {identity_of(r)};")
                if r.op == "welford" and v.vec > 1:
                    # a vector's values join the running Welford triple together: one division
                    # a vector instead of one a value (a vector never straddles the row's end)
                    pre.append(f"{rt} {r.var}_x[FC_VEC];")
                    body.append(f" {r.var}_x[j] = {convert(r.input, dtypes[r.input], r.dtype)};")
                    post.append(f"if (ok) {r.var} = fc_welford_add<FC_VEC>({r.var}, {r.var}_x);")
                    continue
                body.append(" " + accumulate_stmt(r, r.input, dtypes))
            targets, body = [r.input for r in reds], ["if (ok) {", *body, "}"]
            early = self.early if stage == 1 else ()
            if early:  # Note [Stores in the first pass]
                store_body, decls, stores = self.store_lines(early)
                targets += [s.var for _, s in early]
                body, pre, post = body + store_body, pre + decls, post + stores
            carry = self.carry_for(reds)
            # Note [Flushed softmax terms] (prelude/math.cuh): a softmax sum's exps, unless
            # carried to a later pass or read by a store of this pass (outputs keep subnormals)
            sums = [r.input for r in reds if self.softmax and r is self.softmax[1]]
            self.flushed = set() if early else {x for x in sums if x not in carry}
            self.element_pass(targets, body, carry, pre, post)
            self.flushed = set()
            if two_pass:
                body = []
                for r in two_pass:
                    rt = REGISTER_TYPE[r.dtype]
                    self.combine(f"{r.var}_s", rt, f"fc_op_sum<{rt}>()")
                    L.append(f"    const {rt} {r.var}_mean = {r.var}_s / ({rt})N;")
                    L.append(f"    {rt} {r.var}_m2 = ({rt})0;")
                    x = convert(r.input, dtypes[r.input], r.dtype)
                    body.append(f" const {rt} {r.var}_d = {x} - {r.var}_mean; "
                                f"{r.var}_m2 += {r.var}_d * {r.var}_d;")  # fmt: skip
                self.element_pass([r.input for r in two_pass], ["if (ok) {", *body, "}"])
                for r in two_pass:
                    rt = REGISTER_TYPE[r.dtype]
                    self.combine(f"{r.var}_m2", rt, f"fc_op_sum<{rt}>()")
                    L.append(f"    {accumulator_type(r)} {r.var}; {r.var}.mean = {r.var}_mean; "
                             f"{r.var}.m2 = {r.var}_m2; {r.var}.count = (int)N;")  # fmt: skip
            for g, group in enumerate(self.combined[stage]):
                last = v.defer and stage == program.stages and g == len(self.combined[stage]) - 1
                if len(group) == 1:
                    var, ctype, op = group[0].var, accumulator_type(group[0]), op_functor(group[0])
                else:
                    ct, n = accumulator_type(group[0]), len(group)  # Note [Merged row reductions]
                    var, ctype = f"{group[0].var}_m", f"fc_multi<{ct}, {n}>"
                    op = f"fc_op_multi<{ct}, {', '.join(op_functor(r)[:-2] for r in group)}>()"
                    L.append(f"    {ctype} {var} = {{{{{', '.join(r.var for r in group)}}}}};")
                if last:  # Note [Deferred row end]: the block's partial waits to be sent
                    L.append(f"    {var} = {self.row_reduce(var, ctype, op)};")
                    L.append(f"    const {ctype} fc_send = {var};")
                    self.deferred = (ctype, op, group)
                    continue
                self.combine(var, ctype, op)
                if len(group) > 1:
                    L.extend(f"    {r.var} = {var}.v[{i}];" for i, r in enumerate(group))
            if not (v.defer and stage == program.stages):
                self.row_stmts(stage)

    def row_end(self) -> None:
        """The last pass (element-level outputs, column partials) and row-level outputs."""
        program, v, L = self.program, self.v, self.L
        early = {k for k, _ in self.early}
        elem_stores = [(k, s) for k, s in enumerate(program.stores)
                       if not program.store_rowlevel[k] and k not in early]  # fmt: skip
        if elem_stores:
            self.last_pass(elem_stores)
        for k, s in enumerate(program.stores):
            if program.store_rowlevel[k]:
                first = "tx == 0 && cl_rank == 0" if v.cluster > 1 else "tx == 0"
                L.append(f"    if ({first} && row_ok) o{k}[o{k}_row] = {to_memory(s.var, s.dtype)};")

    def last_pass(self, elem_stores: list) -> None:
        v, L = self.v, self.L
        for i in range(self.n_acc):
            if i not in v.cached and self.cached:
                L.append(f"    fc_opaque(a{i});")
        body, decls, post = self.store_lines(elem_stores)
        self.element_pass([s.var for _, s in elem_stores], body, pre=decls, post=post)

    def store_lines(self, elem_stores: list) -> tuple[list[str], list[str], list[str]]:
        """(per element, per vector before, per vector after) lines storing `elem_stores`."""
        program, v, dtypes, n_acc = self.program, self.v, self.dtypes, self.n_acc
        body, decls, post = [], [], []
        for k, s in elem_stores:
            if k in v.acc:  # Note [Column partials]
                body.append(f"if (ok) acc{k}[it][j] += ({acc_type(s.dtype)}){s.var};")
                continue
            value = stored_form(program, dtypes, s.var, s.dtype)
            if v.modes[n_acc + k] != "vec":
                at = k_offset(f"o{k}", "kb + j", v.k2)
                body.append(f"if (ok) o{k}[o{k}_row + {at}] = {value};")
                continue
            at = k_offset(f"o{k}", "kb", v.k2, unit=True)
            if s.dtype is DataType.Bool and v.store_hint == 0:  # Note [Mask words]
                decls.append(f"fc_mask_bytes<FC_VEC> o{k}_v = fc_mask_init<FC_VEC>();")
                body.append(f"fc_mask_set(o{k}_v, j, {value});")
                post.append(f"if (ok) fc_store_mask(o{k} + o{k}_row + {at}, o{k}_v);")
                continue
            decls.append(f"fc_vec<{MEMORY_TYPE[s.dtype]}, FC_VEC> o{k}_v;")
            body.append(f"o{k}_v[j] = {value};")
            post.append(f"if (ok) fc_store_vec_hint<FC_VEC, {v.store_hint}>"
                        f"(o{k} + o{k}_row + {at}, o{k}_v);")  # fmt: skip
        return body, decls, post


# Note [Stores in the first pass]: an element-level output that no row reduction feeds (the
# keep mask of dropout + residual + layer norm) is stored by the pass that first computes it,
# as its vector's loads arrive, instead of being carried in registers to the last pass.
def early_stores(program: ReductionProgram, v: InnerVariant) -> list:
    """(k, store) of the element-level outputs the first pass of a cached row stores."""
    if not v.iters or v.defer or program.stages == 0 or v.resize is not None:
        return []
    stage_of = dict(program.stage_of)
    return [(k, s) for k, s in enumerate(program.stores)
            if not program.store_rowlevel[k] and k not in v.acc and stage_of.get(s.var) == 0]
