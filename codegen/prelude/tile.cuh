// fusion-cache prelude: tile.
// Tiles staged through shared memory for kernels whose tensors disagree on their innermost
// dim (codegen/transpose_cuda.py, Note [Transpose tiles]).
#ifndef FC_PRELUDE_TILE
#define FC_PRELUDE_TILE

// One chunk of Bytes (4, 8 or 16) copied global -> shared without a register, zero-filled
// and reading nothing where !ok. 16-byte chunks skip L1 (.cg: the tile is read once); the
// smaller ones can only take .ca.
template <int Bytes> FC_DEVICE void fc_cp_async(void* smem, const void* gmem, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async moves 4, 8 or 16 bytes");
  const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
  if constexpr (Bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 ::"r"(dst), "l"(gmem), "r"(ok ? 16 : 0) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;"
                 ::"r"(dst), "l"(gmem), "n"(Bytes), "r"(ok ? Bytes : 0) : "memory");
  }
#endif
}

FC_DEVICE void fc_cp_async_commit_group() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N> FC_DEVICE void fc_cp_async_wait_groups() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// A chunk of N values of T in shared memory, as one access.
template <int N, typename T> FC_DEVICE fc_vec<T, N> fc_smem_get(const unsigned char* p) {
  return *reinterpret_cast<const fc_vec<T, N>*>(p);
}
template <int N, typename T> FC_DEVICE void fc_smem_put(unsigned char* p, const fc_vec<T, N>& v) {
  *reinterpret_cast<fc_vec<T, N>*>(p) = v;
}

#endif  // FC_PRELUDE_TILE
