// fusion-cache prelude: float8.
// Storage types for the float8 formats and their conversions with torch's rules (c10's
// Float8_* constructors, which torch's .to() runs on the CPU and the GPU alike):
//   e4m3fn: round to nearest even; no infinities in the format. A value rounding past 448,
//           and +-inf, saturate to +-448 (0x7e) where FC_E4M3_SATURATE is 1, else become NaN
//           (0x7f with the sign): torch changed this between versions, and the define is set
//           from the running torch's own cast (Note [Float8 overflow] in codegen/prelude.py).
//           NaN stays NaN, its sign kept.
//   e5m2:   round to nearest even; 65536 and beyond, and +-inf, give +-inf; NaN gives 0x7f.
//   e8m0fnu: a power of two (exponent only, no sign): the float's exponent rounded to
//           nearest even on its mantissa; NaN and +-inf give NaN (0xff); the sign is dropped.
// Values live in float registers, as half and bfloat16 do (Note [Register types]). Doubles
// and integers convert through float first, as the c10 constructors take a float.
#ifndef FC_PRELUDE_FLOAT8
#define FC_PRELUDE_FLOAT8

struct __align__(1) fc_e4m3 { unsigned char bits; };
struct __align__(1) fc_e5m2 { unsigned char bits; };
struct __align__(1) fc_e8m0 { unsigned char bits; };

FC_DEVICE float fc_to_float(fc_e4m3 x) {
  const unsigned int sign = (unsigned int)(x.bits & 0x80) << 24;
  const unsigned int mag = x.bits & 0x7f;
  if (mag == 0x7f) return __uint_as_float(sign | 0x7fc00000u);
  const unsigned int exp = mag >> 3, man = mag & 7;
  float v;
  if (exp == 0) {
    v = (float)man * 0x1p-9f;  // subnormal: man / 8 * 2^-6, exact
  } else {
    v = __uint_as_float(((exp + 120u) << 23) | (man << 20));  // rebias 7 -> 127
  }
  return __uint_as_float(__float_as_uint(v) | sign);
}

FC_DEVICE float fc_to_float(fc_e5m2 x) {
  // e5m2 is the upper byte of an IEEE half; a NaN is made here, as the half conversion
  // would drop its sign (cvt gives the canonical NaN)
  if ((x.bits & 0x7f) > 0x7c) return __uint_as_float(((unsigned int)(x.bits & 0x80) << 24) | 0x7fc00000u);
  return fc_to_float(fc_half_from_bits((unsigned short)(x.bits << 8)));
}

FC_DEVICE float fc_to_float(fc_e8m0 x) {
  if (x.bits == 0) return __uint_as_float(0x00400000u);  // 2^-127, a float subnormal
  if (x.bits == 0xff) return __uint_as_float(0x7f800001u);
  return __uint_as_float((unsigned int)x.bits << 23);
}

FC_DEVICE fc_e4m3 fc_to_e4m3(float f) {
  unsigned int u = __float_as_uint(f);
  const unsigned int sign = u & 0x80000000u;
  u ^= sign;
  unsigned char out;
  if (u >= 0x43f00000u) {  // 480 and beyond (after rounding past 448), inf or NaN
    out = u > 0x7f800000u || !FC_E4M3_SATURATE ? 0x7f : 0x7e;
  } else if (u < 0x3c800000u) {  // below 2^-6: subnormal, rounded by a float add
    // adding 2^-(6+3-1) * 2^23-scale leaves the rounded subnormal in the low bits
    const unsigned int magic = 141u << 23;
    out = (unsigned char)(__float_as_uint(__fadd_rn(__uint_as_float(u), __uint_as_float(magic)))
                          - magic);
  } else {
    const unsigned int odd = (u >> 20) & 1u;
    u += ((unsigned int)(7 - 127) << 23) + 0x7ffffu + odd;  // rebias, round half to even
    out = (unsigned char)(u >> 20);
    if (out == 0x7f && FC_E4M3_SATURATE) out = 0x7e;  // rounding reached the NaN pattern
  }
  fc_e4m3 r;
  r.bits = out | (unsigned char)(sign >> 24);
  return r;
}

FC_DEVICE fc_e5m2 fc_to_e5m2(float f) {
  unsigned int u = __float_as_uint(f);
  const unsigned int sign = u & 0x80000000u;
  u ^= sign;
  unsigned char out;
  if (u >= (143u << 23)) {  // 65536 and beyond, inf or NaN
    out = u > 0x7f800000u ? 0x7f : 0x7c;
  } else if (u < (113u << 23)) {  // below 2^-14: subnormal
    const unsigned int magic = 134u << 23;
    out = (unsigned char)(__float_as_uint(__fadd_rn(__uint_as_float(u), __uint_as_float(magic)))
                          - magic);
  } else {
    const unsigned int odd = (u >> 21) & 1u;
    u += ((unsigned int)(15 - 127) << 23) + 0xfffffu + odd;
    out = (unsigned char)(u >> 21);
  }
  fc_e5m2 r;
  r.bits = out | (unsigned char)(sign >> 24);
  return r;
}

FC_DEVICE fc_e8m0 fc_to_e8m0(float f) {
  const unsigned int u = __float_as_uint(f);
  unsigned int exp = (u >> 23) & 0xffu;
  fc_e8m0 r;
  if (exp == 0xffu) {
    r.bits = 0xff;
    return r;
  }
  // round to nearest even on the mantissa; the implicit bit (1 for normals) is the LSB
  const bool guard = (u & 0x400000u) != 0;
  const bool rest = (u & 0x3fffffu) != 0;
  if (guard && (rest || exp > 0)) ++exp;
  r.bits = (unsigned char)exp;
  return r;
}

// a double NaN narrowed to float keeps its sign (cvt would give the canonical NaN)
FC_DEVICE float fc_narrow_keep_nan(double d) {
  if (d == d) return (float)d;
  return __uint_as_float((unsigned int)((unsigned long long)__double_as_longlong(d) >> 32) |
                         0x7fc00000u);
}
FC_DEVICE fc_e4m3 fc_to_e4m3(double d) { return fc_to_e4m3(fc_narrow_keep_nan(d)); }
FC_DEVICE fc_e5m2 fc_to_e5m2(double d) { return fc_to_e5m2(fc_narrow_keep_nan(d)); }
FC_DEVICE fc_e8m0 fc_to_e8m0(double d) { return fc_to_e8m0((float)d); }
template <typename T, FC_IF_INT(T)> FC_DEVICE fc_e4m3 fc_to_e4m3(T x) {
  return fc_to_e4m3((float)x);
}
template <typename T, FC_IF_INT(T)> FC_DEVICE fc_e5m2 fc_to_e5m2(T x) {
  return fc_to_e5m2((float)x);
}
template <typename T, FC_IF_INT(T)> FC_DEVICE fc_e8m0 fc_to_e8m0(T x) {
  return fc_to_e8m0((float)x);
}

FC_DEVICE float fc_widen(fc_e4m3 x) { return fc_to_float(x); }
FC_DEVICE float fc_widen(fc_e5m2 x) { return fc_to_float(x); }
FC_DEVICE float fc_widen(fc_e8m0 x) { return fc_to_float(x); }

#endif  // FC_PRELUDE_FLOAT8
