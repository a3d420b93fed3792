// fusion-cache prelude: index.
// Reads by index and through windows (Note [Gather loads], Note [Resize frames] in
// schedulers/resize.py).
#ifndef FC_PRELUDE_INDEX
#define FC_PRELUDE_INDEX

// An index outside its dim stops the kernel with a device-side assert, as torch's indexing
// kernels do: the context is unusable afterwards (cudaErrorAssert), and the message names
// the op. Out of line, so the check costs the hot path one compare and a branch; declared not
// to return (the assert ends the thread; the trap makes sure), so the caller keeps nothing
// live across the call: an embedding gather's registers 40 -> 25 (48 -> 38 with two vectors
// a thread), which lets more blocks share an SM.
__device__ __noinline__ __attribute__((noreturn)) void fc_index_fail(long long i, long long n,
                                                                    const char* what) {
  printf("fusion_cache: %s: index %lld is out of range for a dim of size %lld\n", what, i, n);
  __assertfail("index out of range (fusion_cache: see the line above)", "fusion_cache kernel", 0,
               what, 1);
  __trap();
}

FC_DEVICE long long fc_check_index(long long i, long long n, const char* what) {
  if (i < 0 || i >= n) fc_index_fail(i, n, what);
  return i;
}

// The zero of a memory type (T() is no expression for `long long`).
template <typename T> FC_DEVICE T fc_zero() { return T(); }

// A vector load that reads nothing and gives zeros where !ok, through the plain path (for
// kernels that also write one of their inputs).
template <int N, typename T> FC_DEVICE fc_vec<T, N> fc_load_vec_or_zero(const T* p, bool ok) {
  fc_vec<T, N> v;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = T();
  if (ok) v = fc_load_vec<N>(p);
  return v;
}

// Note [Scatter kernels] (schedulers/scatter.py): a store that adds to what is there, from
// threads that may hit the same element. 16-bit floats and bools share a 32-bit word with a
// neighbour: a compare-and-swap loop (16-bit floats, each add rounded as torch rounds a
// 16-bit +=) or an or (bool: += on bools is an or) on the word.
FC_DEVICE void fc_atomic_add(float* p, float v) { atomicAdd(p, v); }
FC_DEVICE void fc_atomic_add(double* p, double v) { atomicAdd(p, v); }
FC_DEVICE void fc_atomic_add(int* p, int v) { atomicAdd(p, v); }
FC_DEVICE void fc_atomic_add(long long* p, long long v) {
  atomicAdd(reinterpret_cast<unsigned long long*>(p), (unsigned long long)v);
}
template <typename H> FC_DEVICE void fc_atomic_add_16(H* p, H v) {
  unsigned int* word = reinterpret_cast<unsigned int*>((unsigned long long)p & ~3ull);
  const unsigned shift = ((unsigned long long)p & 2) ? 16 : 0;
  unsigned int old = *word, seen;
  do {
    seen = old;
    H cur;
    cur.bits = (unsigned short)(seen >> shift);
    H sum = fc_cast<H>(fc_to_float(cur) + fc_to_float(v));
    const unsigned int next = (seen & ~(0xffffu << shift)) | ((unsigned int)sum.bits << shift);
    old = atomicCAS(word, seen, next);
  } while (old != seen);
}
FC_DEVICE void fc_atomic_add(fc_half* p, fc_half v) { fc_atomic_add_16(p, v); }
FC_DEVICE void fc_atomic_add(fc_bf16* p, fc_bf16 v) { fc_atomic_add_16(p, v); }
FC_DEVICE void fc_atomic_add(bool* p, bool v) {
  if (!v) return;
  unsigned int* word = reinterpret_cast<unsigned int*>((unsigned long long)p & ~3ull);
  atomicOr(word, 1u << (8 * ((unsigned long long)p & 3)));
}

#endif  // FC_PRELUDE_INDEX
