#pragma once
// Batch normalisation over NCHW on the host: statistics per channel over (N, H, W), x seen as
// (N, C, S) with S = H·W; and Ops<HostSpace>'s BatchNorm family built on it (at the end).
//
//   statistics   shifted sums per channel, Σ(x − k) and Σ(x − k)² over the M values, from which
//                mean = k + Σ(x − k)/M and var = Σ(x − k)²/M − (Σ(x − k)/M)²; on one rank k is
//                the channel's mean from a first pass (Σx): the two-pass variance; when the sums
//                travel (synchronised over the data axis) k is the running mean, the same on every
//                rank, and (Σ(x − k), Σ(x − k)², M) take one all-reduce
//   normalise    y = act((x − mean) · rstd · weight + bias + residual), act = ReLU or identity,
//                the residual optional (a ResNet block's tail in one pass)
//   backward     g = dy · [y > 0] with the ReLU (y > 0 exactly where the pre-activation is), the
//                residual's gradient is g; per channel Σg and Σg·(x − mean) (this rank's, kept for
//                the weight gradients), then with x̂ = (x − mean) · rstd over the M values behind
//                the statistics (all ranks' sums and M when synchronised):
//                  dx = weight · rstd · (g − Σg/M − x̂ · Σg·x̂/M)   (training)
//                  dx = weight · rstd · g                            (eval: the statistics are constants)
//                dweight += Σg·(x − mean)·rstd, dbias += Σg
//
// Sums run in double (8 lanes of T per plane, then double); statistics (mean, rstd, running
// statistics, kept sums) are of type S = accum_t<T>: double for double, float for float.

#include "dpml/core/error.hpp"
#include "dpml/kernels/device.hpp"
#include "dpml/kernels/image.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace dpml::kernels::host {

namespace detail {
// Σ_{i<n} f(i) over 8 lanes in T (each lane holds ~n/8 terms of one plane), then in double: the
// lanes vectorise, which a single double accumulator would not (no reassociation without
// -ffast-math).
template <class T, class F>
double lane_sum(std::int64_t n, F f) {
  T lane[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] += f(i + l);
  double sum = 0;
  for (; i < n; ++i) sum += f(i);
  for (int l = 0; l < 8; ++l) sum += lane[l];
  return sum;
}
}  // namespace detail

// sum[c] = Σ_{n, s} x (N, C, S).
template <class T>
void bn_channel_sum(const T* x, std::int64_t N, std::int64_t C, std::int64_t S, double* sum) {
  for (std::int64_t c = 0; c < C; ++c) {
    double acc = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const T* p = x + (n * C + c) * S;
      acc += detail::lane_sum<T>(S, [p](std::int64_t s) { return p[s]; });
    }
    sum[c] = acc;
  }
}

// d1[c] = Σ_{n, s} (x − k[c]),  d2[c] = Σ_{n, s} (x − k[c])², with k rounded to T.
template <class T, class K>
void bn_shifted_sums(const T* x, const K* k, std::int64_t N, std::int64_t C, std::int64_t S, double* d1, double* d2) {
  for (std::int64_t c = 0; c < C; ++c) {
    const T m = static_cast<T>(k[c]);
    double a = 0, b = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const T* p = x + (n * C + c) * S;
      a += detail::lane_sum<T>(S, [p, m](std::int64_t s) { return p[s] - m; });
      b += detail::lane_sum<T>(S, [p, m](std::int64_t s) { return (p[s] - m) * (p[s] - m); });
    }
    d1[c] = a;
    d2[c] = b;
  }
}

// y = act((x − mean) · rstd · weight + bias + residual) per channel; residual may be null.
template <class T, class S>
void bn_normalize(const T* x, const T* residual, const S* mean, const S* rstd, const T* weight, const T* bias,
                  bool relu, std::int64_t N, std::int64_t C, std::int64_t Sp, T* y) {
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) {
      const double k = static_cast<double>(rstd[c]) * static_cast<double>(weight[c]);
      const T scale = static_cast<T>(k), shift = static_cast<T>(static_cast<double>(bias[c]) - mean[c] * k);
      const std::int64_t at = (n * C + c) * Sp;
      const T* in = x + at;
      T* out = y + at;
      for (std::int64_t s = 0; s < Sp; ++s) out[s] = in[s] * scale + shift;
      if (residual != nullptr)
        for (std::int64_t s = 0; s < Sp; ++s) out[s] += residual[at + s];
      if (relu)
        for (std::int64_t s = 0; s < Sp; ++s) out[s] = std::max(out[s], T(0));
    }
}

// sum_g[c] = Σ g,  sum_gx[c] = Σ g · (x − mean), with g = dy · [y > 0] when the forward's output y
// is given (a fused ReLU), else dy.
template <class T, class S>
void bn_backward_sums(const T* dy, const T* y, const T* x, const S* mean, std::int64_t N, std::int64_t C,
                      std::int64_t Sp, double* sum_g, double* sum_gx) {
  for (std::int64_t c = 0; c < C; ++c) {
    const T m = static_cast<T>(mean[c]);
    double a = 0, b = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t at = (n * C + c) * Sp;
      const T* d = dy + at;
      const T* in = x + at;
      const T* mask = y != nullptr ? y + at : nullptr;
      auto g = [d, mask](std::int64_t s) { return mask == nullptr || mask[s] > T(0) ? d[s] : T(0); };
      a += detail::lane_sum<T>(Sp, g);
      b += detail::lane_sum<T>(Sp, [&g, in, m](std::int64_t s) { return g(s) * (in[s] - m); });
    }
    sum_g[c] = a;
    sum_gx[c] = b;
  }
}

// dx from dy (masked by y as in bn_backward_sums); sum_g, sum_gx (C) are the sums over the `count`
// values behind the statistics (all ranks' when synchronised); training = false drops the terms
// through the statistics. dresidual = g where given. Per channel dx = a·g + b·x + c0, the
// coefficients folded in double.
template <class T, class S>
void bn_backward_input(const T* dy, const T* y, const T* x, const S* mean, const S* rstd, const T* weight,
                       const double* sum_g, const double* sum_gx, double count, bool training, std::int64_t N,
                       std::int64_t C, std::int64_t Sp, T* dx, T* dresidual) {
  for (std::int64_t c = 0; c < C; ++c) {
    const double r = rstd[c], k = r * static_cast<double>(weight[c]);
    const double mg = training ? sum_g[c] / count : 0.0, mgx = training ? sum_gx[c] * r / count : 0.0;
    const T a = static_cast<T>(k), b = static_cast<T>(-k * r * mgx), c0 = static_cast<T>(-k * mg + k * r * mgx * mean[c]);
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t at = (n * C + c) * Sp;
      for (std::int64_t s = 0; s < Sp; ++s) {
        const T g = y == nullptr || y[at + s] > T(0) ? dy[at + s] : T(0);
        if (dresidual != nullptr) dresidual[at + s] = g;
        dx[at + s] = a * g + b * x[at + s] + c0;
      }
    }
  }
}

// Ops<HostSpace>'s BatchNorm family over NCHW images of sizes d; gamma, beta (C) and activations
// T, statistics S = accum_t<T> (kernels/cuda/conv/batch_norm.hpp's BatchNormOps is the twin).
// `across` (null: this rank's statistics): across(S* buf, n) sums n values over the data axis in
// place (a synchronised BatchNorm; one all-reduce per pass). The count M travels in the buffer, so
// ranks may hold different numbers of images.
struct BatchNormOps {
  using Dev = Device<HostSpace>;

  // training: mean, rstd (C) of the batch, running_mean/var moved by momentum towards mean and the
  // unbiased variance; eval: mean, rstd from the running statistics. y = act(bn(x) + residual).
  template <class T, class S, class Across>
  static void batch_norm_forward(Dev&, const T* x, const T* residual, const T* gamma, const T* beta, T* y, S* mean,
                                 S* rstd, S* running_mean, S* running_var, const ImageDims& d, bool training, bool relu,
                                 double momentum, double eps, const Across* across) {
    const std::int64_t C = d.C, Sp = d.H * d.W;
    if (training) {
      std::vector<double> shift(static_cast<std::size_t>(C)), d1(static_cast<std::size_t>(C)), d2(d1.size());
      double M = static_cast<double>(d.N * Sp);
      if (across != nullptr) {
        std::copy_n(running_mean, C, shift.begin());
        bn_shifted_sums(x, shift.data(), d.N, C, Sp, d1.data(), d2.data());
        std::vector<S> buf(static_cast<std::size_t>(2 * C + 1));  // Σ(x − k), Σ(x − k)², M
        std::copy(d1.begin(), d1.end(), buf.begin());
        std::copy(d2.begin(), d2.end(), buf.begin() + C);
        buf[static_cast<std::size_t>(2 * C)] = static_cast<S>(M);
        (*across)(buf.data(), 2 * C + 1);
        std::copy_n(buf.begin(), C, d1.begin());
        std::copy_n(buf.begin() + C, C, d2.begin());
        M = static_cast<double>(buf[static_cast<std::size_t>(2 * C)]);
      } else if (M > 0) {
        bn_channel_sum(x, d.N, C, Sp, shift.data());
        for (double& k : shift) k /= M;
        bn_shifted_sums(x, shift.data(), d.N, C, Sp, d1.data(), d2.data());
      }
      DPML_REQUIRE(M > 1, "batch_norm forward: training needs more than one value per channel, got "
                              << M << " (N·H·W" << (across != nullptr ? " over the data axis" : "") << ")");
      for (std::int64_t c = 0; c < C; ++c) {
        const auto u = static_cast<std::size_t>(c);
        const double m = d1[u] / M, var = std::max(d2[u] / M - m * m, 0.0), mu = shift[u] + m;
        mean[c] = static_cast<S>(mu);
        rstd[c] = static_cast<S>(1.0 / std::sqrt(var + eps));
        running_mean[c] = static_cast<S>((1 - momentum) * running_mean[c] + momentum * mu);
        running_var[c] = static_cast<S>((1 - momentum) * running_var[c] + momentum * var * M / (M - 1));
      }
    } else {
      for (std::int64_t c = 0; c < C; ++c) {
        mean[c] = running_mean[c];
        rstd[c] = static_cast<S>(1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps));
      }
    }
    bn_normalize(x, residual, mean, rstd, gamma, beta, relu, d.N, C, Sp, y);
  }

  // dx (overwritten) from dy and what the forward saw and saved (x, y when relu, mean, rstd);
  // dresidual = the residual's gradient when non-null; sums (2, C) = this rank's Σg, Σg·(x − mean),
  // kept for batch_norm_backward_weight. training: dx through the statistics (all ranks' sums with
  // `across`).
  template <class T, class S, class Across>
  static void batch_norm_backward_input(Dev&, const T* dy, const T* y, const T* x, const S* mean, const S* rstd,
                                        const T* gamma, T* dx, T* dresidual, S* sums, const ImageDims& d,
                                        bool training, bool relu, const Across* across) {
    const std::int64_t C = d.C, Sp = d.H * d.W;
    const T* mask = relu ? y : nullptr;
    std::vector<double> sg(static_cast<std::size_t>(C)), sgx(sg.size());
    bn_backward_sums(dy, mask, x, mean, d.N, C, Sp, sg.data(), sgx.data());
    std::copy(sg.begin(), sg.end(), sums);
    std::copy(sgx.begin(), sgx.end(), sums + C);
    double M = static_cast<double>(d.N * Sp);
    if (training && across != nullptr) {
      std::vector<S> buf(static_cast<std::size_t>(2 * C + 1));  // Σg, Σg·(x − mean), M
      std::copy_n(sums, 2 * C, buf.begin());
      buf[static_cast<std::size_t>(2 * C)] = static_cast<S>(M);
      (*across)(buf.data(), 2 * C + 1);
      std::copy_n(buf.begin(), C, sg.begin());
      std::copy_n(buf.begin() + C, C, sgx.begin());
      M = static_cast<double>(buf[static_cast<std::size_t>(2 * C)]);
    }
    bn_backward_input(dy, mask, x, mean, rstd, gamma, sg.data(), sgx.data(), M, training, d.N, C, Sp, dx, dresidual);
  }

  // dgamma += Σg·(x − mean)·rstd, dbeta += Σg (C), from the sums batch_norm_backward_input kept.
  template <class T, class S>
  static void batch_norm_backward_weight(Dev&, const S* sums, const S* rstd, T* dgamma, T* dbeta, std::int64_t C) {
    for (std::int64_t c = 0; c < C; ++c) {
      dgamma[c] += static_cast<T>(static_cast<double>(sums[C + c]) * rstd[c]);
      dbeta[c] += static_cast<T>(sums[c]);
    }
  }
};

}  // namespace dpml::kernels::host
