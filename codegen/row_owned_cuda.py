"""The owned-rows kernel of an accumulate into a constant fill (Note [Owned rows] in
schedulers/row_sums.py): out [V, H] = fill + the sum of value [N, H] rows at index [N] in one
launch, no workspace, each output row written once, every sum in an order the index fixes.

`fc_rows_owned`: a block owns consecutive output rows (at most R). Its threads read the whole
index into registers (P ids a thread; a warp 32P consecutive positions, 32 a load: every
block reads the same bytes, from L2 after the first). A run (32 aligned positions naming
one row: a padding row's) makes its row hot; every block finds the same hot rows, in the
order of their first runs, so each block knows, without a word between blocks, which
slices of the hot rows it sums (task k: hot row k / SL, SV column vectors from slice
k % SL; the grid's last blocks take the first tasks) and which rows it owns (V rows and
the slices, D rows each, dealt evenly). It counts its rows' tokens in shared memory and
stores the fill to the first EARLY rows of each warp no token names; then its slices: its
warps split the row's token list, the partials added in warp order, the slice stored. The
owner skips a hot row.
Then the block lists its other named rows' tokens in token order (one int each: the token
above RB bits of the row in the block) and each warp writes its rows, W apart: the fill, or
the fill plus the row's tokens' values added in token order (AHEAD tokens' loads issued
before any is added, LV column vectors a lane a pass), cast once.
"""
from __future__ import annotations

from .cuda_ops import MEMORY_TYPE
from .prelude import prelude_source
from .row_sums_cuda import _rest_params, _value_offset

OWNED_NAME = "fc_rows_owned"
MAX_IDS = 16  # index positions a thread keeps in registers
SHARED_BYTES = 48 * 1024  # static shared memory a block may declare


def shared_bytes(threads: int, rows: int, tokens: int, per: int, sv: int, vw: int) -> int:
    """Static shared memory of the kernel: counts [R], list [N], runs and hot rows [W P],
    warp sums [W], flags, partials [W][SV VW]."""
    warps = threads // 32
    return 4 * (rows + max(1, tokens) + 2 * warps * per + warps + 2 + warps * sv * vw)


def render_owned(out_dtype, index_dtype, value_dtype, rest: int, vw: int, index_type: str,
                 what: str, threads: int, rows: int, tokens: int, per: int, lv: int,
                 ahead: int, sv: int, early: int, hot_ahead: int = 4, slice_rows: int = 0,
                 hint: int = 0,
                 min_blocks: int = 0) -> str:  # fmt: skip
    """`threads` a block, `rows` R the most rows of a block, `tokens` N (the list's
    capacity), `per` P ids a thread (32 P W >= N), `lv` column vectors a lane of a named
    row's pass, `ahead` tokens loaded before adding, `sv` column vectors a hot slice
    (`hot_ahead` loads a lane of it in flight, `slice_rows` D the rows a slice counts for
    where rows are dealt), `early` rows a warp whose fill is stored before the lists are
    built, `hint` the stores' cache hint, `min_blocks` blocks an SM the registers must allow
    (0: no bound)."""
    ot, it, vt = MEMORY_TYPE[out_dtype], MEMORY_TYPE[index_dtype], MEMORY_TYPE[value_dtype]
    what = what.replace('"', "'")
    rbits = max(1, (rows - 1).bit_length())
    store = f"fc_store_vec_hint<VW, {hint}>" if hint else "fc_store_vec<VW>"
    bounds = f"{threads}, {min_blocks}" if min_blocks else f"{threads}"
    params = [f"{ot}* __restrict__ out", f"const {it}* __restrict__ index", "idx_t index_s",
              f"const {vt}* __restrict__ value", "idx_t value_s", *_rest_params(rest, vw),
              "idx_t N", "idx_t V", "idx_t H", "idx_t HV", "float fill"]  # fmt: skip
    load = ("fc_load_vec_ro<VW>(value + at)" if vw > 1 else None)
    defs = [f"#define {k} {v}" for k, v in (
        ("T", threads), ("W", threads // 32), ("P", per), ("R", rows), ("RB", rbits),
        ("LCAP", max(1, tokens)), ("VW", vw), ("LV", lv), ("AHEAD", ahead), ("HA", hot_ahead),
        ("D", slice_rows), ("SV", sv),
        ("TPW", 32 // sv), ("EARLY", early), ("FULL", "0xffffffffu"))]  # fmt: skip
    lines = [prelude_source("core", "math", "index"), f"typedef {index_type} idx_t;", *defs,
             f"FC_DEVICE fc_vec<{vt}, VW> fc_owned_load(const {vt}* __restrict__ value, idx_t at) {{",
             f"  return {load};" if load else f"  fc_vec<{vt}, VW> r; r[0] = value[at]; return r;",
             "}",
             f'extern "C" __global__ void __launch_bounds__({bounds}) {OWNED_NAME}(',
             "    " + ",\n    ".join(params) + ") {"]  # fmt: skip
    fill_row = ["for (idx_t j = lane; j < HV; j += 32)",
                f"  {store}(out + (r0 + lr) * H + j * VW, f);"]  # fmt: skip
    hot_sum = [  # a slice of hot row hr: the warp's share of its tokens, then the block's
        "const int a = (int)((long long)L * warp / W), e = (int)((long long)L * (warp + 1) / W);",
        "const int j = lane / SV;",
        "const idx_t cv = (idx_t)s * SV + lane % SV;",
        "const bool ok = cv < HV;",
        "const idx_t c = cv * VW;",
        *_value_offset(rest, vw),
        "fc_vec<float, VW> acc;",
        "#pragma unroll",
        "for (int i = 0; i < VW; ++i) acc[i] = 0.0f;",
        "for (int q0 = a; q0 < e; q0 += TPW * HA) {",
        f"  fc_vec<{vt}, VW> x[HA];",
        "#pragma unroll",
        "  for (int q = 0; q < HA; ++q) {",
        "    const int at = q0 + q * TPW + j;",
        "    if (ok && at < e) x[q] = fc_owned_load(value, (idx_t)lst[at] * value_s + voff);",
        "  }",
        "#pragma unroll",
        "  for (int q = 0; q < HA; ++q)",
        "    if (ok && q0 + q * TPW + j < e)",
        "#pragma unroll",
        "      for (int i = 0; i < VW; ++i) acc[i] += (float)fc_widen(x[q][i]);",
        "}",
        "#pragma unroll",
        "for (int m = SV; m < 32; m <<= 1)",
        "#pragma unroll",
        "  for (int i = 0; i < VW; ++i) acc[i] += __shfl_xor_sync(FULL, acc[i], m);",
        "if (lane < SV)",
        "#pragma unroll",
        "  for (int i = 0; i < VW; ++i) part[warp][lane * VW + i] = acc[i];",
        "__syncthreads();",
        "if (threadIdx.x < SV && (idx_t)s * SV + threadIdx.x < HV) {",
        "  fc_vec<float, VW> sum;",
        "#pragma unroll",
        "  for (int i = 0; i < VW; ++i) sum[i] = fill;",
        "  for (int k = 0; k < W; ++k)",
        "#pragma unroll",
        "    for (int i = 0; i < VW; ++i) sum[i] += part[k][threadIdx.x * VW + i];",
        f"  fc_vec<{ot}, VW> o;",
        "#pragma unroll",
        f"  for (int i = 0; i < VW; ++i) o[i] = fc_cast<{ot}>(sum[i]);",
        f"  {store}(out + (idx_t)hr * H + ((idx_t)s * SV + threadIdx.x) * VW, o);",
        "}"]  # fmt: skip
    dedupe = [
        "// the distinct rows of runs, in the order of their first runs (every block the same)",
        "bool first = false;",
        "int cr = -1;",
        "if (threadIdx.x < W * P) {",
        "  cr = cand[threadIdx.x];",
        "  first = cr >= 0;",
        "  for (int k = 0; first && k < (int)threadIdx.x; ++k) first = cand[k] != cr;",
        "}",
        "const unsigned fb = __ballot_sync(FULL, first);",
        "if (lane == 0) wsum[warp] = __popc(fb);",
        "__syncthreads();",
        "int before = 0;",
        "for (int k = 0; k < W; ++k) {",
        "  if (k < warp) before += wsum[k];",
        "  nh += wsum[k];",
        "}",
        "if (first) hot[before + __popc(fb & lt)] = cr;",
        "__syncthreads();"]  # fmt: skip
    hot = [
        "for (int k = threadIdx.x; k < nh; k += T) {  // the owner leaves its hot rows to the slices",
        "  const long long lr = (long long)hot[k] - r0;",
        "  if (lr >= 0 && lr < rows) cnt[lr] = -1;",
        "}",
        "for (long long k = G - 1 - (long long)blockIdx.x; k < nt; k += G) {",
        "  const int hr = hot[k / SL], s = (int)(k % SL);",
        "  int mine = 0;",
        "#pragma unroll",
        "  for (int g = 0; g < P; ++g) mine += __popc(__ballot_sync(FULL, ids[g] == hr));",
        "  __syncthreads();  // the last slice's list and warp sums read",
        "  if (lane == 0) wsum[warp] = mine;",
        "  __syncthreads();",
        "  int p = 0, L = 0;",
        "  for (int k2 = 0; k2 < W; ++k2) {",
        "    if (k2 < warp) p += wsum[k2];",
        "    L += wsum[k2];",
        "  }",
        "#pragma unroll",
        "  for (int g = 0; g < P; ++g) {  // its tokens, in token order",
        "    const bool in = ids[g] == hr;",
        "    const unsigned hb = __ballot_sync(FULL, in);",
        "    if (in) lst[p + __popc(hb & lt)] = (int)(t0 + 32 * g);",
        "    p += __popc(hb);",
        "  }",
        "  __syncthreads();",
        *["  " + x if not x.startswith("#") else x for x in hot_sum],
        "}",
        "__syncthreads();  // hot rows marked, the slices' lists and sums read"]  # fmt: skip
    named = [  # row lr (n tokens on the list): column passes of LV vectors a lane
        "for (idx_t c0 = 0; c0 < HV; c0 += 32 * LV) {",
        "  fc_vec<float, VW> s[LV];",
        "  idx_t vo[LV];",
        "#pragma unroll",
        "  for (int v = 0; v < LV; ++v) {",
        "#pragma unroll",
        "    for (int i = 0; i < VW; ++i) s[v][i] = fill;",
        "    const idx_t c = (c0 + lane + 32 * v) * VW;",
        *["  " + x for x in _value_offset(rest, vw)],
        "    vo[v] = voff;",
        "  }",
        "  int got = 0;",
        "  for (int k0 = 0; got < n && k0 < L; k0 += 32) {  // its tokens: the list's entries of row lr",
        "    const int en = k0 + lane < L ? lst[k0 + lane] : -1;",
        "    unsigned hit = __ballot_sync(FULL, en >= 0 && (en & ((1 << RB) - 1)) == lr);",
        "    got += __popc(hit);",
        "    while (hit) {  // AHEAD tokens' values loaded before any is added, in token order",
        "      int tq[AHEAD];",
        "#pragma unroll",
        "      for (int q = 0; q < AHEAD; ++q) {",
        "        const int src = __shfl_sync(FULL, en >> RB, hit ? __ffs(hit) - 1 : 0);",
        "        tq[q] = hit ? src : -1;",
        "        hit &= hit - 1;",
        "      }",
        f"      fc_vec<{vt}, VW> x[AHEAD][LV];",
        "#pragma unroll",
        "      for (int q = 0; q < AHEAD; ++q)",
        "#pragma unroll",
        "        for (int v = 0; v < LV; ++v)",
        "          if (tq[q] >= 0 && c0 + lane + 32 * v < HV)",
        "            x[q][v] = fc_owned_load(value, (idx_t)tq[q] * value_s + vo[v]);",
        "#pragma unroll",
        "      for (int q = 0; q < AHEAD; ++q)",
        "#pragma unroll",
        "        for (int v = 0; v < LV; ++v)",
        "          if (tq[q] >= 0 && c0 + lane + 32 * v < HV)",
        "#pragma unroll",
        "            for (int i = 0; i < VW; ++i) s[v][i] += (float)fc_widen(x[q][v][i]);",
        "    }",
        "  }",
        "#pragma unroll",
        "  for (int v = 0; v < LV; ++v) {",
        "    if (c0 + lane + 32 * v >= HV) continue;",
        f"    fc_vec<{ot}, VW> o;",
        "#pragma unroll",
        f"    for (int i = 0; i < VW; ++i) o[i] = fc_cast<{ot}>(s[v][i]);",
        f"    {store}(out + (r0 + lr) * H + (c0 + lane + 32 * v) * VW, o);",
        "  }",
        "}"]  # fmt: skip
    body = [
        "__shared__ int cnt[R];  // tokens naming each of the block's rows; -1: hot",
        "__shared__ int lst[LCAP];  // a slice's tokens, then the named rows' (token << RB | row)",
        "__shared__ int cand[W * P];  // the row a run of 32 positions names, or -1",
        "__shared__ int hot[W * P];",
        "__shared__ int wsum[W];",
        "__shared__ int runs;",
        "__shared__ float part[W][SV * VW];",
        "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
        "const unsigned lt = (1u << lane) - 1u;",
        "for (int k = threadIdx.x; k < R; k += T) cnt[k] = 0;",
        "if (threadIdx.x == 0) runs = 0;",
        "// the whole index, P ids a thread: warp w positions [32 P w, 32 P (w + 1))",
        "const idx_t t0 = (idx_t)warp * 32 * P + lane;",
        "long long raw[P];",
        "#pragma unroll",
        "for (int g = 0; g < P; ++g)",
        "  raw[g] = t0 + 32 * g < N ? (long long)fc_ldg(index + (t0 + 32 * g) * index_s) : -1;",
        "int ids[P];",
        "#pragma unroll",
        "for (int g = 0; g < P; ++g)",
        "  if (blockIdx.x == 0 && t0 + 32 * g < N)  // checked once; other blocks skip a bad id",
        f'    fc_check_index(raw[g], V, "{what}");',
        "#pragma unroll",
        "for (int g = 0; g < P; ++g)",
        "  ids[g] = t0 + 32 * g < N && raw[g] >= 0 && raw[g] < V ? (int)raw[g] : -1;",
        "__syncthreads();",
        "unsigned in_run = 0;  // bit g: the warp's 32 ids of round g name one row",
        "#pragma unroll",
        "for (int g = 0; g < P; ++g) {",
        "  const int id = ids[g], id0 = __shfl_sync(FULL, id, 0);",
        "  const bool run = __ballot_sync(FULL, id == id0 && id >= 0) == FULL;",
        "  in_run |= (unsigned)run << g;",
        "  if (lane == 0) {",
        "    cand[warp * P + g] = run ? id0 : -1;",
        "    if (run) runs = 1;",
        "  }",
        "}",
        "__syncthreads();",
        "int nh = 0;",
        "if (runs) {",
        *["  " + x if not x.startswith("#") else x for x in dedupe],
        "}",
        "// the block's rows: V rows and nt slices of D rows' cost each dealt evenly, block b",
        "// taking the slices k = G - 1 - b (mod G)",
        "const long long G = gridDim.x, SL = (HV + SV - 1) / SV, nt = nh * SL;",
        "const long long each = (nt + G - 1) / G, d = nt && D ? (D < V / G / each ? D : V / G / each) : 0;",
        "const long long U = V + nt * d, b = blockIdx.x;",
        "const long long s0 = nt % G > G - b ? nt % G - (G - b) : 0, s1 = nt % G > G - b - 1 ? nt % G - (G - b - 1) : 0;",
        "const idx_t r0 = b * U / G - d * ((nt / G) * b + s0);",
        "const int rows = (int)((b + 1) * U / G - d * ((nt / G) * (b + 1) + s1) - r0);",
        "#pragma unroll",
        "for (int g = 0; g < P; ++g) {  // counts; a run's with one add",
        "  const int id = ids[g];",
        "  const bool run = (in_run >> g) & 1u;",
        "  const long long lr = (long long)id - r0;",
        "  if (id >= 0 && lr >= 0 && lr < rows && (!run || lane == 0)) atomicAdd(&cnt[lr], run ? 32 : 1);",
        "}",
        "__syncthreads();",
        f"fc_vec<{ot}, VW> f;",
        "#pragma unroll",
        f"for (int i = 0; i < VW; ++i) f[i] = fc_cast<{ot}>(fill);",
        "for (int e = 0; e < EARLY; ++e) {  // the fill of the warp's first rows, before the lists",
        "  const int lr = warp + e * W;",
        "  if (lr < rows && cnt[lr] == 0)",
        *["    " + x for x in fill_row],
        "}",
        "if (nh) {",
        *["  " + x if not x.startswith("#") else x for x in hot],
        "}",
        "// the named rows' tokens, in token order",
        "int mine = 0;",
        "#pragma unroll",
        "for (int g = 0; g < P; ++g) {",
        "  const long long lr = (long long)ids[g] - r0;",
        "  mine += __popc(__ballot_sync(FULL, ids[g] >= 0 && lr >= 0 && lr < rows && cnt[lr] > 0));",
        "}",
        "if (lane == 0) wsum[warp] = mine;",
        "__syncthreads();",
        "int p = 0, L = 0;",
        "for (int k = 0; k < W; ++k) {",
        "  if (k < warp) p += wsum[k];",
        "  L += wsum[k];",
        "}",
        "#pragma unroll",
        "for (int g = 0; g < P; ++g) {",
        "  const long long lr = (long long)ids[g] - r0;",
        "  const bool in = ids[g] >= 0 && lr >= 0 && lr < rows && cnt[lr] > 0;",
        "  const unsigned hb = __ballot_sync(FULL, in);",
        "  if (in) lst[p + __popc(hb & lt)] = (int)((t0 + 32 * g) << RB) | (int)lr;",
        "  p += __popc(hb);",
        "}",
        "__syncthreads();",
        "// each warp its rows, W apart: the fill, or the fill plus the row's tokens",
        "for (int lr = warp; lr < rows; lr += W) {",
        "  const int n = cnt[lr];",
        "  if (n < 0 || (n == 0 && lr < EARLY * W)) continue;",
        "  if (n == 0) {",
        *["    " + x for x in fill_row],
        "    continue;",
        "  }",
        *["  " + x if not x.startswith("#") else x for x in named],
        "}"]  # fmt: skip
    lines += [b if b.startswith("#") else "  " + b for b in body] + ["}"]
    return "\n".join(lines) + "\n"
