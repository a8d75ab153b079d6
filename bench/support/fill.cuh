#pragma once
// Benchmark inputs written on the device: uniform values in [lo, hi) from a hash of the index — no
// host copies, the same values in every run. Shared by bench/gemm, bench/kernels and bench/conv
// (included by relative path; this folder is not a program).
#include <dpml/core/cuda_error.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace dpml::bench {

template <class T>
__global__ void fill_uniform_kernel(T* p, std::int64_t n, std::uint32_t seed, float lo, float hi) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 0x9e3779b9u ^ seed;
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    const float u = lo + (hi - lo) * static_cast<float>(x & 0xffffff) / 16777216.f;
    if constexpr (std::is_same_v<T, std::int32_t>) p[i] = static_cast<std::int32_t>(u);
    else p[i] = T(u);
  }
}

// p (n) = uniform [lo, hi) values of stream `seed` (integers: truncated), on `stream`.
template <class T>
void fill_uniform(T* p, std::int64_t n, std::uint32_t seed, float lo, float hi, cudaStream_t stream = nullptr) {
  fill_uniform_kernel<<<1024, 256, 0, stream>>>(p, n, seed, lo, hi);
  DPML_CHECK_LAUNCH();
}

}  // namespace dpml::bench
