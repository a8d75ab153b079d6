#pragma once
// The LSTM cell's element-wise step on a GPU (the maths of kernels/host/lstm.hpp, gates in
// PyTorch's order (i, f, g, o) along the 4H columns): one thread per (row, unit), arithmetic in
// fp32 whatever the storage type. layers::Lstm runs the two GEMMs around it (cuda::LinearOps: the
// input projection of all steps, and each step's recurrent h_{t−1} · W_hhᵀ accumulated into the
// pre-activations), so a GPU LSTM is cuDNN-free: per step one GEMM and one of these kernels.

#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/device.hpp"

#include <cuda_runtime.h>

#include <cstdint>

namespace dpml::kernels::cuda {

namespace detail::lstm {

__device__ __forceinline__ float sigmoid(float z) { return 1.f / (1.f + __expf(-z)); }

template <class T>
__global__ void cell_forward_kernel(T* __restrict__ gates, const T* __restrict__ c_prev, T* __restrict__ c,
                                    T* __restrict__ h, std::int64_t B, std::int64_t H) {
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < B * H;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t b = k / H, j = k % H;
    T* a = gates + b * 4 * H;
    const float i = sigmoid(load_f(a[j])), f = sigmoid(load_f(a[H + j])), g = tanhf(load_f(a[2 * H + j])),
                o = sigmoid(load_f(a[3 * H + j]));
    const float cn = f * (c_prev ? load_f(c_prev[k]) : 0.f) + i * g;
    a[j] = from_f<T>(i), a[H + j] = from_f<T>(f), a[2 * H + j] = from_f<T>(g), a[3 * H + j] = from_f<T>(o);
    c[k] = from_f<T>(cn);
    h[k] = from_f<T>(o * tanhf(cn));
  }
}

template <class T>
__global__ void cell_backward_kernel(const T* __restrict__ gates, const T* __restrict__ c_prev, const T* __restrict__ c,
                                     const T* __restrict__ dy, const T* __restrict__ dh_rec, T* __restrict__ dc,
                                     T* __restrict__ dgates, std::int64_t B, std::int64_t H) {
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < B * H;
       k += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t b = k / H, j = k % H;
    const T* a = gates + b * 4 * H;
    T* d = dgates + b * 4 * H;
    const float i = load_f(a[j]), f = load_f(a[H + j]), g = load_f(a[2 * H + j]), o = load_f(a[3 * H + j]);
    const float tc = tanhf(load_f(c[k])), cp = c_prev ? load_f(c_prev[k]) : 0.f;
    const float dh = load_f(dy[k]) + (dh_rec ? load_f(dh_rec[k]) : 0.f);
    const float dct = load_f(dc[k]) + dh * o * (1.f - tc * tc);
    d[j] = from_f<T>(dct * g * i * (1.f - i));
    d[H + j] = from_f<T>(dct * cp * f * (1.f - f));
    d[2 * H + j] = from_f<T>(dct * i * (1.f - g * g));
    d[3 * H + j] = from_f<T>(dh * tc * o * (1.f - o));
    dc[k] = from_f<T>(dct * f);
  }
}

constexpr int kThreads = 256;

}  // namespace detail::lstm

// Ops<CudaSpace>'s LSTM family (kernels/ops.hpp).
struct LstmOps {
  using Dev = Device<CudaSpace>;
  // gates (B, 4H): pre-activations in, activations out; c_prev (B, H) or null (zeros); c, h (B, H) out
  template <class T>
  static void lstm_cell_forward(Dev& dev, T* gates, const T* c_prev, T* c, T* h, std::int64_t B, std::int64_t H) {
    using detail::lstm::kThreads;
    if (B * H == 0) return;
    detail::lstm::cell_forward_kernel<<<grid_for(B * H, kThreads), kThreads, 0, dev.stream()>>>(gates, c_prev, c, h, B, H);
    DPML_CHECK_LAUNCH();
  }
  // gates, c_prev (or null), c, dy (B, H), dh_rec (or null); dc (B, H) in and out; dgates (B, 4H) out
  template <class T>
  static void lstm_cell_backward(Dev& dev, const T* gates, const T* c_prev, const T* c, const T* dy, const T* dh_rec, T* dc,
                                 T* dgates, std::int64_t B, std::int64_t H) {
    using detail::lstm::kThreads;
    if (B * H == 0) return;
    detail::lstm::cell_backward_kernel<<<grid_for(B * H, kThreads), kThreads, 0, dev.stream()>>>(gates, c_prev, c, dy, dh_rec,
                                                                                                  dc, dgates, B, H);
    DPML_CHECK_LAUNCH();
  }
};

}  // namespace dpml::kernels::cuda
