"""How a row kernel's data arrives: copied ahead through shared memory (Note [Row
pipeline]), kept there (Note [Rows in shared memory]) or in registers for every pass, weights
loaded once (Note [Weights loaded once]), or loaded again in each pass."""
from __future__ import annotations

from ..cuda_ops import MEMORY_TYPE
from ..resize_cuda import gathered, pred_test
from .common import k_offset


def zero(mt: str) -> str:
    """The zero of a memory type: T() for a one-word name, a cast for `long long`."""
    return f"({mt})0" if " " in mt else f"{mt}()"


class RowLoads:
    """Mixed into RowKernel (row_kernel.py): reads its program, variant `v`, lines `L`,
    `cached` (the row kept for every pass), `row_level`, `shared_by_rows`, `hoisted` and
    `in_smem`."""

    def stage_chunk(self, slot: str, c: int) -> str:  # this thread's 16 bytes of cached input c
        v = self.v
        return (f"fc_stage[(((({slot}) * {len(v.cached)} + {c}) * FC_TY + threadIdx.y) * {v.iters}"
                " + it) * FC_TX + tx]")  # fmt: skip

    def prefetch(self, row0: str, slot: str) -> list[str]:
        """cp.async of the cached inputs of row group `row0` into stage `slot`, and loads of
        its row-level values into registers."""
        program, v = self.program, self.v
        out = ["{"] + ["  " + x for x in self.row_offsets(f"{row0} + threadIdx.y", "p_",
                                                        [*v.cached, *self.row_level])]  # fmt: skip
        for i in self.row_level:
            mt = MEMORY_TYPE[program.accesses[i].dtype]
            out.append(f"  a{i}_next = p_row_ok ? a{i}[p_a{i}_row] : {zero(mt)};")
        out += ["#pragma unroll", f"  for (int it = 0; it < {v.iters}; ++it) {{",
                "    const idx_t kb = k_lo + ((idx_t)it * FC_TX + tx) * FC_VEC;",
                "    const bool ok = p_row_ok && kb < k_hi;"]  # fmt: skip
        for c, i in enumerate(v.cached):
            at = k_offset(f"a{i}", "kb", v.k2, unit=True)
            out.append(f"    fc_cp_async16(&{self.stage_chunk(slot, c)}, ok ? a{i} + p_a{i}_row + {at} "
                       f": a{i}, ok);")  # fmt: skip
        return out + ["  }", "}"]

    def pipelined_loop_head(self) -> None:
        """Note [Row pipeline]: stage slot^1 fills with the next row group while this one
        runs; deferred (Note [Deferred row end]), a ring of three stages."""
        program, v, L = self.program, self.v, self.L
        first_row0, row_step = self.first_row0, self.row_step
        stages, after = (3, "slot == 2u ? 0u : slot + 1u") if v.defer else (2, "slot ^ 1u")
        L.append(f"  extern __shared__ uint4 fc_stage[];  // [{stages}][cached][TY][ITERS][TX] chunks")
        L.extend(f"  {MEMORY_TYPE[program.accesses[i].dtype]} a{i}_next;" for i in self.row_level)
        L.extend("  " + x for x in self.prefetch(first_row0, "0"))
        L.append("  fc_cp_async_commit();")
        L.append("  unsigned slot = 0;")
        if v.defer:
            self.deferred_state()
        L.append(f"  for (idx_t row0 = {first_row0}; row0 < rows; row0 += {row_step}, slot = {after}) {{")
        L.extend(f"    const {MEMORY_TYPE[program.accesses[i].dtype]} a{i}_now = a{i}_next;"
                 for i in self.row_level)  # fmt: skip
        L.extend("    " + x for x in self.prefetch(f"row0 + {row_step}", after))
        L.append("    fc_cp_async_commit();")
        L.append("    fc_cp_async_wait<1>();")

    def row_load(self, i: int) -> str:
        if i in self.row_level:
            return f"a{i}_now"
        mt = MEMORY_TYPE[self.program.accesses[i].dtype]
        rv = self.rv
        if rv is not None and (rv.gathers[i] or rv.preds[i]):  # Note [Gather loads]
            test = pred_test(rv, i, self.coord(False))
            ok = "row_ok" if test is None else f"row_ok && {test}"
            return f"(({ok}) ? a{i}[a{i}_row{gathered(rv, i)}] : fc_zero<{mt}>())"
        return f"(row_ok ? a{i}[a{i}_row] : {zero(mt)})"

    def elem_load(self, i: int) -> str:
        """Element j of access i in a pass: a bf16 one read from a vector as a float through its
        32-bit word (fc_bf16_at), which widening leaves as it is."""
        text = self.elem_load_raw(i)
        if (MEMORY_TYPE[self.program.accesses[i].dtype] == "fc_bf16" and self.v.vec % 2 == 0
                and self.v.modes[i] != "gather" and text.endswith("[j]")):  # fmt: skip
            return f"fc_bf16_at({text[:-3]}, j)"
        return text

    def elem_load_raw(self, i: int) -> str:
        v = self.v
        if v.modes[i] == "gather":  # element by element: by index or in a window along K
            rv, mt = self.rv, MEMORY_TYPE[self.program.accesses[i].dtype]
            test = pred_test(rv, i, self.coord(True))
            ok = "ok" if test is None else f"ok && {test}"
            at = k_offset(f"a{i}", "kb + j", v.k2)
            return f"(({ok}) ? a{i}[a{i}_row + {at}{gathered(rv, i)}] : fc_zero<{mt}>())"
        if i in self.hoisted:
            return f"a{i}_w1[j]" if v.weights == "shared" else f"a{i}_w[it][j]"
        if self.cached and i in v.cached:
            return f"a{i}_s[j]" if v.rows_in_smem else f"a{i}_c[it][j]"
        return f"a{i}_l[j]"

    def fetch(self, i: int, kb: str, into: str) -> list[str]:
        """Statements loading the vector at `kb` of access i into `into` (an fc_vec or an
        array of FC_VEC values), zeros where !ok."""
        v = self.v
        mt = MEMORY_TYPE[self.program.accesses[i].dtype]
        ok = "ok"
        if self.rv is not None and self.rv.preds[i]:  # in windows of row dims: once a row
            ok = f"(ok && {pred_test(self.rv, i, self.coord(False))})"
        if v.modes[i] == "vec":
            at = k_offset(f"a{i}", kb, v.k2, unit=True)
            hint = v.weight_hint if v.weight_hint and i in self.shared_by_rows else v.load_hint
            return [f"{into} = fc_load_vec_if<FC_VEC, {hint}>(a{i} + a{i}_row + {at}, {ok});"]
        at = k_offset(f"a{i}", f"{kb} + j", v.k2)
        return ["#pragma unroll",
                f"for (int j = 0; j < FC_VEC; ++j) {into}[j] = {ok} ? a{i}[a{i}_row + {at}] : {zero(mt)};"]  # fmt: skip

    def weight_chunk(self, w: int) -> str:  # this thread's 16 bytes of hoisted weight w, this `it`
        return f"fc_wts[((({w}) * FC_TY + threadIdx.y) * {self.v.iters} + it) * FC_TX + tx]"

    def hoist_weights(self) -> None:
        """Note [Weights loaded once]: before the row loop, into registers or this thread's
        chunks of shared memory."""
        program, v, hoisted, in_smem = self.program, self.v, self.hoisted, self.in_smem
        if not hoisted:
            return
        weights = [f"  fc_vec<{MEMORY_TYPE[program.accesses[i].dtype]}, FC_VEC> a{i}_w[{v.iters}];"
                   for i in hoisted if not in_smem]  # fmt: skip
        if in_smem:
            weights.append("  extern __shared__ uint4 fc_wts[];  // [weights][TY][ITERS][TX] chunks")
        weights += ["#pragma unroll", f"  for (int it = 0; it < {v.iters}; ++it) {{",
                    "    const idx_t kb = k_lo + ((idx_t)it * FC_TX + tx) * FC_VEC;",
                    "    const bool ok = kb < k_hi;"]  # fmt: skip
        for w, i in enumerate(hoisted):
            if in_smem:
                at = k_offset(f"a{i}", "kb", v.k2, unit=True)
                weights.append(f"    fc_cp_async16(&{self.weight_chunk(w)}, ok ? a{i} + {at} : a{i}, ok);")
            else:
                weights += [f"    {{ const idx_t a{i}_row = 0;",
                            *("      " + line for line in self.fetch(i, "kb", f"a{i}_w[it]")), "    }"]
        weights.append("  }")
        if in_smem:
            weights.append("  fc_cp_async_commit();  // waited for by the first pass reading them")
        self.L += weights

    def load_rows_ahead(self) -> None:
        """Note [Rows a thread]: rows of a few vectors (softmax or layer norm of rows of 32)
        leave a thread one load in flight a row, each row group waiting for its own. With
        `rows_a_thread` R, a thread loads its R rows (TY apart) of the block's R row groups
        first, all in flight together, and then runs each row as before, from registers."""
        program, v, L = self.program, self.v, self.L
        for i in v.cached:
            mt = MEMORY_TYPE[program.accesses[i].dtype]
            L.append(f"    fc_vec<{mt}, FC_VEC> a{i}_r[{v.rows_a_thread}][{v.iters}];")
        L.append("#pragma unroll")
        L.append(f"    for (int rr = 0; rr < {v.rows_a_thread}; ++rr) {{")
        L.extend("      " + x for x in self.row_offsets("row0 + (idx_t)rr * FC_TY + threadIdx.y", "",
                                                        v.cached))  # fmt: skip
        L.append("#pragma unroll")
        L.append(f"      for (int it = 0; it < {v.iters}; ++it) {{")
        L.append("        const idx_t kb = k_lo + ((idx_t)it * FC_TX + tx) * FC_VEC;")
        L.append("        const bool ok = row_ok && kb < k_hi;")
        for i in v.cached:
            L.extend("        " + line for line in self.fetch(i, "kb", f"a{i}_r[rr][it]"))
        L.append("      }")
        L.append("    }")

    def cache_row(self) -> None:
        """The row's own data to registers once, for every pass; weights: L1/L2."""
        program, v, L = self.program, self.v, self.L
        if not self.cached or v.rows_in_smem:
            return
        for i in v.cached:  # whole vectors: 16-bit values stay two to a register
            mt = MEMORY_TYPE[program.accesses[i].dtype]
            L.append(f"    fc_vec<{mt}, FC_VEC> a{i}_c[{v.iters}];")
        if v.rows_a_thread > 1:  # loaded ahead with the thread's other rows
            L.append("#pragma unroll")
            L.append(f"    for (int it = 0; it < {v.iters}; ++it) {{")
            L.extend(f"      a{i}_c[it] = a{i}_r[rr][it];" for i in v.cached)
            L.append("    }")
            return
        L.append("#pragma unroll")
        L.append(f"    for (int it = 0; it < {v.iters}; ++it) {{")
        if not v.pipeline:  # the pipelined copies read zeros past the row's end instead
            L.append("      const idx_t kb = k_lo + ((idx_t)it * FC_TX + tx) * FC_VEC;")
            L.append("      const bool ok = row_ok && kb < k_hi;")
        for c, i in enumerate(v.cached):
            mt = MEMORY_TYPE[program.accesses[i].dtype]
            if v.pipeline:  # arrived in shared memory (zeros past the row's end)
                L.append(f"      a{i}_c[it] = *reinterpret_cast<const fc_vec<{mt}, FC_VEC>*>"
                         f"(&{self.stage_chunk('slot', c)});")  # fmt: skip
            else:
                L.extend("      " + line for line in self.fetch(i, "kb", f"a{i}_c[it]"))
        L.append("    }")

    def vector_load(self, i: int) -> list[str]:
        """In a pass, this vector of access i: from its stage, the weights' shared memory, or
        memory; none where registers hold it (a{i}_c, a{i}_w)."""
        v = self.v
        mt = MEMORY_TYPE[self.program.accesses[i].dtype]
        if v.modes[i] == "gather":  # read element by element in the pass itself
            return []
        if i in v.cached and v.rows_in_smem:  # this vector of the row, from its stage
            chunk = self.stage_chunk("slot", v.cached.index(i))
            return [f"      const fc_vec<{mt}, FC_VEC> a{i}_s = *reinterpret_cast<const "
                    f"fc_vec<{mt}, FC_VEC>*>(&{chunk});"]  # fmt: skip
        if i in self.hoisted and self.in_smem:  # this vector of the weight, from shared memory
            return [f"      const fc_vec<{mt}, FC_VEC> a{i}_w1 = *reinterpret_cast<const "
                    f"fc_vec<{mt}, FC_VEC>*>(&{self.weight_chunk(self.hoisted.index(i))});"]  # fmt: skip
        if not (self.cached and i in v.cached) and i not in self.hoisted:
            return [f"      fc_vec<{mt}, FC_VEC> a{i}_l;",
                    *("      " + line for line in self.fetch(i, "kb", f"a{i}_l"))]
        return []
