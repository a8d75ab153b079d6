#pragma once
// BatchNorm2d over NHWC activations (the maths of kernels/host/batch_norm.hpp), device kernels: x
// is viewed as (rows = N·H·W, C), so a channel is a column and its statistics are column sums.
//
//   forward, training   mean = Σx / M, then var = Σ(x − mean)² / M (two passes, as the host:
//                       no E[x²] − mean² cancellation), rstd = 1/√(var + eps); running_mean and
//                       running_var move by `momentum` towards mean and the unbiased M/(M−1)·var
//                       (PyTorch's rule); M = rows
//   forward, eval       mean and rstd from the running statistics (written to mean/rstd, so the
//                       backward reads the same buffers in both modes)
//   both                y = act(x̂·γ + β + residual), x̂ = (x − mean)·rstd; residual optional,
//                       act = ReLU or identity — the tail of a ResNet block in one pass
//   backward            g = dy·[y > 0] (with ReLU), d_residual = g (when the forward added one);
//                       dβ += Σg, dγ += Σg·x̂; dx = γ·rstd·(g − Σg/M − x̂·Σg·x̂/M) in training,
//                       γ·rstd·g in eval
//
// Column sums are reduce.hpp's two deterministic stages (partials per 256-row chunk, then one
// thread per channel adds them in chunk order): no float atomics, the same bits every run. The
// element-wise passes move 8 channels (16 bytes of bf16) per thread when C % 8 == 0 and the
// tensors are 16-byte aligned, one element otherwise.
//
// Types: activations T (bf16, f16 or float), γ, β and their gradients P (float or 16-bit), the
// statistics mean, rstd and the running statistics fp32 (C). A synchronised variant would
// all-reduce the two column sums of each pass across the data axis before they are used; that is
// not wired here. Launchers take the stream and never synchronise.

#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/elementwise.hpp"
#include "dpml/kernels/cuda/reduce.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

namespace dpml::kernels::cuda {

struct BatchNormConfig {
  bool training = true;  // batch statistics (and the running-statistics update) or running statistics
  bool relu = false;     // y = relu(bn(x) + residual)
  float momentum = 0.1f;
  float eps = 1e-5f;
};

namespace detail::bn {

inline constexpr int kThreads = 256;

// V consecutive channels of one row as floats: one 16-byte vector (V = 8) or one element.
template <int V, class T>
__device__ __forceinline__ void load_v(const T* p, float (&v)[V]) {
  if constexpr (V == 8) {
    const ew::Pack8<T> pk = *reinterpret_cast<const ew::Pack8<T>*>(p);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = load_f(pk.v[e]);
  } else {
    static_assert(V == 1);
    v[0] = load_f(*p);
  }
}
template <int V, class T>
__device__ __forceinline__ void store_v(T* p, const float (&v)[V]) {
  if constexpr (V == 8) {
    ew::Pack8<T> pk;
#pragma unroll
    for (int e = 0; e < 8; ++e) pk.v[e] = from_f<T>(v[e]);
    *reinterpret_cast<ew::Pack8<T>*>(p) = pk;
  } else {
    static_assert(V == 1);
    *p = from_f<T>(v[0]);
  }
}

// ---- statistics (column_sums functors) ----
template <class T>
struct Value {  // x (rows, C)
  const T* x;
  int C;
  __device__ Sums<1> operator()(std::int64_t r, int c) const { return {{load_f(x[r * C + c])}}; }
};
struct StoreMean {
  float* mean;
  float count;
  __device__ void operator()(int c, const Sums<1>& s) const { mean[c] = s.v[0] / count; }
};
template <class T>
struct SquaredDeviation {
  const T* x;
  const float* mean;
  int C;
  __device__ Sums<1> operator()(std::int64_t r, int c) const {
    const float d = load_f(x[r * C + c]) - mean[c];
    return {{d * d}};
  }
};
struct FinishStatistics {  // rstd, and the running statistics (when given)
  const float* mean;
  float* rstd;
  float* running_mean;
  float* running_var;
  float count, momentum, eps;
  __device__ void operator()(int c, const Sums<1>& s) const {
    const float var = s.v[0] / count;
    rstd[c] = 1.f / sqrtf(var + eps);
    if (running_mean != nullptr) {
      running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * mean[c];
      running_var[c] = (1.f - momentum) * running_var[c] + momentum * var * (count / (count - 1.f));
    }
  }
};

template <int = 0>  // a template only so that several translation units may include the header
__global__ void eval_statistics_kernel(const float* __restrict__ running_mean, const float* __restrict__ running_var,
                                       float* __restrict__ mean, float* __restrict__ rstd, int C, float eps) {
  const int c = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  mean[c] = running_mean[c];
  rstd[c] = 1.f / sqrtf(running_var[c] + eps);
}

// ---- forward: y = act(x̂·γ + β + residual), V channels per thread ----
template <int V, class T, class P>
__global__ void normalize_kernel(const T* x, const T* residual, const float* __restrict__ mean,
                                 const float* __restrict__ rstd, const P* __restrict__ gamma,
                                 const P* __restrict__ beta, T* y, std::int64_t rows, int C, bool relu) {
  const int groups = C / V;  // V-channel groups per row
  const std::int64_t n = rows * groups;
  for (std::int64_t u = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c0 = static_cast<int>(u % groups) * V;
    const std::int64_t at = u / groups * C + c0;
    float v[V], r[V];
    load_v<V>(x + at, v);
    if (residual != nullptr) load_v<V>(residual + at, r);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const int c = c0 + e;
      const float scale = rstd[c] * load_f(gamma[c]);
      float z = (v[e] - mean[c]) * scale + load_f(beta[c]);
      if (residual != nullptr) z += r[e];
      v[e] = relu ? fmaxf(z, 0.f) : z;
    }
    store_v<V>(y + at, v);
  }
}

// ---- backward ----
// {g, g·x̂} with g = dy, masked by the ReLU when y is given (y > 0 ⇔ the pre-activation was > 0).
template <class T>
struct GradTerms {
  const T* dy;
  const T* y;  // nullptr: no ReLU
  const T* x;
  const float* mean;
  const float* rstd;
  int C;
  __device__ Sums<2> operator()(std::int64_t r, int c) const {
    const std::int64_t i = r * C + c;
    const float g = y != nullptr && !(load_f(y[i]) > 0.f) ? 0.f : load_f(dy[i]);
    return {{g, g * (load_f(x[i]) - mean[c]) * rstd[c]}};
  }
};
template <class P>
struct StoreGradSums {  // sums (2, C) = {Σg, Σg·x̂} for dx; dβ += Σg, dγ += Σg·x̂
  float* sums;
  P* dgamma;
  P* dbeta;
  int C;
  __device__ void operator()(int c, const Sums<2>& s) const {
    sums[c] = s.v[0];
    sums[C + c] = s.v[1];
    dbeta[c] = from_f<P>(load_f(dbeta[c]) + s.v[0]);
    dgamma[c] = from_f<P>(load_f(dgamma[c]) + s.v[1]);
  }
};

template <int V, class T, class P>
__global__ void backward_input_kernel(const T* dy, const T* y, const T* x, const float* __restrict__ mean,
                                      const float* __restrict__ rstd, const P* __restrict__ gamma,
                                      const float* __restrict__ sums, T* dx, T* dresidual, std::int64_t rows, int C,
                                      bool training) {
  const int groups = C / V;
  const std::int64_t n = rows * groups;
  const float inv_m = 1.f / static_cast<float>(rows);
  for (std::int64_t u = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c0 = static_cast<int>(u % groups) * V;
    const std::int64_t at = u / groups * C + c0;
    float g[V], xv[V], yv[V];
    load_v<V>(dy + at, g);
    load_v<V>(x + at, xv);
    if (y != nullptr) {
      load_v<V>(y + at, yv);
#pragma unroll
      for (int e = 0; e < V; ++e) g[e] = yv[e] > 0.f ? g[e] : 0.f;  // as GradTerms
    }
    if (dresidual != nullptr) store_v<V>(dresidual + at, g);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const int c = c0 + e;
      const float k = load_f(gamma[c]) * rstd[c];
      if (training) {
        const float xhat = (xv[e] - mean[c]) * rstd[c];
        xv[e] = k * (g[e] - sums[c] * inv_m - xhat * sums[C + c] * inv_m);
      } else {
        xv[e] = k * g[e];
      }
    }
    store_v<V>(dx + at, xv);
  }
}

// 8 channels per thread when every tensor allows 16-byte vectors.
template <class T>
bool vec8(std::int64_t C, std::initializer_list<const T*> ptrs) {
  if (C % 8 != 0) return false;
  for (const T* p : ptrs)
    if (p != nullptr && !aligned16(p)) return false;
  return true;
}

inline void check(std::int64_t rows, std::int64_t C, const BatchNormConfig& cfg, const char* pass) {
  DPML_REQUIRE(rows >= 0 && C > 0 && C < (std::int64_t{1} << 31) && cfg.eps > 0.f,
               "batch_norm " << pass << ": rows=" << rows << " C=" << C << " eps=" << cfg.eps << " out of range");
  DPML_REQUIRE(!cfg.training || rows > 1, "batch_norm " << pass
                                                       << ": training needs more than one value per channel, got rows="
                                                       << rows << " (N·H·W)");
}

}  // namespace detail::bn

// Floats of scratch that batch_norm_forward and batch_norm_backward need: the column sums'
// partials, then the backward's (2, C) sums.
inline std::int64_t batch_norm_scratch(std::int64_t rows, std::int64_t C) {
  return column_sums_scratch(rows, C, 2) + 2 * C;
}

// x, y, residual (rows = N·H·W, C); gamma, beta (C); mean, rstd (C) fp32, written (saved for the
// backward); running_mean, running_var (C) fp32: updated in training (may be null: no update),
// read in eval. residual may be null; y may alias x or residual.
template <class T, class P>
void batch_norm_forward(const T* x, const T* residual, const P* gamma, const P* beta, T* y, float* mean, float* rstd,
                        float* running_mean, float* running_var, std::int64_t rows, std::int64_t C,
                        const BatchNormConfig& cfg, float* scratch, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T> && detail::is_storage_v<P>);
  using namespace detail::bn;
  check(rows, C, cfg, "forward");
  DPML_REQUIRE(cfg.training ? (running_mean == nullptr) == (running_var == nullptr)
                            : running_mean != nullptr && running_var != nullptr,
               "batch_norm forward (rows=" << rows << ", C=" << C << "): running_mean and running_var are both given"
                                           << (cfg.training ? " or both null" : " in eval mode"));
  const int c = static_cast<int>(C);
  if (cfg.training) {
    const auto count = static_cast<float>(rows);
    column_sums<1>(Value<T>{x, c}, StoreMean{mean, count}, scratch, rows, C, stream);
    column_sums<1>(SquaredDeviation<T>{x, mean, c},
                   FinishStatistics{mean, rstd, running_mean, running_var, count, cfg.momentum, cfg.eps}, scratch, rows,
                   C, stream);
  } else {
    eval_statistics_kernel<><<<static_cast<unsigned>(ceil_div(C, kThreads)), kThreads, 0, stream>>>(
        running_mean, running_var, mean, rstd, c, cfg.eps);
    DPML_CHECK_LAUNCH();
  }
  if (rows == 0) return;
  if (vec8<T>(C, {x, residual, y})) {
    normalize_kernel<8><<<grid_for(rows * C / 8, kThreads), kThreads, 0, stream>>>(x, residual, mean, rstd, gamma,
                                                                                   beta, y, rows, c, cfg.relu);
  } else {
    normalize_kernel<1><<<grid_for(rows * C, kThreads), kThreads, 0, stream>>>(x, residual, mean, rstd, gamma, beta, y,
                                                                               rows, c, cfg.relu);
  }
  DPML_CHECK_LAUNCH();
}

// From dy (rows, C) and what the forward saw and saved (x, y when cfg.relu, mean, rstd, gamma):
// dx (rows, C), overwritten; dresidual (rows, C), overwritten when non-null (the forward added a
// residual); dgamma, dbeta (C) += their gradients. dx may alias dy.
template <class T, class P>
void batch_norm_backward(const T* dy, const T* y, const T* x, const float* mean, const float* rstd, const P* gamma,
                         T* dx, T* dresidual, P* dgamma, P* dbeta, std::int64_t rows, std::int64_t C,
                         const BatchNormConfig& cfg, float* scratch, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T> && detail::is_storage_v<P>);
  using namespace detail::bn;
  check(rows, C, cfg, "backward");
  DPML_REQUIRE(!cfg.relu || y != nullptr,
               "batch_norm backward (rows=" << rows << ", C=" << C << "): the fused ReLU needs the forward's output y");
  const int c = static_cast<int>(C);
  const T* mask = cfg.relu ? y : nullptr;
  float* sums = scratch + column_sums_scratch(rows, C, 2);  // (2, C)
  column_sums<2>(GradTerms<T>{dy, mask, x, mean, rstd, c}, StoreGradSums<P>{sums, dgamma, dbeta, c}, scratch, rows, C,
                 stream);
  if (rows == 0) return;
  if (vec8<T>(C, {dy, mask, x, dx, dresidual})) {
    backward_input_kernel<8><<<grid_for(rows * C / 8, kThreads), kThreads, 0, stream>>>(
        dy, mask, x, mean, rstd, gamma, sums, dx, dresidual, rows, c, cfg.training);
  } else {
    backward_input_kernel<1><<<grid_for(rows * C, kThreads), kThreads, 0, stream>>>(
        dy, mask, x, mean, rstd, gamma, sums, dx, dresidual, rows, c, cfg.training);
  }
  DPML_CHECK_LAUNCH();
}

}  // namespace dpml::kernels::cuda
