#pragma once
// BatchNorm2d over NHWC activations (the maths of kernels/host/batch_norm.hpp), device kernels: x
// is viewed as (rows = N·H·W, C), so a channel is a column and its statistics are column sums.
//
//   forward, training   one pass of shifted sums per channel, Σ(x − k) and Σ(x − k)² with k
//                       the channel's value in row 0 (no E[x²] − mean² cancellation when the
//                       mean is large against the spread), then mean = k + Σ(x − k)/M,
//                       var = Σ(x − k)²/M − (Σ(x − k)/M)², rstd = 1/√(var + eps); running_mean
//                       and running_var move by `momentum` towards mean and the unbiased
//                       M/(M−1)·var (PyTorch's rule); M = rows (all ranks' rows when synchronised)
//   forward, eval       mean and rstd from the running statistics (written to mean/rstd, so the
//                       backward reads the same buffers in both modes)
//   both                y = act(x·a + b + residual) with a = γ·rstd, b = β − mean·a per channel
//                       (computed once per channel, so the element pass reads two vectors of
//                       coefficients); residual optional, act = ReLU or identity — the tail of a
//                       ResNet block in one pass
//   backward            g = dy·[y > 0] (with ReLU), d_residual = g (when the forward added one);
//                       one pass of Σg and Σg·(x − mean) per channel, so dβ += Σg, dγ += Σg·x̂;
//                       then dx = A·g + B·(x − mean) + C0 with A = γ·rstd, and in training
//                       B = −A·rstd·Σg·x̂/M, C0 = −A·Σg/M (in eval B = C0 = 0)
//
// Column sums are reduce.hpp's two deterministic stages (partials per 256-row chunk, lanes added
// in order): no float atomics, the same bits every run. Every pass moves 8 channels (16 bytes of
// bf16) per thread and row when C % 8 == 0 and the tensors are 16-byte aligned, one element
// otherwise. Per step that is 2 reads and 1 write of x's size forward (plus the residual), and
// 3 reads (dy, y, x) twice and 1–2 writes backward — measured on an H100 in bench/resnet_train.
//
// Synchronised statistics (SyncBatchNorm; the last argument, `across`, see LocalStatistics): in
// training, each pass keeps its two column sums, (2, C) fp32, in scratch instead of using them at
// once; `across` all-reduces them over the data-parallel ranks (one collective of 2C floats on the
// stream) and returns the ranks' total rows M; a tiny per-channel kernel then finishes from the
// totals. Forward: the shift k must be the same on every rank, so it is running_mean — equal on the
// ranks, since every rank moves it by the same global statistics; near the batch mean once
// trained; 0 at the start, where the fp32 variance loses about (mean/std)²·10⁻⁶ relative, below
// bf16's 2⁻⁹ unless a channel's mean exceeds some 40 standard deviations. mean, rstd and the
// running statistics are then the global batch's. Backward: dβ and dγ
// take the local sums (before the all-reduce), as PyTorch's SyncBatchNorm does, so that the data-
// parallel average of the ranks' gradients is the whole batch's; dx takes the totals and M.
//
// Ranks of different sizes (CountedStatistics, the layers' form): each rank's row count travels
// with its sums, (2C + 1) floats in one all-reduce, and the kernels that finish the statistics read
// the total M from device memory — so a global batch that the ranks do not divide evenly (or an
// empty rank) is still exactly the one-rank batch, and no host ever waits for M.
//
// Weight gradients later (the layers' backward_input / backward_weight split): batch_norm_backward
// adds dγ, dβ in the same pass as dx; batch_norm_backward_input keeps this rank's two sums (2, C)
// instead, and batch_norm_weight_grads turns them into dγ, dβ later — a per-channel kernel, no
// second pass over the activations.
//
// Types: activations T (bf16, f16 or float), γ, β and their gradients P (float or 16-bit), the
// statistics mean, rstd and the running statistics fp32 (C). Launchers take the stream and never
// synchronise (the local passes; a synchronised pass waits only as long as `across` does).
//
// At the end: Ops<CudaSpace>'s BatchNorm family (kernels/host/batch_norm.hpp's twin) over NHWC
// images.

#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/device.hpp"
#include "dpml/kernels/cuda/elementwise.hpp"
#include "dpml/kernels/cuda/reduce.hpp"
#include "dpml/kernels/image.hpp"

#include <cuda_runtime.h>

#include <concepts>
#include <cstdint>
#include <type_traits>

namespace dpml::kernels::cuda {

struct BatchNormConfig {
  bool training = true;  // batch statistics (and the running-statistics update) or running statistics
  bool relu = false;     // y = relu(bn(x) + residual)
  float momentum = 0.1f;
  float eps = 1e-5f;
};

// Where a training pass's two per-channel sums come from. LocalStatistics: this call's rows only,
// the sums used where they are made (in the column sums' last stage). A synchronised BatchNorm
// passes instead a callable
//   std::int64_t across(float* sums, std::int64_t C, std::int64_t rows)
// that replaces sums — (2, C) fp32 on the device, final on the launch's stream — by their totals
// over the data-parallel ranks (one all-reduce of 2C floats, ordered on that stream) and returns
// the rows behind the totals (`rows` summed over the ranks).
struct LocalStatistics {};
// Or, where ranks may hold different numbers of rows, CountedStatistics{allreduce} with
//   void allreduce(float* data, std::int64_t n)
// summing n floats over the data-parallel ranks in place, ordered on the launch's stream: the sums
// travel with this rank's row count, (2C + 1) floats, and the kernels read the total from there.
template <class AllReduce>
struct CountedStatistics {
  AllReduce allreduce;
};
template <class AllReduce>
CountedStatistics<AllReduce> counted_statistics(AllReduce allreduce) {
  return {allreduce};
}
namespace detail::bn {
template <class A>
inline constexpr bool is_counted = false;
template <class R>
inline constexpr bool is_counted<CountedStatistics<R>> = true;
}  // namespace detail::bn
template <class A>
concept StatisticsSource = std::same_as<A, LocalStatistics> || detail::bn::is_counted<A> ||
                           requires(const A& a, float* sums, std::int64_t n) {
                             { a(sums, n, n) } -> std::convertible_to<std::int64_t>;
                           };

namespace detail::bn {

inline constexpr int kThreads = 256;

// ---- statistics (column_sums_v functors, V channels per thread) ----
// A thread's channels c0 … c0 + V − 1 and one per-channel vector of them, loaded once (the state
// of the column_sums_v functors below).
template <int V>
struct Channels {
  float v[V];
  int c0;
};
template <int V, class T>
__device__ __forceinline__ Channels<V> channels(const T* per_channel, int c0) {
  Channels<V> st;
  st.c0 = c0;
  load_v<V>(per_channel + c0, st.v);
  return st;
}

template <int V, class T, class S>
struct ShiftedTerms {  // {x − k, (x − k)²}, k = shift[c]: x's row 0 (shift = x) or running_mean
  const T* x;
  const S* shift;  // (C)
  int C;
  __device__ Channels<V> setup(int c0) const { return channels<V>(shift, c0); }
  __device__ void add(const Channels<V>& k, std::int64_t r, Sums<2> (&acc)[V]) const {
    float v[V];
    load_v<V>(x + r * C + k.c0, v);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = v[e] - k.v[e];
      acc[e].v[0] += d;
      acc[e].v[1] += d * d;
    }
  }
};
template <class S, class P>
struct FinishStatistics {  // mean, rstd, the running statistics (when given), the coefficients a, b
  const S* shift;  // (C), ShiftedTerms' k; may be running_mean (read before it is moved)
  const P* gamma;
  const P* beta;
  float* mean;
  float* rstd;
  float* running_mean;
  float* running_var;
  float* coef;  // (2, C): a, b
  float count, momentum, eps;
  int C;
  const float* total = nullptr;  // the ranks' total rows in device memory (counted statistics), else count
  __device__ void operator()(int c, const Sums<2>& s) const {
    const float M = total != nullptr ? *total : count;
    const float d = s.v[0] / M;
    const float m = load_f(shift[c]) + d;
    const float var = fmaxf(s.v[1] / M - d * d, 0.f);
    const float r = 1.f / sqrtf(var + eps);
    mean[c] = m;
    rstd[c] = r;
    if (running_mean != nullptr) {
      running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * m;
      running_var[c] = (1.f - momentum) * running_var[c] + momentum * var * (M / (M - 1.f));
    }
    const float a = r * load_f(gamma[c]);
    coef[c] = a;
    coef[C + c] = load_f(beta[c]) - m * a;
  }
};

template <class P>
__global__ void eval_statistics_kernel(const float* __restrict__ running_mean, const float* __restrict__ running_var,
                                       const P* __restrict__ gamma, const P* __restrict__ beta, float* __restrict__ mean,
                                       float* __restrict__ rstd, float* __restrict__ coef, int C, float eps) {
  const int c = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float m = running_mean[c], r = 1.f / sqrtf(running_var[c] + eps), a = r * load_f(gamma[c]);
  mean[c] = m;
  rstd[c] = r;
  coef[c] = a;
  coef[C + c] = load_f(beta[c]) - m * a;
}

// ---- forward: y = act(x·a + b + residual), V channels per thread ----
template <int V, class T>
__global__ void normalize_kernel(const T* x, const T* residual, const float* __restrict__ coef, T* y,
                                 std::int64_t rows, int C, bool relu) {
  const int groups = C / V;  // V-channel groups per row
  const std::int64_t n = rows * groups;
  for (std::int64_t u = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c0 = static_cast<int>(u % groups) * V;
    const std::int64_t at = u / groups * C + c0;
    float v[V], r[V], a[V], b[V];
    load_v<V>(x + at, v);
    if (residual != nullptr) load_v<V>(residual + at, r);
    load_v<V>(coef + c0, a);
    load_v<V>(coef + C + c0, b);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      float z = v[e] * a[e] + b[e];
      if (residual != nullptr) z += r[e];
      v[e] = relu ? fmaxf(z, 0.f) : z;
    }
    store_v<V>(y + at, v);
  }
}

// ---- backward ----
// g = dy, masked by the ReLU when y is given (y > 0 ⇔ the pre-activation was > 0).
template <int V, class T>
__device__ __forceinline__ void masked_grad(const T* dy, const T* y, std::int64_t at, float (&g)[V]) {
  load_v<V>(dy + at, g);
  if (y != nullptr) {
    float yv[V];
    load_v<V>(y + at, yv);
#pragma unroll
    for (int e = 0; e < V; ++e) g[e] = yv[e] > 0.f ? g[e] : 0.f;
  }
}
template <int V, class T>
struct GradTerms {  // {g, g·(x − mean)}
  const T* dy;
  const T* y;  // nullptr: no ReLU
  const T* x;
  const float* mean;
  int C;
  __device__ Channels<V> setup(int c0) const { return channels<V>(mean, c0); }
  __device__ void add(const Channels<V>& m, std::int64_t r, Sums<2> (&acc)[V]) const {
    const std::int64_t at = r * C + m.c0;
    float g[V], xv[V];
    masked_grad<V>(dy, y, at, g);
    load_v<V>(x + at, xv);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      acc[e].v[0] += g[e];
      acc[e].v[1] += g[e] * (xv[e] - m.v[e]);
    }
  }
};
template <class P>
struct ParamGrads {  // dβ += Σg, dγ += Σg·x̂
  const float* rstd;
  P* dgamma;
  P* dbeta;
  __device__ void operator()(int c, const Sums<2>& s) const {
    dbeta[c] = from_f<P>(load_f(dbeta[c]) + s.v[0]);
    dgamma[c] = from_f<P>(load_f(dgamma[c]) + s.v[1] * rstd[c]);
  }
};
template <class P>
struct InputGradCoefficients {  // coef (3, C) = A, B, C0 of dx, from Σg and Σg·(x − mean) over M rows
  const float* rstd;
  const P* gamma;
  float* coef;
  float inv_m;  // 1/M
  int C;
  bool training;
  const float* total = nullptr;  // M in device memory (counted statistics), else inv_m
  __device__ void operator()(int c, const Sums<2>& s) const {
    const float inv = total != nullptr ? 1.f / *total : inv_m;
    const float r = rstd[c], sg = s.v[0], sgx = s.v[1] * r;  // Σg, Σg·x̂
    const float A = load_f(gamma[c]) * r;
    coef[c] = A;
    coef[C + c] = training ? -A * r * sgx * inv : 0.f;
    coef[2 * C + c] = training ? -A * sg * inv : 0.f;
  }
};
template <class First, class Second>
struct BothOuts {  // two out functors on the same sums
  First first;
  Second second;
  __device__ void operator()(int c, const Sums<2>& s) const {
    first(c, s);
    second(c, s);
  }
};

// StoreSums<2> that also writes this rank's row count after the sums: (2C + 1) floats.
struct StoreSumsAndCount {
  float* sums;
  int C;
  float rows;
  __device__ void operator()(int c, const Sums<2>& s) const {
    StoreSums<2>{sums, C}(c, s);
    if (c == 0) sums[2 * static_cast<std::int64_t>(C)] = rows;
  }
};

template <int V, class T>
__global__ void backward_input_kernel(const T* dy, const T* y, const T* x, const float* __restrict__ mean,
                                      const float* __restrict__ coef, T* dx, T* dresidual, std::int64_t rows, int C) {
  const int groups = C / V;
  const std::int64_t n = rows * groups;
  for (std::int64_t u = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c0 = static_cast<int>(u % groups) * V;
    const std::int64_t at = u / groups * C + c0;
    float g[V], xv[V], m[V], A[V], B[V], C0[V];
    masked_grad<V>(dy, y, at, g);
    load_v<V>(x + at, xv);
    load_v<V>(mean + c0, m);
    load_v<V>(coef + c0, A);
    load_v<V>(coef + C + c0, B);
    load_v<V>(coef + 2 * C + c0, C0);
    if (dresidual != nullptr) store_v<V>(dresidual + at, g);
#pragma unroll
    for (int e = 0; e < V; ++e) xv[e] = A[e] * g[e] + B[e] * (xv[e] - m[e]) + C0[e];
    store_v<V>(dx + at, xv);
  }
}

// local_rows: the statistics are this call's rows alone (not counted over ranks), so training
// needs more than one.
inline void check(std::int64_t rows, std::int64_t C, const BatchNormConfig& cfg, const char* pass, bool local_rows) {
  DPML_REQUIRE(rows >= 0 && C > 0 && C < (std::int64_t{1} << 31) && cfg.eps > 0.f,
               "batch_norm " << pass << ": rows=" << rows << " C=" << C << " eps=" << cfg.eps << " out of range");
  DPML_REQUIRE(!cfg.training || !local_rows || rows > 1, "batch_norm " << pass
                                                       << ": training needs more than one value per channel, got rows="
                                                       << rows << " (N·H·W)");
}

// Σ(x − shift), Σ(x − shift)² per channel into `out`, 8 channels per thread when `vec`.
template <class T, class S, class Out>
void shifted_sums(const T* x, const S* shift, Out out, bool vec, float* scratch, std::int64_t rows, std::int64_t C,
                  cudaStream_t stream) {
  const int c = static_cast<int>(C);
  if (vec) column_sums_v<2, 8>(ShiftedTerms<8, T, S>{x, shift, c}, out, scratch, rows, C, stream);
  else column_sums_v<2, 1>(ShiftedTerms<1, T, S>{x, shift, c}, out, scratch, rows, C, stream);
}
// Σg, Σg·(x − mean) per channel into `out` (g = dy masked by the ReLU when mask is given).
template <class T, class Out>
void grad_sums(const T* dy, const T* mask, const T* x, const float* mean, Out out, bool vec, float* scratch,
               std::int64_t rows, std::int64_t C, cudaStream_t stream) {
  const int c = static_cast<int>(C);
  if (vec) column_sums_v<2, 8>(GradTerms<8, T>{dy, mask, x, mean, c}, out, scratch, rows, C, stream);
  else column_sums_v<2, 1>(GradTerms<1, T>{dy, mask, x, mean, c}, out, scratch, rows, C, stream);
}

// Scratch of a pass: the column sums' partials (from scratch), then coef — (2, C) forward, (3, C)
// backward — then the kept sums (2, C) of a synchronised pass (2C + 1 with the count).
inline float* coefficients(float* scratch, std::int64_t rows, std::int64_t C) {
  return scratch + column_sums_scratch(rows, C, 2);
}
inline float* kept_sums(float* scratch, std::int64_t rows, std::int64_t C) {
  return coefficients(scratch, rows, C) + 3 * C;
}

// The ranks' total rows behind a synchronised pass's sums, checked.
template <class Across>
std::int64_t total_rows(const Across& across, float* sums, std::int64_t rows, std::int64_t C, const char* pass) {
  const std::int64_t total = across(sums, C, rows);
  DPML_REQUIRE(total >= rows && total > 1, "batch_norm " << pass << " (rows=" << rows << ", C=" << C
                                                         << "), synchronised: the ranks' total rows " << total
                                                         << " must be at least this rank's and more than one");
  return total;
}

}  // namespace detail::bn

// Floats of scratch that batch_norm_forward and batch_norm_backward(_input) need: the column
// sums' partials, the per-channel coefficients (2, C) forward, (3, C) backward, and the (2, C)
// sums that a synchronised pass all-reduces (and the count of counted statistics).
inline std::int64_t batch_norm_scratch(std::int64_t rows, std::int64_t C) {
  return column_sums_scratch(rows, C, 2) + 5 * C + 1;
}

// x, y, residual (rows = N·H·W, C); gamma, beta (C); mean, rstd (C) fp32, written (saved for the
// backward); running_mean, running_var (C) fp32: updated in training (may be null: no update —
// not with synchronised statistics, whose shift running_mean is), read in eval. residual may be
// null; y may alias x or residual. `across`: see LocalStatistics.
template <class T, class P, StatisticsSource Across = LocalStatistics>
void batch_norm_forward(const T* x, const T* residual, const P* gamma, const P* beta, T* y, float* mean, float* rstd,
                        float* running_mean, float* running_var, std::int64_t rows, std::int64_t C,
                        const BatchNormConfig& cfg, float* scratch, cudaStream_t stream, const Across& across = {}) {
  static_assert(detail::is_storage_v<T> && detail::is_storage_v<P>);
  using namespace detail::bn;
  constexpr bool synchronised = !std::is_same_v<Across, LocalStatistics>, counted = is_counted<Across>;
  check(rows, C, cfg, "forward", !counted);
  DPML_REQUIRE(cfg.training ? (running_mean == nullptr) == (running_var == nullptr)
                            : running_mean != nullptr && running_var != nullptr,
               "batch_norm forward (rows=" << rows << ", C=" << C << "): running_mean and running_var are both given"
                                           << (cfg.training ? " or both null" : " in eval mode"));
  DPML_REQUIRE(!synchronised || !cfg.training || running_mean != nullptr,
               "batch_norm forward (rows=" << rows << ", C=" << C
                                           << "), synchronised: the running statistics are needed (running_mean is "
                                              "the shift of the sums that every rank must share)");
  const int c = static_cast<int>(C);
  float* coef = coefficients(scratch, rows, C);  // (2, C)
  const bool vec = detail::whole_packs(C, 8, {x, residual, y, coef, synchronised ? running_mean : nullptr});
  if (cfg.training) {
    auto finish = [&](const auto* shift, std::int64_t count, const float* total = nullptr) {
      return FinishStatistics<std::remove_cvref_t<decltype(*shift)>, P>{
          shift, gamma, beta, mean, rstd, running_mean, running_var, coef, static_cast<float>(count), cfg.momentum,
          cfg.eps, c, total};
    };
    if constexpr (counted) {
      const float* shift = running_mean;
      float* sums = kept_sums(scratch, rows, C);  // (2C + 1): Σ(x − k), Σ(x − k)², this rank's rows
      shifted_sums(x, shift, StoreSumsAndCount{sums, c, static_cast<float>(rows)}, vec, scratch, rows, C, stream);
      across.allreduce(sums, 2 * C + 1);
      apply_column_sums<2>(sums, finish(shift, 0, sums + 2 * C), C, stream);
    } else if constexpr (synchronised) {
      const float* shift = running_mean;
      float* sums = kept_sums(scratch, rows, C);  // (2, C)
      shifted_sums(x, shift, StoreSums<2>{sums, c}, vec, scratch, rows, C, stream);
      apply_column_sums<2>(sums, finish(shift, total_rows(across, sums, rows, C, "forward")), C, stream);
    } else {
      shifted_sums(x, x, finish(x, rows), vec, scratch, rows, C, stream);  // k: row 0
    }
  } else {
    eval_statistics_kernel<P><<<static_cast<unsigned>(ceil_div(C, kThreads)), kThreads, 0, stream>>>(
        running_mean, running_var, gamma, beta, mean, rstd, coef, c, cfg.eps);
    DPML_CHECK_LAUNCH();
  }
  if (rows == 0) return;
  if (vec) {
    normalize_kernel<8><<<grid_for(rows * C / 8, kThreads), kThreads, 0, stream>>>(x, residual, coef, y, rows, c,
                                                                                   cfg.relu);
  } else {
    normalize_kernel<1><<<grid_for(rows * C, kThreads), kThreads, 0, stream>>>(x, residual, coef, y, rows, c, cfg.relu);
  }
  DPML_CHECK_LAUNCH();
}

namespace detail::bn {
// The backward pass of batch_norm_backward and batch_norm_backward_input; `local` receives this
// rank's sums Σg, Σg·(x − mean) per channel (ParamGrads: dγ, dβ now; StoreSums: kept for later).
template <class T, class P, class LocalOut, StatisticsSource Across>
void backward(const T* dy, const T* y, const T* x, const float* mean, const float* rstd, const P* gamma, T* dx,
              T* dresidual, LocalOut local, std::int64_t rows, std::int64_t C, const BatchNormConfig& cfg,
              float* scratch, cudaStream_t stream, const Across& across) {
  static_assert(detail::is_storage_v<T> && detail::is_storage_v<P>);
  constexpr bool counted = is_counted<Across>;
  check(rows, C, cfg, "backward", !counted);
  DPML_REQUIRE(!cfg.relu || y != nullptr,
               "batch_norm backward (rows=" << rows << ", C=" << C << "): the fused ReLU needs the forward's output y");
  const int c = static_cast<int>(C);
  const T* mask = cfg.relu ? y : nullptr;
  float* coef = coefficients(scratch, rows, C);  // (3, C)
  const bool vec = detail::whole_packs(C, 8, {dy, mask, x, dx, dresidual, mean, coef});
  auto input_coefficients = [&](std::int64_t count, const float* total = nullptr) {
    return InputGradCoefficients<P>{rstd, gamma, coef, count > 0 ? 1.f / static_cast<float>(count) : 0.f, c,
                                    cfg.training, total};
  };
  if (std::is_same_v<Across, LocalStatistics> || !cfg.training) {  // eval: dx needs no sums of other ranks
    grad_sums(dy, mask, x, mean, BothOuts<LocalOut, InputGradCoefficients<P>>{local, input_coefficients(rows)}, vec,
              scratch, rows, C, stream);
  } else if constexpr (counted) {
    float* sums = kept_sums(scratch, rows, C);  // (2C + 1): Σg, Σg·(x − mean), this rank's rows
    grad_sums(dy, mask, x, mean, BothOuts<LocalOut, StoreSumsAndCount>{local, {sums, c, static_cast<float>(rows)}},
              vec, scratch, rows, C, stream);
    across.allreduce(sums, 2 * C + 1);
    apply_column_sums<2>(sums, input_coefficients(0, sums + 2 * C), C, stream);
  } else if constexpr (!std::is_same_v<Across, LocalStatistics>) {
    float* sums = kept_sums(scratch, rows, C);  // (2, C)
    grad_sums(dy, mask, x, mean, BothOuts<LocalOut, StoreSums<2>>{local, {sums, c}}, vec, scratch, rows, C, stream);
    apply_column_sums<2>(sums, input_coefficients(total_rows(across, sums, rows, C, "backward")), C, stream);
  }
  if (rows == 0) return;
  if (vec) {
    backward_input_kernel<8><<<grid_for(rows * C / 8, kThreads), kThreads, 0, stream>>>(dy, mask, x, mean, coef, dx,
                                                                                        dresidual, rows, c);
  } else {
    backward_input_kernel<1><<<grid_for(rows * C, kThreads), kThreads, 0, stream>>>(dy, mask, x, mean, coef, dx,
                                                                                    dresidual, rows, c);
  }
  DPML_CHECK_LAUNCH();
}
}  // namespace detail::bn

// From dy (rows, C) and what the forward saw and saved (x, y when cfg.relu, mean, rstd, gamma):
// dx (rows, C), overwritten; dresidual (rows, C), overwritten when non-null (the forward added a
// residual); dgamma, dbeta (C) += their gradients (this rank's rows only, also when synchronised).
// dx may alias dy. `across`: see LocalStatistics (eval needs no sums of other ranks).
template <class T, class P, StatisticsSource Across = LocalStatistics>
void batch_norm_backward(const T* dy, const T* y, const T* x, const float* mean, const float* rstd, const P* gamma,
                         T* dx, T* dresidual, P* dgamma, P* dbeta, std::int64_t rows, std::int64_t C,
                         const BatchNormConfig& cfg, float* scratch, cudaStream_t stream, const Across& across = {}) {
  detail::bn::backward(dy, y, x, mean, rstd, gamma, dx, dresidual, detail::bn::ParamGrads<P>{rstd, dgamma, dbeta},
                       rows, C, cfg, scratch, stream, across);
}

// batch_norm_backward without the weight gradients: this rank's sums Σg, Σg·(x − mean) go to
// sums (2, C) fp32 instead, for batch_norm_weight_grads (a layer's backward_weight, later).
template <class T, class P, StatisticsSource Across = LocalStatistics>
void batch_norm_backward_input(const T* dy, const T* y, const T* x, const float* mean, const float* rstd,
                               const P* gamma, T* dx, T* dresidual, float* sums, std::int64_t rows, std::int64_t C,
                               const BatchNormConfig& cfg, float* scratch, cudaStream_t stream,
                               const Across& across = {}) {
  detail::bn::backward(dy, y, x, mean, rstd, gamma, dx, dresidual, StoreSums<2>{sums, static_cast<int>(C)}, rows, C,
                       cfg, scratch, stream, across);
}

// dgamma += Σg·(x − mean)·rstd, dbeta += Σg (C), from the sums (2, C) of batch_norm_backward_input.
template <class P>
void batch_norm_weight_grads(const float* sums, const float* rstd, P* dgamma, P* dbeta, std::int64_t C,
                             cudaStream_t stream) {
  static_assert(detail::is_storage_v<P>);
  apply_column_sums<2>(sums, detail::bn::ParamGrads<P>{rstd, dgamma, dbeta}, C, stream);
}

// Ops<CudaSpace>'s BatchNorm family over NHWC images of sizes d (rows = N·H·W pixels, C columns):
// the layers' entry to the launchers above, on the Device's stream and scratch. Statistics S are
// fp32; `across` (null: this rank's statistics) is across(float* data, n), an in-place sum over
// the data axis on the Device's stream — counted statistics, so ranks may differ in size.
struct BatchNormOps {
  using Dev = Device<CudaSpace>;

  template <class T, class S, class Across>
  static void batch_norm_forward(Dev& dev, const T* x, const T* residual, const T* gamma, const T* beta, T* y, S* mean,
                                 S* rstd, S* running_mean, S* running_var, const ImageDims& d, bool training, bool relu,
                                 double momentum, double eps, const Across* across) {
    check_types<T, S>();
    const BatchNormConfig cfg{training, relu, static_cast<float>(momentum), static_cast<float>(eps)};
    float* scratch = dev.scratch<float>(batch_norm_scratch(d.pixels(), d.C));
    auto run = [&](const auto& source) {
      cuda::batch_norm_forward(x, residual, gamma, beta, y, mean, rstd, running_mean, running_var, d.pixels(), d.C,
                               cfg, scratch, dev.stream(), source);
    };
    if (across != nullptr) run(counted_statistics([across](float* p, std::int64_t n) { (*across)(p, n); }));
    else run(LocalStatistics{});
  }

  template <class T, class S, class Across>
  static void batch_norm_backward_input(Dev& dev, const T* dy, const T* y, const T* x, const S* mean, const S* rstd,
                                        const T* gamma, T* dx, T* dresidual, S* sums, const ImageDims& d,
                                        bool training, bool relu, const Across* across) {
    check_types<T, S>();
    const BatchNormConfig cfg{.training = training, .relu = relu};
    float* scratch = dev.scratch<float>(batch_norm_scratch(d.pixels(), d.C));
    auto run = [&](const auto& source) {
      cuda::batch_norm_backward_input(dy, y, x, mean, rstd, gamma, dx, dresidual, sums, d.pixels(), d.C, cfg, scratch,
                                      dev.stream(), source);
    };
    if (across != nullptr) run(counted_statistics([across](float* p, std::int64_t n) { (*across)(p, n); }));
    else run(LocalStatistics{});
  }

  template <class T, class S>
  static void batch_norm_backward_weight(Dev& dev, const S* sums, const S* rstd, T* dgamma, T* dbeta, std::int64_t C) {
    check_types<T, S>();
    batch_norm_weight_grads(sums, rstd, dgamma, dbeta, C, dev.stream());
  }

 private:
  template <class T, class S>
  static constexpr void check_types() {
    static_assert(detail::is_storage_v<T> && std::is_same_v<S, float>,
                  "dpml: no BatchNorm kernel for this type on CudaSpace (float, bf16 or fp16 activations; fp32 "
                  "statistics)");
  }
};

}  // namespace dpml::kernels::cuda
