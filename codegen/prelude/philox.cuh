// fusion-cache prelude: philox.
// Counter-based random numbers, Note [Philox numbers] (fusion_cache/ir/interpret/random.py):
// element i of a random op takes words of Philox 4x32-10 with key (seed) and counter
// (i's group, offset), so its value depends on (seed, offset, i) alone. The reference
// computes the same words with torch integer ops.
#ifndef FC_PRELUDE_PHILOX
#define FC_PRELUDE_PHILOX

// The four words of the last group a thread drew, per random statement: neighbouring
// elements of one thread share a group (4 float numbers, 2 double ones), and the element
// loops are unrolled, so Philox runs once a group.
struct fc_rng_cache {
  unsigned long long group;
  unsigned w0, w1, w2, w3;
};

FC_DEVICE fc_rng_cache fc_rng_cache_init() {
  fc_rng_cache c;
  c.group = ~0ull;  // no group index reaches it
  c.w0 = c.w1 = c.w2 = c.w3 = 0u;
  return c;
}

FC_DEVICE void fc_philox(unsigned long long seed, unsigned long long offset,
                         unsigned long long group, fc_rng_cache& c) {
  unsigned k0 = (unsigned)seed, k1 = (unsigned)(seed >> 32);
  unsigned c0 = (unsigned)group, c1 = (unsigned)(group >> 32);
  unsigned c2 = (unsigned)offset, c3 = (unsigned)(offset >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const unsigned lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
    const unsigned lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  c.w0 = c0;
  c.w1 = c1;
  c.w2 = c2;
  c.w3 = c3;
  c.group = group;
}

// Note [Philox lanes]: `lane` is the element's place in its thread's vector where the kernel
// knows each vector's lane 0 starts a group (its element index a multiple of 4), the lanes
// unrolled: lane 0 (and 4) draws the group, the others read its words by place, and no
// element computes its 64-bit index's group or word. -1: not known; the cached group is
// compared and the word picked by index.
FC_DEVICE void fc_rng_group(fc_rng_cache& c, unsigned long long seed, unsigned long long offset,
                            unsigned long long group, int lane, int per) {
  if (lane < 0) {
    if (c.group != group) fc_philox(seed, offset, group, c);
  } else if (lane % per == 0) {
    fc_philox(seed, offset, group, c);
  }
}

// Element i's place in its group: where lanes draw, lane j's place (j = i mod 4 there), which
// unrolled lanes know at compile time, so no element computes its 64-bit index to pick a word
FC_DEVICE unsigned fc_rng_place(unsigned long long i, int lane) {
  return lane < 0 ? (unsigned)(i & 3) : (unsigned)lane;
}

// a double in [0, 1) from 53 bits of two words
FC_DEVICE double fc_unit_double(unsigned a, unsigned b) {
  return ((double)a * 0x1p21 + (double)(b >> 11)) * 0x1p-53;
}

FC_DEVICE float fc_rng_uniform(fc_rng_cache& c, unsigned long long seed, unsigned long long offset,
                               unsigned long long i, float lo, float hi, int lane = -1) {
  fc_rng_group(c, seed, offset, i >> 2, lane, 4);
  const unsigned at = fc_rng_place(i, lane);
  const unsigned w = (at & 2) ? ((at & 1) ? c.w3 : c.w2) : ((at & 1) ? c.w1 : c.w0);
  const float u = (float)(w >> 8) * 0x1p-24f;
  if (lo == 0.0f && hi == 1.0f) return u;  // the same bits (u >= +0), one add less
  return __fadd_rn(lo, __fmul_rn(__fsub_rn(hi, lo), u));
}

FC_DEVICE double fc_rng_uniform(fc_rng_cache& c, unsigned long long seed,
                                unsigned long long offset, unsigned long long i, double lo,
                                double hi, int lane = -1) {
  fc_rng_group(c, seed, offset, i >> 1, lane, 2);
  const double u = (fc_rng_place(i, lane) & 1) ? fc_unit_double(c.w2, c.w3)
                                                : fc_unit_double(c.w0, c.w1);
  if (lo == 0.0 && hi == 1.0) return u;
  return __dadd_rn(lo, __dmul_rn(__dsub_rn(hi, lo), u));
}

FC_DEVICE float fc_rng_normal(fc_rng_cache& c, unsigned long long seed, unsigned long long offset,
                              unsigned long long i, float mean, float std, int lane = -1) {
  fc_rng_group(c, seed, offset, i >> 2, lane, 4);
  const unsigned at = fc_rng_place(i, lane);
  const unsigned a = (at & 2) ? c.w2 : c.w0, b = (at & 2) ? c.w3 : c.w1;
  const float u1 = (float)((a >> 8) + 1u) * 0x1p-24f;
  const float u2 = (float)(b >> 8) * 0x1p-24f;
  const float r = sqrtf(__fmul_rn(-2.0f, logf(u1)));
  float s, co;
  sincosf(__fmul_rn(u2, 6.283185307179586f), &s, &co);
  return __fadd_rn(mean, __fmul_rn(std, __fmul_rn(r, (at & 1) ? s : co)));
}

FC_DEVICE double fc_rng_normal(fc_rng_cache& c, unsigned long long seed,
                               unsigned long long offset, unsigned long long i, double mean,
                               double std, int lane = -1) {
  fc_rng_group(c, seed, offset, i >> 1, lane, 2);
  const double u1 = __dadd_rn(fc_unit_double(c.w0, c.w1), 0x1p-53);
  const double u2 = fc_unit_double(c.w2, c.w3);
  const double r = sqrt(__dmul_rn(-2.0, log(u1)));
  double s, co;
  sincos(__dmul_rn(u2, 6.283185307179586), &s, &co);
  return __dadd_rn(mean, __dmul_rn(std, __dmul_rn(r, (fc_rng_place(i, lane) & 1) ? s : co)));
}

#endif  // FC_PRELUDE_PHILOX
