#pragma once
// Dropout on the device: the mask kernel and Ops<CudaSpace>'s dropout family (the twin of
// kernels/host/activation.hpp's DropoutOps).
//
// The mask is the host's bit for bit: each thread takes one Philox block — elements 4q … 4q+3 of
// one sample — and asks kernels/dropout_rule.hpp's DropoutRule::kept4, the very function the host
// loop calls, which elements are kept. Philox is ten rounds of integer multiplies, so drawing four
// words per block (not one per element) keeps the kernel near the memory floor: a grid-stride loop
// over samples × ⌈per_sample / 4⌉ blocks, each thread storing its four (or, at a sample's end,
// fewer) consecutive elements. Applying the mask is the element-wise product of
// kernels/cuda/elementwise.hpp (fp32 arithmetic, one rounding on the store).

#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/device.hpp"
#include "dpml/kernels/cuda/elementwise.hpp"
#include "dpml/kernels/dropout_rule.hpp"

#include <cuda_runtime.h>

#include <cstdint>

namespace dpml::kernels::cuda {

namespace detail::dropout {

inline constexpr int kThreads = 256;

// mask (samples, per_sample) ∈ {0, scale}; quads = ⌈per_sample / 4⌉ Philox blocks per sample.
template <class T>
__global__ void mask_kernel(T* mask, std::int64_t samples, std::int64_t per_sample, std::int64_t quads,
                            std::int64_t first_sample, DropoutRule rule, float scale) {
  const T keep = from_f<T>(scale), drop = from_f<T>(0.f);
  const std::int64_t total = samples * quads;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const std::int64_t n = i / quads, q = i - n * quads;  // sample (local), block within it
    const unsigned bits = rule.kept4(static_cast<std::uint64_t>(first_sample + n), static_cast<std::uint64_t>(q));
    T* row = mask + n * per_sample;  // (per_sample)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::int64_t e = 4 * q + j;
      if (e < per_sample) row[e] = (bits >> j) & 1u ? keep : drop;
    }
  }
}

}  // namespace detail::dropout

// mask (samples, per_sample) = scale where `rule` keeps the element of global sample
// first_sample + n, else 0 (the host's dropout_mask).
template <class T>
void dropout_mask(T* mask, std::int64_t samples, std::int64_t per_sample, std::int64_t first_sample,
                  const DropoutRule& rule, float scale, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  const std::int64_t quads = ceil_div(per_sample, 4);
  if (samples * quads == 0) return;
  detail::dropout::mask_kernel<<<grid_for(samples * quads, detail::dropout::kThreads), detail::dropout::kThreads, 0,
                                 stream>>>(mask, samples, per_sample, quads, first_sample, rule, scale);
  DPML_CHECK_LAUNCH();
}

// Ops<CudaSpace>'s dropout family, on the Device's stream (same names and arguments as the host's).
struct DropoutOps {
  using Dev = Device<CudaSpace>;
  // mask (samples, per_sample) ∈ {0, scale}; scale (1/(1−p)) rounded once to T, as on the host
  template <class T>
  static void dropout_mask(Dev& dev, T* mask, std::int64_t samples, std::int64_t per_sample, std::int64_t first_sample,
                           const DropoutRule& rule, double scale) {
    cuda::dropout_mask(mask, samples, per_sample, first_sample, rule, static_cast<float>(scale), dev.stream());
  }
  // y (n) = x (n) · mask (n)
  template <class T>
  static void dropout_apply(Dev& dev, const T* x, const T* mask, T* y, std::int64_t n) {
    cuda::mul(x, mask, y, n, dev.stream());
  }
};

}  // namespace dpml::kernels::cuda
