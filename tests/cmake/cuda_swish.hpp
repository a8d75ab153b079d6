#pragma once
// SwishOps<CudaSpace>: the consumer's own GPU kernels behind its Swish layer (swish.hpp, which
// includes this file when nvcc compiles it). Each op queues one kernel on the Device's stream —
// the stream every dpml layer of the model runs on — so the layer is ordered with its neighbours
// and the trainer's gradient buckets without any synchronisation. T: bf16 or float, arithmetic in
// fp32, one rounding on the store.
//
//   forward, backward_input   element-wise, a grid-stride loop over rows · cols
//   backward_weight           dβ (cols) += Σ_rows …: a block covers 32 columns with 8 row lanes,
//                             each lane sums every 8th row, then lane 0 adds the 8 partial sums in
//                             a fixed order (deterministic: the same bits on every run and rank)

#include "swish.hpp"

#include <dpml/core/bf16.hpp>
#include <dpml/core/cuda_error.hpp>
#include <dpml/kernels/cuda/device.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace consumer {

namespace swish_kernels {

constexpr int kThreads = 256;
constexpr int kColumns = 32, kLanes = 8;  // backward_weight's block: (kColumns, kLanes) threads

__device__ inline float sigmoid(float z) { return 1.f / (1.f + expf(-z)); }

template <class T>
__global__ void forward(const T* x, const T* beta, T* y, std::int64_t n, std::int64_t cols) {  // x, y: (n / cols, cols)
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x) {
    const float v = dpml::to_float(x[i]);
    y[i] = T(v * sigmoid(dpml::to_float(beta[i % cols]) * v));
  }
}

template <class T>
__global__ void backward_input(const T* x, const T* beta, const T* dy, T* dx, std::int64_t n, std::int64_t cols) {
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += std::int64_t{gridDim.x} * blockDim.x) {
    const float b = dpml::to_float(beta[i % cols]), v = dpml::to_float(x[i]), s = sigmoid(b * v);
    dx[i] = T(dpml::to_float(dy[i]) * (s + b * v * s * (1.f - s)));
  }
}

// grid (ceil(cols / kColumns)), block (kColumns, kLanes)
template <class T>
__global__ void backward_weight(const T* x, const T* beta, const T* dy, T* dbeta, std::int64_t rows, std::int64_t cols) {
  __shared__ float partial[kLanes][kColumns];
  const std::int64_t c = std::int64_t{blockIdx.x} * kColumns + threadIdx.x;
  float sum = 0.f;
  if (c < cols) {
    const float b = dpml::to_float(beta[c]);
    for (std::int64_t r = threadIdx.y; r < rows; r += kLanes) {
      const float v = dpml::to_float(x[r * cols + c]), s = sigmoid(b * v);
      sum += dpml::to_float(dy[r * cols + c]) * v * v * s * (1.f - s);
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.f;
    for (int lane = 0; lane < kLanes; ++lane) total += partial[lane][threadIdx.x];
    dbeta[c] = T(dpml::to_float(dbeta[c]) + total);
  }
}

inline unsigned blocks_for(std::int64_t n) {  // a grid-stride loop's grid: at most 1024 blocks
  return static_cast<unsigned>(std::min<std::int64_t>((n + kThreads - 1) / kThreads, 1024));
}

}  // namespace swish_kernels

template <>
struct SwishOps<dpml::CudaSpace> {
  using Dev = dpml::kernels::Device<dpml::CudaSpace>;

  // y (rows, cols) = x · σ(β x), beta (cols)
  template <class T>
  static void forward(Dev& dev, const T* x, const T* beta, T* y, std::int64_t rows, std::int64_t cols) {
    const std::int64_t n = rows * cols;
    if (n == 0) return;
    swish_kernels::forward<<<swish_kernels::blocks_for(n), swish_kernels::kThreads, 0, dev.stream()>>>(x, beta, y, n, cols);
    DPML_CHECK_LAUNCH();
  }
  // dx (rows, cols) = dy · (σ + β x σ (1 − σ))
  template <class T>
  static void backward_input(Dev& dev, const T* x, const T* beta, const T* dy, T* dx, std::int64_t rows, std::int64_t cols) {
    const std::int64_t n = rows * cols;
    if (n == 0) return;
    swish_kernels::backward_input<<<swish_kernels::blocks_for(n), swish_kernels::kThreads, 0, dev.stream()>>>(x, beta, dy, dx,
                                                                                                              n, cols);
    DPML_CHECK_LAUNCH();
  }
  // dbeta (cols) += Σ_rows dy · x² σ (1 − σ)
  template <class T>
  static void backward_weight(Dev& dev, const T* x, const T* beta, const T* dy, T* dbeta, std::int64_t rows, std::int64_t cols) {
    if (cols == 0) return;
    const auto blocks = static_cast<unsigned>((cols + swish_kernels::kColumns - 1) / swish_kernels::kColumns);
    swish_kernels::backward_weight<<<blocks, dim3(swish_kernels::kColumns, swish_kernels::kLanes), 0, dev.stream()>>>(
        x, beta, dy, dbeta, rows, cols);
    DPML_CHECK_LAUNCH();
  }
};

}  // namespace consumer
