"""The deterministic scatter kernels (Note [Deterministic scatter] in schedulers/scatter.py),
over tensors in memory: the index and the source are kernel inputs with their own strides,
the output a fresh row-major tensor the first (pointwise) kernel has filled.

`render_ordered_accumulate`: index_put_accumulate as one block a tile of output rows by
256 columns. Each thread owns one column and keeps the tile's sums of it in shared memory,
started from the output's values; the block stages the index (checked) a chunk at a time in
shared memory, and each warp scans it 32 positions at a time with a ballot of those landing in
its tile, adding their rows in index order. No two threads add to one element and the order
is the index's, so the result is the same on every run.

`render_claim` / `render_winners`: a scatter whose last index (row-major) wins: the first
keeps each output element's largest position in a workspace (an atomic max), the second
stores the source values of the winners.
"""
from __future__ import annotations

from .cuda_ops import MEMORY_TYPE
from .prelude import prelude_source


# output rows a block sums: 32 x 256 columns of 4-byte sums are 32 KiB of shared memory, of
# 8-byte ones 16 rows (static shared memory stops at 48 KiB)
def rows_for(dtype) -> int:
    wide = ("double", "long long", "int64_t", "uint64_t")  # 8-byte sums
    return 16 if _acc_type(dtype) in wide else 32


BLOCK = 256
CHUNK = 1024  # index positions staged at once
FILL_NAME = "fc_fill_positions"
ACCUMULATE_NAME = "fc_accumulate_ordered"
CLAIM_NAME = "fc_scatter_claim"
WINNERS_NAME = "fc_scatter_winners"


def _acc_type(dtype) -> str:
    mt = MEMORY_TYPE[dtype]
    return {"fc_half": "float", "fc_bf16": "float", "bool": "int", "int": "int64_t"}.get(mt, mt)


def render_ordered_accumulate(out_dtype, index_dtype, value_dtype, rest: int, sum_dtype=None,
                              fill: bool = False) -> str:  # fmt: skip
    """out [V, H] (row-major), index [N] (stride), value [N, *rest] (strides); `rest` dims
    flattened into H column by column. Sums in `sum_dtype`'s accumulator type (out's by
    default), started from `out` or, with `fill`, from the argument `fill`."""
    mt, it, vt = MEMORY_TYPE[out_dtype], MEMORY_TYPE[index_dtype], MEMORY_TYPE[value_dtype]
    at = _acc_type(sum_dtype or out_dtype)
    ROWS = rows_for(sum_dtype or out_dtype)
    rest_params = "".join(f", idx_t n{d}, idx_t vs{d}" for d in range(rest))
    lines = [prelude_source("core", "math", "index"), "typedef long long idx_t;",
             f'extern "C" __global__ void __launch_bounds__({BLOCK}) {ACCUMULATE_NAME}(',
             f"    {mt}* __restrict__ out, const {it}* __restrict__ index, idx_t index_s,",
             f"    const {vt}* __restrict__ value, idx_t value_s{rest_params},",
             f"    idx_t N, idx_t V, idx_t H{', double fill' if fill else ''}) {{",
             f"  __shared__ {at} sums[{ROWS}][{BLOCK}];",
             f"  __shared__ long long rows[{CHUNK}];",
             f"  const idx_t v0 = (idx_t)blockIdx.x * {ROWS};",
             f"  const idx_t col = (idx_t)blockIdx.y * {BLOCK} + threadIdx.x;",
             "  const int lane = threadIdx.x & 31;",
             "  const bool mine = col < H;",
             "  // this column's offset in a row of value",
             "  idx_t voff = 0;",
             "  {",
             "    idx_t rem = mine ? col : 0;"]  # fmt: skip
    for d in range(rest - 1, -1, -1):
        lines.append(f"    voff += (rem % n{d}) * vs{d}; rem /= n{d};")
    start = f"({at})fill" if fill else f"({at})fc_widen(out[(v0 + r) * H + col])"
    lines += ["  }",
              f"  for (int r = 0; r < {ROWS}; ++r)",
              f"    sums[r][threadIdx.x] = (mine && v0 + r < V) ? {start} : ({at})0;",
              f"  for (idx_t c0 = 0; c0 < N; c0 += {CHUNK}) {{",
              "    __syncthreads();",
              f"    const idx_t n = N - c0 < {CHUNK} ? N - c0 : {CHUNK};",
              f"    for (idx_t k = threadIdx.x; k < n; k += {BLOCK})",
              '      rows[k] = fc_check_index((long long)index[(c0 + k) * index_s], V, '
              '"index_put_accumulate");',
              "    __syncthreads();",
              "    for (idx_t k0 = 0; k0 < n; k0 += 32) {",
              "      const idx_t k = k0 + lane;",
              "      const long long v = k < n ? rows[k] : -1;",
              f"      unsigned hit = __ballot_sync(0xffffffffu, v >= v0 && v < v0 + {ROWS});",
              "      while (hit) {",
              "        const int b = __ffs(hit) - 1;",
              "        hit &= hit - 1;",
              "        const long long row = rows[k0 + b];",
              "        if (mine)",
              f"          sums[row - v0][threadIdx.x] += ({at})fc_widen(value[(c0 + k0 + b) * value_s + voff]);",
              "      }",
              "    }",
              "  }",
              "  if (!mine) return;",
              f"  for (int r = 0; r < {ROWS} && v0 + r < V; ++r)",
              f"    out[(v0 + r) * H + col] = fc_cast<{mt}>(sums[r][threadIdx.x]);",
              "}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _coords(rank: int, lines: list[str]) -> None:
    """c0.. of row-major position p over sizes n0.. (the index's shape)."""
    lines.append("  idx_t rem = p;")
    for d in range(rank - 1, 0, -1):
        lines.append(f"  const idx_t c{d} = rem % n{d}; rem /= n{d};")
    lines.append("  const idx_t c0 = rem;")


def _target(rank: int, dim: int, index_dtype) -> list[str]:
    """The output offset of position p: the index's value along `dim`, p's coordinates
    elsewhere."""
    lines: list[str] = []
    _coords(rank, lines)
    ioff = " + ".join(f"c{d} * is{d}" for d in range(rank))
    lines.append(f"  const long long at = fc_check_index((long long)index[{ioff}], extent, \"scatter\");")
    terms = [f"at * os{d}" if d == dim else f"c{d} * os{d}" for d in range(rank)]
    lines.append(f"  const idx_t o = {' + '.join(terms)};")
    return lines


def _head(name: str, params: list[str]) -> list[str]:
    return [prelude_source("core", "math", "index"), "typedef long long idx_t;",
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(',
            "    " + ",\n    ".join(params) + ") {",
            "  const idx_t p = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;",
            "  if (p >= numel) return;"]  # fmt: skip


def render_fill() -> str:
    lines = _head(FILL_NAME, ["long long* __restrict__ w", "idx_t numel"])
    lines += ["  w[p] = -1;", "}"]
    return "\n".join(lines) + "\n"


def _shape_params(rank: int, index_dtype) -> list[str]:
    it = MEMORY_TYPE[index_dtype]
    return ([f"const {it}* __restrict__ index"] + [f"idx_t n{d}" for d in range(rank)]
            + [f"idx_t is{d}" for d in range(rank)] + [f"idx_t os{d}" for d in range(rank)]
            + ["idx_t extent", "idx_t numel"])  # fmt: skip


def render_claim(rank: int, dim: int, index_dtype) -> str:
    params = ["long long* __restrict__ w"] + _shape_params(rank, index_dtype)
    lines = _head(CLAIM_NAME, params) + _target(rank, dim, index_dtype)
    lines += ["  atomicMax(&w[o], (long long)p);", "}"]
    return "\n".join(lines) + "\n"


def render_winners(rank: int, dim: int, index_dtype, out_dtype, src_dtype) -> str:
    mt, st = MEMORY_TYPE[out_dtype], MEMORY_TYPE[src_dtype]
    params = ([f"{mt}* __restrict__ out", "const long long* __restrict__ w",
               f"const {st}* __restrict__ src"] + [f"idx_t ss{d}" for d in range(rank)]
              + _shape_params(rank, index_dtype))  # fmt: skip
    lines = _head(WINNERS_NAME, params) + _target(rank, dim, index_dtype)
    soff = " + ".join(f"c{d} * ss{d}" for d in range(rank))
    lines += [f"  if (w[o] == (long long)p) out[o] = fc_cast<{mt}>(src[{soff}]);", "}"]
    return "\n".join(lines) + "\n"
