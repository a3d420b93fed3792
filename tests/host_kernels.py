"""Generated kernels run on the CPU: their CUDA C++ compiled by g++ with a host stand-in for
the core prelude, one thread after another, on the plan's real arguments.

Without a GPU this checks what NVRTC cannot: that a plan's offsets, windows, gathers and
vector modes and the kernel's index arithmetic compute the right values. Only kernels that
need no barrier or shared memory run this way (pointwise, scatter): threads run in turn. The
prelude's math (math.cuh, complex.cuh) and index checks (index.cuh) are the real files; core.cuh is
replaced below (its loads and 16-bit conversions are PTX). Tests skip where there is no g++.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from codegen.prelude import PRELUDE_DIR
from fusion_cache.frontend.dtypes import to_torch

HAVE_GXX = shutil.which("g++") is not None
_BUILD = Path(tempfile.gettempdir()) / "fusion_cache_host_kernels"

HOST_CORE = r"""
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdexcept>
#define FC_PRELUDE_CORE
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define FC_DEVICE inline
struct fc_dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local fc_dim3 threadIdx, blockIdx;
static fc_dim3 blockDim, gridDim;
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
inline void __assertfail(const char* msg, const char*, unsigned, const char* fn, size_t) {
  throw std::runtime_error(fn);
}
[[noreturn]] inline void __trap() { throw std::runtime_error("trap"); }
template <bool B, typename T = void> struct fc_enable_if {};
template <typename T> struct fc_enable_if<true, T> { typedef T type; };
template <typename T> struct fc_is_integral { static constexpr bool value = false; };
#define FC_MARK_INTEGRAL(T) template <> struct fc_is_integral<T> { static constexpr bool value = true; };
FC_MARK_INTEGRAL(bool) FC_MARK_INTEGRAL(char) FC_MARK_INTEGRAL(signed char)
FC_MARK_INTEGRAL(unsigned char) FC_MARK_INTEGRAL(short) FC_MARK_INTEGRAL(unsigned short)
FC_MARK_INTEGRAL(int) FC_MARK_INTEGRAL(unsigned int) FC_MARK_INTEGRAL(long)
FC_MARK_INTEGRAL(unsigned long) FC_MARK_INTEGRAL(long long) FC_MARK_INTEGRAL(unsigned long long)
template <typename T> struct fc_is_signed { static constexpr bool value = T(-1) < T(0); };
template <typename T> struct fc_make_unsigned { typedef T type; };
template <> struct fc_make_unsigned<int> { typedef unsigned int type; };
template <> struct fc_make_unsigned<long long> { typedef unsigned long long type; };
template <> struct fc_make_unsigned<long> { typedef unsigned long type; };
template <> struct fc_make_unsigned<short> { typedef unsigned short type; };
template <> struct fc_make_unsigned<signed char> { typedef unsigned char type; };
#define FC_IF_INT(T) typename fc_enable_if<fc_is_integral<T>::value, int>::type = 0
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
inline long long __double_as_longlong(double d) { long long i; memcpy(&i, &d, 8); return i; }
// CUDA's inverse error functions, which the host libm lacks: bisection on erf is enough here
inline double fc_host_erfinv(double y) {
  if (y <= -1 || y >= 1) return y == 1 ? INFINITY : y == -1 ? -INFINITY : NAN;
  double lo = -6, hi = 6;
  for (int i = 0; i < 200; ++i) { double m = 0.5 * (lo + hi); (erf(m) < y ? lo : hi) = m; }
  return 0.5 * (lo + hi);
}
inline float erfinvf(float y) { return (float)fc_host_erfinv(y); }
inline double erfinv(double y) { return fc_host_erfinv(y); }
inline float erfcinvf(float y) { return (float)fc_host_erfinv(1.0 - y); }
inline double erfcinv(double y) { return fc_host_erfinv(1.0 - y); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rsqrt(float x) { return 1.0f / sqrtf(x); }
struct alignas(2) fc_half { unsigned short bits; };
struct alignas(2) fc_bf16 { unsigned short bits; };
inline fc_half fc_half_from_bits(unsigned short b) { fc_half h; h.bits = b; return h; }
inline fc_bf16 fc_bf16_from_bits(unsigned short b) { fc_bf16 h; h.bits = b; return h; }
inline float fc_to_float(fc_half h) { _Float16 x; memcpy(&x, &h.bits, 2); return (float)x; }
inline float fc_to_float(fc_bf16 h) { return __uint_as_float(((unsigned)h.bits) << 16); }
inline fc_half fc_to_half(float f) { _Float16 x = (_Float16)f; fc_half h; memcpy(&h.bits, &x, 2); return h; }
inline fc_bf16 fc_to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return fc_bf16_from_bits(0x7fc0);
  u += 0x7fffu + ((u >> 16) & 1u);
  return fc_bf16_from_bits((unsigned short)(u >> 16));
}
inline fc_half fc_to_half(double d) { return fc_to_half((float)d); }
inline fc_half fc_to_half(fc_half h) { return h; }
inline fc_half fc_to_half(fc_bf16 h) { return fc_to_half(fc_to_float(h)); }
template <typename T, FC_IF_INT(T)> inline fc_half fc_to_half(T x) { return fc_to_half((float)x); }
inline fc_bf16 fc_to_bf16(double d) { return fc_to_bf16((float)d); }
inline fc_bf16 fc_to_bf16(fc_bf16 h) { return h; }
inline fc_bf16 fc_to_bf16(fc_half h) { return fc_to_bf16(fc_to_float(h)); }
template <typename T, FC_IF_INT(T)> inline fc_bf16 fc_to_bf16(T x) { return fc_to_bf16((float)x); }
inline float fc_to_float(float x) { return x; }
inline float fc_to_float(double x) { return (float)x; }
template <typename T, FC_IF_INT(T)> inline float fc_to_float(T x) { return (float)x; }
inline double fc_to_double(fc_half h) { return fc_to_float(h); }
inline double fc_to_double(fc_bf16 h) { return fc_to_float(h); }
inline double fc_to_double(float x) { return x; }
inline double fc_to_double(double x) { return x; }
template <typename T, FC_IF_INT(T)> inline double fc_to_double(T x) { return (double)x; }
inline float fc_widen(fc_half h) { return fc_to_float(h); }
inline float fc_widen(fc_bf16 h) { return fc_to_float(h); }
template <typename T> inline T fc_widen(T x) { return x; }
template <typename To> struct fc_cast_impl {
  template <typename From> static To run(From x) { return static_cast<To>(fc_widen(x)); }
};
template <> struct fc_cast_impl<fc_half> {
  template <typename From> static fc_half run(From x) { return fc_to_half(x); }
};
template <> struct fc_cast_impl<fc_bf16> {
  template <typename From> static fc_bf16 run(From x) { return fc_to_bf16(x); }
};
template <typename To, typename From> inline To fc_cast(From x) { return fc_cast_impl<To>::run(x); }
template <typename T> T fc_nan();
template <> inline float fc_nan<float>() { return NAN; }
template <> inline double fc_nan<double>() { return (double)NAN; }
template <typename T> T fc_inf();
template <> inline float fc_inf<float>() { return INFINITY; }
template <> inline double fc_inf<double>() { return (double)INFINITY; }
template <typename T> struct fc_limits {
  static T lowest() {
    typedef typename fc_make_unsigned<T>::type U;
    return fc_is_signed<T>::value ? T(U(1) << (sizeof(T) * 8 - 1)) : T(0);
  }
  static T highest() { return T(~lowest()); }
};
template <> struct fc_limits<bool> { static bool lowest() { return false; } static bool highest() { return true; } };
template <> struct fc_limits<float> { static float lowest() { return -INFINITY; } static float highest() { return INFINITY; } };
template <> struct fc_limits<double> { static double lowest() { return -INFINITY; } static double highest() { return INFINITY; } };
inline void fc_wait_prior_grid() {}
template <typename T, int N> struct alignas(sizeof(T) * N) fc_vec {
  T v[N];
  T& operator[](int i) { return v[i]; }
  const T& operator[](int i) const { return v[i]; }
};
template <int N> inline float fc_bf16_at(const fc_vec<fc_bf16, N>& v, int j) {
  unsigned w;
  memcpy(&w, &v.v[j & ~1], 4);
  return __uint_as_float((j & 1) ? (w & 0xffff0000u) : (w << 16));
}
inline void fc_check_align(const void* p, size_t a) {
  if (((uintptr_t)p) % a) throw std::runtime_error("misaligned vector access");
}
template <int N, typename T> inline fc_vec<T, N> fc_load_vec(const T* p) {
  fc_check_align(p, sizeof(T) * N);
  return *reinterpret_cast<const fc_vec<T, N>*>(p);
}
template <int N, typename T> inline fc_vec<T, N> fc_load_vec_ro(const T* p) { return fc_load_vec<N>(p); }
template <int N, int Hint, typename T> inline fc_vec<T, N> fc_load_vec_hint(const T* p) { return fc_load_vec<N>(p); }
template <int N, int Hint, typename T> inline fc_vec<T, N> fc_load_vec_if(const T* p, bool ok) {
  fc_vec<T, N> v;
  for (int i = 0; i < N; ++i) v[i] = T();
  if (ok) v = fc_load_vec<N>(p);
  return v;
}
template <int N, typename T> inline void fc_store_vec(T* p, const fc_vec<T, N>& v) {
  fc_check_align(p, sizeof(T) * N);
  *reinterpret_cast<fc_vec<T, N>*>(p) = v;
}
template <int N, int Hint, typename T> inline void fc_store_vec_hint(T* p, const fc_vec<T, N>& v) { fc_store_vec<N>(p, v); }
template <typename T> inline T fc_ldg(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *p; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <typename T> inline void fc_opaque(const T*&) {}
// atomics that hold where a block's threads run at once (lockstep)
template <typename T> inline T atomicCAS(T* p, T cmp, T v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}
template <typename T> inline T atomicAdd(T* p, T v) {
  T old;
  __atomic_load(p, &old, __ATOMIC_SEQ_CST);
  T next = old + v;
  while (!__atomic_compare_exchange(p, &old, &next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
    next = old + v;
  return old;
}
inline long long atomicMax(long long* p, long long v) {
  long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
  return old;
}
template <typename T> inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicOr(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
"""


# Kernels with barriers or warp votes run each block's threads in lockstep (RUNTIME below):
# __shared__ arrays are statics (blocks run one after another), __syncthreads a barrier of
# the block, __ballot_sync one of the warp.
LOCKSTEP = r"""
#define __shared__ static
typedef int (*fc_rt_body)(void*, unsigned t, unsigned bx, unsigned by);
extern "C" int fc_rt_run(unsigned gx, unsigned gy, unsigned n, int fibers, fc_rt_body body,
                         void* ctx, fc_dim3* tidx, fc_dim3* bidx);
extern "C" void fc_rt_block_sync();
extern "C" void fc_rt_warp_sync(unsigned w);
static unsigned fc_vote[1024];
inline void __syncthreads() { fc_rt_block_sync(); }
inline unsigned __ballot_sync(unsigned, bool p) {
  const unsigned t = threadIdx.y * blockDim.x + threadIdx.x, w = t / 32;
  fc_vote[t] = p;
  fc_rt_warp_sync(w);
  unsigned m = 0;
  for (unsigned i = 0; i < 32; ++i) m |= (fc_vote[w * 32 + i] ? 1u : 0u) << i;
  fc_rt_warp_sync(w);
  return m;
}
inline int __ffs(unsigned x) { return __builtin_ffs(x); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  fc_rt_warp_sync((threadIdx.y * blockDim.x + threadIdx.x) / 32);
}
static unsigned char fc_swap[1024][64];
template <typename T> inline T fc_host_shfl(T v, unsigned src) {
  static_assert(sizeof(T) <= 64, "shuffled values up to 64 bytes");
  const unsigned t = threadIdx.y * blockDim.x + threadIdx.x, w = t / 32;
  memcpy(fc_swap[t], &v, sizeof(T));
  fc_rt_warp_sync(w);
  T out;
  memcpy(&out, fc_swap[w * 32 + (src & 31)], sizeof(T));
  fc_rt_warp_sync(w);
  return out;
}
template <typename T> inline unsigned __match_any_sync(unsigned, T v) {
  static_assert(sizeof(T) <= 64, "matched values up to 64 bytes");
  const unsigned t = threadIdx.y * blockDim.x + threadIdx.x, w = t / 32;
  memcpy(fc_swap[t], &v, sizeof(T));
  fc_rt_warp_sync(w);
  unsigned m = 0;
  for (unsigned i = 0; i < 32 && w * 32 + i < blockDim.x * blockDim.y; ++i)
    m |= (memcmp(fc_swap[w * 32 + i], &v, sizeof(T)) == 0 ? 1u : 0u) << i;
  fc_rt_warp_sync(w);
  return m;
}
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int m, int = 32) {
  return fc_host_shfl(v, ((threadIdx.y * blockDim.x + threadIdx.x) & 31) ^ m);
}
template <typename T> inline T __shfl_sync(unsigned, T v, int src, int = 32) { return fc_host_shfl(v, src); }
template <typename T> inline T __shfl_down_sync(unsigned, T v, unsigned d, int = 32) {
  return fc_host_shfl(v, ((threadIdx.y * blockDim.x + threadIdx.x) & 31) + d);
}
"""


# The lockstep runner, built once and loaded before the kernels (their wrappers call it): a
# kernel's library compiles without the C++ thread headers, 0.35 -> 0.17 s of g++ each.
# Fibers: the block's threads take turns on the calling OS thread, each running until it
# waits at a barrier; a barrier is a turn of context switches, not a futex wake-up of every
# OS thread of the block, which also starved the other test worker of its core
# (tests/test_row_owned.py, one process: 37 -> 19 s). A kernel whose threads spin on another's store (volatile loads) takes OS threads, one a
# CUDA thread of the block, made once for the grid: the blocks run in turn, each ending at a
# barrier of the block (a thread a CUDA thread a block cost about 3 s a test of 264 blocks
# of 64 threads in thread starts alone).
RUNTIME = r"""
#include <atomic>
#include <barrier>
#include <memory>
#include <thread>
#include <vector>
#include <stdio.h>
#include <sys/mman.h>
#include <ucontext.h>
struct fc_dim3 { unsigned x = 0, y = 0, z = 0; };
typedef int (*fc_rt_body)(void*, unsigned t, unsigned bx, unsigned by);

static std::barrier<>* fc_block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> fc_warp_barriers;

struct fc_fiber_barrier {
  unsigned expected = 0, arrived = 0, phase = 0;
  void complete_if_due() {
    if (arrived >= expected) { arrived = 0; ++phase; }
  }
};
static bool fc_fibers;
static std::vector<fc_fiber_barrier> fc_fb;  // [0]: the block's, [1 + w]: warp w's
static std::vector<ucontext_t> fc_ctx;
static ucontext_t fc_sched;
static unsigned fc_cur, fc_gx, fc_gy;
static bool fc_finished;
// the first block a thread of which failed: the others end with that block, and only then
// (a flag set in block 1 ended threads that had not yet looked after block 0's barrier, and
// those in block 1 waited for them for ever)
static unsigned fc_failed_at;
static unsigned long long fc_progress;  // arrivals and ends: a turn of none is a deadlock
static fc_dim3 *fc_tidx, *fc_bidx;
static fc_rt_body fc_body;
static void* fc_body_ctx;

static void fc_fiber_wait(fc_fiber_barrier& b) {
  const unsigned me = fc_cur, phase = b.phase;
  ++fc_progress;
  ++b.arrived;
  b.complete_if_due();
  while (b.phase == phase) {  // the others' turns, until the last of them arrives
    const fc_dim3 t = *fc_tidx, k = *fc_bidx;
    swapcontext(&fc_ctx[me], &fc_sched);
    fc_cur = me;
    *fc_tidx = t;
    *fc_bidx = k;
  }
}

static void fc_fiber_drop(fc_fiber_barrier& b) {
  --b.expected;
  b.complete_if_due();
}

extern "C" void fc_rt_block_sync() {
  if (fc_fibers) fc_fiber_wait(fc_fb[0]);
  else fc_block_barrier->arrive_and_wait();
}

extern "C" void fc_rt_warp_sync(unsigned w) {
  if (fc_fibers) fc_fiber_wait(fc_fb[1 + w]);
  else fc_warp_barriers[w]->arrive_and_wait();
}

static void fc_fiber_main() {
  const unsigned t = fc_cur;
  for (unsigned by = 0; by < fc_gy; ++by) for (unsigned b = 0; b < fc_gx; ++b) {
    if (fc_body(fc_body_ctx, t, b, by)) {
      fc_failed_at = by * fc_gx + b;
      fc_fiber_drop(fc_fb[0]);
      fc_fiber_drop(fc_fb[1 + t / 32]);
      goto out;
    }
    fc_fiber_wait(fc_fb[0]);  // the block ends before the next one starts
    if (fc_failed_at <= by * fc_gx + b) goto out;  // as a trap ends the grid
  }
out:
  ++fc_progress;
  fc_finished = true;
}

static int fc_run_fibers(unsigned n) {
  fc_fb.assign(1 + (n + 31) / 32, fc_fiber_barrier());
  fc_fb[0].expected = n;
  for (unsigned w = 0; w < (n + 31) / 32; ++w) fc_fb[1 + w].expected = n - 32 * w < 32 ? n - 32 * w : 32;
  const size_t stack = 256 << 10, guard = 4096, each = stack + guard;
  char* mem = (char*)mmap(nullptr, n * each, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) { perror("fc_rt_run: mmap"); return 1; }
  fc_ctx.assign(n, ucontext_t());
  for (unsigned k = 0; k < n; ++k) {
    mprotect(mem + k * each, guard, PROT_NONE);  // an overflow faults, not a neighbour's stack
    getcontext(&fc_ctx[k]);
    fc_ctx[k].uc_stack.ss_sp = mem + k * each + guard;
    fc_ctx[k].uc_stack.ss_size = stack;
    fc_ctx[k].uc_link = &fc_sched;
    makecontext(&fc_ctx[k], fc_fiber_main, 0);
  }
  std::vector<char> done(n, 0);
  fc_fibers = true;
  for (unsigned live = n; live;) {
    const unsigned long long before = fc_progress;
    for (unsigned k = 0; k < n; ++k) {
      if (done[k]) continue;
      fc_cur = k;
      fc_finished = false;
      swapcontext(&fc_sched, &fc_ctx[k]);
      if (fc_finished) { done[k] = 1; --live; }
    }
    if (live && fc_progress == before) {
      fprintf(stderr, "fc_rt_run: %u threads wait at barriers no other thread will reach\n", live);
      fc_failed_at = 0;
      break;
    }
  }
  fc_fibers = false;
  munmap(mem, n * each);
  return fc_failed_at != ~0u;
}

static int fc_run_threads(unsigned n) {
  std::barrier<> block(n);
  fc_block_barrier = &block;
  fc_warp_barriers.clear();
  for (unsigned w = 0; w < (n + 31) / 32; ++w)
    fc_warp_barriers.emplace_back(new std::barrier<>(n - 32 * w < 32 ? n - 32 * w : 32));
  std::atomic<unsigned> failed_at{~0u};  // as fc_failed_at
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < n; ++t) threads.emplace_back([&, t] {
    for (unsigned by = 0; by < fc_gy; ++by) for (unsigned b = 0; b < fc_gx; ++b) {
      if (fc_body(fc_body_ctx, t, b, by)) {
        failed_at = by * fc_gx + b;
        block.arrive_and_drop(); fc_warp_barriers[t / 32]->arrive_and_drop();
        return;
      }
      block.arrive_and_wait();  // the block ends before the next one starts
      if (failed_at <= by * fc_gx + b) return;  // as a trap ends the grid
    }
  });
  for (auto& th : threads) th.join();
  return failed_at != ~0u;
}

extern "C" int fc_rt_run(unsigned gx, unsigned gy, unsigned n, int fibers, fc_rt_body body,
                         void* ctx, fc_dim3* tidx, fc_dim3* bidx) {
  fc_gx = gx; fc_gy = gy; fc_body = body; fc_body_ctx = ctx; fc_tidx = tidx; fc_bidx = bidx;
  fc_failed_at = ~0u;
  return fibers ? fc_run_fibers(n) : fc_run_threads(n);
}
"""


def _strip_prelude(source: str) -> str:
    marker = "// ---- end prelude ----\n"
    return source[source.index(marker) + len(marker):]


_PARAMS = re.compile(r'extern "C" __global__ void __launch_bounds__\(\d+(?:, \d+)?\) (\w+)\(\s*(.*?)\)\s*\{', re.S)


def _library(source: str) -> tuple[Any, str, list[str]]:
    """(the loaded library, kernel name, parameter declarations) for a kernel source."""
    name, params = _PARAMS.search(source).groups()
    decls = [p.strip() for p in params.split(",")]
    names = [d.split()[-1] for d in decls]
    lockstep = "__syncthreads" in source or "__ballot_sync" in source or "fc_row_reduce" in source
    parts = [HOST_CORE, LOCKSTEP if lockstep else "", (PRELUDE_DIR / "math.cuh").read_text()]
    if "fusion-cache prelude: core, math, reduce" in source:
        parts.append((PRELUDE_DIR / "reduce.cuh").read_text())
    if "// fusion-cache prelude: complex." in source:
        parts.append((PRELUDE_DIR / "complex.cuh").read_text())
    prefix = "\n".join(parts + [(PRELUDE_DIR / "index.cuh").read_text()])
    body = prefix + "\n" + _strip_prelude(source)
    call = f"{name}({', '.join(names)});"
    head = (f'\nextern "C" int fc_host_launch(unsigned gx, unsigned gy, unsigned bx, unsigned by_, '
            f'{", ".join(decls)}) {{\n  gridDim.x = gx; gridDim.y = gy; blockDim.x = bx; '
            "blockDim.y = by_;\n")
    if not lockstep:
        wrapper = head + (
            "  try {\n    for (unsigned by = 0; by < gy; ++by) for (unsigned b = 0; b < gx; ++b)\n"
            "      for (unsigned t = 0; t < bx * by_; ++t) {\n"
            "        blockIdx.x = b; blockIdx.y = by; threadIdx.x = t % bx; threadIdx.y = t / bx;\n"
            f"        {call}\n      }}\n"
            '  } catch (const std::exception& e) { fprintf(stderr, "%s\\n", e.what()); return 1; }\n'
            "  return 0;\n}\n")  # fmt: skip
    else:
        # a thread that spins on another's store needs OS threads (RUNTIME)
        fibers = int("volatile" not in _strip_prelude(source))
        wrapper = head + (
            "  auto run = [&](unsigned t, unsigned b, unsigned by) -> int {\n"
            "    threadIdx.x = t % bx; threadIdx.y = t / bx; blockIdx.x = b; blockIdx.y = by;\n"
            f"    try {{ {call} }} catch (const std::exception& e) {{\n"
            '      fprintf(stderr, "%s\\n", e.what()); return 1;\n    }\n'
            "    return 0;\n  };\n"
            f"  return fc_rt_run(gx, gy, bx * by_, {fibers}, [](void* f, unsigned t, unsigned b, "
            "unsigned by) {\n    return (*static_cast<decltype(run)*>(f))(t, b, by);\n"
            "  }, &run, &threadIdx, &blockIdx);\n}\n")  # fmt: skip
    text = body + wrapper
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    _BUILD.mkdir(exist_ok=True)
    if lockstep:
        _runtime()
    lib = _BUILD / f"k{digest}.so"
    if not lib.exists():
        src = _BUILD / f"k{digest}.cpp"
        src.write_text(f'#include "{_header(prefix)}"\n' + text[len(prefix):])
        tmp = _BUILD / f"k{digest}.{os.getpid()}.tmp.so"
        done = subprocess.run(["g++", *_GXX, "-shared", "-o", str(tmp), str(src)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"g++ failed on {src}:\n{done.stderr[-3000:]}")
        tmp.replace(lib)
    return ctypes.CDLL(str(lib)), name, decls


# the header and the kernel compile with the same flags, or g++ ignores the precompiled header
_GXX = ["-std=c++20", "-O1", "-fPIC", "-pthread", "-w"]
_RUNTIME: list = []


def _runtime() -> None:
    """RUNTIME built and loaded once a process, its symbols global: the kernels' libraries
    leave fc_rt_* to the dynamic linker."""
    if _RUNTIME:
        return
    lib = _BUILD / f"rt{hashlib.sha256(RUNTIME.encode()).hexdigest()[:20]}.so"
    if not lib.exists():
        src = lib.with_suffix(".cpp")
        src.write_text(RUNTIME)
        tmp = lib.with_name(f"{lib.stem}.{os.getpid()}.tmp.so")
        done = subprocess.run(["g++", *_GXX, "-shared", "-o", str(tmp), str(src)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"g++ failed on {src}:\n{done.stderr[-3000:]}")
        tmp.replace(lib)
    _RUNTIME.append(ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL))


def _header(prefix: str) -> Path:
    """The prelude part of a kernel's source as a header, precompiled once for the kernels
    that share it: parsing it (the C++ library headers most) was half of each g++ run,
    0.65 -> 0.33 s a kernel. Without its .gch, g++ reads the header as text."""
    header = _BUILD / f"p{hashlib.sha256(prefix.encode()).hexdigest()[:20]}.h"
    gch = header.with_name(header.name + ".gch")
    if not gch.exists():  # the workers of a run may both build it: each its own, then a rename
        tmp = header.with_name(f"{header.name}.{os.getpid()}.tmp")
        tmp.write_text(prefix)
        tmp.replace(header)
        done = subprocess.run(["g++", *_GXX, "-x", "c++-header", "-o", f"{tmp}.gch", str(header)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"g++ failed on {header}:\n{done.stderr[-3000:]}")
        Path(f"{tmp}.gch").replace(gch)
    return header


_CTYPES = {"ptr": ctypes.c_void_p, "i64": ctypes.c_longlong, "i32": ctypes.c_int,
           "f64": ctypes.c_double, "f32": ctypes.c_float, "bool": ctypes.c_bool}  # fmt: skip


def launch_on_host(launch: Any, values: list, outs: list, work: list) -> None:
    """Run one KernelLaunch of a plan on CPU tensors; ArgRefs filled as fill_args does."""
    from fusion_cache.runtime.plans import fill_args

    lib, _, _ = _library(launch.source)
    slots = [(i, a) for i, a in enumerate(launch.args) if hasattr(a, "kind")]
    args = fill_args(launch.args, slots, values, outs, work)
    fn = lib.fc_host_launch
    fn.argtypes = [ctypes.c_uint] * 4 + [_CTYPES[t] for t in launch.arg_types]
    fn.restype = ctypes.c_int
    if launch.grid[2] != 1 or launch.block[2] != 1:
        raise NotImplementedError("host runs cover 2-D grids and blocks")
    if "__cluster_dims__" in launch.source or launch.cooperative or launch.shared_mem:
        raise NotImplementedError("host runs have no clusters, grid barriers or dynamic shared memory")
    if fn(launch.grid[0], launch.grid[1], launch.block[0], launch.block[1], *args):
        raise RuntimeError(f"{launch.name} failed on the host (see stderr)")


def run_plan_on_host(fd: Any, values: list, launches: list | None = None,
                     scratch: list | None = None) -> list[torch.Tensor]:  # fmt: skip
    """Plan `fd` for these CPU tensors (for the h100 profile), run its kernels here (each
    segment's, in order, for a segmented plan), and return its outputs as execute would.
    `launches` collects the kernels run. `scratch`: the plan's workspaces, made here (filled
    as spec.workspace_fills says, Note [Kept words]) where it is empty, kept for the next
    run as the plan keeps them per stream."""
    from fusion_cache.runtime.executor import executor_for
    from fusion_cache.runtime.plans import LaunchPlan

    launches = [] if launches is None else launches
    fd.precompile(values, target="h100")
    plan = executor_for(fd).last_plan
    if not isinstance(plan, LaunchPlan):
        env = dict(zip(plan.input_states, values))
        for seg in plan.segments:
            if seg.scheduler is None:
                raise AssertionError(f"a segment runs on the reference evaluator: {plan.description}")
            outs = run_plan_on_host(seg.definition, [env[v] for v in seg.sub.inputs], launches)
            env.update(zip(seg.sub.outputs, outs))
        return [env[v] for v in plan.output_states]
    spec = plan.spec
    launches += list(spec.kernels)
    outs = [torch.empty(o.shape, dtype=to_torch(o.dtype)) if o.alias_input is None
            else values[o.alias_input] for o in spec.outputs]  # fmt: skip
    fills = spec.workspace_fills or (None,) * len(spec.workspaces)
    work = scratch or [torch.empty(n, dtype=to_torch(dt)) if fill is None else
                       torch.full((n,), fill, dtype=to_torch(dt))
                       for (n, dt), fill in zip(spec.workspaces, fills)]  # fmt: skip
    if scratch is not None and not scratch:
        scratch.extend(work)
    for launch in spec.kernels:
        launch_on_host(launch, values, outs, work)
    return [o for o, s in zip(outs, spec.outputs) if s.alias_input is None]
