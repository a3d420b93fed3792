// fusion-cache prelude: math.
// Elementwise functions with torch's semantics where CUDA's libdevice lacks them or differs.
// Overloads: float, double, and integers (FC_IF_INT) where torch defines the op for ints.
// 16-bit floats are not accepted here on purpose: widen them with fc_to_float first.
#ifndef FC_PRELUDE_MATH
#define FC_PRELUDE_MATH

// ---- classification ------------------------------------------------------------------------

FC_DEVICE bool fc_isnan(float x) { return x != x; }
FC_DEVICE bool fc_isnan(double x) { return x != x; }
template <typename T, FC_IF_INT(T)> FC_DEVICE bool fc_isnan(T) { return false; }

FC_DEVICE bool fc_isinf(float x) { return fabsf(x) == fc_inf<float>(); }
FC_DEVICE bool fc_isinf(double x) { return fabs(x) == fc_inf<double>(); }
template <typename T, FC_IF_INT(T)> FC_DEVICE bool fc_isinf(T) { return false; }

FC_DEVICE bool fc_isfinite(float x) { return fabsf(x) < fc_inf<float>(); }  // NaN -> false
FC_DEVICE bool fc_isfinite(double x) { return fabs(x) < fc_inf<double>(); }
template <typename T, FC_IF_INT(T)> FC_DEVICE bool fc_isfinite(T) { return true; }

FC_DEVICE bool fc_isposinf(float x) { return x == fc_inf<float>(); }
FC_DEVICE bool fc_isposinf(double x) { return x == fc_inf<double>(); }
template <typename T, FC_IF_INT(T)> FC_DEVICE bool fc_isposinf(T) { return false; }

FC_DEVICE bool fc_isneginf(float x) { return x == -fc_inf<float>(); }
FC_DEVICE bool fc_isneginf(double x) { return x == -fc_inf<double>(); }
template <typename T, FC_IF_INT(T)> FC_DEVICE bool fc_isneginf(T) { return false; }

// Sign bit as stored: true for -0.0 and for NaNs with the sign bit set (as torch.signbit).
FC_DEVICE bool fc_signbit(float x) { return __float_as_int(x) < 0; }
FC_DEVICE bool fc_signbit(double x) { return __double_as_longlong(x) < 0; }
template <typename T, FC_IF_INT(T)> FC_DEVICE bool fc_signbit(T x) {
  if constexpr (fc_is_signed<T>::value) return x < T(0);
  else return false;
}

// ---- sign, abs, rounding -------------------------------------------------------------------

// torch.sign: NaN -> 0, -0.0 -> 0.
FC_DEVICE float fc_sign(float x) { return (float)((0.0f < x) - (x < 0.0f)); }
FC_DEVICE double fc_sign(double x) { return (double)((0.0 < x) - (x < 0.0)); }
template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_sign(T x) {
  if constexpr (fc_is_signed<T>::value) return T((T(0) < x) - (x < T(0)));
  else return T(T(0) < x);
}

FC_DEVICE float fc_abs(float x) { return fabsf(x); }
FC_DEVICE double fc_abs(double x) { return fabs(x); }
template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_abs(T x) {
  if constexpr (fc_is_signed<T>::value) return x < T(0) ? T(-x) : x;
  else return x;
}

// torch.round (no decimals) rounds half to even, i.e. rint.
FC_DEVICE float fc_round_half_even(float x) { return rintf(x); }
FC_DEVICE double fc_round_half_even(double x) { return rint(x); }
template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_round_half_even(T x) { return x; }

// torch.frac: x - trunc(x); frac(inf) is NaN, as in torch.
FC_DEVICE float fc_frac(float x) { return x - truncf(x); }
FC_DEVICE double fc_frac(double x) { return x - trunc(x); }

FC_DEVICE float fc_nextafter(float x, float y) { return nextafterf(x, y); }
FC_DEVICE double fc_nextafter(double x, double y) { return nextafter(x, y); }

// ---- exp of a softmax sum's terms ---------------------------------------------------------
// Note [Flushed softmax terms]: the terms exp(x - max) of a softmax's sum (the row kernel's
// pass for it; codegen/reduction/row_kernel.py), where the row's max contributes exactly 1,
// so a term under 2^-126 cannot change the sum's float. exp2f keeps such results as
// subnormals with a compare and two predicated multiplies around MUFU.EX2, which also kept
// NVCC from predicating the accumulation (a branch a value); the .ftz form is that MUFU.EX2
// alone, the same bits for every other result. Its argument is x*log2(e) - m*log2(e), one
// fma (within an ulp or two of the exponent (x - m)*log2(e) gives, as Triton's and quack's
// kernels compute it). With the bf16 reads of fc_bf16_at (core.cuh), cross-entropy's row
// kernel (bf16 8192x50304, clusters of 8) took 640 instructions a thread and row instead of
// 896, and ran 2420 GB/s instead of 1924 on the H100 (before the fma; the kernel is bound by
// instruction issue, not memory: benchmarks/sweeps/ce.json). Terms carried to a later pass
// (softmax's output) keep exp2f and their subnormals.
FC_DEVICE float fc_exp2_flushed(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  const float y = exp2f(x);
  return y < 1.17549435e-38f ? 0.0f : y;
#endif
}

// Note [Lean column softmax] (codegen/reduction/column_norm.py): 2^(y - 64) as MUFU.EX2 of
// y and one multiply. The .ftz form flushes only y under -126, results under 2^-190 that no
// float holds, and the multiply makes the subnormals that exp2f keeps with a compare and
// two predicated multiplies around the MUFU.
FC_DEVICE float fc_exp2_biased(float y) {
#if defined(__CUDA_ARCH__)
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(y));
  return e * 0x1p-64f;
#else
  return exp2f(y - 64.0f);
#endif
}

// ---- min / max / clamp ---------------------------------------------------------------------
// torch.maximum / minimum / clamp propagate NaN; fmaxf would drop it.

FC_DEVICE float fc_maximum(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? fc_nan<float>() : fmaxf(a, b);
#endif
}
FC_DEVICE float fc_minimum(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? fc_nan<float>() : fminf(a, b);
#endif
}

// The elementwise max of two pairs of bf16 (the bits of a 32-bit word each), NaN kept as
// torch.maximum keeps it: exact, as a max of the floats they widen to.
FC_DEVICE unsigned fc_max_bf16x2(unsigned a, unsigned b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned r;
  asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  const float lo = fc_maximum(__uint_as_float(a << 16), __uint_as_float(b << 16));
  const float hi = fc_maximum(__uint_as_float(a & 0xffff0000u), __uint_as_float(b & 0xffff0000u));
  return (__float_as_uint(hi) & 0xffff0000u) | (__float_as_uint(lo) >> 16);
#endif
}

FC_DEVICE double fc_maximum(double a, double b) {
  return (a != a) ? a : ((b != b) ? b : fmax(a, b));
}
FC_DEVICE double fc_minimum(double a, double b) {
  return (a != a) ? a : ((b != b) ? b : fmin(a, b));
}
template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_maximum(T a, T b) { return a < b ? b : a; }
template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_minimum(T a, T b) { return b < a ? b : a; }

// torch.clamp(x, lo, hi): a NaN in x or in either bound gives NaN; hi wins when lo > hi.
FC_DEVICE float fc_clamp(float x, float lo, float hi) {
  return fc_minimum(fc_maximum(x, lo), hi);
}
FC_DEVICE double fc_clamp(double x, double lo, double hi) {
  return fc_minimum(fc_maximum(x, lo), hi);
}
template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_clamp(T x, T lo, T hi) {
  return fc_minimum(fc_maximum(x, lo), hi);
}

// torch.relu keeps NaN and -0.0.
FC_DEVICE float fc_relu(float x) { return x < 0.0f ? 0.0f : x; }
FC_DEVICE double fc_relu(double x) { return x < 0.0 ? 0.0 : x; }
template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_relu(T x) {
  if constexpr (fc_is_signed<T>::value) return x < T(0) ? T(0) : x;
  else return x;
}

// ---- division family -----------------------------------------------------------------------

// torch.remainder: the result takes the sign of the divisor (Python's %).
FC_DEVICE float fc_remainder(float a, float b) {
  float m = fmodf(a, b);
  if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) m += b;
  return m;
}
FC_DEVICE double fc_remainder(double a, double b) {
  double m = fmod(a, b);
  if (m != 0.0 && ((b < 0.0) != (m < 0.0))) m += b;
  return m;
}
template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_remainder(T a, T b) {
  T m = a % b;
  if constexpr (fc_is_signed<T>::value) {
    if (m != T(0) && ((b < T(0)) != (m < T(0)))) m += b;
  }
  return m;
}

// torch.fmod: the result takes the sign of the dividend (C's fmod and %).
FC_DEVICE float fc_fmod(float a, float b) { return fmodf(a, b); }
FC_DEVICE double fc_fmod(double a, double b) { return fmod(a, b); }
template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_fmod(T a, T b) { return a % b; }

// Note [Row divisors]: a division whose divisor is the same for a whole row (softmax's sum)
// costs an IEEE division per element. Instead each row computes r = 1 / (y * s) once, with s a
// power of two that keeps r a normal number, and each element x * r * s: two multiplications,
// within 1.5 ulp of x / y, and the same special values for zero, infinite and NaN divisors.
template <typename T> struct fc_divisor {
  T r, s;
};
// Where 1 / y leaves the normal range, and the powers of two that bring y back into it.
template <typename T> struct fc_divisor_range;
template <> struct fc_divisor_range<float> {
  static constexpr float lo = 0x1p-125f, hi = 0x1p125f, up = 0x1p64f, down = 0x1p-64f;
};
template <> struct fc_divisor_range<double> {
  static constexpr double lo = 0x1p-1021, hi = 0x1p1021, up = 0x1p512, down = 0x1p-512;
};
template <typename T> FC_DEVICE fc_divisor<T> fc_divisor_of(T y) {
  typedef fc_divisor_range<T> R;
  const T a = fc_abs(y);
  fc_divisor<T> d;
  d.s = a < R::lo ? R::up : (a > R::hi ? R::down : T(1));
  d.r = T(1) / (y * d.s);
  return d;
}
template <typename T> FC_DEVICE T fc_div_by(T x, fc_divisor<T> d) { return x * d.r * d.s; }

// torch.div(rounding_mode='trunc').
FC_DEVICE float fc_div_trunc(float a, float b) { return truncf(a / b); }
FC_DEVICE double fc_div_trunc(double a, double b) { return trunc(a / b); }
template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_div_trunc(T a, T b) { return a / b; }

// torch.div(rounding_mode='floor'). For floats torch derives the quotient from fmod so that
// floor_divide(a, b) * b + remainder(a, b) == a holds as closely as possible.
template <typename F> FC_DEVICE F fc_div_floor_float_(F a, F b) {
  if (b == F(0)) return a / b;
  const F m = fmod(a, b);
  F q = (a - m) / b;
  if (m != F(0) && ((b < F(0)) != (m < F(0)))) q -= F(1);
  if (q == F(0)) return copysign(F(0), a / b);
  F f = floor(q);
  if (q - f > F(0.5)) f += F(1);
  return f;
}
FC_DEVICE float fc_div_floor(float a, float b) { return fc_div_floor_float_<float>(a, b); }
FC_DEVICE double fc_div_floor(double a, double b) { return fc_div_floor_float_<double>(a, b); }
template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_div_floor(T a, T b) {
  T q = a / b;
  if constexpr (fc_is_signed<T>::value) {
    const T r = a % b;
    if (r != T(0) && ((r < T(0)) != (b < T(0)))) q -= T(1);
  }
  return q;
}

template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_gcd(T a, T b) {
  a = fc_abs(a);
  b = fc_abs(b);
  while (a != T(0)) {
    const T c = a;
    a = T(b % a);
    b = c;
  }
  return b;
}

// ---- powers and shifts ---------------------------------------------------------------------

FC_DEVICE float fc_pow(float a, float b) { return powf(a, b); }
FC_DEVICE double fc_pow(double a, double b) { return pow(a, b); }

// Integer pow as torch: negative exponents give 0 except for bases 1 and -1.
template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_pow(T base, T exp) {
  if constexpr (fc_is_signed<T>::value) {
    if (exp < T(0)) {
      if (base == T(1)) return T(1);
      if (base == T(-1)) return (exp & T(1)) ? T(-1) : T(1);
      return T(0);
    }
  }
  // Multiply in the unsigned type: overflow wraps (as torch's kernels do in practice)
  // without being undefined behaviour.
  typedef typename fc_make_unsigned<T>::type U;
  U result = 1, b = U(base);
  U e = U(exp);
  while (e) {
    if (e & 1u) result = U(result * b);
    e >>= 1;
    b = U(b * b);
  }
  return T(result);
}

// torch.bitwise_left_shift: shifts outside [0, bits) give 0.
template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_shl(T a, T b) {
  typedef typename fc_make_unsigned<T>::type U;
  constexpr int kBits = (int)sizeof(T) * 8;
  if constexpr (fc_is_signed<T>::value) {
    if (b < T(0)) return T(0);
  }
  if (b >= T(kBits)) return T(0);
  return T(U(a) << b);
}

// torch.bitwise_right_shift: shifts outside [0, bits) fill with the sign bit.
template <typename T, FC_IF_INT(T)> FC_DEVICE T fc_shr(T a, T b) {
  constexpr int kBits = (int)sizeof(T) * 8;
  if constexpr (fc_is_signed<T>::value) {
    if (b < T(0) || b >= T(kBits)) return a < T(0) ? T(-1) : T(0);
  } else {
    if (b >= T(kBits)) return T(0);
  }
  return T(a >> b);
}

// ---- activations and special functions -----------------------------------------------------

// torch.sigmoid / silu as torch's CUDA kernels compute them (1 / (1 + exp(-x))).
FC_DEVICE float fc_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
FC_DEVICE double fc_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
FC_DEVICE float fc_silu(float x) { return x / (1.0f + expf(-x)); }
FC_DEVICE double fc_silu(double x) { return x / (1.0 + exp(-x)); }

// gelu(approximate='tanh'): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
FC_DEVICE float fc_gelu_tanh(float x) {
  const float kBeta = 0.7978845608028654f;
  const float kKappa = 0.044715f;
  const float cube = x * x * x;
  return 0.5f * x * (1.0f + tanhf(kBeta * (x + kKappa * cube)));
}
FC_DEVICE double fc_gelu_tanh(double x) {
  const double kBeta = 0.79788456080286535588;
  const double kKappa = 0.044715;
  const double cube = x * x * x;
  return 0.5 * x * (1.0 + tanh(kBeta * (x + kKappa * cube)));
}

// gelu(approximate='none'): 0.5 x (1 + erf(x / sqrt(2))).
FC_DEVICE float fc_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
FC_DEVICE double fc_gelu(double x) { return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440)); }

FC_DEVICE float fc_erfinv(float x) { return erfinvf(x); }
FC_DEVICE double fc_erfinv(double x) { return erfinv(x); }
FC_DEVICE float fc_erfcinv(float x) { return erfcinvf(x); }
FC_DEVICE double fc_erfcinv(double x) { return erfcinv(x); }

FC_DEVICE float fc_lgamma(float x) { return lgammaf(x); }
FC_DEVICE double fc_lgamma(double x) { return lgamma(x); }

#endif  // FC_PRELUDE_MATH
