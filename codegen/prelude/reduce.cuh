// fusion-cache prelude: reduce.
// Warp and block reductions as templates over an op functor, and Welford (mean, m2, count)
// for var / var_mean / normalizations.
//
// An op functor has `T operator()(T, T) const` and `T identity() const`. Results do not depend
// on timing: for a given block shape every combine happens in a fixed order, so a kernel gives
// the same bits run after run (not the same bits as torch, whose order differs).
#ifndef FC_PRELUDE_REDUCE
#define FC_PRELUDE_REDUCE

template <typename T> struct fc_op_sum {
  static constexpr bool symmetric = true;  // op(a, b) has the bits of op(b, a)
  FC_DEVICE T identity() const { return T(0); }
  FC_DEVICE T operator()(T a, T b) const { return a + b; }
};
template <typename T> struct fc_op_prod {
  static constexpr bool symmetric = true;  // op(a, b) has the bits of op(b, a)
  FC_DEVICE T identity() const { return T(1); }
  FC_DEVICE T operator()(T a, T b) const { return a * b; }
};
// max / min propagate NaN like torch.amax / amin.
template <typename T> struct fc_op_max {
  // max(-0, +0) and max(+0, -0) may keep different zeros
  static constexpr bool symmetric = false;
  FC_DEVICE T identity() const { return fc_limits<T>::lowest(); }
  FC_DEVICE T operator()(T a, T b) const { return fc_maximum(a, b); }
};
template <typename T> struct fc_op_min {
  // min(-0, +0) and min(+0, -0) may keep different zeros
  static constexpr bool symmetric = false;
  FC_DEVICE T identity() const { return fc_limits<T>::highest(); }
  FC_DEVICE T operator()(T a, T b) const { return fc_minimum(a, b); }
};

// ---- Welford -------------------------------------------------------------------------------
// N is the count type: int is enough below 2^31 elements per reduction, int64_t otherwise.

template <typename T, typename N = int> struct fc_welford {
  T mean;
  T m2;  // sum of squared deviations from the mean
  N count;
};

template <typename T, typename N = int> FC_DEVICE fc_welford<T, N> fc_welford_init() {
  fc_welford<T, N> w;
  w.mean = T(0);
  w.m2 = T(0);
  w.count = N(0);
  return w;
}

template <typename T, typename N>
FC_DEVICE fc_welford<T, N> fc_welford_update(fc_welford<T, N> w, T x) {
  w.count += N(1);
  const T delta = x - w.mean;
  w.mean += delta / T(w.count);
  w.m2 += delta * (x - w.mean);
  return w;
}

// Chan et al.'s parallel combine; empty sides pass the other through unchanged.
template <typename T, typename N>
FC_DEVICE fc_welford<T, N> fc_welford_combine(fc_welford<T, N> a, fc_welford<T, N> b) {
  if (b.count == N(0)) return a;
  if (a.count == N(0)) return b;
  const N n = a.count + b.count;
  const T b_frac = T(b.count) / T(n);
  const T delta = b.mean - a.mean;
  fc_welford<T, N> r;
  r.mean = a.mean + delta * b_frac;
  r.m2 = a.m2 + b.m2 + delta * delta * T(a.count) * b_frac;
  r.count = n;
  return r;
}

// N / n, the weight of a combine in fc_welford_add: for float the fast division (2 ulp),
// without the IEEE division's slow-path branch and call.
template <typename T> FC_DEVICE T fc_weight(T num, T den) { return num / den; }
template <> FC_DEVICE float fc_weight<float>(float num, float den) { return __fdividef(num, den); }

// Note [Welford add]: adds N values at once (N a power of two): their own mean and m2 by
// two passes over them, then one combine, so a row read from memory pays one division
// every N values. The combine has no empty-side branch (an empty w gets weight N / N = 1
// and keeps m2 = the values'). Nsight Compute had this loop instruction-bound next to a
// plain sum's (var_mean bf16 256x262144: 22 warps waiting on memory per issued instruction
// against the sum's 69); without the branch and slow path it ran 2076 -> 2107-2127 GB/s on
// the H100 (benchmarks/results/sweep-ahead.json against that run's base). Loading two or
// four vectors ahead of this chain did not help (same file).
template <int N, typename T, typename C>
FC_DEVICE fc_welford<T, C> fc_welford_add(fc_welford<T, C> w, const T (&x)[N]) {
  T s = x[0];
#pragma unroll
  for (int i = 1; i < N; ++i) s += x[i];
  const T mean = s * (T(1) / T(N));  // exact: N is a power of two
  T m2 = T(0);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const T d = x[i] - mean;
    m2 += d * d;
  }
  const C n = w.count + C(N);
  const T frac = fc_weight(T(N), T(n));
  const T delta = mean - w.mean;
  w.mean += delta * frac;
  w.m2 += m2 + delta * delta * T(w.count) * frac;
  w.count = n;
  return w;
}

// torch.var semantics: divide by max(count - correction, 0); 0/0 gives NaN as in torch.
template <typename T, typename N>
FC_DEVICE T fc_welford_var(fc_welford<T, N> w, T correction) {
  const T dof = T(w.count) - correction;
  return w.m2 / (dof > T(0) ? dof : T(0));
}

template <typename T, typename N = int> struct fc_op_welford {
  static constexpr bool symmetric = false;
  FC_DEVICE fc_welford<T, N> identity() const { return fc_welford_init<T, N>(); }
  FC_DEVICE fc_welford<T, N> operator()(fc_welford<T, N> a, fc_welford<T, N> b) const {
    return fc_welford_combine(a, b);
  }
};

// ---- shuffles ------------------------------------------------------------------------------

template <typename T> FC_DEVICE T fc_shfl_xor(T v, int lane_mask, unsigned mask = 0xffffffffu) {
  return __shfl_xor_sync(mask, v, lane_mask);
}
template <typename T> FC_DEVICE T fc_shfl(T v, int src_lane, unsigned mask = 0xffffffffu) {
  return __shfl_sync(mask, v, src_lane);
}
template <typename T, typename N>
FC_DEVICE fc_welford<T, N> fc_shfl_xor(fc_welford<T, N> w, int lane_mask,
                                       unsigned mask = 0xffffffffu) {
  w.mean = fc_shfl_xor(w.mean, lane_mask, mask);
  w.m2 = fc_shfl_xor(w.m2, lane_mask, mask);
  w.count = fc_shfl_xor(w.count, lane_mask, mask);
  return w;
}
template <typename T, typename N>
FC_DEVICE fc_welford<T, N> fc_shfl(fc_welford<T, N> w, int src_lane, unsigned mask = 0xffffffffu) {
  w.mean = fc_shfl(w.mean, src_lane, mask);
  w.m2 = fc_shfl(w.m2, src_lane, mask);
  w.count = fc_shfl(w.count, src_lane, mask);
  return w;
}

// Note [Merged row reductions]: independent reductions of one stage (layer norm backward's
// two row sums) travel together as one fc_multi value: one round of shuffles, one pair of
// block barriers and one cluster barrier instead of one each. Each slot keeps its own op.
// Layer norm backward bf16 on the H100: 1204 -> 1495 GB/s at 4096x16384, 912 -> 1137 at
// 1024x65536, where a block works on one row at a time and waits out every barrier
// (benchmarks/results/sweep-partials.json).
template <typename T, int N> struct fc_multi {
  T v[N];
};
template <typename T, int N>
FC_DEVICE fc_multi<T, N> fc_shfl_xor(fc_multi<T, N> m, int lane_mask, unsigned mask = 0xffffffffu) {
#pragma unroll
  for (int i = 0; i < N; ++i) m.v[i] = fc_shfl_xor(m.v[i], lane_mask, mask);
  return m;
}
template <typename T, int N>
FC_DEVICE fc_multi<T, N> fc_shfl(fc_multi<T, N> m, int src_lane, unsigned mask = 0xffffffffu) {
#pragma unroll
  for (int i = 0; i < N; ++i) m.v[i] = fc_shfl(m.v[i], src_lane, mask);
  return m;
}
template <typename T, typename... Ops> struct fc_op_multi {
  static constexpr int N = sizeof...(Ops);
  static constexpr bool symmetric = (Ops::symmetric && ...);
  FC_DEVICE fc_multi<T, N> operator()(fc_multi<T, N> a, fc_multi<T, N> b) const {
    int i = 0;
    ((a.v[i] = Ops()(a.v[i], b.v[i]), ++i), ...);
    return a;
  }
};

// ---- warp reduce ---------------------------------------------------------------------------

FC_DEVICE unsigned fc_lane_mask(unsigned width) {
  return width >= 32u ? 0xffffffffu : ((1u << width) - 1u);
}
FC_DEVICE unsigned fc_linear_tid() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
FC_DEVICE unsigned fc_block_threads() { return blockDim.x * blockDim.y * blockDim.z; }

// Reduces within aligned groups of Width lanes (a power of two <= 32); every lane of the warp
// must be present. Each lane gets its group's result (lanes may differ in the last bits for
// ops that are not commutative bit for bit, such as Welford: use lane 0's when it matters).
template <int Width = 32, typename T, typename Op> FC_DEVICE T fc_warp_reduce(T v, Op op) {
#pragma unroll
  for (int off = Width / 2; off > 0; off /= 2) v = op(v, fc_shfl_xor(v, off));
  return v;
}

// Reduces lanes [0, width) of a warp whose higher lanes may not exist (the last warp of a
// block of n % 32 != 0 threads). The result is complete in lane 0 only.
template <typename T, typename Op>
FC_DEVICE T fc_warp_reduce_partial(T v, Op op, unsigned lane, unsigned width) {
  if (width >= 32u) return fc_warp_reduce(v, op);
  const unsigned mask = fc_lane_mask(width);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const T other = fc_shfl_xor(v, off, mask);
    // Lane i pairs with i + off; a partner past `width` holds nothing of ours. By induction
    // lane 0 ends with lanes [0, width) combined.
    if ((lane ^ (unsigned)off) < width) v = op(v, other);
  }
  return v;
}

// ---- block reduce --------------------------------------------------------------------------
// All threads of the block must call these (they hold __syncthreads). smem must hold at least
// 32 elements of T; it is free for reuse when the call returns.

// Reduces over the whole block (any shape, any thread count up to 1024). Every thread
// receives the result.
template <typename T, typename Op> FC_DEVICE T fc_block_reduce(T v, Op op, T* smem) {
  const unsigned tid = fc_linear_tid(), n = fc_block_threads();
  const unsigned lane = tid & 31u, warp = tid >> 5;
  const unsigned width = n - (warp << 5) < 32u ? n - (warp << 5) : 32u;
  v = fc_warp_reduce_partial(v, op, lane, width);
  if (n <= 32u) return fc_shfl(v, 0, fc_lane_mask(width));
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  // Every thread folds the per-warp partials in the same order: same result everywhere.
  const unsigned nwarps = (n + 31u) >> 5;
  T r = smem[0];
  for (unsigned w = 1; w < nwarps; ++w) r = op(r, smem[w]);
  __syncthreads();
  return r;
}

// Reduces over threadIdx.x separately for each (threadIdx.y, threadIdx.z): one row per y.
// blockDim.x must be a power of two <= 32 or a multiple of 32. Every thread of a row
// receives the row's result.
template <typename T, typename Op> FC_DEVICE T fc_block_reduce_x(T v, Op op, T* smem) {
  const unsigned bdx = blockDim.x;
  const unsigned tid = fc_linear_tid(), n = fc_block_threads();
  const unsigned lane = tid & 31u, warp = tid >> 5;
  if (bdx <= 32u) {
    // Rows live inside a warp; the block may end in a partial warp of whole rows.
    const unsigned width = n - (warp << 5) < 32u ? n - (warp << 5) : 32u;
    const unsigned mask = fc_lane_mask(width);
    for (unsigned off = bdx >> 1; off > 0; off >>= 1) v = op(v, fc_shfl_xor(v, (int)off, mask));
    return fc_shfl(v, (int)(lane & ~(bdx - 1u)), mask);
  }
  v = fc_warp_reduce(v, op);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  const unsigned warps_per_row = bdx >> 5;
  const unsigned first = (warp / warps_per_row) * warps_per_row;
  T r = smem[first];
  for (unsigned w = 1; w < warps_per_row; ++w) r = op(r, smem[first + w]);
  __syncthreads();
  return r;
}

// fc_block_reduce_x with the block shape known at compile time: rows of TX threads (a power
// of two <= 32 or a multiple of 32) in a block of THREADS threads. Constant shapes spare the
// run-time division and the dead branch, which inner kernels run once or twice per row.
// Every thread of a row receives the row's result, with the same bits.
// Note [Alternating row buffers]: with parity >= 0, smem holds two buffers of 32 and calls
// alternate between them (parity 0, 1, 0, ...), which spares the barrier after the reads: a
// warp writes a buffer again two calls later, past the first barrier of the call between,
// which every warp reaches only after reading it. parity < 0: one buffer, two barriers.
// On the H100 layer norm backward f32 256x262144 1962 -> 2074 GB/s, 17 other cases of rows
// over several warps within 1% (benchmarks/results/sweep-alternate.json), but layer norm
// f32 1024x65536 2717 -> 2510 (sweep-alternate_check.json): taken only by kernels keeping
// column partials (schedulers/reduction.py), whose six measured cases moved -0.9% to +5.7%.
template <int TX, int THREADS, typename T, typename Op>
FC_DEVICE T fc_row_reduce(T v, Op op, T* smem, int parity = -1) {
  static_assert(TX <= 32 ? (TX & (TX - 1)) == 0 : TX % 32 == 0, "rows of 2^k <= 32 or 32k threads");
  const unsigned tid = threadIdx.x + TX * threadIdx.y, lane = tid & 31u, warp = tid >> 5;
  if constexpr (TX <= 32) {
    // rows live inside a warp; a block of THREADS % 32 != 0 ends in a partial warp of whole rows
    const unsigned mask = THREADS % 32 == 0 ? 0xffffffffu
        : fc_lane_mask(THREADS - (warp << 5) < 32u ? THREADS - (warp << 5) : 32u);
#pragma unroll
    for (int off = TX / 2; off > 0; off /= 2) v = op(v, fc_shfl_xor(v, off, mask));
    // a butterfly of a symmetric op leaves the same bits in every lane; others take lane 0's
    if constexpr (Op::symmetric) return v;
    else return fc_shfl(v, (int)(lane & ~(unsigned)(TX - 1)), mask);
  } else {
    T* buf = parity > 0 ? smem + 32 : smem;
    v = fc_warp_reduce(v, op);
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    const unsigned first = warp / (TX / 32) * (TX / 32);
    T r = buf[first];
#pragma unroll
    for (int w = 1; w < TX / 32; ++w) r = op(r, buf[first + w]);
    if (parity < 0) __syncthreads();
    return r;  // every thread folded the same partials in the same order
  }
}

// Note [Row fold]: a block's TY thread rows each hold VEC accumulators of the same TX * VEC
// columns; every row's values of S columns a round go to shared memory, the TY values of
// each column are split over the NT / (TX * S) threads sharing it, and those partials are
// folded by each column's thread once more: three barriers a round, all threads working.
// A tree over the rows for each value in turn took VEC * (log2(TY) + 2) barriers with most
// threads idle. H100, both timed in one call (the reduction family against a worktree of
// the tree fold): sums over dim 0 bf16 +2.4 to +3.6% (4096x16384 2354 -> 2431 GB/s,
// 1024x65536 2407 -> 2489), f32 0 to +1.1%; 8x64-thread blocks, which folded 64 rows,
// 2162 -> 2390 (sweep-outer_static.json, sweep-outer_static_fold.json). Every thread row
// gets the results; the order of the folds is fixed, so they are the same bits every run.
template <int TX, int TY, int VEC, int S, typename T, typename Op>
FC_DEVICE void fc_fold_rows(T (&acc)[VEC], Op op, T* smem) {
  constexpr int C = TX * S;                  // columns of a round
  constexpr int NT = TX * TY;
  constexpr int G = NT >= C ? NT / C : 1;    // threads sharing a column
  constexpr int ROWS = TY / G;               // rows each of them folds
  constexpr int PER = NT >= C ? 1 : C / NT;  // columns a thread folds
  static_assert(VEC % S == 0 && TY % G == 0, "fc_fold_rows: S divides VEC, G divides TY");
  T* fold = smem + TY * C;  // G * C partials
  const int t = threadIdx.y * TX + threadIdx.x;
#pragma unroll
  for (int j0 = 0; j0 < VEC; j0 += S) {
#pragma unroll
    for (int j = 0; j < S; ++j) smem[threadIdx.y * C + threadIdx.x * S + j] = acc[j0 + j];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      const int u = t + k * NT, c = u % C, g = u / C;
      T v = smem[g * ROWS * C + c];
#pragma unroll
      for (int r = 1; r < ROWS; ++r) v = op(v, smem[(g * ROWS + r) * C + c]);
      fold[g * C + c] = v;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < S; ++j) {
      const int c = threadIdx.x * S + j;
      T v = fold[c];
#pragma unroll
      for (int g = 1; g < G; ++g) v = op(v, fold[g * C + c]);
      acc[j0 + j] = v;
    }
    __syncthreads();
  }
}

// ---- thread-block clusters (sm_90) -------------------------------------------------------
// Note [Cluster rows]: a row too long for one block's registers is split over the C blocks
// of a thread-block cluster, each keeping its slice. A row reduction is reduced in each block
// first, then the C partials are exchanged through distributed shared memory: block r's
// thread c stores the partial into slot r of block c, one cluster barrier, and every block
// folds slots 0..C-1 in the same order, so all blocks hold the same bits. Slots alternate
// between two buffers call by call: a block writing buffer b again has passed the barrier of
// the call in between, which every block reaches only after reading b. The hardware runs a
// cluster's blocks together, so the barrier cannot deadlock.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
FC_DEVICE unsigned fc_cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

FC_DEVICE void fc_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
               "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Writes v, word by word, to the shared memory of block `rank` at the place `local` has here.
template <typename T> FC_DEVICE void fc_store_remote(T* local, const T& v, unsigned rank) {
  static_assert(sizeof(T) % 4 == 0, "cluster slots move 32-bit words");
  const unsigned addr = (unsigned)__cvta_generic_to_shared(local);
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  const unsigned* words = reinterpret_cast<const unsigned*>(&v);
#pragma unroll
  for (int i = 0; i < (int)(sizeof(T) / 4); ++i)
    asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(remote + 4 * i), "r"(words[i]) : "memory");
}

// Reads the value block `rank` keeps at the place `local` has here.
template <typename T> FC_DEVICE T fc_load_remote(const T* local, unsigned rank) {
  static_assert(sizeof(T) % 4 == 0, "cluster slots move 32-bit words");
  const unsigned addr = (unsigned)__cvta_generic_to_shared(local);
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  T v;
  unsigned* words = reinterpret_cast<unsigned*>(&v);
#pragma unroll
  for (int i = 0; i < (int)(sizeof(T) / 4); ++i)
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(words[i]) : "r"(remote + 4 * i) : "memory");
  return v;
}

// The C partials of this block's row in a slot buffer, folded in slot order.
template <int C, typename T, typename Op> FC_DEVICE T fc_fold_slots(Op op, const T* row_slots) {
  T r = row_slots[0];
#pragma unroll
  for (int i = 1; i < C; ++i) r = op(r, row_slots[i]);
  return r;
}

// v: the block's result for row threadIdx.y (the same in every thread of the row). slots:
// 2 * blockDim.y * C elements of shared memory; phase: 0 or 1, flipped after every call.
template <int C, typename T, typename Op>
FC_DEVICE T fc_cluster_reduce(T v, Op op, T* slots, unsigned phase) {
  T* row_slots = slots + (phase * blockDim.y + threadIdx.y) * C;
  if (threadIdx.x < C) fc_store_remote(row_slots + fc_cluster_rank(), v, threadIdx.x);
  fc_cluster_sync();
  return fc_fold_slots<C>(op, row_slots);
}

// Note [Deferred row end]: fc_cluster_reduce split at its barrier. A block sends a row's
// partial and arrives (fc_cluster_send), computes the next row's first pass, and only then
// waits and folds the partials (fc_cluster_receive) to finish the row; the barrier's latency
// and its release (which waits for the block's earlier output stores) overlap that pass.
// Arrive and wait alternate per thread, as the PTX barrier requires: a block receives row
// k-1 before it sends row k. Two buffers still suffice: a block sends row k into buffer
// k&1 after its wait for row k-1, which every peer reaches only after reading row k-2
// there (each peer reads row k-2 before it sends row k-1).
template <int C, typename T>
FC_DEVICE void fc_cluster_send(const T& v, T* slots, unsigned phase) {
  T* row_slots = slots + (phase * blockDim.y + threadIdx.y) * C;
  if (threadIdx.x < C) fc_store_remote(row_slots + fc_cluster_rank(), v, threadIdx.x);
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}

template <int C, typename T, typename Op>
FC_DEVICE T fc_cluster_receive(Op op, const T* slots, unsigned phase) {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
  return fc_fold_slots<C>(op, slots + (phase * blockDim.y + threadIdx.y) * C);
}

// Note [Cluster exchange]: the cluster barrier above has release semantics, so each thread
// first waits until all its earlier global stores (the previous row's outputs) are
// performed; a block then stalls on memory fences (ncu: "membar", 17-23% of the stalls of
// layer norm backward and softmax over rows of 16384 to 65536 on the H100). This exchange
// needs no fence: thread c sends the partial to block c with st.async, which counts its
// bytes on block c's mbarrier for that slot buffer and row; a row's threads wait for the
// mbarrier's phase there (acquire), and the block that armed it expects C partials. Buffers
// alternate as above, so mbarrier b completes a phase every other call: parity (call/2)&1.
// A block cannot overwrite a buffer a peer still reads: it sends call k+2 only after it has
// all the partials of call k+1, which the peer sends after reading call k. Completions that
// arrive before the expecting arrive leave the count negative for a while, as PTX allows.
FC_DEVICE unsigned fc_smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// Arms `n` mbarriers of one expected arrival each and arrives at the cluster barrier; the
// first exchange waits there, so that no block sends before its peers' mbarriers exist,
// and the wait overlaps the first row's loads. Only the thread that armed them fences.
FC_DEVICE void fc_cluster_bars_init(unsigned long long* bars, int n) {
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    for (int i = 0; i < n; ++i)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(fc_smem_addr(bars + i)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

FC_DEVICE bool fc_bar_try_wait(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile("{\n\t.reg .pred p;\n\t"
               "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
               "selp.u32 %0, 1, 0, p;\n\t}"
               : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  return done != 0;
}

// Writes v to the place `local` has in block `rank`, counted on that block's `bar`.
template <typename T>
FC_DEVICE void fc_send_remote(T* local, const T& v, unsigned rank, unsigned long long* bar) {
  static_assert(sizeof(T) % 4 == 0, "cluster slots move 32-bit words");
  unsigned remote, remote_bar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(fc_smem_addr(local)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_bar) : "r"(fc_smem_addr(bar)), "r"(rank));
  const unsigned* words = reinterpret_cast<const unsigned*>(&v);
#pragma unroll
  for (int i = 0; i < (int)(sizeof(T) / 4); ++i)
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];"
                 ::"r"(remote + 4 * i), "r"(words[i]), "r"(remote_bar) : "memory");
}

// As fc_cluster_reduce, through mbarriers (Note [Cluster exchange]). bars: 2 * blockDim.y
// mbarriers armed by fc_cluster_bars_init; call: 0, 1, 2, ... counted over every call, by
// every thread of the block alike.
template <int C, typename T, typename Op>
FC_DEVICE T fc_cluster_reduce_async(T v, Op op, T* slots, unsigned long long* bars, unsigned call) {
  if (call == 0) asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
  const unsigned buffer = call & 1u;
  T* row_slots = slots + (buffer * blockDim.y + threadIdx.y) * C;
  unsigned long long* bar = bars + buffer * blockDim.y + threadIdx.y;
  if (threadIdx.x == 0)
    asm volatile("mbarrier.arrive.expect_tx.relaxed.cta.shared::cta.b64 _, [%0], %1;"
                 ::"r"(fc_smem_addr(bar)), "r"((unsigned)(C * sizeof(T))) : "memory");
  if (threadIdx.x < C) fc_send_remote(row_slots + fc_cluster_rank(), v, threadIdx.x, bar);
  while (!fc_bar_try_wait(fc_smem_addr(bar), (call >> 1) & 1u)) {
  }
  return fc_fold_slots<C>(op, row_slots);
}
#endif

#endif  // FC_PRELUDE_REDUCE
