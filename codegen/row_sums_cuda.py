"""The row-sums kernels of an accumulate into a constant fill (Note [Row sums] in
schedulers/row_sums.py): out [V, H] = fill + the sum of value [N, H] rows at index [N].

Four kernels over one int workspace `w` of 2 V (w[r]: the token that owns row r, or -1;
w[V + r]: 0 where another token also names r, else -1) and a float workspace `acc` [N, H]
(the sums of the other tokens, at the owner's row):

- `fc_rows_fill`: w = -1.
- `fc_rows_claim`: each token (checked) claims its row with a compare-and-swap; the first
  token to find the row taken marks it shared and zeroes the owner's `acc` row.
- `fc_rows_add`: each token that does not own its row adds its values to the owner's `acc`
  row with atomic adds (red.global.add.v4.f32 on sm_90).
- `fc_rows_out`: each output row, VW columns a thread: fill, plus the owner's values, plus
  `acc` where the row is shared, cast once; rows no token names get the fill.

The output is written once and the values read about once (the owners' from memory, the
others' through L2), so the kernels move what the op must: index, values, output.

By default two kernels do it on words kept between runs (Note [Row sums on kept words]):
`fc_rows_claim_add` claims each token's row for this run (claims tagged with the run need no
fill) and adds the other tokens' values; `fc_rows_out_kept` writes the rows.
"""
from __future__ import annotations

from .cuda_ops import MEMORY_TYPE
from .prelude import prelude_source

BLOCK = 256
FILL_NAME = "fc_rows_fill"
CLAIM_NAME = "fc_rows_claim"
ADD_NAME = "fc_rows_add"
OUT_NAME = "fc_rows_out"

# Vector atomic adds of floats: one red.global.add.v4.f32 per four on sm_90 (PTX 8.1), one
# atomicAdd each elsewhere (and in host runs, which have no __CUDA_ARCH__).
RED_ADD = r"""
template <int N> FC_DEVICE void fc_red_add_vec(float* p, const fc_vec<float, N>& v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4)
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                   :: "l"(p + i), "f"(v[i]), "f"(v[i + 1]), "f"(v[i + 2]), "f"(v[i + 3])
                   : "memory");
    return;
  }
#endif
#pragma unroll
  for (int i = 0; i < N; ++i) atomicAdd(p + i, v[i]);
}
"""


def _head(name: str, params: list[str], index_type: str, wait: bool = False) -> list[str]:
    """`wait`: launched dependent on the kernel before it (Note [Dependent launch])."""
    return [prelude_source("core", "math", "index"), f"typedef {index_type} idx_t;",
            f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(',
            "    " + ",\n    ".join(params) + ") {"] + (
                ["  fc_wait_prior_grid();"] if wait else [])  # fmt: skip


def _value_offset(rest: int, vw: int) -> list[str]:
    """`voff`: the offset of column c in a row of value. With vw > 1 the row is contiguous
    (the plan checks it); with vw == 1 its dims n{d} have strides vs{d}."""
    if vw > 1:
        return ["  const idx_t voff = c;"]
    lines = ["  idx_t voff = 0;", "  {", "    idx_t rem = c;"]
    for d in range(rest - 1, -1, -1):
        lines.append(f"    voff += (rem % n{d}) * vs{d}; rem /= n{d};")
    return lines + ["  }"]


def _rest_params(rest: int, vw: int) -> list[str]:
    return [] if vw > 1 else [p for d in range(rest) for p in (f"idx_t n{d}", f"idx_t vs{d}")]


def _unit(lines: list[str], count: str) -> None:
    """u: this thread's (row, column vector) unit; c: its first column."""
    lines += ["  const idx_t u = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;",
              f"  if (u >= {count}) return;",
              "  const idx_t row = u / HV;",
              "  const idx_t c = (u - row * HV) * VW;"]  # fmt: skip


def render_fill(index_type: str) -> str:
    lines = _head(FILL_NAME, ["int* __restrict__ w", "idx_t count"], index_type)
    lines += ["  const idx_t p = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;",
              "  if (p < count) w[p] = -1;", "}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def render_claim(index_dtype, index_type: str, what: str, zw: int, wait: bool = False) -> str:
    """`zw`: floats a store zeroes (H % zw == 0)."""
    it = MEMORY_TYPE[index_dtype]
    params = ["int* __restrict__ w", "float* __restrict__ acc",
              f"const {it}* __restrict__ index", "idx_t index_s", "idx_t N", "idx_t V",
              "idx_t H"]  # fmt: skip
    lines = _head(CLAIM_NAME, params, index_type, wait)
    what = what.replace('"', "'")
    lines += ["  const idx_t t = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;",
              "  if (t >= N) return;",
              f'  const idx_t r = (idx_t)fc_check_index((long long)index[t * index_s], V, "{what}");',
              "  const int owner = atomicCAS(&w[r], -1, (int)t);",
              "  if (owner == -1) return;",
              "  // the first of the row's other tokens zeroes the owner's sums",
              "  if (atomicCAS(&w[V + r], -1, 0) != -1) return;",
              "  float* sums = acc + (idx_t)owner * H;",
              f"  fc_vec<float, {zw}> zero;",
              f"  for (int j = 0; j < {zw}; ++j) zero[j] = 0.0f;",
              f"  for (idx_t c = 0; c < H; c += {zw}) fc_store_vec<{zw}>(sums + c, zero);",
              "}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def render_add(index_dtype, value_dtype, rest: int, vw: int, index_type: str,
               wait: bool = False) -> str:  # fmt: skip
    it, vt = MEMORY_TYPE[index_dtype], MEMORY_TYPE[value_dtype]
    params = ["const int* __restrict__ w", "float* __restrict__ acc",
              f"const {it}* __restrict__ index", "idx_t index_s",
              f"const {vt}* __restrict__ value", "idx_t value_s", *_rest_params(rest, vw),
              "idx_t N", "idx_t H", "idx_t HV"]  # fmt: skip
    lines = _head(ADD_NAME, params, index_type, wait)
    lines.insert(1, RED_ADD)
    lines.insert(2, f"#define VW {vw}")
    _unit(lines, "N * HV")
    lines += ["  const idx_t t = row;",
              "  const int owner = w[(idx_t)index[t * index_s]];",
              "  if (owner == (int)t) return;"]  # fmt: skip
    lines += _value_offset(rest, vw)
    lines += _load_values("t", vt, vw)
    lines += ["  fc_red_add_vec<VW>(acc + (idx_t)owner * H + c, v);", "}"]
    return "\n".join(lines) + "\n"


def _load_values(token: str, vt: str, vw: int) -> list[str]:
    """`v`: VW values of `token`'s row at column c, as floats."""
    if vw > 1:
        return [f"  const fc_vec<{vt}, VW> raw = fc_load_vec_ro<VW>(value + {token} * value_s + voff);",
                "  fc_vec<float, VW> v;",
                "#pragma unroll",
                "  for (int j = 0; j < VW; ++j) v[j] = (float)fc_widen(raw[j]);"]  # fmt: skip
    return ["  fc_vec<float, VW> v;",
            f"  v[0] = (float)fc_widen(value[{token} * value_s + voff]);"]  # fmt: skip


def render_out(out_dtype, value_dtype, rest: int, vw: int, index_type: str,
               wait: bool = False) -> str:  # fmt: skip
    ot, vt = MEMORY_TYPE[out_dtype], MEMORY_TYPE[value_dtype]
    params = [f"{ot}* __restrict__ out", "const int* __restrict__ w",
              "const float* __restrict__ acc", f"const {vt}* __restrict__ value",
              "idx_t value_s", *_rest_params(rest, vw), "idx_t V", "idx_t H", "idx_t HV",
              "float fill"]  # fmt: skip
    lines = _head(OUT_NAME, params, index_type, wait)
    lines.insert(1, f"#define VW {vw}")
    _unit(lines, "V * HV")
    lines += ["  const int owner = w[row];",
              "  fc_vec<float, VW> s;",
              "#pragma unroll",
              "  for (int j = 0; j < VW; ++j) s[j] = fill;",
              "  if (owner >= 0) {"]  # fmt: skip
    body = _value_offset(rest, vw) + _load_values("(idx_t)owner", vt, vw)
    body += ["#pragma unroll",
             "  for (int j = 0; j < VW; ++j) s[j] += v[j];",
             "  if (w[V + row] == 0) {",
             "    const fc_vec<float, VW> a = fc_load_vec<VW>(acc + (idx_t)owner * H + c);",
             "#pragma unroll",
             "    for (int j = 0; j < VW; ++j) s[j] += a[j];",
             "  }"]  # fmt: skip
    lines += [b if b.startswith("#") else "  " + b for b in body] + ["  }"]
    lines += [f"  fc_vec<{ot}, VW> o;",
              "#pragma unroll",
              f"  for (int j = 0; j < VW; ++j) o[j] = fc_cast<{ot}>(s[j]);",
              "  fc_store_vec<VW>(out + row * H + c, o);",
              "}"]  # fmt: skip
    return "\n".join(lines) + "\n"


# ---- two kernels on kept words (Note [Row sums on kept words]) -------------------------------

CLAIM_ADD_NAME = "fc_rows_claim_add"
KEPT_OUT_NAME = "fc_rows_out_kept"

# The kept words (LaunchSpec.kept, after two counters): the run count, then per row a claim
# (run << 32 | owning token) and a shared mark (the run in which a second token named the
# row), then the float sums [N, H], kept zero between runs.
KEPT_RUN = 0
KEPT_CLAIMS = 2  # 8-byte aligned: the buffer's word 2 + 2


def kept_layout(v: int, n: int, h: int) -> tuple[int, int, int]:
    """(shared marks, sums, total words) as offsets into the kept words."""
    shared = KEPT_CLAIMS + 2 * v
    sums = -(-(shared + v + 2) // 64) * 64 - 2  # 256-byte aligned in the buffer (2 counters before)
    return shared, sums, sums + n * h


CLAIM = r"""
// The token that owns the row: this one if no token of this run claimed it before.
FC_DEVICE unsigned fc_rows_claim(unsigned long long* slot, unsigned run, unsigned t) {
  const unsigned long long mine = ((unsigned long long)run << 32) | t;
  unsigned long long seen = *(volatile unsigned long long*)slot;
  while ((unsigned)(seen >> 32) != run) {
    const unsigned long long prev = atomicCAS(slot, seen, mine);
    if (prev == seen) return t;
    seen = prev;
  }
  return (unsigned)seen;
}
// Asks L2 for the 128-byte line at p (host runs: nothing).
FC_DEVICE void fc_rows_prefetch(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
#endif
}
"""

_KEPT_POINTERS = ["  unsigned* words = kept + 2;",
                  f"  unsigned long long* claims = (unsigned long long*)(words + {KEPT_CLAIMS});",
                  "  unsigned* shared = words + shared_at;",
                  "  float* sums = (float*)(words + sums_at);"]  # fmt: skip


def render_claim_add(index_dtype, value_dtype, rest: int, vw: int, index_type: str,
                     what: str) -> str:  # fmt: skip
    """A warp a token: lane 0 claims the token's row for this run; a token that finds it
    taken adds its values to the owner's sums (the owner's id comes back from the
    compare-and-swap). The last block to finish records the run for the next kernel."""
    it, vt = MEMORY_TYPE[index_dtype], MEMORY_TYPE[value_dtype]
    what = what.replace('"', "'")
    params = ["unsigned* __restrict__ kept", f"const {it}* __restrict__ index", "idx_t index_s",
              f"const {vt}* __restrict__ value", "idx_t value_s", *_rest_params(rest, vw),
              "idx_t N", "idx_t V", "idx_t H", "idx_t shared_at", "idx_t sums_at"]  # fmt: skip
    lines = _head(CLAIM_ADD_NAME, params, index_type)
    lines[1:1] = [RED_ADD, CLAIM, f"#define VW {vw}"]
    lines += _KEPT_POINTERS
    lines += ["  // this run's number (never 0, which fresh words hold); the last block stores it",
              "  // after every block read the last run's (so the read-only path is safe)",
              f"  const unsigned last = __ldg(&words[{KEPT_RUN}]);",
              "  const unsigned run = last + 1 == 0 ? 1 : last + 1;",
              "  const int lane = threadIdx.x & 31;",
              "  const idx_t threads = (idx_t)gridDim.x * blockDim.x;",
              "  const idx_t warps = threads >> 5;",
              "  // the rows kernel reads every row's claim and mark first thing: from L2, not DRAM",
              "  for (idx_t w = ((idx_t)blockIdx.x * blockDim.x + threadIdx.x) * 32; w < shared_at + V;",
              "       w += threads * 32)",
              "    fc_rows_prefetch(words + w);",
              "  for (idx_t t = ((idx_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; t < N; t += warps) {",
              "    // every lane reads (one access) and checks the token; lane 0 claims its row",
              f'    const long long row = fc_check_index((long long)index[t * index_s], V, "{what}");',
              "    unsigned owner = 0;",
              "    if (lane == 0) {",
              "      owner = fc_rows_claim(claims + row, run, (unsigned)t);",
              "      if (owner != (unsigned)t) shared[row] = run;",
              "    }",
              "    owner = __shfl_sync(0xffffffffu, owner, 0);",
              "    if (owner == (unsigned)t) continue;  // the owner's values are read with its row",
              "    for (idx_t c = (idx_t)lane * VW; c < H; c += 32 * VW) {"]  # fmt: skip
    lines += ["    " + b if not b.startswith("#") else b
              for b in _value_offset(rest, vw) + _load_values("t", vt, vw)]
    lines += ["      fc_red_add_vec<VW>(sums + (idx_t)owner * H + c, v);",
              "    }",
              "  }",
              "  // every block read the old run count before the last one stores the new",
              "  __syncthreads();",
              "  if (threadIdx.x == 0) {",
              "    __threadfence();",
              "    if (atomicAdd(&kept[0], 1u) == gridDim.x - 1) {",
              f"      words[{KEPT_RUN}] = run;",
              "      kept[0] = 0;",
              "    }",
              "  }",
              "}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def render_out_kept(out_dtype, value_dtype, rest: int, vw: int, index_type: str,
                    wait: bool = False, units: int = 1) -> str:  # fmt: skip
    """Each output row, VW columns a thread: the fill, plus the owner's values where a token
    of this run claimed the row, plus the others' sums (zeroed again) where it was shared.
    A thread takes `units` such vectors, blockDim.x apart, their claims and values loaded
    before any is stored."""
    ot, vt = MEMORY_TYPE[out_dtype], MEMORY_TYPE[value_dtype]
    params = [f"{ot}* __restrict__ out", "unsigned* __restrict__ kept",
              f"const {vt}* __restrict__ value", "idx_t value_s", *_rest_params(rest, vw),
              "idx_t V", "idx_t H", "idx_t HV", "idx_t shared_at", "idx_t sums_at",
              "float fill"]  # fmt: skip
    lines = _head(KEPT_OUT_NAME, params, index_type, wait)
    lines.insert(1, f"#define VW {vw}")
    lines += _KEPT_POINTERS
    lines += [f"  const idx_t first = (idx_t)blockIdx.x * blockDim.x * {units} + threadIdx.x;",
              "  // the claim kernel's words, complete before this kernel reads (read-only path)",
              f"  const unsigned run = __ldg(&words[{KEPT_RUN}]);"]  # fmt: skip
    for k in range(units):
        lines += [f"  const idx_t u{k} = first + (idx_t){k} * blockDim.x;",
                  f"  const bool in{k} = u{k} < V * HV;",
                  f"  const idx_t row{k} = in{k} ? u{k} / HV : 0;",
                  f"  const idx_t c{k} = (u{k} - row{k} * HV) * VW;",
                  f"  const unsigned long long claim{k} = in{k} ? __ldg(claims + row{k}) : 0ull;"]
    for k in range(units):
        lines += [f"  const bool own{k} = in{k} && (unsigned)(claim{k} >> 32) == run;",
                  f"  const idx_t owner{k} = (idx_t)(unsigned)claim{k};",
                  f"  fc_vec<float, VW> v{k};",
                  f"  if (own{k}) {{",
                  f"    const idx_t c = c{k};"]  # fmt: skip
        body = _value_offset(rest, vw) + _load_values(f"owner{k}", vt, vw) + [f"  v{k} = v;"]
        lines += [b if b.startswith("#") else "  " + b for b in body] + ["  }"]
    for k in range(units):
        lines += [f"  if (in{k}) {{",
                  "    fc_vec<float, VW> s;",
                  "#pragma unroll",
                  "    for (int j = 0; j < VW; ++j) s[j] = fill;",
                  f"    if (own{k}) {{",
                  "#pragma unroll",
                  f"      for (int j = 0; j < VW; ++j) s[j] += v{k}[j];",
                  f"      if (__ldg(shared + row{k}) == run) {{  // the others' sums, zeroed again",
                  f"        float* a = sums + owner{k} * H + c{k};",
                  "        const fc_vec<float, VW> add = fc_load_vec<VW>(a);",
                  "        fc_vec<float, VW> zero;",
                  "#pragma unroll",
                  "        for (int j = 0; j < VW; ++j) { s[j] += add[j]; zero[j] = 0.0f; }",
                  "        fc_store_vec<VW>(a, zero);",
                  "      }",
                  "    }",
                  f"    fc_vec<{ot}, VW> o;",
                  "#pragma unroll",
                  f"    for (int j = 0; j < VW; ++j) o[j] = fc_cast<{ot}>(s[j]);",
                  f"    fc_store_vec<VW>(out + row{k} * H + c{k}, o);",
                  "  }"]  # fmt: skip
    return "\n".join(lines) + "}\n"
