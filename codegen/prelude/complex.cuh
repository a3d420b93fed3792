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

#endif  // FC_PRELUDE_COMPLEX
