#pragma once
// Fused softmax + cross-entropy, forward and backward in one kernel, over (N, V) logits.
//
//   loss_n     = logsumexp(x_n) − x_n[target_n]
//   dlogits_n  = (softmax(x_n) − onehot(target_n)) · dloss        written over the logits
//
// One block per row, two passes over the row and no probability buffer: pass 1 streams the
// logits once with an online max/sum (each thread keeps (m, s) with s = Σ exp(x − m), merged
// across the block), which gives logsumexp; pass 2 reads each logit again and writes its gradient
// exp(x − lse) − [j = target] in place. Probabilities are never stored, not even once: for
// GPT-2's (16384, 50304) bf16 logits that is 1.6 GB of traffic saved per step against a softmax
// kernel followed by a loss kernel. Bytes moved: 2 reads + 1 write of the logits (bf16) — the floor.
//
// Columns [V_real, V) are padding (GPT-2's vocabulary 50257 padded to 50304): they are left out of
// the softmax and get zero gradient. A negative target marks an ignored row: zero loss, zero
// gradient. `dloss` is the loss's scale (1/N for a mean over the rows). Losses are fp32, per row.

#include "dpml/kernels/cuda/common.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <cmath>

namespace dpml::kernels::cuda {

namespace detail::xent {

inline constexpr int kThreads = 512;

__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both empty
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    forward_backward_kernel(T* logits, const std::int32_t* __restrict__ targets, float* __restrict__ losses,
                            float dloss, std::int64_t V, std::int64_t V_real) {
  __shared__ float sm[kThreads / 32], ss[kThreads / 32];
  T* x = logits + static_cast<std::int64_t>(blockIdx.x) * V;  // (V)
  const std::int32_t target = targets[blockIdx.x];
  float m = -INFINITY, s = 0.f;
  for (std::int64_t j = threadIdx.x; j < V_real; j += kThreads) {
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
  const float lse = m + logf(s);  // every thread holds the row's logsumexp

  const bool ignored = target < 0;
  if (threadIdx.x == 0) losses[blockIdx.x] = ignored ? 0.f : lse - load_f(x[target]);
  __syncthreads();  // the target logit is read before pass 2 overwrites it
  const float scale = ignored ? 0.f : dloss;
  for (std::int64_t j = threadIdx.x; j < V; j += kThreads) {
    const float p = j < V_real ? __expf(load_f(x[j]) - lse) : 0.f;
    x[j] = from_f<T>((p - (j == target ? 1.f : 0.f)) * scale);
  }
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
  detail::xent::forward_backward_kernel<<<static_cast<unsigned>(N), detail::xent::kThreads, 0, stream>>>(
      logits, targets, losses, dloss, V, V_real);
  DPML_CHECK_LAUNCH();
}

}  // namespace dpml::kernels::cuda
