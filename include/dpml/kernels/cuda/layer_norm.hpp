#pragma once
// Layer normalisation over the last dimension, device kernels (the maths of
// kernels/host/layer_norm.hpp): bf16 or fp32 activations and parameters, fp32 statistics.
//
//   forward           one warp per row: mean, then Σ(x − μ)² from a second pass over the row
//                     (the row is hot in L1, and two passes avoid E[x²] − μ² cancellation);
//                     saves μ and rstd (rows) in fp32 for the backward
//   backward_input    one warp per row: dx = rstd·(g − mean(g) − x̂·mean(g·x̂)),  g = dy·w
//   backward_weight   dw += Σ_rows dy·x̂, db += Σ_rows dy — column sums over the rows, in two
//                     deterministic stages without atomics (reduce.hpp)
//
// Launchers take the stream and never synchronise. `scratch` for backward_weight holds
// layer_norm_weight_scratch(rows, C) floats.

#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/reduce.hpp"

#include <cuda_runtime.h>

#include <cstdint>

namespace dpml::kernels::cuda {

namespace detail::ln {

inline constexpr int kWarpsPerBlock = 4;

template <class T>
__global__ void forward_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                               T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
                               std::int64_t rows, int C, float eps) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const T* xr = x + r * C;  // (C)
  float s = 0.f;
  for (int c = lane; c < C; c += 32) s += load_f(xr[c]);
  const float mu = warp_sum(s) / static_cast<float>(C);
  float v = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float d = load_f(xr[c]) - mu;
    v += d * d;
  }
  const float rs = rsqrtf(warp_sum(v) / static_cast<float>(C) + eps);
  T* yr = y + r * C;
  for (int c = lane; c < C; c += 32) yr[c] = from_f<T>((load_f(xr[c]) - mu) * rs * load_f(w[c]) + load_f(b[c]));
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

template <class T>
__global__ void backward_input_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                                      const float* __restrict__ mean, const float* __restrict__ rstd,
                                      T* __restrict__ dx, std::int64_t rows, int C) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const T *dyr = dy + r * C, *xr = x + r * C;
  const float mu = mean[r], rs = rstd[r];
  float gs = 0.f, gxs = 0.f;
  for (int c = lane; c < C; c += 32) {
    const float g = load_f(dyr[c]) * load_f(w[c]), xh = (load_f(xr[c]) - mu) * rs;
    gs += g;
    gxs += g * xh;
  }
  const float g_mean = warp_sum(gs) / static_cast<float>(C), gx_mean = warp_sum(gxs) / static_cast<float>(C);
  T* dxr = dx + r * C;
  for (int c = lane; c < C; c += 32) {
    const float g = load_f(dyr[c]) * load_f(w[c]), xh = (load_f(xr[c]) - mu) * rs;
    dxr[c] = from_f<T>(rs * (g - g_mean - xh * gx_mean));
  }
}

// dy·x̂ and dy at (r, c), for the column sums of the weight gradient.
template <class T>
struct WeightTerms {
  const T* dy;
  const T* x;
  const float* mean;
  const float* rstd;
  int C;
  __device__ Sums<2> operator()(std::int64_t r, int c) const {
    const float g = load_f(dy[r * C + c]);
    return {{g * (load_f(x[r * C + c]) - mean[r]) * rstd[r], g}};
  }
};
template <class T>
struct AddInto {
  T* dw;
  T* db;
  __device__ void operator()(int c, const Sums<2>& s) const {
    dw[c] = from_f<T>(load_f(dw[c]) + s.v[0]);
    db[c] = from_f<T>(load_f(db[c]) + s.v[1]);
  }
};

}  // namespace detail::ln

// Floats of scratch that layer_norm_backward_weight needs.
inline std::int64_t layer_norm_weight_scratch(std::int64_t rows, std::int64_t C) { return column_sums_scratch(rows, C, 2); }

// x, y (rows, C); w, b (C); mean, rstd (rows), fp32.
template <class T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, float* mean, float* rstd, std::int64_t rows,
                        std::int64_t C, float eps, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  if (rows == 0) return;
  using namespace detail::ln;
  forward_kernel<<<static_cast<unsigned>(ceil_div(rows, kWarpsPerBlock)), kWarpsPerBlock * 32, 0, stream>>>(
      x, w, b, y, mean, rstd, rows, static_cast<int>(C), eps);
  DPML_CHECK_LAUNCH();
}

// dx (rows, C), overwritten.
template <class T>
void layer_norm_backward_input(const T* dy, const T* x, const T* w, const float* mean, const float* rstd, T* dx,
                               std::int64_t rows, std::int64_t C, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  if (rows == 0) return;
  using namespace detail::ln;
  backward_input_kernel<<<static_cast<unsigned>(ceil_div(rows, kWarpsPerBlock)), kWarpsPerBlock * 32, 0, stream>>>(
      dy, x, w, mean, rstd, dx, rows, static_cast<int>(C));
  DPML_CHECK_LAUNCH();
}

// dw, db (C) += the weight and bias gradients; scratch: layer_norm_weight_scratch(rows, C) floats.
template <class T>
void layer_norm_backward_weight(const T* dy, const T* x, const float* mean, const float* rstd, T* dw, T* db,
                                float* scratch, std::int64_t rows, std::int64_t C, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  column_sums<2>(detail::ln::WeightTerms<T>{dy, x, mean, rstd, static_cast<int>(C)}, detail::ln::AddInto<T>{dw, db},
                 scratch, rows, C, stream);
}

}  // namespace dpml::kernels::cuda
