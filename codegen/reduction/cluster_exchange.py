"""Rows shared by a cluster's blocks (Note [Cluster rows] in prelude/reduce.cuh): each
block's slice of the row, the exchange of the blocks' row partials (Note [Cluster exchange]),
and the deferred row end that overlaps that exchange with the next row (Note [Deferred row
end])."""
from __future__ import annotations

from ..cuda_ops import MEMORY_TYPE
from ..kernel_ir import ReductionProgram
from .common import accumulator_type, ident, merged_groups


def one_exchange(program: ReductionProgram, merge: bool) -> bool:
    """Whether a row's reductions travel in one exchange, after one pass (Note [Deferred row
    end] in prelude/reduce.cuh): one stage of plain reductions that combine together."""
    return (program.stages == 1 and not any(r.op == "welford" for r in program.reductions)
            and len(merged_groups(program.reductions, merge)) == 1)  # fmt: skip


class ClusterExchange:
    """Mixed into RowKernel (row_kernel.py): reads its program, variant `v`, lines `L`,
    `row_level` and `deferred`, and calls its row_offsets, row_stmts and row_end."""

    def cluster_buffers(self, t: str) -> list[str]:
        """Where the cluster's blocks leave their row partials of C type `t`."""
        if self.v.cluster > 1:
            return [f"  __shared__ {t} cl_{ident(t)}[2 * FC_TY * FC_CLUSTER];"]
        return []

    def cluster_slice(self) -> None:
        """This block's slice [k_lo, k_hi) of every row (Note [Cluster rows])."""
        v, L = self.v, self.L
        if v.cluster > 1:
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

    def cluster_combine(self, var: str, ctype: str, op: str) -> None:
        """`var`, already reduced over the block's row, reduced over the cluster's blocks."""
        v, L = self.v, self.L
        if v.cluster > 1:
            if v.exchange_async:
                L.append(f"    {var} = fc_cluster_reduce_async<FC_CLUSTER>({var}, {op}, "
                         f"cl_{ident(ctype)}, cl_bars, cl_call++);")  # fmt: skip
            else:
                L.append(f"    {var} = fc_cluster_reduce<FC_CLUSTER>({var}, {op}, cl_{ident(ctype)}, "
                         "cl_phase); cl_phase ^= 1u;")  # fmt: skip

    def deferred_state(self) -> None:
        """Note [Deferred row end]: the row group whose last pass is still to run."""
        program, L = self.program, self.L
        L.extend(f"  {MEMORY_TYPE[program.accesses[i].dtype]} a{i}_prev = 0;" for i in self.row_level)
        L.append("  idx_t prev0 = 0;")
        L.append("  bool have_prev = false;")

    def exchange(self, part: str, ctype: str, op: str = "") -> str:
        """Note [Deferred row end]: this row group's partial sent, or the previous one's
        received, through the cluster barrier."""
        slots = f"cl_{ident(ctype)}"
        if part == "send":
            return f"fc_cluster_send<FC_CLUSTER>(fc_send, {slots}, cl_phase)"
        return f"fc_cluster_receive<FC_CLUSTER>({op}, {slots}, cl_phase ^ 1u)"

    def deferred_end(self, send: bool) -> None:
        """Note [Deferred row end]: the end of row group prev0, whose stage is slot_prev;
        with `send`, this row group's partial goes out once the previous one's are in."""
        program, L = self.program, self.L
        ctype, op, group = self.deferred
        L.append("    {")
        L.append("    const unsigned slot = slot_prev;")
        L.extend(f"    const {MEMORY_TYPE[program.accesses[i].dtype]} a{i}_now = a{i}_prev;"
                 for i in self.row_level)  # fmt: skip
        every = range(len(self.tensors))
        L.extend("    " + x for x in self.row_offsets("prev0 + threadIdx.y", "", every))
        self.row_stmts(0)
        L.append(f"    const {ctype} fc_recv = {self.exchange('receive', ctype, op)};")
        if send:
            L.append(f"    {self.exchange('send', ctype)};")
        if len(group) == 1:
            L.append(f"    const {ctype} {group[0].var} = fc_recv;")
        else:
            L.extend(f"    const {accumulator_type(r)} {r.var} = fc_recv.v[{i}];"
                     for i, r in enumerate(group))  # fmt: skip
        self.row_stmts(program.stages)
        self.row_end()
        L.append("    }")

    def deferred_loop_end(self) -> None:
        """Note [Deferred row end]: the previous row group ends in this iteration (the first
        only sends its partial), and the last one after the loop."""
        L = self.L
        ctype = self.deferred[0]
        L.append("    const unsigned slot_prev = slot == 0u ? 2u : slot - 1u;")
        L.append("    if (have_prev) {")
        self.deferred_end(send=True)
        L.append("    } else {")
        L.append(f"      {self.exchange('send', ctype)};")
        L.append("    }")
        L.append("    cl_phase ^= 1u;")
        L.append("    have_prev = true;")
        L.append("    prev0 = row0;")
        L.extend(f"    a{i}_prev = a{i}_now;" for i in self.row_level)
        L.append("  }")
        L.append("  if (have_prev) {  // the last row group's end")
        L.append("    const unsigned slot_prev = slot == 0u ? 2u : slot - 1u;")
        self.deferred_end(send=False)
        L.append("  }")
