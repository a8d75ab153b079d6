#pragma once
// Fused softmax + cross-entropy, forward and backward in one kernel, over (N, V) logits.
//
//   loss_n     = logsumexp(x_n) − x_n[target_n]
//   dlogits_n  = (softmax(x_n) − onehot(target_n)) · dloss        written over the logits
//
// One block per row and no probability buffer. Where a row fits in shared memory (V·sizeof(T)
// up to the device's per-block limit: GPT-2's 50304 bf16 logits are 98 KiB, two blocks per SM)
// and is a whole number of 16-byte chunks, the row is read from global memory once, into shared
// memory, taking its max on the way; a second pass there gives Σ exp(x − max), so logsumexp; a
// third writes each gradient exp(x − lse) − [j = target] over the logits in global memory. Bytes
// moved: 1 read + 1 write of the logits, the floor. Otherwise the row streams from global memory
// twice: pass 1 with an online max/sum (each thread keeps (m, s) with s = Σ exp(x − m), merged
// across the block), pass 2 writing the gradients. Probabilities are never stored: for GPT-2's
// (16384, 50304) bf16 logits that saves 1.6 GB of traffic per step against a softmax kernel
// followed by a loss kernel.
//
// Columns [V_real, V) are padding (GPT-2's vocabulary 50257 padded to 50304): they are left out of
// the softmax and get zero gradient. A negative target marks an ignored row: zero loss, zero
// gradient. `dloss` is the loss's scale (1/N for a mean over the rows). Losses are fp32, per row.
//
// Vocabulary-parallel (Megatron's, for a tensor-parallel LM head): each tensor rank holds the
// logits of its columns [begin, begin + V) of the padded vocabulary; the streaming form's two
// passes, with the row's max and Σ exp combined over the ranks between them by the caller's
// all-reduces of a (4, N) fp32 workspace `stats` (4·N floats, not logits: 256 KiB at N = 16384):
//   vocab_parallel_xent_stats     pass 1: stats[0] = stats[3] = this shard's max m, stats[1] =
//                                 Σ exp(x − m), stats[2] = the target's logit if the shard holds it
//   all-reduce (max) stats[0]     the row's max M over the vocabulary
//   vocab_parallel_xent_rescale   stats[1] ·= exp(m − M)
//   all-reduce (sum) stats[1..2]  Σ exp(x − M) over the vocabulary, and the target's logit
//   vocab_parallel_xent_finish    pass 2: the loss (the same on every rank) and dlogits in place

#include "dpml/kernels/cuda/common.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace dpml::kernels::cuda {

namespace detail::xent {

inline constexpr int kThreads = 512;

__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both empty
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

// Pass 1 over a row's first `count` logits: (max m, Σ exp(x − m)), online per thread, then merged
// over the block; every thread returns the block's pair.
template <class T>
__device__ __forceinline__ float2 row_max_sum(const T* x, std::int64_t count) {
  __shared__ float sm[kThreads / 32], ss[kThreads / 32];
  float m = -INFINITY, s = 0.f;
  for (std::int64_t j = threadIdx.x; j < count; j += kThreads) {
    const float v = load_f(x[j]);
    if (v > m) {
      s = s * __expf(m - v) + 1.f;
      m = v;
    } else {
      s += __expf(v - m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  m = lane < kThreads / 32 ? sm[lane] : -INFINITY;
  s = lane < kThreads / 32 ? ss[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  return make_float2(m, s);
}

// Pass 2 over a row of V logits, of which the first `count` are real: dlogits = (exp(x − lse) −
// [j = target]) · scale in place, zero on the padding (target: the row's, in this row's columns;
// outside them it matches no j).
template <class T>
__device__ __forceinline__ void write_dlogits(T* x, std::int64_t V, std::int64_t count, float lse, std::int64_t target,
                                              float scale) {
  for (std::int64_t j = threadIdx.x; j < V; j += kThreads) {
    const float p = j < count ? __expf(load_f(x[j]) - lse) : 0.f;
    x[j] = from_f<T>((p - (j == target ? 1.f : 0.f)) * scale);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    forward_backward_kernel(T* logits, const std::int32_t* __restrict__ targets, float* __restrict__ losses,
                            float dloss, std::int64_t V, std::int64_t V_real) {
  T* x = logits + static_cast<std::int64_t>(blockIdx.x) * V;  // (V)
  const std::int32_t target = targets[blockIdx.x];
  const float2 ms = row_max_sum(x, V_real);
  const float lse = ms.x + logf(ms.y);  // every thread holds the row's logsumexp

  const bool ignored = target < 0;
  if (threadIdx.x == 0) losses[blockIdx.x] = ignored ? 0.f : lse - load_f(x[target]);
  __syncthreads();  // the target logit is read before pass 2 overwrites it
  write_dlogits(x, V, V_real, lse, target, ignored ? 0.f : dloss);
}

// `v` reduced over the block with `op` (identity `id`); every thread gets the result. Reusable
// back to back: the first barrier keeps an earlier call's readers ahead of this call's writers.
template <class Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float id) {
  __shared__ float partial[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? partial[lane] : id;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The shared-memory form (header comment): the row as V / E chunks of E = 16 / sizeof(T) logits in
// dynamic shared memory; column j = c·E + k of chunk c. Same results as forward_backward_kernel
// up to the order of the sums.
template <class T>
__global__ void __launch_bounds__(kThreads)
    resident_forward_backward_kernel(T* logits, const std::int32_t* __restrict__ targets,
                                     float* __restrict__ losses, float dloss, std::int64_t V, std::int64_t V_real) {
  constexpr int E = 16 / static_cast<int>(sizeof(T));
  extern __shared__ uint4 row[];  // (V / E) chunks
  uint4* x = reinterpret_cast<uint4*>(logits + static_cast<std::int64_t>(blockIdx.x) * V);
  const int chunks = static_cast<int>(V / E), real = static_cast<int>(V_real);
  const std::int32_t target = targets[blockIdx.x];
  float m = -INFINITY;
#pragma unroll 4
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    const uint4 v = x[c];
    row[c] = v;
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int k = 0; k < E; ++k)
      if (c * E + k < real) m = fmaxf(m, load_f(e[k]));
  }
  m = block_reduce(m, [](float a, float b) { return fmaxf(a, b); }, -INFINITY);
  float s = 0.f;
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    const uint4 v = row[c];
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int k = 0; k < E; ++k)
      if (c * E + k < real) s += __expf(load_f(e[k]) - m);
  }
  s = block_reduce(s, [](float a, float b) { return a + b; }, 0.f);
  const float lse = m + logf(s);
  const float scale = target < 0 ? 0.f : dloss;
  if (target < 0 && threadIdx.x == 0) losses[blockIdx.x] = 0.f;
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    const uint4 v = row[c];
    const T* e = reinterpret_cast<const T*>(&v);
    uint4 g;
    T* ge = reinterpret_cast<T*>(&g);
#pragma unroll
    for (int k = 0; k < E; ++k) {
      const int j = c * E + k;
      const float xv = load_f(e[k]);
      if (j == target) losses[blockIdx.x] = lse - xv;
      ge[k] = from_f<T>(((j < real ? __expf(xv - lse) : 0.f) - (j == target ? 1.f : 0.f)) * scale);
    }
    x[c] = g;
  }
}

// The columns [begin, begin + V) of a padded vocabulary of V_real real columns: how many are real.
__host__ __device__ inline std::int64_t real_in_shard(std::int64_t begin, std::int64_t V, std::int64_t V_real) {
  return V_real <= begin ? 0 : (V_real - begin < V ? V_real - begin : V);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    vocab_parallel_stats_kernel(const T* logits, const std::int32_t* __restrict__ targets, float* __restrict__ stats,
                                std::int64_t N, std::int64_t V, std::int64_t begin, std::int64_t V_real) {
  const T* x = logits + static_cast<std::int64_t>(blockIdx.x) * V;
  const float2 ms = row_max_sum(x, real_in_shard(begin, V, V_real));
  if (threadIdx.x == 0) {
    const std::int64_t t = targets[blockIdx.x] - begin;
    stats[blockIdx.x] = stats[3 * N + blockIdx.x] = ms.x;
    stats[N + blockIdx.x] = ms.y;
    stats[2 * N + blockIdx.x] = t >= 0 && t < V ? load_f(x[t]) : 0.f;
  }
}

__global__ void vocab_parallel_rescale_kernel(float* stats, std::int64_t N) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const float m = stats[3 * N + i], M = stats[i];
  stats[N + i] = m == -INFINITY ? 0.f : stats[N + i] * __expf(m - M);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    vocab_parallel_finish_kernel(T* logits, const std::int32_t* __restrict__ targets, const float* __restrict__ stats,
                                 float* __restrict__ losses, float dloss, std::int64_t N, std::int64_t V,
                                 std::int64_t begin, std::int64_t V_real) {
  T* x = logits + static_cast<std::int64_t>(blockIdx.x) * V;
  const std::int32_t target = targets[blockIdx.x];
  const float lse = stats[blockIdx.x] + logf(stats[N + blockIdx.x]);
  const bool ignored = target < 0;
  if (threadIdx.x == 0) losses[blockIdx.x] = ignored ? 0.f : lse - stats[2 * N + blockIdx.x];
  write_dlogits(x, V, real_in_shard(begin, V, V_real), lse, target - begin, ignored ? 0.f : dloss);
}

// The most dynamic shared memory a block of the current device may have (the opt-in limit, less
// the block reduction's static array): the longest row the shared-memory form takes.
inline std::size_t max_resident_bytes() {
  static const std::size_t bytes = [] {
    int device = 0, optin = 0;
    DPML_CHECK_CUDA(cudaGetDevice(&device));
    DPML_CHECK_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return static_cast<std::size_t>(optin) - 1024;
  }();
  return bytes;
}

}  // namespace detail::xent

// logits (N, V): in, replaced by dlogits; targets (N) in [0, V_real) or negative (ignored);
// losses (N) fp32, out.
template <class T>
void softmax_cross_entropy(T* logits, const std::int32_t* targets, float* losses, float dloss, std::int64_t N,
                           std::int64_t V, std::int64_t V_real, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  DPML_REQUIRE(V_real > 0 && V_real <= V, "softmax_cross_entropy: V_real=" << V_real << " outside (0, V=" << V << "]");
  if (N == 0) return;
  DPML_REQUIRE(N < (std::int64_t{1} << 31), "softmax_cross_entropy: " << N << " rows is too many for one grid");
  const auto bytes = static_cast<std::size_t>(V) * sizeof(T);
  if (bytes % 16 == 0 && detail::aligned16(logits) && bytes <= detail::xent::max_resident_bytes()) {
    constexpr auto kernel = detail::xent::resident_forward_backward_kernel<T>;
    static const bool opted_in = [] {  // above 48 KiB a kernel must ask for its shared memory
      DPML_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(detail::xent::max_resident_bytes())));
      return true;
    }();
    (void)opted_in;
    kernel<<<static_cast<unsigned>(N), detail::xent::kThreads, bytes, stream>>>(logits, targets, losses, dloss, V, V_real);
  } else {
    detail::xent::forward_backward_kernel<<<static_cast<unsigned>(N), detail::xent::kThreads, 0, stream>>>(
        logits, targets, losses, dloss, V, V_real);
  }
  DPML_CHECK_LAUNCH();
}

// Vocabulary-parallel cross-entropy (header comment): logits (N, V), this rank's columns
// [begin, begin + V) of the padded vocabulary; targets (N) global ids in [0, V_real) or negative;
// stats (4, N) fp32. Pass 1:
template <class T>
void vocab_parallel_xent_stats(const T* logits, const std::int32_t* targets, float* stats, std::int64_t N,
                               std::int64_t V, std::int64_t begin, std::int64_t V_real, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  DPML_REQUIRE(begin >= 0 && V > 0 && V_real > 0, "vocab-parallel cross entropy: shard [" << begin << ", " << begin + V
                                                     << ") of " << V_real << " real columns");
  if (N == 0) return;
  DPML_REQUIRE(N < (std::int64_t{1} << 31), "vocab-parallel cross entropy: " << N << " rows is too many for one grid");
  detail::xent::vocab_parallel_stats_kernel<<<static_cast<unsigned>(N), detail::xent::kThreads, 0, stream>>>(
      logits, targets, stats, N, V, begin, V_real);
  DPML_CHECK_LAUNCH();
}
// After the all-reduce (max) of stats[0]:
inline void vocab_parallel_xent_rescale(float* stats, std::int64_t N, cudaStream_t stream) {
  if (N == 0) return;
  detail::xent::vocab_parallel_rescale_kernel<<<grid_for(N, 256), 256, 0, stream>>>(stats, N);
  DPML_CHECK_LAUNCH();
}
// After the all-reduce (sum) of stats[1..2]: losses (N) and dlogits over the logits, as
// softmax_cross_entropy's.
template <class T>
void vocab_parallel_xent_finish(T* logits, const std::int32_t* targets, const float* stats, float* losses, float dloss,
                                std::int64_t N, std::int64_t V, std::int64_t begin, std::int64_t V_real,
                                cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  if (N == 0) return;
  detail::xent::vocab_parallel_finish_kernel<<<static_cast<unsigned>(N), detail::xent::kThreads, 0, stream>>>(
      logits, targets, stats, losses, dloss, N, V, begin, V_real);
  DPML_CHECK_LAUNCH();
}

}  // namespace dpml::kernels::cuda
