"""Column partials (Note [Column partials]): the sums a row kernel keeps for every row it
visits, the block's row of partials they end as, and their finish, in the row kernel after
a grid-wide barrier (Note [Finish in the row kernel]) or in a second kernel
(render_column_finish)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..cuda_ops import MEMORY_TYPE
from ..prelude import prelude_source
from .common import acc_type, ident


class ColumnPartials:
    """Mixed into RowKernel (row_kernel.py): reads its program, variant `v` and lines `L`."""

    def finish_params(self) -> list[str]:
        """The column sums' outputs and the grid barrier, where the kernel finishes them."""
        v = self.v
        params = [f"{t}* __restrict__ fin{k}" for k, t in zip(v.acc, v.finish)]
        return params + (["unsigned* __restrict__ fc_bar"] if v.finish else [])

    def partials_init(self) -> None:
        """A thread's partials of the columns it keeps, zeroed before the row loop."""
        program, v, L = self.program, self.v, self.L
        for k in v.acc:
            at = acc_type(program.stores[k].dtype)
            L.append(f"  {at} acc{k}[{v.iters}][FC_VEC];")
            L.append("#pragma unroll")
            L.append(f"  for (int it = 0; it < {v.iters}; ++it) for (int j = 0; j < FC_VEC; ++j) acc{k}[it][j] = 0;")

    def block_partials(self) -> None:
        """The block's column partials: its TY thread rows added in a fixed order, through
        one table a type that the partials take in turn (each turn ends at a barrier): a
        table each overran the 48 KiB of static shared memory with three bf16 partials."""
        program, v, L = self.program, self.v, self.L
        for at in sorted({acc_type(program.stores[k].dtype) for k in v.acc}):
            L.append(f"  __shared__ {at} part_{ident(at)}[FC_TY][FC_TX * FC_VEC];")
        for k in v.acc:
            at = acc_type(program.stores[k].dtype)
            part = f"part_{ident(at)}"
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

    def finish_in_kernel(self) -> None:
        """Note [Finish in the row kernel]: every block has written its row of partials; all
        meet at a grid-wide barrier (safe: the launch is cooperative, so all are resident),
        then each block adds up tiles of 32 columns over the partial rows in a fixed order,
        as the finish kernel would. The barrier's counters reset themselves: the last block
        past the barrier zeroes them for the next launch on the stream."""
        program, v, L = self.program, self.v, self.L
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
