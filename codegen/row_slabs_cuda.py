"""The row-slab kernels of an accumulate into a constant fill (Note [Row slabs] in
schedulers/row_sums.py): out [V, H] = fill + the sum of value [N, H] rows at index [N], each
output row written once, every sum in an order fixed by the index alone.

- `fc_slabs_reset`: the hot-row words zeroed (the row and partial counts, the done counters).
- `fc_slabs_rows`: a block a slab of R output rows; each warp reads a contiguous part of the
  index, 32 consecutive positions a load (every block reads the same bytes: L1 and L2 serve
  them). Sweep 1 counts its rows' tokens (shared atomic counts, which do not depend on order)
  and the warp's tokens in the slab; the rows no token names are written then, their stores
  draining while the list is built. Sweep 3 lists, in index order (a warp's tokens after the
  warps' before it, within a warp by ballot), the tokens of rows named at most T times; where
  a row of the slab is named more often, sweep 2 first counts only those. Each warp then
  writes its named rows: the fill plus the listed tokens' values in index order, cast once.
  A row named more than T times is hot: the block appends it to the hot list and leaves it to
  the next kernel, so no row costs one warp more than T rows of loads.
- `fc_slabs_hot`: a block per (index segment, hot row): each warp adds the values of its
  part of the segment naming the row, in index order; the block adds its warps' sums in
  warp order into a float partial row; the last block of a hot row (a done counter) adds
  the row's partials in segment order to the fill and writes the row. Empty grid: the hot
  count read, nothing else.
"""
from __future__ import annotations

from .cuda_ops import MEMORY_TYPE
from .prelude import prelude_source
from .row_sums_cuda import _load_values, _rest_params, _value_offset

BLOCK = 256
WARPS = BLOCK // 32
SWEEP = 8  # rounds of 32 positions a warp loads before voting on them
LANE_VECS = 4  # column vectors a lane of the hot kernel sums at once
AHEAD = 4  # tokens whose values a warp of the hot kernel loads before adding them
MAX_SEGMENTS = 128  # index segments of the hot kernel
RESET_NAME = "fc_slabs_reset"
ROWS_NAME = "fc_slabs_rows"
HOT_NAME = "fc_slabs_hot"


def words(max_hot: int, segments: int) -> int:
    """Int words: [0] hot rows, [1] partial rows taken, then the hot rows [max_hot], their
    done counters [max_hot] and each (hot row, segment)'s partial row or -1."""
    return 2 + 2 * max_hot + max_hot * segments


def _head(name: str, params: list[str], index_type: str, defines: list[str],
          wait: bool = True) -> list[str]:  # fmt: skip
    """`wait`: for the kernel before it (Note [Dependent launch]) before anything else."""
    return [prelude_source("core", "math", "index"), f"typedef {index_type} idx_t;",
            *[f"#define {d}" for d in defines],
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(',
            "    " + ",\n    ".join(params) + ") {",
            "  fc_wait_prior_grid();" if wait else "  // waits for the reset below"]  # fmt: skip


def render_reset(index_type: str) -> str:
    lines = _head(RESET_NAME, ["int* __restrict__ w", "idx_t MH"], index_type, [])
    lines += ["  const idx_t p = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;",
              "  if (p < 2) w[p] = 0;",
              "  if (p < MH) w[2 + MH + p] = 0;",
              "}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def render_rows(out_dtype, index_dtype, value_dtype, rest: int, vw: int, index_type: str,
                what: str, rows: int, most: int) -> str:  # fmt: skip
    """`rows`: R, output rows a block; `most`: T, the most tokens of a row summed here."""
    ot, it, vt = MEMORY_TYPE[out_dtype], MEMORY_TYPE[index_dtype], MEMORY_TYPE[value_dtype]
    what = what.replace('"', "'")
    params = [f"{ot}* __restrict__ out", "int* __restrict__ w",
              f"const {it}* __restrict__ index", "idx_t index_s",
              f"const {vt}* __restrict__ value", "idx_t value_s", *_rest_params(rest, vw),
              "idx_t N", "idx_t V", "idx_t H", "idx_t HV", "float fill"]  # fmt: skip
    lines = _head(ROWS_NAME, params, index_type,
                  [f"VW {vw}", f"R {rows}", f"T {most}", f"SWEEP {SWEEP}", f"WARPS {WARPS}"],
                  wait=False)
    lines.insert(len(lines) - 3, "\n".join([
        "// the slab row of position t, where t < end names a row of the slab named at most T",
        "// times; else -1",
        f"FC_DEVICE int fc_slab_row(const {it}* __restrict__ index, idx_t index_s, idx_t t,",
        "                           idx_t end, idx_t r0, const int* cnt) {",
        "  if (t >= end) return -1;",
        "  const long long r = (long long)fc_ldg(index + t * index_s) - r0;",
        "  return r >= 0 && r < R && cnt[r] <= T ? (int)r : -1;",
        "}"]))  # fmt: skip
    store = [f"fc_vec<{ot}, VW> o;",
             "#pragma unroll",
             f"for (int i = 0; i < VW; ++i) o[i] = fc_cast<{ot}>(s[i]);",
             "fc_store_vec<VW>(out + row * H + c, o);"]  # fmt: skip
    body = ["__shared__ int cnt[R];",
            "__shared__ int tok[R * T];  // the listed tokens, in index order",
            "__shared__ int where[R * T];  // and their rows in the slab",
            "__shared__ int warp_sum[WARPS];",
            "__shared__ int picked[WARPS][T];",
            "__shared__ int any_hot;",
            "const idx_t r0 = (idx_t)blockIdx.x * R;",
            "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
            "for (int k = threadIdx.x; k < R; k += blockDim.x) cnt[k] = 0;",
            "if (threadIdx.x == 0) any_hot = 0;",
            "__syncthreads();",
            "// each warp a contiguous part of the index, read 32 consecutive positions a load",
            "const idx_t part = (N + WARPS - 1) / WARPS;",
            "const idx_t w0 = warp * part, w1 = w0 + part < N ? w0 + part : N;",
            "// sweep 1: how many tokens name each row of the slab (every index checked), and",
            "// how many of the warp's part name one",
            "int mine = 0;",
            "for (idx_t t0 = w0; t0 < w1; t0 += 32 * SWEEP) {",
            "  long long r[SWEEP];",
            "#pragma unroll",
            "  for (int g = 0; g < SWEEP; ++g) {",
            "    const idx_t t = t0 + 32 * g + lane;",
            f'    r[g] = t < w1 ? fc_check_index((long long)fc_ldg(index + t * index_s), V, "{what}") - r0 : -1;',
            "  }",
            "#pragma unroll",
            "  for (int g = 0; g < SWEEP; ++g) {",
            "    const bool in = r[g] >= 0 && r[g] < R;",
            "    if (in && atomicAdd(&cnt[r[g]], 1) == T) any_hot = 1;",
            "    mine += __popc(__ballot_sync(0xffffffffu, in));",
            "  }",
            "}",
            "if (lane == 0) warp_sum[warp] = mine;",
            "__syncthreads();",
            "// the rows no token names, written first: their stores drain while the list is built",
            "for (int lr = warp; lr < R && r0 + lr < V; lr += WARPS) {",
            "  if (cnt[lr]) continue;",
            "  const idx_t row = r0 + lr;",
            "  for (idx_t j = lane; j < HV; j += 32) {",
            "    const idx_t c = j * VW;",
            "    fc_vec<float, VW> s;",
            "#pragma unroll",
            "    for (int i = 0; i < VW; ++i) s[i] = fill;",
            *["    " + x for x in store],
            "  }",
            "}",
            "if (any_hot) {  // sweep 2: only the tokens of rows named at most T times count",
            "  mine = 0;",
            "  for (idx_t t0 = w0; t0 < w1; t0 += 32 * SWEEP) {",
            "    int at[SWEEP];",
            "#pragma unroll",
            "    for (int g = 0; g < SWEEP; ++g) at[g] = fc_slab_row(index, index_s, t0 + 32 * g + lane, w1, r0, cnt);",
            "#pragma unroll",
            "    for (int g = 0; g < SWEEP; ++g) mine += __popc(__ballot_sync(0xffffffffu, at[g] >= 0));",
            "  }",
            "  __syncthreads();",
            "  if (lane == 0) warp_sum[warp] = mine;",
            "  __syncthreads();",
            "}",
            "int p = 0, listed = 0;",
            "for (int k = 0; k < WARPS; ++k) {",
            "  const int s = warp_sum[k];",
            "  if (k < warp) p += s;",
            "  listed += s;",
            "}",
            "// sweep 3: the listed tokens in index order, a warp's after the warps' before it",
            "for (idx_t t0 = w0; listed && t0 < w1; t0 += 32 * SWEEP) {",
            "  int at[SWEEP];",
            "#pragma unroll",
            "  for (int g = 0; g < SWEEP; ++g) at[g] = fc_slab_row(index, index_s, t0 + 32 * g + lane, w1, r0, cnt);",
            "#pragma unroll",
            "  for (int g = 0; g < SWEEP; ++g) {",
            "    const unsigned hit = __ballot_sync(0xffffffffu, at[g] >= 0);",
            "    if (at[g] >= 0) {",
            "      const int q = p + __popc(hit & ((1u << lane) - 1u));",
            "      tok[q] = (int)(t0 + 32 * g + lane);",
            "      where[q] = at[g];",
            "    }",
            "    p += __popc(hit);",
            "  }",
            "}",
            "__syncthreads();",
            "// the reset before this kernel (launched dependent) wrote only the hot-row words,",
            "// which nothing above touches; everything the kernels before the reset wrote was",
            "// written before it started",
            "fc_wait_prior_grid();",
            "// the named rows: the fill plus their tokens' values in index order",
            "for (int lr = warp; lr < R; lr += WARPS) {",
            "  const idx_t row = r0 + lr;",
            "  if (row >= V) break;",
            "  const int n_r = cnt[lr];",
            "  if (n_r == 0) continue;",
            "  if (n_r > T) {  // hot: fc_slabs_hot writes it",
            "    if (lane == 0) w[2 + atomicAdd(&w[0], 1)] = (int)row;",
            "    continue;",
            "  }",
            "  int got = 0;",
            "  for (int k0 = 0; k0 < listed && got < n_r; k0 += 32) {",
            "    const int k = k0 + lane;",
            "    const bool h = k < listed && where[k] == lr;",
            "    const unsigned hit = __ballot_sync(0xffffffffu, h);",
            "    if (h) picked[warp][got + __popc(hit & ((1u << lane) - 1u))] = tok[k];",
            "    got += __popc(hit);",
            "  }",
            "  __syncwarp();",
            "  for (idx_t j = lane; j < HV; j += 32) {",
            "    const idx_t c = j * VW;",
            "    fc_vec<float, VW> s;",
            "#pragma unroll",
            "    for (int i = 0; i < VW; ++i) s[i] = fill;",
            *["    " + x for x in _value_offset(rest, vw)],
            "    for (int q = 0; q < n_r; ++q) {",
            "      const idx_t t = picked[warp][q];",
            *["    " + x for x in _load_values("t", vt, vw)],
            "#pragma unroll",
            "      for (int i = 0; i < VW; ++i) s[i] += v[i];",
            "    }",
            *["    " + x for x in store],
            "  }",
            "  __syncwarp();",
            "}"]  # fmt: skip
    lines += [b if b.startswith("#") else "  " + b for b in body] + ["}"]
    return "\n".join(lines) + "\n"


def render_hot(out_dtype, index_dtype, value_dtype, rest: int, vw: int, index_type: str) -> str:
    ot, it, vt = MEMORY_TYPE[out_dtype], MEMORY_TYPE[index_dtype], MEMORY_TYPE[value_dtype]
    params = [f"{ot}* __restrict__ out", "int* __restrict__ w", "float* __restrict__ part",
              f"const {it}* __restrict__ index", "idx_t index_s",
              f"const {vt}* __restrict__ value", "idx_t value_s", *_rest_params(rest, vw),
              "idx_t N", "idx_t H", "idx_t HV", "idx_t SEG", "int S", "int MH", "float fill"]
    ct = 32 * LANE_VECS * vw  # columns a tile
    lines = _head(HOT_NAME, params, index_type,
                  [f"VW {vw}", f"LV {LANE_VECS}", f"CT {ct}", f"WARPS {WARPS}", f"AHEAD {AHEAD}",
                   f"MAXS {MAX_SEGMENTS}"])
    load = "fc_load_vec_ro<VW>(value + at)" if vw > 1 else None
    lines.insert(len(lines) - 3, "\n".join([
        f"FC_DEVICE fc_vec<{vt}, VW> fc_slab_load(const {vt}* __restrict__ value, idx_t at) {{",
        f"  return {load};" if load else f"  fc_vec<{vt}, VW> r; r[0] = value[at]; return r;",
        "}"]))
    body = ["__shared__ float acc[WARPS][CT];",
            "__shared__ int found, slot_p, last;",
            "__shared__ int plist[MAXS];",
            "const int hot = w[0];",
            "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
            "const idx_t seg0 = (idx_t)blockIdx.x * SEG;",
            "const idx_t seg1 = seg0 + SEG < N ? seg0 + SEG : N;",
            "const idx_t sub = (SEG + WARPS - 1) / WARPS;",
            "const idx_t my0 = seg0 + warp * sub;",
            "const idx_t my1 = my0 + sub < seg1 ? my0 + sub : seg1;",
            "for (int slot = blockIdx.y; slot < hot; slot += gridDim.y) {",
            "  const long long row = w[2 + slot];",
            "  int* const pidx = w + 2 + 2 * MH + (idx_t)slot * S;",
            "  if (threadIdx.x == 0) found = 0;",
            "  __syncthreads();",
            "  int mine = 0;",
            "  for (idx_t t0 = my0; t0 < my1; t0 += 32) {",
            "    const idx_t t = t0 + lane;",
            "    mine += __popc(__ballot_sync(0xffffffffu, t < my1 && (long long)fc_ldg(index + t * index_s) == row));",
            "  }",
            "  if (lane == 0 && mine) atomicAdd(&found, mine);",
            "  __syncthreads();",
            "  if (threadIdx.x == 0) slot_p = found ? atomicAdd(&w[1], 1) : -1;",
            "  __syncthreads();",
            "  const int p = slot_p;",
            "  for (idx_t ct0 = 0; p >= 0 && ct0 < H; ct0 += CT) {",
            "    fc_vec<float, VW> s[LV];",
            "#pragma unroll",
            "    for (int u = 0; u < LV; ++u)",
            "#pragma unroll",
            "      for (int i = 0; i < VW; ++i) s[u][i] = 0.0f;",
            "    idx_t vo[LV];  // each column vector's offset in a row of value",
            "#pragma unroll",
            "    for (int u = 0; u < LV; ++u) {",
            "      const idx_t c = (ct0 / VW + lane + 32 * u) * VW;",
            *["  " + x for x in _value_offset(rest, vw)],
            "      vo[u] = voff;",
            "    }",
            "    for (idx_t t0 = my0; mine && t0 < my1; t0 += 32) {",
            "      const idx_t tl = t0 + lane;",
            "      unsigned hit = __ballot_sync(0xffffffffu, tl < my1 && (long long)fc_ldg(index + tl * index_s) == row);",
            "      while (hit) {  // AHEAD tokens' values loaded before any is added",
            "        idx_t tq[AHEAD];",
            "#pragma unroll",
            "        for (int q = 0; q < AHEAD; ++q) {",
            "          tq[q] = hit ? t0 + __ffs(hit) - 1 : -1;",
            "          hit &= hit - 1;",
            "        }",
            f"        fc_vec<{vt}, VW> raw[AHEAD][LV];",
            "#pragma unroll",
            "        for (int q = 0; q < AHEAD; ++q)",
            "#pragma unroll",
            "          for (int u = 0; u < LV; ++u)",
            "            if (tq[q] >= 0 && ct0 / VW + lane + 32 * u < HV)",
            "              raw[q][u] = fc_slab_load(value, tq[q] * value_s + vo[u]);",
            "#pragma unroll",
            "        for (int q = 0; q < AHEAD; ++q)",
            "#pragma unroll",
            "          for (int u = 0; u < LV; ++u)",
            "            if (tq[q] >= 0 && ct0 / VW + lane + 32 * u < HV)",
            "#pragma unroll",
            "              for (int i = 0; i < VW; ++i) s[u][i] += (float)fc_widen(raw[q][u][i]);",
            "      }",
            "    }",
            "#pragma unroll",
            "    for (int u = 0; u < LV; ++u)",
            "#pragma unroll",
            "      for (int i = 0; i < VW; ++i) acc[warp][(lane + 32 * u) * VW + i] = s[u][i];",
            "    __syncthreads();",
            "    for (int x = threadIdx.x; x < CT && ct0 + x < H; x += blockDim.x) {",
            "      float total = 0.0f;",
            "      for (int k = 0; k < WARPS; ++k) total += acc[k][x];",
            "      part[(idx_t)p * H + ct0 + x] = total;",
            "    }",
            "    __syncthreads();",
            "  }",
            "  if (threadIdx.x == 0) {",
            "    pidx[blockIdx.x] = p;",
            "    __threadfence();",
            "    last = atomicAdd(&w[2 + MH + slot], 1) == S - 1;",
            "  }",
            "  __syncthreads();",
            "  if (last) {  // every segment's partial is in: the row, in segment order",
            "    __threadfence();",
            "    if (threadIdx.x == 0) {  // the partials there are, in segment order",
            "      int k = 0;",
            "      for (int q = 0; q < S; ++q) {",
            "        const int pq = __ldcg(pidx + q);",
            "        if (pq >= 0) plist[k++] = pq;",
            "      }",
            "      found = k;",
            "    }",
            "    __syncthreads();",
            "    const int np = found;",
            "    for (idx_t c = threadIdx.x; c < H; c += blockDim.x) {",
            "      float total = fill;",
            "      int q = 0;",
            "      for (; q + 8 <= np; q += 8) {  // eight loads in flight, added in order",
            "        float x[8];",
            "#pragma unroll",
            "        for (int k = 0; k < 8; ++k) x[k] = __ldcg(part + (idx_t)plist[q + k] * H + c);",
            "#pragma unroll",
            "        for (int k = 0; k < 8; ++k) total += x[k];",
            "      }",
            "      for (; q < np; ++q) total += __ldcg(part + (idx_t)plist[q] * H + c);",
            f"      out[row * H + c] = fc_cast<{ot}>(total);",
            "    }",
            "  }",
            "  __syncthreads();",
            "}"]  # fmt: skip
    lines += [b if b.startswith("#") else "  " + b for b in body] + ["}"]
    return "\n".join(lines) + "\n"
