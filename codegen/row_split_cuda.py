"""The split walk of the row chains (Note [Split walk] in schedulers/row_sums.py): the rows
kernel of an embedding's gradient as two kinds of blocks of one grid, so that the blocks
writing the fill never wait on a gather.

- Named blocks (NB = ceil(NR / WARPS), spread evenly over the grid so that their gathers
  run beside the fill's stores from start to end): a warp a named row, taken from the list of
  named rows the link appended (w[3V + 2 + g], -1 past the last): the row's head and slot
  words read and set back to -1, its list walked and its slot's sums added (Note [Slab
  walk]'s column passes), the row stored.
- Fill blocks (the rest): a block the SR whole rows of a slab; its threads read the rows'
  count words (one a row, set back to -1 where named) and store the fill to every row no
  token names. Block NB also sets back the link's two counters.

Each word has one reader, which sets it back (Note [Kept words]): count words the fill
blocks, head and slot words and the list of named rows the named warps, the counters the
fill block of slab 0 (the link, which alone adds to them, has finished). Each output row
is written by one block: named rows by their warp, the others by their slab's block.
"""
from __future__ import annotations

from .cuda_ops import MEMORY_TYPE
from .row_sums_cuda import (
    RED_ADD,
    SLAB_WALK_NAME,
    WARPS,
    _head,
    _walk_defs,
    _walk_params,
    named_row_passes,
    slab_rows_of,
    warp_adds,
)

SPLIT_WALK_NAME = SLAB_WALK_NAME.replace("slab", "split")
CHUNK = 8  # hot tokens a warp of a hot block takes at a time (Note [Walk adds])


def hot_blocks(tokens: int, sms: int) -> int:
    """Blocks of the hot adds (Note [Walk adds]): a chunk a warp, at most two an SM."""
    return max(1, min(-(-tokens // (CHUNK * WARPS)), 2 * sms))


def named_blocks(named_rows: int) -> int:
    """Blocks of the named rows: a warp a row of the link's list of `named_rows` at most."""
    return -(-named_rows // WARPS)


def render_split_walk(out_dtype, value_dtype, rest: int, vw: int, index_type: str, hv: int,
                      wait: bool = False, units: int = 8, hint: int = 0, min_blocks: int = 0,
                      sorted_lists: bool = False, hot: int = 0) -> str:  # fmt: skip
    """Note [Split walk] (bounded lists, kept words): `hv` units a row; `units`: a fill
    block's SR whole rows, at most BLOCK * units units; `hint`, `min_blocks`, `sorted_lists`
    as the slab walk's (codegen/row_sums_cuda.render_slab_walk). The last parameter NR: the
    length of the list of named rows (the named blocks' warps). `hot`: (Note [Walk adds]) the
    first `hot` blocks add the link's list of tokens past their row's bound to the rows'
    slots, a warp CHUNK tokens at a time; a named warp of a hot row waits for its slot's
    pending count to come back to -1 (then NT, the tokens, is a parameter too)."""
    ot, vt = MEMORY_TYPE[out_dtype], MEMORY_TYPE[value_dtype]
    ah = max(1, min(4, -(-hv // 32)))
    store = f"fc_store_vec_hint<VW, {hint}>" if hint else "fc_store_vec<VW>"
    params = [p.replace("const int* __restrict__ head", "int* __restrict__ head").replace(
        "const float* __restrict__ acc", "float* __restrict__ acc")
        for p in _walk_params(out_dtype, value_dtype, rest, vw, True)] + ["int NR"]
    params += ["int NT"] if hot else []
    lines = _head(SPLIT_WALK_NAME, params, index_type, wait, min_blocks=min_blocks)
    lines.insert(2, _walk_defs(vt, vw, [f"#define SR {slab_rows_of(hv, units)}",
                                        f"#define AH {ah}", f"#define WARPS {WARPS}",
                                        "#define LV 1", "#define AHEAD 4",
                                        f"#define CH {CHUNK}", f"#define HB {hot}"]))
    if hot:
        lines.insert(1, RED_ADD)
    # Note [Walk adds]: after the named rows, the hot tokens' counter, tokens, slots, pending
    lists = ["int* const hot_t = head + 3 * V + 3 + NR;",
             "int* const hot_s = hot_t + NT;",
             "int* const pend = hot_s + NT;"]
    adds = ["// the hot tokens: a warp CH of the list at a time, added to their slots",
            *lists,
            "for (long long c0 = ((long long)blockIdx.x * WARPS + warp) * CH; c0 < NT;",
            "     c0 += (long long)HB * WARPS * CH) {",
            "  const long long e = c0 + lane;",
            "  int tt = -1, slot = -1;",
            "  if (lane < CH && e < NT) {",
            "    tt = hot_t[e];",
            "    slot = hot_s[e];",
            "  }",
            "  const unsigned over = __ballot_sync(0xffffffffu, tt >= 0);",
            "  if (!over) break;  // the list is contiguous: nothing past here",
            "  if (tt >= 0) {",
            "    hot_t[e] = -1;",
            "    hot_s[e] = -1;",
            "  }",
            *["  " + x for x in warp_adds(vt, rest, vw,
                                         "(idx_t)__shfl_sync(0xffffffffu, tt, src[q] < 0 ? 0 : src[q])")],
            "  __threadfence();  // the adds before the pending counts (their readers fence too)",
            "  __syncwarp();",
            "  const unsigned same = __match_any_sync(0xffffffffu, slot);",
            "  if (tt >= 0 && lane == __ffs(same & over) - 1) atomicAdd(&pend[slot], -__popc(same & over));",
            "}",
            "return;"]  # fmt: skip
    wait_hot = ["if (sl >= 0) {  // its tokens past the bound: added by the hot blocks",
                "  const int* const pend = head + 3 * V + 3 + NR + 2 * NT;",
                "  if (lane == 0) while (*(volatile const int*)(pend + sl) != -1) {}",
                "  __syncwarp();",
                "  __threadfence();",
                "}"]  # fmt: skip
    # words: head [V], count [V], slot [V], slots used, named rows taken, named rows [NR]
    named = ["// a named row a warp: its words read and set back, its list and slot added",
             "const int g = (int)named_at * WARPS + warp;",
             "if (g >= NR) return;",
             "int* const named = head + 3 * V + 2;",
             "const int listed = named[g];",
             "if (listed < 0) return;",
             "const idx_t row = listed;",
             "const int hd = head[row], sl = head[2 * V + row];",
             "__syncwarp();",
             "if (lane == 0) {",
             "  named[g] = -1;",
             "  head[row] = -1;",
             "  if (sl >= 0) head[2 * V + row] = -1;",
             "}",
             *(wait_hot if hot else []),
             *[x[2:] if x.startswith("  ") else x  # at the depth of this block's body
               for x in named_row_passes(vt, ot, rest, vw, True, True, store, sorted_lists, "hd")],
             "return;"]  # fmt: skip
    fill = ["// the fill to the slab's rows no token names",
            "const idx_t r0 = (b - named_at) * SR;",
            "const int rows = V - r0 < SR ? (int)(V - r0) : SR;",
            "if (r0 == 0 && threadIdx.x == 0) {  // the link's counters: slots, named rows",
            "  head[3 * V] = -1;",
            "  head[3 * V + 1] = -1;",
            *(["  head[3 * V + 2 + NR] = -1;  // hot tokens"] if hot else []),
            "}",
            "for (int i = threadIdx.x; i < rows; i += blockDim.x) {",
            "  const int n = head[V + r0 + i];",
            "  cs[i] = n;",
            "  if (n >= 0) head[V + r0 + i] = -1;",
            "}",
            "__syncthreads();",
            f"fc_vec<{ot}, VW> f;",
            "#pragma unroll",
            f"for (int j = 0; j < VW; ++j) f[j] = fc_cast<{ot}>(fill);",
            "const idx_t e = (r0 + rows) * HV;",
            "#pragma unroll 4",
            "for (idx_t u = r0 * HV + threadIdx.x; u < e; u += blockDim.x) {",
            "  const idx_t row = u / HV;",
            f"  if (cs[row - r0] < 0) {store}(out + row * H + (u - row * HV) * VW, f);",
            "}"]  # fmt: skip
    body = ["__shared__ int cs[SR];  // the slab's count words",
            *(["__shared__ int order[WARPS][32];  // a named row's tokens, ascending"]
              if sorted_lists else []),
            "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
            "// block b is named where floor((b + 1) NB / T) passes floor(b NB / T), the named",
            "// blocks before it: floor(b NB / T)",
            *(["if (blockIdx.x < HB) {", *["  " + x if not x.startswith("#") else x
                                                for x in adds], "}"] if hot else []),
            "const long long nb = (NR + WARPS - 1) / WARPS, b = (long long)blockIdx.x - HB,",
            "                all = (long long)gridDim.x - HB;",
            "const long long named_at = b * nb / all;",
            "if ((b + 1) * nb / all > named_at) {",
            *["  " + x if not x.startswith("#") else x for x in named],
            "}",
            *fill]  # fmt: skip
    lines += [b if b.startswith("#") else "  " + b for b in body] + ["}"]
    return "\n".join(lines) + "\n"
