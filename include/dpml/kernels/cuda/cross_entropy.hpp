#pragma once
// Fused softmax + cross-entropy, forward and backward in one kernel, over (N, V) logits (the
// maths of kernels/host/cross_entropy.hpp).
//
//   loss_n     = logsumexp(x_n) − x_n[target_n]
//   dlogits_n  = (softmax(x_n) − onehot(target_n)) · dloss        written over the logits, or into a
//                                                                 buffer of their own; or not at all
//                                                                 (dlogits null: evaluation)
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
// the softmax and get zero gradient. A target outside [0, V_real) (negative: by choice) marks an
// ignored row: zero loss, zero gradient, and no read outside the row. `dloss` is the loss's scale
// (1/N for a mean over the rows). Losses are fp32, per row; add_row_losses sums them, in double and
// in a fixed order, into a running device scalar (the loss layers' sum: nothing is read back in
// the step).
//
// Vocabulary-parallel (Megatron's, for a tensor-parallel LM head): each tensor rank holds the
// logits of its columns [begin, begin + V) of the padded vocabulary; the streaming form's two
// passes, with the row's max and Σ exp combined over the ranks between them. The layers'
// (layers/vocab_parallel_cross_entropy.hpp) form needs one all-reduce (sum) only, the tensor
// region's conjugate operation, of a (tp, 3, N) fp32 `stats` buffer:
//   vocab_parallel_xent_partials  pass 1: slot `rank` of stats gets this shard's (max m, Σ exp(x − m),
//                                 the target's logit if the shard holds it, else 0), every other
//                                 slot 0, so that the sum gathers every shard's triple exactly
//   all-reduce (sum) stats        (tp·3·N floats: 384 KiB at tp = 2, N = 16384)
//   vocab_parallel_xent_combine   pass 2: M = max_k m_k, S = Σ_k s_k · exp(m_k − M), the loss (the
//                                 same on every rank) and dlogits
//
// count_correct adds a classifier's correct predictions (rows whose first largest real logit is at
// the target: the host's rule) to a running device double, as the losses are summed: one thread
// per row, one atomic add per warp — nothing read back in the step. vocab_xent_count_hits counts
// the same way from the all-reduced stats of the vocabulary-parallel form (a masked LM's accuracy).
//
// CrossEntropyOps at the end is Ops<CudaSpace>'s cross-entropy family (the host twin:
// kernels/host/cross_entropy.hpp); its row losses live in Device::scratch.

#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/device.hpp"

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
// over the block; every thread returns the block's pair. A row of whole 16-byte chunks that starts
// on a 16-byte boundary (`vector`, the same for the whole block) is read a chunk per load: the
// chunk's max first, so that the running sum is rescaled once per chunk.
template <class T>
__device__ __forceinline__ float2 row_max_sum(const T* x, std::int64_t count, std::int64_t V) {
  __shared__ float sm[kThreads / 32], ss[kThreads / 32];
  constexpr int E = 16 / static_cast<int>(sizeof(T));
  float m = -INFINITY, s = 0.f;
  if (V % E == 0 && aligned16(x)) {
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    const std::int64_t chunks = (count + E - 1) / E;
    for (std::int64_t c = threadIdx.x; c < chunks; c += kThreads) {
      const uint4 raw = xv[c];
      const T* e = reinterpret_cast<const T*>(&raw);
      float v[E];
      float cm = -INFINITY;
#pragma unroll
      for (int k = 0; k < E; ++k) {
        v[k] = c * E + k < count ? load_f(e[k]) : -INFINITY;
        cm = fmaxf(cm, v[k]);
      }
      if (cm == -INFINITY) continue;  // nothing real in the chunk (exp(−∞ − −∞) would be NaN)
      if (cm > m) {
        s *= __expf(m - cm);
        m = cm;
      }
#pragma unroll
      for (int k = 0; k < E; ++k) s += __expf(v[k] - m);  // exp(−∞) = 0 past `count`
    }
  } else {
    for (std::int64_t j = threadIdx.x; j < count; j += kThreads) {
      const float v = load_f(x[j]);
      if (v > m) {
        s = s * __expf(m - v) + 1.f;
        m = v;
      } else {
        s += __expf(v - m);
      }
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

// Pass 2 over a row x of V logits, of which the first `count` are real: out = (exp(x − lse) −
// [j = target]) · scale, zero on the padding (target: the row's, in this row's columns; outside
// them it matches no j). out may be x: each element is read before it is written, by one thread.
// 16-byte loads and stores where both rows allow them (row_max_sum's condition).
template <class T>
__device__ __forceinline__ void write_dlogits(const T* x, T* out, std::int64_t V, std::int64_t count, float lse,
                                              std::int64_t target, float scale) {
  constexpr int E = 16 / static_cast<int>(sizeof(T));
  if (V % E == 0 && aligned16(x) && aligned16(out)) {
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    uint4* ov = reinterpret_cast<uint4*>(out);
    for (std::int64_t c = threadIdx.x; c < V / E; c += kThreads) {
      const uint4 raw = xv[c];
      const T* e = reinterpret_cast<const T*>(&raw);
      uint4 g;
      T* ge = reinterpret_cast<T*>(&g);
#pragma unroll
      for (int k = 0; k < E; ++k) {
        const std::int64_t j = c * E + k;
        const float p = j < count ? __expf(load_f(e[k]) - lse) : 0.f;
        ge[k] = from_f<T>((p - (j == target ? 1.f : 0.f)) * scale);
      }
      ov[c] = g;
    }
    return;
  }
  for (std::int64_t j = threadIdx.x; j < V; j += kThreads) {
    const float p = j < count ? __expf(load_f(x[j]) - lse) : 0.f;
    out[j] = from_f<T>((p - (j == target ? 1.f : 0.f)) * scale);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    forward_backward_kernel(const T* logits, T* dlogits, const std::int32_t* __restrict__ targets,
                            float* __restrict__ losses, float dloss, std::int64_t V, std::int64_t V_real) {
  const std::int64_t offset = static_cast<std::int64_t>(blockIdx.x) * V;
  const T* x = logits + offset;  // (V)
  const std::int32_t target = targets[blockIdx.x];
  const float2 ms = row_max_sum(x, V_real, V);
  const float lse = ms.x + logf(ms.y);  // every thread holds the row's logsumexp

  const bool ignored = target < 0 || target >= V_real;
  if (threadIdx.x == 0) losses[blockIdx.x] = ignored ? 0.f : lse - load_f(x[target]);
  if (dlogits == nullptr) return;  // the whole block alike
  __syncthreads();  // the target logit is read before pass 2 may overwrite it (in place)
  write_dlogits(x, dlogits + offset, V, V_real, lse, target, ignored ? 0.f : dloss);
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
    resident_forward_backward_kernel(const T* logits, T* dlogits, const std::int32_t* __restrict__ targets,
                                     float* __restrict__ losses, float dloss, std::int64_t V, std::int64_t V_real) {
  constexpr int E = 16 / static_cast<int>(sizeof(T));
  extern __shared__ uint4 row[];  // (V / E) chunks
  const std::int64_t offset = static_cast<std::int64_t>(blockIdx.x) * V;
  const uint4* x = reinterpret_cast<const uint4*>(logits + offset);
  const int chunks = static_cast<int>(V / E), real = static_cast<int>(V_real);
  const std::int32_t target = targets[blockIdx.x];
  const bool ignored = target < 0 || target >= V_real;
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
  if (threadIdx.x == 0)  // the row in shared memory is complete: block_reduce synchronised
    losses[blockIdx.x] = ignored ? 0.f : lse - load_f(reinterpret_cast<const T*>(row)[target]);
  if (dlogits == nullptr) return;
  const float scale = ignored ? 0.f : dloss;
  uint4* out = reinterpret_cast<uint4*>(dlogits + offset);  // may be x: it is not read again
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    const uint4 v = row[c];
    const T* e = reinterpret_cast<const T*>(&v);
    uint4 g;
    T* ge = reinterpret_cast<T*>(&g);
#pragma unroll
    for (int k = 0; k < E; ++k) {
      const int j = c * E + k;
      ge[k] = from_f<T>(((j < real ? __expf(load_f(e[k]) - lse) : 0.f) - (j == target ? 1.f : 0.f)) * scale);
    }
    out[c] = g;
  }
}

// The columns [begin, begin + V) of a padded vocabulary of V_real real columns: how many are real.
__host__ __device__ inline std::int64_t real_in_shard(std::int64_t begin, std::int64_t V, std::int64_t V_real) {
  return V_real <= begin ? 0 : (V_real - begin < V ? V_real - begin : V);
}

// The layers' vocabulary-parallel form (header comment), pass 1: one block per row.
template <class T>
__global__ void __launch_bounds__(kThreads)
    vocab_parallel_partials_kernel(const T* logits, const std::int32_t* __restrict__ targets,
                                   float* __restrict__ stats, std::int64_t N, std::int64_t V, std::int64_t begin,
                                   std::int64_t V_real, int tp, int rank) {
  const std::int64_t n = blockIdx.x, real = real_in_shard(begin, V, V_real);
  const T* x = logits + n * V;
  const float2 ms = row_max_sum(x, real, V);
  const std::int64_t t = targets[n] - begin;
  for (int i = threadIdx.x; i < 3 * tp; i += kThreads) {  // (slot k, field f) = (i / 3, i % 3)
    const int k = i / 3, f = i % 3;
    float v = 0.f;
    if (k == rank) v = f == 0 ? ms.x : f == 1 ? ms.y : (t >= 0 && t < real ? load_f(x[t]) : 0.f);
    stats[static_cast<std::int64_t>(i) * N + n] = v;
  }
}

// Pass 2, after the all-reduce (sum) of stats: every thread merges the row's tp triples (a few
// broadcast reads), then the loss and this shard's dlogits (out may be the logits).
template <class T>
__global__ void __launch_bounds__(kThreads)
    vocab_parallel_combine_kernel(const T* logits, T* dlogits, const std::int32_t* __restrict__ targets,
                                  const float* __restrict__ stats, float* __restrict__ losses, float dloss,
                                  std::int64_t N, std::int64_t V, std::int64_t begin, std::int64_t V_real, int tp) {
  const std::int64_t n = blockIdx.x;
  float M = -INFINITY, S = 0.f, z = 0.f;
  for (int k = 0; k < tp; ++k) M = fmaxf(M, stats[3 * k * N + n]);
  for (int k = 0; k < tp; ++k) {
    const float m = stats[3 * k * N + n];
    if (m != -INFINITY) S += stats[(3 * k + 1) * N + n] * __expf(m - M);
    z += stats[(3 * k + 2) * N + n];  // one shard holds the target: the others gave 0
  }
  const float lse = M + logf(S);
  const std::int32_t target = targets[n];
  const bool ignored = target < 0 || target >= V_real;
  if (threadIdx.x == 0) losses[n] = ignored ? 0.f : lse - z;
  if (dlogits == nullptr) return;
  write_dlogits(logits + n * V, dlogits + n * V, V, real_in_shard(begin, V, V_real), lse, target - begin,
                ignored ? 0.f : dloss);
}

// *sum += scale · Σ losses (N): one block, each thread's strided share in double, then the warps in
// order — the same sum on every run.
static __global__ void __launch_bounds__(kThreads)
    add_row_losses_kernel(const float* __restrict__ losses, std::int64_t N, double scale, double* __restrict__ sum) {
  __shared__ double partial[kThreads / 32];
  double v = 0;
  for (std::int64_t i = threadIdx.x; i < N; i += kThreads) v += losses[i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
    *sum += total * scale;
  }
}

// *correct += the rows n < N whose first largest logit among [0, V_real) is at targets[n]: a
// thread per row, the warp's hits counted by a ballot and added once (integers: exact in double).
template <class T>
__global__ void __launch_bounds__(kThreads)
    count_correct_kernel(const T* __restrict__ logits, const std::int32_t* __restrict__ targets,
                         double* __restrict__ correct, std::int64_t N, std::int64_t V, std::int64_t V_real) {
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  bool hit = false;
  if (n < N) {
    const T* x = logits + n * V;
    std::int64_t best = 0;
    float top = load_f(x[0]);
    for (std::int64_t j = 1; j < V_real; ++j) {
      const float v = load_f(x[j]);
      if (v > top) top = v, best = j;
    }
    hit = best == targets[n];
  }
  const unsigned hits = __ballot_sync(0xffffffffu, hit);  // every thread of the block gets here
  if (threadIdx.x % 32 == 0 && hits != 0) atomicAdd(correct, static_cast<double>(__popc(hits)));
}

// *hits += the rows n < N with a real target whose logit is the row's max over the all-reduced
// stats (tp, 3, N) (the host's vocab_parallel_count_hits): a thread per row, counted as above.
static __global__ void __launch_bounds__(kThreads)
    vocab_parallel_count_hits_kernel(const std::int32_t* __restrict__ targets, const float* __restrict__ stats,
                                     double* __restrict__ hits, std::int64_t N, std::int64_t V_real, int tp) {
  const std::int64_t n = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  bool hit = false;
  if (n < N && targets[n] >= 0 && targets[n] < V_real) {
    float M = -INFINITY, z = 0.f;
    for (int k = 0; k < tp; ++k) {
      M = fmaxf(M, stats[3 * k * N + n]);
      z += stats[(3 * k + 2) * N + n];
    }
    hit = z >= M;
  }
  const unsigned count = __ballot_sync(0xffffffffu, hit);
  if (threadIdx.x % 32 == 0 && count != 0) atomicAdd(hits, static_cast<double>(__popc(count)));
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

// logits (N, V); dlogits (N, V): out, may be logits (in place), or null (losses only); targets (N)
// in [0, V_real), others ignored; losses (N) fp32, out.
template <class T>
void softmax_cross_entropy(const T* logits, T* dlogits, const std::int32_t* targets, float* losses, float dloss,
                           std::int64_t N, std::int64_t V, std::int64_t V_real, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  DPML_REQUIRE(V_real > 0 && V_real <= V, "softmax_cross_entropy: V_real=" << V_real << " outside (0, V=" << V << "]");
  if (N == 0) return;
  DPML_REQUIRE(N < (std::int64_t{1} << 31), "softmax_cross_entropy: " << N << " rows is too many for one grid");
  const auto bytes = static_cast<std::size_t>(V) * sizeof(T);
  if (bytes % 16 == 0 && detail::aligned16(logits) && (dlogits == nullptr || detail::aligned16(dlogits)) &&
      bytes <= detail::xent::max_resident_bytes()) {
    constexpr auto kernel = detail::xent::resident_forward_backward_kernel<T>;
    static const bool opted_in = [] {  // above 48 KiB a kernel must ask for its shared memory
      DPML_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(detail::xent::max_resident_bytes())));
      return true;
    }();
    (void)opted_in;
    kernel<<<static_cast<unsigned>(N), detail::xent::kThreads, bytes, stream>>>(logits, dlogits, targets, losses, dloss,
                                                                                  V, V_real);
  } else {
    detail::xent::forward_backward_kernel<<<static_cast<unsigned>(N), detail::xent::kThreads, 0, stream>>>(
        logits, dlogits, targets, losses, dloss, V, V_real);
  }
  DPML_CHECK_LAUNCH();
}
// logits (N, V): in, replaced by dlogits.
template <class T>
void softmax_cross_entropy(T* logits, const std::int32_t* targets, float* losses, float dloss, std::int64_t N,
                           std::int64_t V, std::int64_t V_real, cudaStream_t stream) {
  softmax_cross_entropy(static_cast<const T*>(logits), logits, targets, losses, dloss, N, V, V_real, stream);
}

// *sum (one double, device) += scale · Σ losses (N); deterministic.
inline void add_row_losses(const float* losses, std::int64_t N, double scale, double* sum, cudaStream_t stream) {
  if (N == 0) return;
  detail::xent::add_row_losses_kernel<<<1, detail::xent::kThreads, 0, stream>>>(losses, N, scale, sum);
  DPML_CHECK_LAUNCH();
}

// logits (N, V), real columns [0, V_real) (V_real ≥ 1); targets (N); *correct (one double, device)
// += the rows predicted right.
template <class T>
void count_correct(const T* logits, const std::int32_t* targets, double* correct, std::int64_t N, std::int64_t V,
                   std::int64_t V_real, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  DPML_REQUIRE(V_real > 0 && V_real <= V, "count_correct: V_real=" << V_real << " outside (0, V=" << V << "]");
  if (N == 0) return;
  const auto blocks = static_cast<unsigned>(ceil_div(N, detail::xent::kThreads));
  detail::xent::count_correct_kernel<<<blocks, detail::xent::kThreads, 0, stream>>>(logits, targets, correct, N, V, V_real);
  DPML_CHECK_LAUNCH();
}

// The layers' vocabulary-parallel form (header comment), pass 1: logits (N, V), this rank's columns
// [begin, begin + V) of a vocabulary of V_real real columns; targets (N) global ids; stats
// (tp, 3, N) fp32, written whole.
template <class T>
void vocab_parallel_xent_partials(const T* logits, const std::int32_t* targets, float* stats, std::int64_t N,
                                  std::int64_t V, std::int64_t begin, std::int64_t V_real, int tp, int rank,
                                  cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  DPML_REQUIRE(begin >= 0 && V > 0 && V_real > 0 && rank >= 0 && rank < tp,
               "vocab-parallel cross entropy: shard [" << begin << ", " << begin + V << ") of " << V_real
                                                       << " real columns, rank " << rank << " of " << tp);
  if (N == 0) return;
  DPML_REQUIRE(N < (std::int64_t{1} << 31), "vocab-parallel cross entropy: " << N << " rows is too many for one grid");
  detail::xent::vocab_parallel_partials_kernel<<<static_cast<unsigned>(N), detail::xent::kThreads, 0, stream>>>(
      logits, targets, stats, N, V, begin, V_real, tp, rank);
  DPML_CHECK_LAUNCH();
}
// Pass 2, after the all-reduce (sum) of stats over the tensor axis: losses (N) fp32 and dlogits
// (N, V) of this shard (may be logits; null: losses only), as softmax_cross_entropy's.
template <class T>
void vocab_parallel_xent_combine(const T* logits, T* dlogits, const std::int32_t* targets, const float* stats,
                                 float* losses, float dloss, std::int64_t N, std::int64_t V, std::int64_t begin,
                                 std::int64_t V_real, int tp, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  if (N == 0) return;
  detail::xent::vocab_parallel_combine_kernel<<<static_cast<unsigned>(N), detail::xent::kThreads, 0, stream>>>(
      logits, dlogits, targets, stats, losses, dloss, N, V, begin, V_real, tp);
  DPML_CHECK_LAUNCH();
}

// Ops<CudaSpace>'s cross-entropy family (kernels/host/cross_entropy.hpp's twin); the per-row
// losses live in the op's scratch, the running loss is one double on the device.
struct CrossEntropyOps {
  using Dev = Device<CudaSpace>;
  // logits (N, V), real columns [0, V_real); targets (N); dlogits (N, V) or null, may be logits;
  // *loss_sum += scale · Σ_n loss_n; dlogits scaled by scale · loss_scale (fp16 loss scaling)
  template <class T>
  static void softmax_xent(Dev& dev, const T* logits, const std::int32_t* targets, T* dlogits, double* loss_sum,
                           std::int64_t N, std::int64_t V, std::int64_t V_real, double scale, double loss_scale = 1.0) {
    float* losses = dev.scratch<float>(N);  // (N)
    softmax_cross_entropy(logits, dlogits, targets, losses, static_cast<float>(scale * loss_scale), N, V, V_real,
                          dev.stream());
    add_row_losses(losses, N, scale, loss_sum, dev.stream());
  }
  // Vocabulary-parallel pass 1: stats (tp, 3, N) fp32
  template <class T>
  static void vocab_xent_partials(Dev& dev, const T* logits, const std::int32_t* targets, float* stats, std::int64_t N,
                                  std::int64_t V, std::int64_t begin, std::int64_t V_real, int tp, int rank) {
    vocab_parallel_xent_partials(logits, targets, stats, N, V, begin, V_real, tp, rank, dev.stream());
  }
  // Pass 2, after the all-reduce (sum) of stats over the tensor axis
  template <class T>
  static void vocab_xent_finish(Dev& dev, const T* logits, const std::int32_t* targets, const float* stats, T* dlogits,
                                double* loss_sum, std::int64_t N, std::int64_t V, std::int64_t begin,
                                std::int64_t V_real, int tp, double scale, double loss_scale = 1.0) {
    float* losses = dev.scratch<float>(N);  // (N)
    vocab_parallel_xent_combine(logits, dlogits, targets, stats, losses, static_cast<float>(scale * loss_scale), N, V,
                                begin, V_real, tp, dev.stream());
    add_row_losses(losses, N, scale, loss_sum, dev.stream());
  }
  // logits (N, V), real columns [0, V_real); targets (N); *correct += the rows predicted right
  template <class T>
  static void count_correct(Dev& dev, const T* logits, const std::int32_t* targets, double* correct, std::int64_t N,
                            std::int64_t V, std::int64_t V_real) {
    cuda::count_correct(logits, targets, correct, N, V, V_real, dev.stream());
  }
  // After pass 1's all-reduce: *hits += the rows whose real target has the row's largest logit
  static void vocab_xent_count_hits(Dev& dev, const std::int32_t* targets, const float* stats, double* hits,
                                    std::int64_t N, std::int64_t V_real, int tp) {
    if (N == 0) return;
    const auto blocks = static_cast<unsigned>(ceil_div(N, detail::xent::kThreads));
    detail::xent::vocab_parallel_count_hits_kernel<<<blocks, detail::xent::kThreads, 0, dev.stream()>>>(targets, stats, hits,
                                                                                                   N, V_real, tp);
    DPML_CHECK_LAUNCH();
  }
  // The running sum (1, device), then zeroed: one small copy, and the host waits for the stream.
  static double take_loss(Dev& dev, double* loss_sum) {
    double v = 0;
    DPML_CHECK_CUDA(cudaMemcpyAsync(&v, loss_sum, sizeof(double), cudaMemcpyDeviceToHost, dev.stream()));
    DPML_CHECK_CUDA(cudaMemsetAsync(loss_sum, 0, sizeof(double), dev.stream()));
    dev.synchronize();
    return v;
  }
};

}  // namespace dpml::kernels::cuda
