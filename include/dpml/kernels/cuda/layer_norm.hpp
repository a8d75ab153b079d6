#pragma once
// Layer normalisation over the last dimension, device kernels (the maths of
// kernels/host/layer_norm.hpp): bf16 or fp32 activations and parameters, fp32 statistics.
//
//   forward           one warp per row: mean, then Σ(x − μ)² from a second pass over the row
//                     (the row is hot in L1, and two passes avoid E[x²] − μ² cancellation);
//                     saves μ and rstd (rows) in fp32 for the backward
//   backward_input    one warp per row: dx = dres + rstd·(g − mean(g) − x̂·mean(g·x̂)),  g = dy·w,
//                     dres an optional residual gradient joining here (a transformer block's
//                     skip connection: no separate add over the activations)
//   backward_weight   dw += Σ_rows dy·x̂, db += Σ_rows dy — column sums over the rows, in two
//                     deterministic stages without atomics (reduce.hpp)
//
// The row kernels move Pack<T, E>s (common.hpp): E = 16 / sizeof(T) elements as one 16-byte
// access where C is a multiple of E and every tensor is 16-byte aligned (GPT-2's C = 768), else
// single elements; backward_weight reads 8 columns per thread and row (Pack8) where C is a
// multiple of 8 and dy and x are 16-byte aligned. Each element is read and written by one lane,
// after the row's sums, so dx may alias dy, x or dres.
//
// Launchers take the stream and never synchronise. `scratch` for backward_weight holds
// layer_norm_weight_scratch(rows, C) floats.

#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/device.hpp"
#include "dpml/kernels/cuda/reduce.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

namespace dpml::kernels::cuda {

namespace detail::ln {

inline constexpr int kWarpsPerBlock = 4;

// Calls f.template operator()<E>() with E = 16 / sizeof(T) where rows of C elements and the given
// tensors (null ones aside) allow 16-byte packs, else with E = 1.
template <class T, class F>
void with_pack(std::int64_t C, std::initializer_list<const void*> tensors, F&& f) {
  constexpr int E = 16 / static_cast<int>(sizeof(T));
  if (whole_packs(C, E, tensors)) f.template operator()<E>();
  else f.template operator()<1>();
}

template <class T, int E>
__global__ void forward_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                               T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd,
                               std::int64_t rows, int C, float eps) {
  using P = Pack<T, E>;
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32, packs = C / E;
  const P* xr = reinterpret_cast<const P*>(x + r * C);  // (C / E)
  float s = 0.f;
  for (int i = lane; i < packs; i += 32) {
    const P xp = xr[i];
#pragma unroll
    for (int k = 0; k < E; ++k) s += load_f(xp.v[k]);
  }
  const float mu = warp_sum(s) / static_cast<float>(C);
  float v = 0.f;
  for (int i = lane; i < packs; i += 32) {
    const P xp = xr[i];
#pragma unroll
    for (int k = 0; k < E; ++k) {
      const float d = load_f(xp.v[k]) - mu;
      v += d * d;
    }
  }
  const float rs = rsqrtf(warp_sum(v) / static_cast<float>(C) + eps);
  const P *wp = reinterpret_cast<const P*>(w), *bp = reinterpret_cast<const P*>(b);
  P* yr = reinterpret_cast<P*>(y + r * C);
  for (int i = lane; i < packs; i += 32) {
    const P xp = xr[i], w_ = wp[i], b_ = bp[i];
    P out;
#pragma unroll
    for (int k = 0; k < E; ++k) out.v[k] = from_f<T>((load_f(xp.v[k]) - mu) * rs * load_f(w_.v[k]) + load_f(b_.v[k]));
    yr[i] = out;
  }
  if (lane == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

template <class T, int E>
__global__ void backward_input_kernel(const T* dy, const T* x, const T* __restrict__ w,
                                      const float* __restrict__ mean, const float* __restrict__ rstd, const T* dres,
                                      T* dx, std::int64_t rows, int C) {
  using P = Pack<T, E>;
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32, packs = C / E;
  const P *dyr = reinterpret_cast<const P*>(dy + r * C), *xr = reinterpret_cast<const P*>(x + r * C);
  const P* wp = reinterpret_cast<const P*>(w);
  const float mu = mean[r], rs = rstd[r];
  float gs = 0.f, gxs = 0.f;
  for (int i = lane; i < packs; i += 32) {
    const P dyp = dyr[i], xp = xr[i], w_ = wp[i];
#pragma unroll
    for (int k = 0; k < E; ++k) {
      const float g = load_f(dyp.v[k]) * load_f(w_.v[k]), xh = (load_f(xp.v[k]) - mu) * rs;
      gs += g;
      gxs += g * xh;
    }
  }
  const float g_mean = warp_sum(gs) / static_cast<float>(C), gx_mean = warp_sum(gxs) / static_cast<float>(C);
  const P* resr = dres ? reinterpret_cast<const P*>(dres + r * C) : nullptr;
  P* dxr = reinterpret_cast<P*>(dx + r * C);
  for (int i = lane; i < packs; i += 32) {
    const P dyp = dyr[i], xp = xr[i], w_ = wp[i];
    P out;
    if (resr) out = resr[i];
#pragma unroll
    for (int k = 0; k < E; ++k) {
      const float g = load_f(dyp.v[k]) * load_f(w_.v[k]), xh = (load_f(xp.v[k]) - mu) * rs;
      const float d = rs * (g - g_mean - xh * gx_mean);
      out.v[k] = from_f<T>(resr ? load_f(out.v[k]) + d : d);
    }
    dxr[i] = out;
  }
}

// Row r's dy·x̂ and dy at the V columns c0 … c0 + V − 1, for the column sums of the weight gradient.
template <int V, class T>
struct WeightTerms {
  const T* dy;
  const T* x;
  const float* mean;
  const float* rstd;
  int C;
  __device__ int setup(int c0) const { return c0; }
  __device__ void add(int c0, std::int64_t r, Sums<2> (&acc)[V]) const {
    float g[V], xv[V];
    load_v<V>(dy + r * C + c0, g);
    load_v<V>(x + r * C + c0, xv);
    const float mu = mean[r], rs = rstd[r];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      acc[e].v[0] += g[e] * (xv[e] - mu) * rs;
      acc[e].v[1] += g[e];
    }
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
  with_pack<T>(C, {x, w, b, y}, [&]<int E>() {
    forward_kernel<T, E><<<static_cast<unsigned>(ceil_div(rows, kWarpsPerBlock)), kWarpsPerBlock * 32, 0, stream>>>(
        x, w, b, y, mean, rstd, rows, static_cast<int>(C), eps);
  });
  DPML_CHECK_LAUNCH();
}

// dx (rows, C) = dres + the input gradient (dres null: none); dx may be dy, x or dres.
template <class T>
void layer_norm_backward_input(const T* dy, const T* x, const T* w, const float* mean, const float* rstd, T* dx,
                               std::int64_t rows, std::int64_t C, cudaStream_t stream, const T* dres = nullptr) {
  static_assert(detail::is_storage_v<T>);
  if (rows == 0) return;
  using namespace detail::ln;
  with_pack<T>(C, {dy, x, w, dres, dx}, [&]<int E>() {
    backward_input_kernel<T, E><<<static_cast<unsigned>(ceil_div(rows, kWarpsPerBlock)), kWarpsPerBlock * 32, 0,
                                  stream>>>(dy, x, w, mean, rstd, dres, dx, rows, static_cast<int>(C));
  });
  DPML_CHECK_LAUNCH();
}

// dw, db (C) += the weight and bias gradients; scratch: layer_norm_weight_scratch(rows, C) floats.
template <class T>
void layer_norm_backward_weight(const T* dy, const T* x, const float* mean, const float* rstd, T* dw, T* db,
                                float* scratch, std::int64_t rows, std::int64_t C, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  using namespace detail::ln;
  const int c = static_cast<int>(C);
  if (detail::whole_packs(C, 8, {dy, x}))
    column_sums_v<2, 8>(WeightTerms<8, T>{dy, x, mean, rstd, c}, AddInto<T>{dw, db}, scratch, rows, C, stream);
  else
    column_sums_v<2, 1>(WeightTerms<1, T>{dy, x, mean, rstd, c}, AddInto<T>{dw, db}, scratch, rows, C, stream);
}

// Ops<CudaSpace>'s LayerNorm family (kernels/host/layer_norm.hpp's twin); statistics in fp32.
struct LayerNormOps {
  using Dev = Device<CudaSpace>;
  template <class T>
  static void layer_norm_forward(Dev& dev, const T* x, const T* w, const T* b, T* y, float* mean, float* rstd,
                                 std::int64_t rows, std::int64_t C, double eps) {
    cuda::layer_norm_forward(x, w, b, y, mean, rstd, rows, C, static_cast<float>(eps), dev.stream());
  }
  template <class T>
  static void layer_norm_backward_input(Dev& dev, const T* dy, const T* x, const T* w, const float* mean,
                                        const float* rstd, T* dx, std::int64_t rows, std::int64_t C,
                                        const T* dres = nullptr) {
    cuda::layer_norm_backward_input(dy, x, w, mean, rstd, dx, rows, C, dev.stream(), dres);
  }
  template <class T>
  static void layer_norm_backward_weight(Dev& dev, const T* dy, const T* x, const float* mean, const float* rstd, T* dw,
                                         T* db, std::int64_t rows, std::int64_t C) {
    cuda::layer_norm_backward_weight(dy, x, mean, rstd, dw, db, dev.scratch<float>(layer_norm_weight_scratch(rows, C)),
                                     rows, C, dev.stream());
  }
};

}  // namespace dpml::kernels::cuda
