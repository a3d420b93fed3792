// fusion-cache prelude: index.
// Reads by index and through windows (Note [Gather loads], Note [Resize frames] in
// schedulers/resize.py).
#ifndef FC_PRELUDE_INDEX
#define FC_PRELUDE_INDEX

// An index outside its dim stops the kernel with a device-side assert, as torch's indexing
// kernels do: the context is unusable afterwards (cudaErrorAssert), and the message names
// the op. Out of line, so the check costs the hot path one compare and a branch.
__device__ __noinline__ void fc_index_fail(long long i, long long n, const char* what) {
  printf("fusion_cache: %s: index %lld is out of range for a dim of size %lld\n", what, i, n);
  __assertfail("index out of range (fusion_cache: see the line above)", "fusion_cache kernel", 0,
               what, 1);
}

FC_DEVICE long long fc_check_index(long long i, long long n, const char* what) {
  if (i < 0 || i >= n) fc_index_fail(i, n, what);
  return i;
}

// A vector load that reads nothing and gives zeros where !ok, through the plain path (for
// kernels that also write one of their inputs).
template <int N, typename T> FC_DEVICE fc_vec<T, N> fc_load_vec_or_zero(const T* p, bool ok) {
  fc_vec<T, N> v;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = T();
  if (ok) v = fc_load_vec<N>(p);
  return v;
}

#endif  // FC_PRELUDE_INDEX
