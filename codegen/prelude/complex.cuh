// fusion-cache prelude: complex.
// complex64 / complex128 values as torch lays them out (real, imaginary), with the arithmetic
// torch's c10::complex does on the GPU. An aggregate, so fc_vec and the load unions hold it.
#ifndef FC_PRELUDE_COMPLEX
#define FC_PRELUDE_COMPLEX

template <typename T> struct __align__(sizeof(T) * 2) fc_complex {
  T re, im;
};

template <typename T> FC_DEVICE fc_complex<T> fc_make_complex(T re, T im) {
  fc_complex<T> z;
  z.re = re;
  z.im = im;
  return z;
}

// A real value (any register type) as a complex one with imaginary part 0; complex values
// change precision part by part.
template <typename T, typename U> FC_DEVICE fc_complex<T> fc_to_complex(U x) {
  return fc_make_complex<T>((T)x, T(0));
}
template <typename T, typename U> FC_DEVICE fc_complex<T> fc_to_complex(fc_complex<U> z) {
  return fc_make_complex<T>((T)z.re, (T)z.im);
}

template <typename T> FC_DEVICE fc_complex<T> operator+(fc_complex<T> a, fc_complex<T> b) {
  return fc_make_complex<T>(a.re + b.re, a.im + b.im);
}
template <typename T> FC_DEVICE fc_complex<T> operator-(fc_complex<T> a, fc_complex<T> b) {
  return fc_make_complex<T>(a.re - b.re, a.im - b.im);
}
template <typename T> FC_DEVICE fc_complex<T> operator-(fc_complex<T> a) {
  return fc_make_complex<T>(-a.re, -a.im);
}
template <typename T> FC_DEVICE fc_complex<T> operator*(fc_complex<T> a, fc_complex<T> b) {
  return fc_make_complex<T>(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re);
}
// Smith's division with numpy's guard for a zero divisor, as c10::complex divides: scaling
// by the larger part of the divisor keeps c^2 + d^2 from overflowing.
template <typename T> FC_DEVICE fc_complex<T> operator/(fc_complex<T> a, fc_complex<T> b) {
  const T c = b.re, d = b.im;
  const T abs_c = c < T(0) ? -c : c, abs_d = d < T(0) ? -d : d;
  if (abs_c >= abs_d) {
    if (abs_c == T(0) && abs_d == T(0)) return fc_make_complex<T>(a.re / abs_c, a.im / abs_d);
    const T rat = d / c;
    const T scl = T(1) / (c + d * rat);
    return fc_make_complex<T>((a.re + a.im * rat) * scl, (a.im - a.re * rat) * scl);
  }
  const T rat = c / d;
  const T scl = T(1) / (d + c * rat);
  return fc_make_complex<T>((a.re * rat + a.im) * scl, (a.im * rat - a.re) * scl);
}
template <typename T> FC_DEVICE bool operator==(fc_complex<T> a, fc_complex<T> b) {
  return a.re == b.re && a.im == b.im;
}
template <typename T> FC_DEVICE bool operator!=(fc_complex<T> a, fc_complex<T> b) {
  return !(a == b);
}

template <typename T> FC_DEVICE bool fc_complex_nonzero(fc_complex<T> z) {
  return z.re != T(0) || z.im != T(0);
}

FC_DEVICE float fc_abs(fc_complex<float> z) { return hypotf(z.re, z.im); }
FC_DEVICE double fc_abs(fc_complex<double> z) { return hypot(z.re, z.im); }
template <typename T> FC_DEVICE fc_complex<T> fc_conj(fc_complex<T> z) {
  return fc_make_complex<T>(z.re, -z.im);
}
template <typename T> FC_DEVICE fc_complex<T> fc_reciprocal(fc_complex<T> z) {
  return fc_make_complex<T>(T(1), T(0)) / z;
}
// torch.isnan / isinf / isfinite of a complex value look at both parts.
template <typename T> FC_DEVICE bool fc_isnan(fc_complex<T> z) {
  return fc_isnan(z.re) || fc_isnan(z.im);
}
template <typename T> FC_DEVICE bool fc_isinf(fc_complex<T> z) {
  return fc_isinf(z.re) || fc_isinf(z.im);
}
template <typename T> FC_DEVICE bool fc_isfinite(fc_complex<T> z) {
  return fc_isfinite(z.re) && fc_isfinite(z.im);
}

// ---- Note [Complex math] ----
// Transcendental functions of complex values with torch's semantics (c10::complex on the GPU
// calls thrust's, which follow C99 Annex G): the principal branch (log's imaginary part in
// (-pi, pi], sqrt's real part >= 0), and the special cases that cost one compare: a real
// argument keeps its real result and the sign of its zero imaginary part; exp, sinh, cosh
// (so sin, cos) past the exponent range scale by e^(x/2) twice instead of overflowing, and
// tanh (so tan) there is +-1 + i*4 sin y cos y e^(-2|x|); sqrt of an infinite imaginary part
// is inf + i*inf. Not copied: thrust's handling of every inf/nan combination (exp(-inf +
// i*inf) is nan + i*nan here, C99 says +-0 +- i*0) and its extra-precise log near |z| = 1
// (here log1p of (|z|-1)(|z|+1), within a few ulp of it away from catastrophic cancellation).
// the largest x whose exp(x) is finite, rounded down
template <typename T> FC_DEVICE T fc_complex_exp_max() {
  return sizeof(T) == 4 ? T(88.7) : T(709.7);
}

// a quarter of the largest finite value: sums of two parts below it stay finite
template <typename T> FC_DEVICE T fc_complex_huge() {
  return sizeof(T) == 4 ? T(8.5e37f) : T(4.4e307);
}

template <typename T> FC_DEVICE fc_complex<T> fc_exp(fc_complex<T> z) {
  if (z.im == T(0)) return fc_make_complex<T>(exp(z.re), z.im);
  const T c = cos(z.im), s = sin(z.im);
  if (z.re > fc_complex_exp_max<T>()) {  // exp(x) overflows while exp(x) * cos(y) may not
    const T h = exp(z.re * T(0.5));
    return fc_make_complex<T>(c * h * h, s * h * h);
  }
  const T e = exp(z.re);
  return fc_make_complex<T>(e * c, e * s);
}

template <typename T> FC_DEVICE fc_complex<T> fc_log(fc_complex<T> z) {
  const T ax = fabs(z.re), ay = fabs(z.im);
  const T big = ax > ay ? ax : ay, small = ax > ay ? ay : ax;
  const T arg = atan2(z.im, z.re);
  if (big > T(0.5) && big < T(2))  // near |z| = 1: log|z| is small, log1p keeps its digits
    return fc_make_complex<T>(T(0.5) * log1p((big - T(1)) * (big + T(1)) + small * small), arg);
  if (big > fc_complex_huge<T>())  // |z| may overflow: log|z| = log|z / 4| + log 4
    return fc_make_complex<T>(
        log(hypot(z.re * T(0.25), z.im * T(0.25))) + T(1.3862943611198906), arg);
  return fc_make_complex<T>(log(hypot(z.re, z.im)), arg);
}

template <typename T> FC_DEVICE fc_complex<T> fc_sqrt(fc_complex<T> z) {
  if (z.re == T(0) && z.im == T(0)) return fc_make_complex<T>(T(0), z.im);
  if (fc_isinf(z.im)) return fc_make_complex<T>(fabs(z.im), z.im);
  const T ax = fabs(z.re), ay = fabs(z.im);
  // |x| + |z| overflows for parts past a quarter of the range: sqrt(z) = 2 sqrt(z / 4)
  const T scale = (ax > fc_complex_huge<T>() || ay > fc_complex_huge<T>()) ? T(0.25) : T(1);
  const T t = sqrt((ax * scale + hypot(ax * scale, ay * scale)) * T(0.5)) / sqrt(scale);
  // t is the part of the larger magnitude: the other is |y| / 2t, no cancellation
  if (z.re >= T(0)) return fc_make_complex<T>(t, z.im / (T(2) * t));
  return fc_make_complex<T>(ay / (T(2) * t), copysign(t, z.im));
}

// Past the exponent range sinh x and cosh x are +-e^|x| / 2: scaled as exp above.
template <typename T> FC_DEVICE fc_complex<T> fc_sinh(fc_complex<T> z) {
  if (z.im == T(0)) return fc_make_complex<T>(sinh(z.re), z.im);
  if (fabs(z.re) > fc_complex_exp_max<T>()) {
    const T h = exp(fabs(z.re) * T(0.5));
    return fc_make_complex<T>(copysign(T(0.5), z.re) * cos(z.im) * h * h,
                              T(0.5) * sin(z.im) * h * h);
  }
  return fc_make_complex<T>(sinh(z.re) * cos(z.im), cosh(z.re) * sin(z.im));
}
template <typename T> FC_DEVICE fc_complex<T> fc_cosh(fc_complex<T> z) {
  if (z.im == T(0)) return fc_make_complex<T>(cosh(z.re), copysign(T(0), z.re) * z.im);
  if (fabs(z.re) > fc_complex_exp_max<T>()) {
    const T h = exp(fabs(z.re) * T(0.5));
    return fc_make_complex<T>(T(0.5) * cos(z.im) * h * h,
                              copysign(T(0.5), z.re) * sin(z.im) * h * h);
  }
  return fc_make_complex<T>(cosh(z.re) * cos(z.im), sinh(z.re) * sin(z.im));
}
// tanh as thrust's (Kahan's) formula: t = tan y, s = sinh x; past |x| = 9 (float) or 22
// (double) tanh x rounds to +-1 and the imaginary part is 4 sin y cos y e^(-2|x|).
template <typename T> FC_DEVICE fc_complex<T> fc_tanh(fc_complex<T> z) {
  if (z.im == T(0)) return fc_make_complex<T>(tanh(z.re), z.im);
  if (fabs(z.re) >= (sizeof(T) == 4 ? T(9) : T(22))) {
    const T e = exp(T(-2) * fabs(z.re));
    return fc_make_complex<T>(copysign(T(1), z.re), T(4) * sin(z.im) * cos(z.im) * e);
  }
  const T t = tan(z.im), beta = T(1) + t * t, s = sinh(z.re), rho = sqrt(T(1) + s * s);
  const T denom = T(1) + beta * s * s;
  return fc_make_complex<T>(beta * rho * s / denom, t / denom);
}
// The circular functions from the hyperbolic ones at i*z = (-y, x):
// sin z = -i sinh(iz), cos z = cosh(iz), tan z = -i tanh(iz).
template <typename T> FC_DEVICE fc_complex<T> fc_sin(fc_complex<T> z) {
  const fc_complex<T> h = fc_sinh(fc_make_complex<T>(-z.im, z.re));
  return fc_make_complex<T>(h.im, -h.re);
}
template <typename T> FC_DEVICE fc_complex<T> fc_cos(fc_complex<T> z) {
  return fc_cosh(fc_make_complex<T>(-z.im, z.re));
}
template <typename T> FC_DEVICE fc_complex<T> fc_tan(fc_complex<T> z) {
  const fc_complex<T> h = fc_tanh(fc_make_complex<T>(-z.im, z.re));
  return fc_make_complex<T>(h.im, -h.re);
}
// torch's complex sigmoid: 1 / (1 + exp(-z))
template <typename T> FC_DEVICE fc_complex<T> fc_sigmoid(fc_complex<T> z) {
  return fc_reciprocal(fc_make_complex<T>(T(1), T(0)) + fc_exp(-z));
}

#endif  // FC_PRELUDE_COMPLEX
