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
"""
from __future__ import annotations

from .cuda_ops import MEMORY_TYPE
from .prelude import prelude_source

BLOCK = 256
FILL_NAME = "fc_rows_fill"
CLAIM_NAME = "fc_rows_claim"
ADD_NAME = "fc_rows_add"
OUT_NAME = "fc_rows_out"
LINK_NAME = "fc_rows_link"  # Note [Row chains]
WALK_NAME = "fc_rows_walk"
SLAB_WALK_NAME = "fc_rows_slab_walk"  # Note [Slab walk]
WARPS = BLOCK // 32

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

# The next kernel, launched dependent (Note [Dependent launch]), is placed at once to wait in
# fc_wait_prior_grid instead of at this grid's end.
LAUNCH_DEPENDENTS = r"""
FC_DEVICE void fc_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}"""


def _head(name: str, params: list[str], index_type: str, wait: bool = False,
          early: bool = False, min_blocks: int = 0) -> list[str]:  # fmt: skip
    """`wait`: launched dependent on the kernel before it (Note [Dependent launch]);
    `early`: the next kernel, launched dependent, is placed at once to wait; `min_blocks`:
    blocks an SM the registers must allow (0: no bound)."""
    bounds = f"{BLOCK}, {min_blocks}" if min_blocks else f"{BLOCK}"
    return [prelude_source("core", "math", "index"), f"typedef {index_type} idx_t;",
            *([LAUNCH_DEPENDENTS] if early else []),
            f'extern "C" __global__ void __launch_bounds__({bounds}) {name}(',
            "    " + ",\n    ".join(params) + ") {"] + (
                ["  fc_launch_dependents();"] if early else []) + (
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


def render_fill(index_type: str, early: bool = False) -> str:
    lines = _head(FILL_NAME, ["int* __restrict__ w", "idx_t count"], index_type, early=early)
    lines += ["  const idx_t p = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;",
              "  if (p < count) w[p] = -1;", "}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def render_claim(index_dtype, index_type: str, what: str, zw: int, wait: bool = False,
                 early: bool = False) -> str:  # fmt: skip
    """`zw`: floats a store zeroes (H % zw == 0)."""
    it = MEMORY_TYPE[index_dtype]
    params = ["int* __restrict__ w", "float* __restrict__ acc",
              f"const {it}* __restrict__ index", "idx_t index_s", "idx_t N", "idx_t V",
              "idx_t H"]  # fmt: skip
    lines = _head(CLAIM_NAME, params, index_type, wait, early)
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
               wait: bool = False, early: bool = False) -> str:  # fmt: skip
    it, vt = MEMORY_TYPE[index_dtype], MEMORY_TYPE[value_dtype]
    params = ["const int* __restrict__ w", "float* __restrict__ acc",
              f"const {it}* __restrict__ index", "idx_t index_s",
              f"const {vt}* __restrict__ value", "idx_t value_s", *_rest_params(rest, vw),
              "idx_t N", "idx_t H", "idx_t HV"]  # fmt: skip
    lines = _head(ADD_NAME, params, index_type, wait, early)
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


def render_link(index_dtype, index_type: str, what: str, wait: bool = False,
                early: bool = False) -> str:  # fmt: skip
    """Note [Row chains]: each token (checked) pushes itself on its row's list."""
    it = MEMORY_TYPE[index_dtype]
    params = ["int* __restrict__ head", "int* __restrict__ next",
              f"const {it}* __restrict__ index", "idx_t index_s", "idx_t N", "idx_t V"]
    lines = _head(LINK_NAME, params, index_type, wait, early)
    what = what.replace('"', "'")
    lines += ["  const idx_t t = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;",
              "  if (t >= N) return;",
              f'  const idx_t r = (idx_t)fc_check_index((long long)index[t * index_s], V, "{what}");',
              "  next[t] = atomicExch(&head[r], (int)t);",
              "}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def render_fill_bounded(index_type: str, early: bool = False) -> str:
    """Note [Row chains], bounded: head, count and slot words -1, the hot rows' sums 0."""
    params = ["int* __restrict__ w", "idx_t count", "float* __restrict__ acc", "idx_t acc_count"]
    lines = _head(FILL_NAME, params, index_type, early=early)
    lines += ["  const idx_t p = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;",
              "  if (p < count) w[p] = -1;",
              "  if (p < acc_count) acc[p] = 0.0f;", "}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _bounded_link_params(it: str, vt: str, rest: int, vw: int) -> list[str]:
    """The bounded link kernels' parameters (Note [Row chains]; Note [Warp adds])."""
    return ["int* __restrict__ w", "int* __restrict__ next", "float* __restrict__ acc",
            f"const {it}* __restrict__ index", "idx_t index_s",
            f"const {vt}* __restrict__ value", "idx_t value_s", *_rest_params(rest, vw),
            "idx_t N", "idx_t V", "idx_t H"]  # fmt: skip


def render_link_bounded(index_dtype, value_dtype, rest: int, vw: int, index_type: str, what: str,
                        bound: int, wait: bool = False, early: bool = False) -> str:  # fmt: skip
    """Note [Row chains], bounded: a row's first `bound` tokens push themselves on its list;
    the next one takes a slot of float sums for the row (zeroed by the fill) and adds its
    values there, and the later ones wait for that slot and add theirs, with atomics."""
    it, vt = MEMORY_TYPE[index_dtype], MEMORY_TYPE[value_dtype]
    params = _bounded_link_params(it, vt, rest, vw)
    lines = _head(LINK_NAME, params, index_type, wait, early)
    lines.insert(1, RED_ADD)
    lines.insert(2, f"#define VW {vw}")
    what = what.replace('"', "'")
    lines += ["  const idx_t t = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;",
              "  if (t >= N) return;",
              f'  const idx_t r = (idx_t)fc_check_index((long long)index[t * index_s], V, "{what}");',
              "  const int at = atomicAdd(&w[V + r], 1) + 1;  // the token's place on its row",
              f"  if (at < {bound}) {{",
              "    next[t] = atomicExch(&w[r], (int)t);",
              "    return;",
              "  }",
              "  int slot;",
              f"  if (at == {bound}) {{",
              "    slot = atomicAdd(&w[3 * V], 1) + 1;",
              "    atomicExch(&w[2 * V + r], slot);",
              "  } else {",
              "    do { slot = *(volatile const int*)(w + 2 * V + r); } while (slot < 0);",
              "  }",
              "  float* sums = acc + (idx_t)slot * H;",
              "  for (idx_t c = 0; c < H; c += VW) {"]  # fmt: skip
    lines += ["  " + x for x in _value_offset(rest, vw) + _load_values("t", vt, vw)]
    lines += ["    fc_red_add_vec<VW>(sums + c, v);", "  }", "}"]
    return "\n".join(lines) + "\n"


def render_link_warp_adds(index_dtype, value_dtype, rest: int, vw: int, index_type: str,
                          what: str, bound: int, hv: int, wait: bool = False,
                          early: bool = False, ahead: int = 4, matched: bool = False,
                          appends: bool = False, defers: bool = False) -> str:  # fmt: skip
    """Note [Warp adds]: render_link_bounded's lists and slots, but a warp adds its tokens past
    the bound together: a lane LV column vectors of each token (the plan's `hv` units a row
    size LV), AHEAD tokens' values loaded before any is added, a run of tokens on one slot
    summed in registers and added to the slot with one vector atomic a column vector.
    `matched`: (Note [Matched places]) the lanes of a warp naming one row take their places
    with one atomic, and one of them waits for the row's slot; `appends` (with `matched`):
    the token at a row's place 0 appends the row to the list of named rows (Note [Split
    walk]), a warp's with one atomic; `defers` (with `appends`): the tokens past the bound are
    listed for the walk to add (Note [Walk adds]) instead of added here."""
    it, vt = MEMORY_TYPE[index_dtype], MEMORY_TYPE[value_dtype]
    params = _bounded_link_params(it, vt, rest, vw)
    lines = _head(LINK_NAME, params, index_type, wait, early)
    lines.insert(1, RED_ADD)
    lines.insert(3, _walk_defs(vt, vw, [f"#define LV {max(1, min(4, -(-hv // 32)))}",
                                        f"#define AHEAD {ahead}", f"#define BOUND {bound}"]))
    what = what.replace('"', "'")
    body = ["const idx_t t = (idx_t)blockIdx.x * blockDim.x + threadIdx.x;",
            "const idx_t HV = H / VW;",
            "const int lane = threadIdx.x & 31;",
            "int slot = -1;  // where the token's values go, past the bound",
            *(_matched_places(what, appends) if matched else [
                "if (t < N) {",
                f'  const idx_t r = (idx_t)fc_check_index((long long)index[t * index_s], V, "{what}");',
                "  const int at = atomicAdd(&w[V + r], 1) + 1;  // the token's place on its row",
                "  if (at < BOUND) {",
                "    next[t] = atomicExch(&w[r], (int)t);",
                "  } else if (at == BOUND) {",
                "    slot = atomicAdd(&w[3 * V], 1) + 1;",
                "    atomicExch(&w[2 * V + r], slot);",
                "  } else {",
                "    do { slot = *(volatile const int*)(w + 2 * V + r); } while (slot < 0);",
                "  }",
                "}"]),
            "const unsigned over = __ballot_sync(0xffffffffu, slot >= 0);",
            "if (!over) return;",
            *(_deferred_adds() if defers else ["const idx_t t0 = t - lane;",
                                               *warp_adds(vt, rest, vw, "t0 + src[q]")])]
    lines += [b if b.startswith("#") else "  " + b for b in body] + ["}"]
    return "\n".join(lines) + "\n"


def _deferred_adds() -> list[str]:
    """Note [Walk adds]: the warp's tokens past the bound appended, with their slots, to the
    list of hot tokens (one atomic a warp), and each slot's count of pending tokens raised by
    its lanes (one atomic a slot, from its lowest lane)."""
    return ["const idx_t NR = N < V ? N : V;",
            "int* const hot_t = w + 3 * V + 3 + NR;",
            "int* const hot_s = hot_t + N;",
            "int* const pend = hot_s + N;",
            "const int lead = __ffs(over) - 1;",
            "int first_at = 0;",
            "if (lane == lead) first_at = atomicAdd(&w[3 * V + 2 + NR], __popc(over)) + 1;",
            "first_at = __shfl_sync(0xffffffffu, first_at, lead);",
            "if (slot >= 0) {",
            "  const int k = first_at + __popc(over & ((1u << lane) - 1u));",
            "  hot_t[k] = (int)t;",
            "  hot_s[k] = slot;",
            "  if (lane == __ffs(same & over) - 1) atomicAdd(&pend[slot], __popc(same & over));",
            "}"]  # fmt: skip


def warp_adds(vt: str, rest: int, vw: int, token: str) -> list[str]:
    """Note [Warp adds]: the warp's lanes of `over` (each with its `slot`) added to their
    slots, a lane LV column vectors of each, AHEAD tokens' values loaded before any is added,
    a run on one slot summed in registers, one vector atomic a column vector a run. `token`:
    the token of lane src[q], an expression every lane evaluates."""
    unit = ["const idx_t j = q0 + lane + 32 * u;  // the lane's column vector",
            "const idx_t c = j * VW;"]  # fmt: skip
    return [
            "for (idx_t q0 = 0; q0 < HV; q0 += 32 * LV) {",
            "  fc_vec<float, VW> s[LV];",
            "  idx_t vo[LV];",
            "#pragma unroll",
            "  for (int u = 0; u < LV; ++u) {",
            *["    " + x for x in unit],
            *["  " + x for x in _value_offset(rest, vw)],
            "    vo[u] = voff;",
            "#pragma unroll",
            "    for (int x = 0; x < VW; ++x) s[u][x] = 0.0f;",
            "  }",
            "  int cur = -1;  // the slot of the run in s",
            "  unsigned todo = over;",
            "  while (todo) {",
            "    int src[AHEAD], sl[AHEAD];",
            f"    fc_vec<{vt}, VW> raw[AHEAD][LV];",
            "#pragma unroll",
            "    for (int q = 0; q < AHEAD; ++q) {  // the same lanes in every lane",
            "      src[q] = todo ? __ffs(todo) - 1 : -1;",
            "      todo &= todo ? todo - 1 : 0u;",
            "      sl[q] = __shfl_sync(0xffffffffu, slot, src[q] < 0 ? 0 : src[q]);",
            f"      const idx_t tq = {token};",
            "#pragma unroll",
            "      for (int u = 0; u < LV; ++u)",
            "        if (src[q] >= 0 && q0 + lane + 32 * u < HV)",
            "          raw[q][u] = fc_row_at(value, tq * value_s + vo[u]);",
            "    }",
            "#pragma unroll",
            "    for (int q = 0; q < AHEAD; ++q) {",
            "      if (src[q] < 0) break;",
            "      if (sl[q] != cur) {  // a new run: the last one's sums to its slot",
            "#pragma unroll",
            "        for (int u = 0; u < LV; ++u) {",
            *["          " + x for x in unit],
            "          if (cur >= 0 && j < HV) fc_red_add_vec<VW>(acc + (idx_t)cur * H + c, s[u]);",
            "#pragma unroll",
            "          for (int x = 0; x < VW; ++x) s[u][x] = 0.0f;",
            "        }",
            "        cur = sl[q];",
            "      }",
            "#pragma unroll",
            "      for (int u = 0; u < LV; ++u)",
            "        if (q0 + lane + 32 * u < HV) fc_row_add(s[u], raw[q][u]);",
            "    }",
            "  }",
            "#pragma unroll",
            "  for (int u = 0; u < LV; ++u) {",
            *["    " + x for x in unit],
            "    if (j < HV) fc_red_add_vec<VW>(acc + (idx_t)cur * H + c, s[u]);",
            "  }",
            "}"]  # fmt: skip


def _matched_places(what: str, appends: bool = False) -> list[str]:
    """Note [Matched places]: the lanes naming one row (a group, __match_any_sync) take their
    places with one atomic add of the group's size, the lowest lane's; a lane's place is the
    group's first plus its rank in the group. Past the bound, a lane takes the slot from the
    group's lane at the bound where there is one, else from the group's first lane past the
    bound, which alone waits for the slot's word. Every lane runs the votes (no lane returns
    before them)."""
    return ["const long long r = t < N ? fc_check_index((long long)index[t * index_s], V, "
            f'"{what}") : -1;',
            "const unsigned same = __match_any_sync(0xffffffffu, r);",
            "const int first = __ffs(same) - 1;",
            "int base = 0;",
            "if (t < N && lane == first) base = atomicAdd(&w[V + r], __popc(same));",
            "base = __shfl_sync(0xffffffffu, base, first);",
            "const int at = base + 1 + __popc(same & ((1u << lane) - 1u));  // the place",
            "if (t < N && at < BOUND) {",
            "  next[t] = atomicExch(&w[r], (int)t);",
            "} else if (t < N && at == BOUND) {",
            "  slot = atomicAdd(&w[3 * V], 1) + 1;",
            "  atomicExch(&w[2 * V + r], slot);",
            "}",
            "const unsigned opened = __ballot_sync(0xffffffffu, t < N && at == BOUND) & same;",
            "const unsigned past = __ballot_sync(0xffffffffu, t < N && at > BOUND) & same;",
            "const int from = opened ? __ffs(opened) - 1 : past ? __ffs(past) - 1 : lane;",
            "if (!opened && past && lane == from) {",
            "  do { slot = *(volatile const int*)(w + 2 * V + r); } while (slot < 0);",
            "}",
            "const int got = __shfl_sync(0xffffffffu, slot, from);",
            "if (t < N && at > BOUND) slot = got;",
            *(["// the rows named first here, on the list of named rows (Note [Split walk])",
               "const unsigned opens = __ballot_sync(0xffffffffu, t < N && at == 0);",
               "if (opens) {",
               "  const int opener = __ffs(opens) - 1;",
               "  int taken = 0;",
               "  if (lane == opener) taken = atomicAdd(&w[3 * V + 1], __popc(opens)) + 1;",
               "  taken = __shfl_sync(0xffffffffu, taken, opener);",
               "  if (t < N && at == 0)",
               "    w[3 * V + 2 + taken + __popc(opens & ((1u << lane) - 1u))] = (int)r;",
               "}"] if appends else [])]  # fmt: skip


def render_walk(out_dtype, value_dtype, rest: int, vw: int, index_type: str, wait: bool = False,
                units: int = 1, bounded: bool = False) -> str:  # fmt: skip
    """Note [Row chains]: each output row, VW columns a thread: the fill plus the values of
    the tokens on the row's list, cast once. A thread takes `units` (row, column vector) units a
    block apart, their head words, first values and next tokens loaded before any is added,
    and a list's next values loaded before the current ones are added."""
    ot, vt = MEMORY_TYPE[out_dtype], MEMORY_TYPE[value_dtype]
    params = _walk_params(out_dtype, value_dtype, rest, vw, bounded)
    lines = _head(WALK_NAME, params, index_type, wait)
    if bounded:  # a hot row's slot of sums, or -1
        lines.append("  const int* __restrict__ slots = head + 2 * V;")
    lines.insert(2, _walk_defs(vt, vw, [f"#define WU {units}"]))  # after idx_t's typedef
    offset = ["  " + x for x in _value_offset(rest, vw)]
    unit = ["    const idx_t u = u0 + (idx_t)k * blockDim.x;",
            "    const idx_t row = u / HV;",
            "    const idx_t c = (u - row * HV) * VW;"]  # fmt: skip
    lines += ["  const idx_t u0 = (idx_t)blockIdx.x * blockDim.x * WU + threadIdx.x;",
              "  int h[WU], t[WU];",
              *(["  int sl[WU];"] if bounded else []),
              "#pragma unroll",
              "  for (int k = 0; k < WU; ++k) {",
              "    const idx_t u = u0 + (idx_t)k * blockDim.x;",
              "    h[k] = u < V * HV ? head[u / HV] : -1;",
              *(["    sl[k] = u < V * HV ? slots[u / HV] : -1;"] if bounded else []),
              "  }",
              f"  fc_vec<{vt}, VW> raw[WU];",
              "#pragma unroll",
              "  for (int k = 0; k < WU; ++k) {",
              "    if (h[k] < 0) continue;",
              *unit, *offset,
              "    raw[k] = fc_row_at(value, (idx_t)h[k] * value_s + voff);",
              "    t[k] = fc_ldg(next + h[k]);",
              "  }",
              "#pragma unroll",
              "  for (int k = 0; k < WU; ++k) {",
              *unit,
              "    if (u >= V * HV) break;",
              "    fc_vec<float, VW> s;",
              "#pragma unroll",
              "    for (int j = 0; j < VW; ++j) s[j] = fill;",
              "    if (h[k] >= 0) {",
              *["  " + x for x in offset],
              f"      fc_vec<{vt}, VW> now = raw[k];",
              "      int n = t[k];",
              "      while (n >= 0) {",
              f"        const fc_vec<{vt}, VW> ahead = fc_row_at(value, (idx_t)n * value_s + voff);",
              "        n = fc_ldg(next + n);",
              "        fc_row_add(s, now);",
              "        now = ahead;",
              "      }",
              "      fc_row_add(s, now);",
              "    }",
              *(["    if (sl[k] >= 0) {",
                 "      const fc_vec<float, VW> a = fc_load_vec<VW>(acc + (idx_t)sl[k] * H + c);",
                 "#pragma unroll",
                 "      for (int j = 0; j < VW; ++j) s[j] += a[j];",
                 "    }"] if bounded else []),
              f"    fc_vec<{ot}, VW> o;",
              "#pragma unroll",
              f"    for (int j = 0; j < VW; ++j) o[j] = fc_cast<{ot}>(s[j]);",
              "    fc_store_vec<VW>(out + row * H + c, o);",
              "  }",
              "}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _walk_params(out_dtype, value_dtype, rest: int, vw: int, bounded: bool) -> list[str]:
    ot, vt = MEMORY_TYPE[out_dtype], MEMORY_TYPE[value_dtype]
    params = [f"{ot}* __restrict__ out", "const int* __restrict__ head",
              "const int* __restrict__ next", f"const {vt}* __restrict__ value",
              "idx_t value_s", *_rest_params(rest, vw), "idx_t V", "idx_t H", "idx_t HV",
              "float fill"]  # fmt: skip
    if bounded:  # the hot rows' sums; `head` starts the fill's words (Note [Row chains])
        params[1:2] = ["const int* __restrict__ head", "const float* __restrict__ acc"]
    return params


def _walk_defs(vt: str, vw: int, defines: list[str]) -> str:
    """VW, `defines`, fc_row_at (VW values of a row of value) and fc_row_add (added as floats)."""
    load = "fc_load_vec_ro<VW>(value + at)" if vw > 1 else None
    return "\n".join([
        f"#define VW {vw}", *defines,
        f"FC_DEVICE fc_vec<{vt}, VW> fc_row_at(const {vt}* __restrict__ value, idx_t at) {{",
        f"  return {load};" if load else f"  fc_vec<{vt}, VW> r; r[0] = value[at]; return r;",
        "}",
        f"FC_DEVICE void fc_row_add(fc_vec<float, VW>& s, const fc_vec<{vt}, VW>& raw) {{",
        "#pragma unroll",
        "  for (int j = 0; j < VW; ++j) s[j] += (float)fc_widen(raw[j]);",
        "}"])  # fmt: skip


def slab_rows_of(hv: int, units: int) -> int:
    """Note [Slab walk]: the whole rows of a block, at most BLOCK * units units (at least one)."""
    return max(1, BLOCK * units // max(1, hv))


def render_slab_walk(out_dtype, value_dtype, rest: int, vw: int, index_type: str, hv: int,
                     wait: bool = False, units: int = 8, bounded: bool = False,
                     kept: bool = False, hint: int = 0, min_blocks: int = 0,
                     persistent: bool = False, fill_first: bool = False,
                     sorted_lists: bool = False) -> str:  # fmt: skip
    """Note [Slab walk]: a block the SR whole rows after the blocks before it (SR * HV at most
    BLOCK * `units` units, or one row). It loads its rows' head (and slot) words once into
    shared memory and lists the named rows there; its threads store the fill to every unit
    of the rows no token names, all issued before anything else is waited on; then each warp
    takes named rows, a lane up to AH units of a row at once, and adds the row's list, each
    token's values loaded with its next token. `hv`: the plan's units a row (sizes SR, AH).
    `kept`: the words live between runs (Note [Kept words]): the block sets its named rows'
    words back to -1 (and a hot row's sums to 0) once read, block 0 the slots-used counter.
    `hint`: the output's stores' cache hint (Note [Cache hints]; 1: evict-first);
    `min_blocks`: blocks an SM its registers must allow (0: as the compiler likes);
    `persistent`: the grid may be smaller than the slabs, a block taking every gridDim.x-th;
    `fill_first`: (Note [Fill first]) the fill stored to every unit of the block's rows before
    waiting for the link kernel (launched dependent), the named rows stored again after a
    barrier; `sorted_lists`: (Note [Sorted lists]) a list's tokens (at most 32) added in
    token order, so its sum does not depend on the order the link's atomics landed in."""
    ot, vt = MEMORY_TYPE[out_dtype], MEMORY_TYPE[value_dtype]
    ah = max(1, min(4, -(-hv // 32)))
    sr = slab_rows_of(hv, units)
    store = f"fc_store_vec_hint<VW, {hint}>" if hint else "fc_store_vec<VW>"
    params = _walk_params(out_dtype, value_dtype, rest, vw, bounded)
    if kept:  # the words are set back here
        params = [p.replace("const int* __restrict__ head", "int* __restrict__ head").replace(
            "const float* __restrict__ acc", "float* __restrict__ acc") for p in params]
    lines = _head(SLAB_WALK_NAME, params, index_type, wait and not fill_first,
                  min_blocks=min_blocks)
    lines.insert(2, _walk_defs(vt, vw, [f"#define SR {sr}", f"#define AH {ah}",
                                        f"#define WARPS {WARPS}"]))
    # bounded words: head [V], count [V], slot [V], slots used [1]
    reset = (["    head[r0 + i] = -1;",
              *(["    head[V + r0 + i] = -1;", "    if (sl >= 0) head[2 * V + r0 + i] = -1;"]
                if bounded else [])] if kept else [])  # fmt: skip
    decls = ["__shared__ int hs[SR];",
             *(["__shared__ int ss[SR];"] if bounded else []),
             "__shared__ int named[SR];  // the block's named rows, in no order",
             "__shared__ int nn;",
             *(["__shared__ int order[WARPS][32];  // a named row's tokens, ascending"]
               if sorted_lists else [])]
    fill_loop = ["#pragma unroll 4",
                 "for (idx_t u = r0 * HV + threadIdx.x; u < e; u += blockDim.x) {",
                 "  const idx_t row = u / HV;",
                 f"  {'' if fill_first else 'if (hs[row - r0] < 0) '}"
                 f"{store}(out + row * H + (u - row * HV) * VW, f);",
                 "}"]  # fmt: skip
    body = ["const idx_t r0 = slab * SR;",
            "const int rows = V - r0 < SR ? (int)(V - r0) : SR;",
            f"fc_vec<{ot}, VW> f;",
            "#pragma unroll",
            f"for (int j = 0; j < VW; ++j) f[j] = fc_cast<{ot}>(fill);",
            "const idx_t e = (r0 + rows) * HV;",
            *(["// every row the fill, before the link is waited for (Note [Fill first])",
               *fill_loop, *(["fc_wait_prior_grid();"] if wait else [])] if fill_first else []),
            *(["if (blockIdx.x == 0 && threadIdx.x == 0) head[3 * V] = -1;  // slots used"]
              if kept and bounded else []),
            "if (threadIdx.x == 0) nn = 0;",
            "__syncthreads();",
            "for (int i = threadIdx.x; i < rows; i += blockDim.x) {",
            "  const int w = head[r0 + i];",
            *(["  const int sl = head[2 * V + r0 + i];  // a hot row's slot of sums, or -1",
               "  ss[i] = sl;"] if bounded else []),
            "  hs[i] = w;",
            "  if (w >= 0) {",
            "    named[atomicAdd(&nn, 1)] = i;",
            *reset,
            "  }",
            "}",
            "__syncthreads();  // (after it, a named row's sums land over its fill)",
            *([] if fill_first else
              ["// the rows no token names: the fill, every store issued at once", *fill_loop]),
            "// the named rows, a warp each: a lane's AH units' lists walked together",
            "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;",
            "for (int j = warp; j < nn; j += WARPS) {",
            "  const int i = named[j];",
            "  const idx_t row = r0 + i;",
            *(["  const int sl = ss[i];"] if bounded else []),
            *named_row_passes(vt, ot, rest, vw, bounded, kept, store, sorted_lists, "hs[i]"),
            "}"]  # fmt: skip
    if persistent:  # a block's slabs one after another; the words of one read before the next
        body = ["for (idx_t slab = blockIdx.x; slab * SR < V; slab += gridDim.x) {",
                *[b if b.startswith("#") else "  " + b for b in body], "  __syncthreads();", "}"]
    else:
        body = ["const idx_t slab = blockIdx.x;", *body]
    lines += [b if b.startswith("#") else "  " + b for b in decls + body] + ["}"]
    return "\n".join(lines) + "\n"


def _list_adds(first: str) -> list[str]:
    """Note [Slab walk]: a named row's list from `first` walked in list order (a column pass)."""
    return ["    // a step of the list: the token's values and its next token loaded together",
            f"    for (int n = {first}; n >= 0;) {{",
            "#pragma unroll",
            "      for (int m = 0; m < AH; ++m)",
            "        if (q0 + lane + 32 * m < HV) now[m] = fc_row_at(value, (idx_t)n * value_s + vo[m]);",
            "      const int after = fc_ldg(next + n);",
            "#pragma unroll",
            "      for (int m = 0; m < AH; ++m)",
            "        if (q0 + lane + 32 * m < HV) fc_row_add(s[m], now[m]);",
            "      n = after;",
            "    }"]  # fmt: skip


def _sorted_list(vt: str, rest: int, vw: int, first: str) -> list[str]:
    """Note [Sorted lists]: before a named row's column passes, its list read into the warp
    (lane k the k-th token), the head token's first-pass values loaded beside the first next
    word (a row of one token waits no longer than the list walk), the tokens ranked and
    written ascending to order[warp]; `k` tokens."""
    return ["  // the list into the warp, the head's first values loaded with its next word",
            f"  const int h0 = {first};",
            f"  fc_vec<{vt}, VW> now[AH];",
            "#pragma unroll",
            "  for (int m = 0; m < AH; ++m) {",
            "    const idx_t c = (lane + 32 * m) * VW;",
            *["  " + x for x in _value_offset(rest, vw)],
            "    if (lane + 32 * m < HV) now[m] = fc_row_at(value, (idx_t)h0 * value_s + voff);",
            "  }",
            "  int mine = lane == 0 ? h0 : 0x7fffffff, k = 1;",
            "  for (int n = fc_ldg(next + h0); n >= 0 && k < 32; ++k) {",
            "    if (lane == k) mine = n;",
            "    n = fc_ldg(next + n);",
            "  }",
            "  int rank = 0;  // tokens are distinct: lane k's place in token order",
            "  for (int q = 0; q < k; ++q) rank += __shfl_sync(0xffffffffu, mine, q) < mine;",
            "  if (lane < k) order[warp][rank] = mine;",
            "  __syncwarp();"]  # fmt: skip


def _sorted_adds() -> list[str]:
    """Note [Sorted lists]: a column pass adds the row's tokens in token order (the head's
    first-pass values as loaded, where it comes first)."""
    return ["    for (int q = 0; q < k; ++q) {",
            "      const int t = order[warp][q];",
            "      if (q0 != 0 || q != 0 || t != h0) {",
            "#pragma unroll",
            "        for (int m = 0; m < AH; ++m)",
            "          if (q0 + lane + 32 * m < HV) now[m] = fc_row_at(value, (idx_t)t * value_s + vo[m]);",
            "      }",
            "#pragma unroll",
            "      for (int m = 0; m < AH; ++m)",
            "        if (q0 + lane + 32 * m < HV) fc_row_add(s[m], now[m]);",
            "    }",
            "    __syncwarp();"]  # fmt: skip


def named_row_passes(vt: str, ot: str, rest: int, vw: int, bounded: bool, kept: bool, store: str,
                     sorted_lists: bool, first: str) -> list[str]:  # fmt: skip
    """Note [Slab walk]: a warp's named row `row` (list head `first`; `sl` its slot of sums
    where bounded), in column passes of AH units a lane: the fill plus its list's values (in
    token order where `sorted_lists`, Note [Sorted lists]) plus the slot's sums (set back to
    0 where `kept`), cast and stored with `store`. Lines at the depth of a loop's body."""
    lane_unit = ["const idx_t c = (q0 + lane + 32 * m) * VW;"]
    slot_sums = ["      if (sl >= 0) {",
                 f"        {'' if kept else 'const '}float* const at = acc + (idx_t)sl * H + c;",
                 "        const fc_vec<float, VW> a = fc_load_vec<VW>(at);",
                 "#pragma unroll",
                 "        for (int x = 0; x < VW; ++x) s[m][x] += a[x];",
                 *(["        fc_vec<float, VW> zero;",
                    "#pragma unroll",
                    "        for (int x = 0; x < VW; ++x) zero[x] = 0.0f;",
                    "        fc_store_vec<VW>(at, zero);"] if kept else []),
                 "      }"]  # fmt: skip
    return [*(_sorted_list(vt, rest, vw, first) if sorted_lists else []),
            "  for (idx_t q0 = 0; q0 < HV; q0 += 32 * AH) {",
            "    fc_vec<float, VW> s[AH];",
            *([] if sorted_lists else [f"    fc_vec<{vt}, VW> now[AH];"]),
            "    idx_t vo[AH];",
            "#pragma unroll",
            "    for (int m = 0; m < AH; ++m) {",
            *["      " + x for x in lane_unit],
            *["    " + x for x in _value_offset(rest, vw)],
            "      vo[m] = voff;",
            "#pragma unroll",
            "      for (int x = 0; x < VW; ++x) s[m][x] = fill;",
            "    }",
            *(_sorted_adds() if sorted_lists else _list_adds(first)),
            "#pragma unroll",
            "    for (int m = 0; m < AH; ++m) {",
            "      if (q0 + lane + 32 * m >= HV) break;",
            *["      " + x for x in lane_unit],
            *(slot_sums if bounded else []),
            f"      fc_vec<{ot}, VW> o;",
            "#pragma unroll",
            f"      for (int x = 0; x < VW; ++x) o[x] = fc_cast<{ot}>(s[m][x]);",
            f"      {store}(out + row * H + c, o);",
            "    }",
            "  }"]  # fmt: skip
