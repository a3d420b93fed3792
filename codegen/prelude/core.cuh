// fusion-cache prelude: core.
// Pasted at the top of every generated kernel. NVRTC runs without include paths, so this
// file defines what <cstdint>, <cuda_fp16.h> and <cuda_bf16.h> would have given us.
#ifndef FC_PRELUDE_CORE
#define FC_PRELUDE_CORE

#define FC_DEVICE __device__ __forceinline__

typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;

// ---- minimal type traits (no <type_traits> under NVRTC) ---------------------------------

template <bool B, typename T = void> struct fc_enable_if {};
template <typename T> struct fc_enable_if<true, T> { typedef T type; };

template <typename T> struct fc_is_integral { static constexpr bool value = false; };
#define FC_MARK_INTEGRAL(T) \
  template <> struct fc_is_integral<T> { static constexpr bool value = true; };
FC_MARK_INTEGRAL(bool)
FC_MARK_INTEGRAL(char)
FC_MARK_INTEGRAL(signed char)
FC_MARK_INTEGRAL(unsigned char)
FC_MARK_INTEGRAL(short)
FC_MARK_INTEGRAL(unsigned short)
FC_MARK_INTEGRAL(int)
FC_MARK_INTEGRAL(unsigned int)
FC_MARK_INTEGRAL(long)
FC_MARK_INTEGRAL(unsigned long)
FC_MARK_INTEGRAL(long long)
FC_MARK_INTEGRAL(unsigned long long)
#undef FC_MARK_INTEGRAL

template <typename T> struct fc_is_signed { static constexpr bool value = T(-1) < T(0); };

template <typename T> struct fc_make_unsigned { typedef T type; };
template <> struct fc_make_unsigned<char> { typedef unsigned char type; };
template <> struct fc_make_unsigned<signed char> { typedef unsigned char type; };
template <> struct fc_make_unsigned<short> { typedef unsigned short type; };
template <> struct fc_make_unsigned<int> { typedef unsigned int type; };
template <> struct fc_make_unsigned<long> { typedef unsigned long type; };
template <> struct fc_make_unsigned<long long> { typedef unsigned long long type; };

// Restricts an overload to integer types, so that a 16-bit float passed by mistake fails to
// compile instead of silently taking the integer path.
#define FC_IF_INT(T) typename fc_enable_if<fc_is_integral<T>::value, int>::type = 0

// ---- 16-bit floats -------------------------------------------------------------------------
// Our own storage types: plain bits, no arithmetic. Generated code computes in float
// ("opmath", like torch) and converts at loads and stores.

struct __align__(2) fc_half { unsigned short bits; };
struct __align__(2) fc_bf16 { unsigned short bits; };

FC_DEVICE fc_half fc_half_from_bits(unsigned short b) { fc_half h; h.bits = b; return h; }
FC_DEVICE fc_bf16 fc_bf16_from_bits(unsigned short b) { fc_bf16 h; h.bits = b; return h; }

FC_DEVICE float fc_to_float(fc_half h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}

FC_DEVICE float fc_to_float(fc_bf16 h) { return __uint_as_float(((unsigned int)h.bits) << 16); }

FC_DEVICE fc_half fc_to_half(float f) {
  fc_half h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}

FC_DEVICE fc_bf16 fc_to_bf16(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  fc_bf16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
#else
  // Round to nearest even on the bits; NaN stays a quiet NaN.
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return fc_bf16_from_bits(0x7fc0);
  u += 0x7fffu + ((u >> 16) & 1u);
  return fc_bf16_from_bits((unsigned short)(u >> 16));
#endif
}

// double and integers go through float, as torch's c10::Half / c10::BFloat16 constructors do
// (they take a float), so results match torch bit for bit.
FC_DEVICE fc_half fc_to_half(double d) { return fc_to_half((float)d); }
FC_DEVICE fc_half fc_to_half(fc_half h) { return h; }
FC_DEVICE fc_half fc_to_half(fc_bf16 h) { return fc_to_half(fc_to_float(h)); }
template <typename T, FC_IF_INT(T)> FC_DEVICE fc_half fc_to_half(T x) {
  return fc_to_half((float)x);
}

FC_DEVICE fc_bf16 fc_to_bf16(double d) { return fc_to_bf16((float)d); }
FC_DEVICE fc_bf16 fc_to_bf16(fc_bf16 h) { return h; }
FC_DEVICE fc_bf16 fc_to_bf16(fc_half h) { return fc_to_bf16(fc_to_float(h)); }
template <typename T, FC_IF_INT(T)> FC_DEVICE fc_bf16 fc_to_bf16(T x) {
  return fc_to_bf16((float)x);
}

FC_DEVICE float fc_to_float(float x) { return x; }
FC_DEVICE float fc_to_float(double x) { return (float)x; }
template <typename T, FC_IF_INT(T)> FC_DEVICE float fc_to_float(T x) { return (float)x; }

FC_DEVICE double fc_to_double(fc_half h) { return (double)fc_to_float(h); }
FC_DEVICE double fc_to_double(fc_bf16 h) { return (double)fc_to_float(h); }
FC_DEVICE double fc_to_double(float x) { return (double)x; }
FC_DEVICE double fc_to_double(double x) { return x; }
template <typename T, FC_IF_INT(T)> FC_DEVICE double fc_to_double(T x) { return (double)x; }

// fc_cast<To>(x): one spelling for every dtype conversion the code generator emits.
// 16-bit floats widen to float first (torch converts half -> int64 through float too).
FC_DEVICE float fc_widen(fc_half h) { return fc_to_float(h); }
FC_DEVICE float fc_widen(fc_bf16 h) { return fc_to_float(h); }
template <typename T> FC_DEVICE T fc_widen(T x) { return x; }

template <typename To> struct fc_cast_impl {
  template <typename From> FC_DEVICE static To run(From x) { return static_cast<To>(fc_widen(x)); }
};
template <> struct fc_cast_impl<fc_half> {
  template <typename From> FC_DEVICE static fc_half run(From x) { return fc_to_half(x); }
};
template <> struct fc_cast_impl<fc_bf16> {
  template <typename From> FC_DEVICE static fc_bf16 run(From x) { return fc_to_bf16(x); }
};
template <typename To, typename From> FC_DEVICE To fc_cast(From x) {
  return fc_cast_impl<To>::run(x);
}

// Note [Column partials]: the sums of one tile of 32 columns of a [groups, N] buffer of
// partials, in a fixed order: thread row `row` of ROWS adds partial rows row, row + ROWS,
// ..., then row 0 adds the thread rows' sums in order and stores them in the output's type.
// Every thread of the block calls it (it synchronizes); threads of row >= ROWS only wait.
// Read through L2 (.cg): in the row kernel the partials come from other SMs (Note [Finish
// in the row kernel]).
template <int ROWS, typename A, typename M, typename I>
FC_DEVICE void fc_sum_column_tile(const A* part, M* out, I N, I groups, I tile, int lane,
                                  int row, A (&sums)[ROWS][32]) {
  const I col = tile * 32 + lane;
  A s = 0;
  if (row < ROWS && col < N)
    for (I g = row; g < groups; g += ROWS) s += __ldcg(&part[g * N + col]);
  if (row < ROWS) sums[row][lane] = s;
  __syncthreads();
  if (row == 0 && col < N) {
    A total = sums[0][lane];
    for (int y = 1; y < ROWS; ++y) total += sums[y][lane];
    out[col] = fc_cast<M>(total);
  }
  __syncthreads();
}

// ---- special values and limits -----------------------------------------------------------

template <typename T> FC_DEVICE T fc_nan();
template <> FC_DEVICE float fc_nan<float>() { return __int_as_float(0x7fc00000); }
template <> FC_DEVICE double fc_nan<double>() {
  return __longlong_as_double(0x7ff8000000000000LL);
}
template <> FC_DEVICE fc_half fc_nan<fc_half>() { return fc_half_from_bits(0x7e00); }
template <> FC_DEVICE fc_bf16 fc_nan<fc_bf16>() { return fc_bf16_from_bits(0x7fc0); }

template <typename T> FC_DEVICE T fc_inf();
template <> FC_DEVICE float fc_inf<float>() { return __int_as_float(0x7f800000); }
template <> FC_DEVICE double fc_inf<double>() {
  return __longlong_as_double(0x7ff0000000000000LL);
}
template <> FC_DEVICE fc_half fc_inf<fc_half>() { return fc_half_from_bits(0x7c00); }
template <> FC_DEVICE fc_bf16 fc_inf<fc_bf16>() { return fc_bf16_from_bits(0x7f80); }

// Identities for max / min reductions: -inf / +inf for floats, the type's range for integers.
template <typename T> struct fc_limits {
  FC_DEVICE static T lowest() {
    typedef typename fc_make_unsigned<T>::type U;  // shifting into the sign bit is UB
    return fc_is_signed<T>::value ? T(U(1) << (sizeof(T) * 8 - 1)) : T(0);
  }
  FC_DEVICE static T highest() { return T(~lowest()); }
};
template <> struct fc_limits<bool> {
  FC_DEVICE static bool lowest() { return false; }
  FC_DEVICE static bool highest() { return true; }
};
template <> struct fc_limits<float> {
  FC_DEVICE static float lowest() { return -fc_inf<float>(); }
  FC_DEVICE static float highest() { return fc_inf<float>(); }
};
template <> struct fc_limits<double> {
  FC_DEVICE static double lowest() { return -fc_inf<double>(); }
  FC_DEVICE static double highest() { return fc_inf<double>(); }
};

// ---- dependent launches (sm_90) -------------------------------------------------------------
// Note [Dependent launch]: a kernel that reads what the kernel before it in the stream wrote
// (a finish kernel reading partials) may be launched with programmatic stream serialization,
// so the GPU readies it while the first one runs; it then waits here, before any memory
// access, for that grid to complete and its writes to be visible. Without such a launch
// the wait returns at once.
FC_DEVICE void fc_wait_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// ---- vectorized global memory access -------------------------------------------------------
// fc_vec<T, N> is N elements moved as one access; sizeof(T) * N must be a power of two.
// Callers guarantee the pointer is aligned to sizeof(T) * N (the signature records it).

template <typename T, int N> struct __align__(sizeof(T) * N) fc_vec {
  T v[N];
  FC_DEVICE T& operator[](int i) { return v[i]; }
  FC_DEVICE const T& operator[](int i) const { return v[i]; }
};

template <int Bytes> struct fc_raw;
template <> struct fc_raw<1> { typedef unsigned char type; };
template <> struct fc_raw<2> { typedef unsigned short type; };
template <> struct fc_raw<4> { typedef unsigned int type; };
template <> struct fc_raw<8> { typedef uint2 type; };
template <> struct fc_raw<16> { typedef uint4 type; };

// Plain load: safe when the buffer may also be written by this kernel (in-place outputs).
template <int N, typename T> FC_DEVICE fc_vec<T, N> fc_load_vec(const T* p) {
  return *reinterpret_cast<const fc_vec<T, N>*>(p);
}

// The bits of one raw load (fc_raw) as N values of T.
template <typename T, int N, typename Raw> FC_DEVICE fc_vec<T, N> fc_bits_as_vec(Raw raw) {
  union {
    Raw raw;
    fc_vec<T, N> vec;
  } u;
  u.raw = raw;
  return u.vec;
}

// Read-only path (ld.global.nc): only for inputs that no thread writes during the kernel.
template <int N, typename T> FC_DEVICE fc_vec<T, N> fc_load_vec_ro(const T* p) {
  constexpr int kBytes = (int)sizeof(T) * N;
  if constexpr (kBytes <= 16) {
    typedef typename fc_raw<kBytes>::type raw_t;
    return fc_bits_as_vec<T, N>(__ldg(reinterpret_cast<const raw_t*>(p)));
  } else {
    fc_vec<T, N> out;
    const uint4* src = reinterpret_cast<const uint4*>(p);
    uint4* dst = reinterpret_cast<uint4*>(&out);
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) dst[i] = __ldg(src + i);
    return out;
  }
}

// Element j of a bf16 vector as a float, read from the 32-bit word holding it: the high half
// is the word masked, the low one the word shifted (one instruction each, where extracting
// the 16-bit field first took two for every high half).
template <int N> FC_DEVICE float fc_bf16_at(const fc_vec<fc_bf16, N>& v, int j) {
  static_assert(N % 2 == 0, "whole 32-bit words");
  const unsigned w = reinterpret_cast<const unsigned*>(v.v)[j >> 1];
  return __uint_as_float((j & 1) ? (w & 0xffff0000u) : (w << 16));
}

template <int N, typename T> FC_DEVICE void fc_store_vec(T* p, const fc_vec<T, N>& v) {
  *reinterpret_cast<fc_vec<T, N>*>(p) = v;
}

// Note [Mask words]: a vector of N bools to store, built as the bytes of 64-bit words by
// shifts; a fc_vec<bool, N> filled element by element kept its bools as predicate bits and
// unpacked them with several instructions each. Dropout + residual + layer norm's keep mask
// (row kernel): 45 -> 40 registers, three blocks an SM, 2713 -> 2878 GB/s on the H100.
template <int N> struct fc_mask_bytes {
  unsigned long long w[(N + 7) / 8];
};

template <int N> FC_DEVICE fc_mask_bytes<N> fc_mask_init() {
  fc_mask_bytes<N> m;
#pragma unroll
  for (int i = 0; i < (N + 7) / 8; ++i) m.w[i] = 0ull;
  return m;
}

template <int N> FC_DEVICE void fc_mask_set(fc_mask_bytes<N>& m, int j, bool b) {
  m.w[j >> 3] |= (unsigned long long)b << (8 * (j & 7));
}

template <int N> FC_DEVICE void fc_store_mask(bool* p, const fc_mask_bytes<N>& m) {
  if constexpr (N >= 8) {
#pragma unroll
    for (int i = 0; i < N / 8; ++i) reinterpret_cast<unsigned long long*>(p)[i] = m.w[i];
  } else {
    *reinterpret_cast<typename fc_raw<N>::type*>(p) = (typename fc_raw<N>::type)m.w[0];
  }
}

// Note [Cache hints]: streaming variants for data a kernel touches once. Loads: Hint 1
// skips L1 (L1::no_allocate), 2 asks L2 to fetch 256 bytes around a miss (L2::256B), 3 does
// both. Stores with Hint 1 are evict-first (st.global.cs). Measured on the H100
// (benchmarks/results/sweep-explore.json): pure reductions, which read every byte once and
// write almost nothing, gain with 3 (var_mean f32 16384x4096 2271 -> 2409 GB/s, outer sums
// too); kernels that also write rows (normalizations) lost a few percent with it, and
// evict-first stores never helped, so those keep the plain forms (Hint 0). Hint 4 marks
// the lines evict-last in L2, for inputs every row reads again (Note [Weights kept in L2]).
#define FC_LD_FORMS(HINT, PTX)                                                              \
  FC_DEVICE void fc_ld_raw(const void* p, uint4& r, fc_hint<HINT>) {                       \
    asm("ld.global.nc" PTX ".v4.u32 {%0, %1, %2, %3}, [%4];"                                \
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));                              \
  }                                                                                          \
  FC_DEVICE void fc_ld_raw(const void* p, uint2& r, fc_hint<HINT>) {                       \
    asm("ld.global.nc" PTX ".v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));     \
  }                                                                                          \
  FC_DEVICE void fc_ld_raw(const void* p, unsigned int& r, fc_hint<HINT>) {                \
    asm("ld.global.nc" PTX ".u32 %0, [%1];" : "=r"(r) : "l"(p));                            \
  }                                                                                          \
  FC_DEVICE void fc_ld_raw(const void* p, unsigned short& r, fc_hint<HINT>) {              \
    asm("ld.global.nc" PTX ".u16 %0, [%1];" : "=h"(r) : "l"(p));                            \
  }
template <int H> struct fc_hint {};
FC_LD_FORMS(1, ".L1::no_allocate")
FC_LD_FORMS(2, ".L2::256B")
FC_LD_FORMS(3, ".L1::no_allocate.L2::256B")
#undef FC_LD_FORMS
// Note [Plain loads]: hint 5 is the coherent ld.global, not ld.global.nc, the form Triton
// emits for the rows of its persistent reductions. No gain (H100, sweep-shortrows1.json):
// softmax f32 2097152x32 2891 GB/s against 2881-2889, layer norm bf16 524288x128 2776 against
// 2777-2792, rows of 256 equal, the sum to a scalar 2630 against 2628 with hint 0.
FC_DEVICE void fc_ld_raw(const void* p, uint4& r, fc_hint<5>) {
  asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
}
FC_DEVICE void fc_ld_raw(const void* p, uint2& r, fc_hint<5>) {
  asm("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
}
FC_DEVICE void fc_ld_raw(const void* p, unsigned int& r, fc_hint<5>) {
  asm("ld.global.u32 %0, [%1];" : "=r"(r) : "l"(p));
}
FC_DEVICE void fc_ld_raw(const void* p, unsigned short& r, fc_hint<5>) {
  asm("ld.global.u16 %0, [%1];" : "=h"(r) : "l"(p));
}

// Hint 4: an L2 evict-last policy (createpolicy, then .L2::cache_hint); the policy asm has
// no inputs, so the compiler makes it once.
FC_DEVICE unsigned long long fc_keep_policy() {
  unsigned long long p;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}
FC_DEVICE void fc_ld_raw(const void* p, uint4& r, fc_hint<4>) {
  asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(fc_keep_policy()));
}
FC_DEVICE void fc_ld_raw(const void* p, uint2& r, fc_hint<4>) {
  asm("ld.global.nc.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
      : "=r"(r.x), "=r"(r.y) : "l"(p), "l"(fc_keep_policy()));
}
FC_DEVICE void fc_ld_raw(const void* p, unsigned int& r, fc_hint<4>) {
  asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(r) : "l"(p), "l"(fc_keep_policy()));
}
FC_DEVICE void fc_ld_raw(const void* p, unsigned short& r, fc_hint<4>) {
  asm("ld.global.nc.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(r) : "l"(p), "l"(fc_keep_policy()));
}

template <int N, int Hint, typename T> FC_DEVICE fc_vec<T, N> fc_load_vec_hint(const T* p) {
  constexpr int kBytes = (int)sizeof(T) * N;
  if constexpr (Hint == 0 || kBytes == 1 || kBytes > 16) {
    return fc_load_vec_ro<N>(p);
  } else {
    typename fc_raw<kBytes>::type raw;
    fc_ld_raw(p, raw, fc_hint<Hint>());
    return fc_bits_as_vec<T, N>(raw);
  }
}

// A load that reads nothing and gives zeros when !ok: one predicated instruction after the
// zeroing moves. Written as C++ (`if (ok) v = load`), the compiler merges each 16-bit lane of
// the old value separately, and a row kept in registers took one register a bf16 value.
#define FC_LD_IF_FORMS(HINT, PTX)                                                            \
  FC_DEVICE void fc_ld_raw_if(const void* p, uint4& r, bool ok, fc_hint<HINT>) {           \
    asm("{\n\t.reg .pred g;\n\tsetp.ne.b32 g, %5, 0;\n\t"                                   \
        "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"          \
        "@g ld.global.nc" PTX ".v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"                         \
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "r"((int)ok));               \
  }                                                                                          \
  FC_DEVICE void fc_ld_raw_if(const void* p, uint2& r, bool ok, fc_hint<HINT>) {           \
    asm("{\n\t.reg .pred g;\n\tsetp.ne.b32 g, %3, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t" \
        "@g ld.global.nc" PTX ".v2.u32 {%0, %1}, [%2];\n\t}"                                 \
        : "=r"(r.x), "=r"(r.y) : "l"(p), "r"((int)ok));                                      \
  }                                                                                          \
  FC_DEVICE void fc_ld_raw_if(const void* p, unsigned int& r, bool ok, fc_hint<HINT>) {    \
    asm("{\n\t.reg .pred g;\n\tsetp.ne.b32 g, %2, 0;\n\tmov.b32 %0, 0;\n\t"                 \
        "@g ld.global.nc" PTX ".u32 %0, [%1];\n\t}" : "=r"(r) : "l"(p), "r"((int)ok));       \
  }
FC_LD_IF_FORMS(0, "")
FC_LD_IF_FORMS(1, ".L1::no_allocate")
FC_LD_IF_FORMS(2, ".L2::256B")
FC_LD_IF_FORMS(3, ".L1::no_allocate.L2::256B")
#undef FC_LD_IF_FORMS
FC_DEVICE void fc_ld_raw_if(const void* p, uint4& r, bool ok, fc_hint<5>) {
  asm("{\n\t.reg .pred g;\n\tsetp.ne.b32 g, %5, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@g ld.global.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "r"((int)ok));
}
FC_DEVICE void fc_ld_raw_if(const void* p, uint2& r, bool ok, fc_hint<5>) {
  asm("{\n\t.reg .pred g;\n\tsetp.ne.b32 g, %3, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
      "@g ld.global.v2.u32 {%0, %1}, [%2];\n\t}"
      : "=r"(r.x), "=r"(r.y) : "l"(p), "r"((int)ok));
}
FC_DEVICE void fc_ld_raw_if(const void* p, unsigned int& r, bool ok, fc_hint<5>) {
  asm("{\n\t.reg .pred g;\n\tsetp.ne.b32 g, %2, 0;\n\tmov.b32 %0, 0;\n\t"
      "@g ld.global.u32 %0, [%1];\n\t}" : "=r"(r) : "l"(p), "r"((int)ok));
}
FC_DEVICE void fc_ld_raw_if(const void* p, uint4& r, bool ok, fc_hint<4>) {
  asm("{\n\t.reg .pred g;\n\tsetp.ne.b32 g, %5, 0;\n\t"
      "mov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
      "@g ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %6;\n\t}"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "r"((int)ok), "l"(fc_keep_policy()));
}
FC_DEVICE void fc_ld_raw_if(const void* p, uint2& r, bool ok, fc_hint<4>) {
  asm("{\n\t.reg .pred g;\n\tsetp.ne.b32 g, %3, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
      "@g ld.global.nc.L2::cache_hint.v2.u32 {%0, %1}, [%2], %4;\n\t}"
      : "=r"(r.x), "=r"(r.y) : "l"(p), "r"((int)ok), "l"(fc_keep_policy()));
}
FC_DEVICE void fc_ld_raw_if(const void* p, unsigned int& r, bool ok, fc_hint<4>) {
  asm("{\n\t.reg .pred g;\n\tsetp.ne.b32 g, %2, 0;\n\tmov.b32 %0, 0;\n\t"
      "@g ld.global.nc.L2::cache_hint.u32 %0, [%1], %3;\n\t}"
      : "=r"(r) : "l"(p), "r"((int)ok), "l"(fc_keep_policy()));
}

// fc_load_vec_hint that reads nothing and gives zeros where !ok.
template <int N, int Hint, typename T> FC_DEVICE fc_vec<T, N> fc_load_vec_if(const T* p, bool ok) {
  constexpr int kBytes = (int)sizeof(T) * N;
  if constexpr (kBytes < 4 || kBytes > 16) {
    fc_vec<T, N> v;
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = T();
    if (ok) v = fc_load_vec_hint<N, Hint>(p);
    return v;
  } else {
    typename fc_raw<kBytes>::type raw;
    fc_ld_raw_if(p, raw, ok, fc_hint<Hint>());
    return fc_bits_as_vec<T, N>(raw);
  }
}

// Note [Column strips] (codegen/reduction_cuda.py): thread t sums columns [V t, V t + V) of
// a [groups, N] buffer of partials over every group, in group order, V-wide loads where the
// rows of partials keep them aligned (N % V == 0).
template <int V, typename A, typename M, typename I>
FC_DEVICE void fc_sum_column_strip(const A* part, M* out, I N, I groups, I t) {
  const I c0 = t * V;
  if (c0 >= N) return;
  A s[V];
#pragma unroll
  for (int j = 0; j < V; ++j) s[j] = A(0);
  if (N % V == 0) {
#pragma unroll 8
    for (I g = 0; g < groups; ++g) {
      const fc_vec<A, V> p = fc_load_vec_if<V, 0>(part + g * N + c0, true);
#pragma unroll
      for (int j = 0; j < V; ++j) s[j] += p[j];
    }
  } else {
    for (I g = 0; g < groups; ++g)
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (c0 + j < N) s[j] += part[g * N + c0 + j];
  }
#pragma unroll
  for (int j = 0; j < V; ++j)
    if (c0 + j < N) out[c0 + j] = fc_cast<M>(s[j]);
}

template <int N, int Hint, typename T>
FC_DEVICE void fc_store_vec_hint(T* p, const fc_vec<T, N>& v) {
  constexpr int kBytes = (int)sizeof(T) * N;
  if constexpr (Hint == 0 || kBytes < 4 || kBytes > 16) {
    fc_store_vec<N>(p, v);
  } else if constexpr (kBytes == 16) {
    const uint4 r = *reinterpret_cast<const uint4*>(&v);
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(r.x), "r"(r.y), "r"(r.z), "r"(r.w) : "memory");
  } else if constexpr (kBytes == 8) {
    const uint2 r = *reinterpret_cast<const uint2*>(&v);
    asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(r.x), "r"(r.y) : "memory");
  } else {
    const unsigned int r = *reinterpret_cast<const unsigned int*>(&v);
    asm volatile("st.global.cs.u32 [%0], %1;" :: "l"(p), "r"(r) : "memory");
  }
}

// ---- asynchronous copies to shared memory (sm_80) -----------------------------------------
// Note [Row pipeline]: a block that loops over row groups copies the next group's rows into
// shared memory with cp.async while it computes on the current one, so memory stays busy
// through the reductions. Each thread copies, and later reads back, only its own 16-byte
// chunks: waiting for its own copies is all the synchronisation it needs.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// 16 bytes; when !ok, none are read and the destination is zero-filled.
FC_DEVICE void fc_cp_async16(void* smem, const void* gmem, bool ok) {
  const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               ::"r"(dst), "l"(gmem), "r"(ok ? 16 : 0) : "memory");
}
FC_DEVICE void fc_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> FC_DEVICE void fc_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#endif

// Hides a pointer's value from the optimizer, so that loads through it stay where the source
// puts them: a row kernel's last pass loads its weights there rather than holding them in
// registers through the row's reductions (layer norm bf16 65536x1024: 63 registers a thread
// instead of 72).
template <typename T> FC_DEVICE void fc_opaque(const T*& p) { asm volatile("" : "+l"(p)); }

// Scalar read-only load that also works for fc_half / fc_bf16.
template <typename T> FC_DEVICE T fc_ldg(const T* p) { return fc_load_vec_ro<1>(p).v[0]; }

#endif  // FC_PRELUDE_CORE
