#pragma once
// Batch normalisation over NCHW on the host: statistics per channel over (N, H, W).
//
//   statistics   sum[c] = Σ x,  then  sqdev[c] = Σ (x − mean[c])²        (two passes: stable)
//   normalise    y = (x − mean) · rstd · weight + bias
//   backward     with x̂ = (x − mean) · rstd, over the M = count values of the batch:
//                  sum_dy[c] = Σ dy,   sum_dy_xhat[c] = Σ dy · x̂
//                  dx = weight · rstd · (dy − sum_dy / M − x̂ · sum_dy_xhat / M)   (training)
//                  dx = weight · rstd · dy                                          (eval)
//                dweight += sum_dy_xhat, dbias += sum_dy
//
// The per-channel sums are separate functions, in double, so that a layer can all-reduce them
// across data-parallel ranks (synchronised batch norm) between the passes; M is then the global
// count.

#include <cstdint>

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

// sqdev[c] = Σ_{n, s} (x − mean[c])².
template <class T>
void bn_channel_sqdev(const T* x, const double* mean, std::int64_t N, std::int64_t C, std::int64_t S, double* sqdev) {
  for (std::int64_t c = 0; c < C; ++c) {
    const T m = static_cast<T>(mean[c]);
    double acc = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const T* p = x + (n * C + c) * S;
      acc += detail::lane_sum<T>(S, [p, m](std::int64_t s) { return (p[s] - m) * (p[s] - m); });
    }
    sqdev[c] = acc;
  }
}

// y = (x − mean) · rstd · weight + bias, per channel.
template <class T>
void bn_normalize(const T* x, const double* mean, const double* rstd, const T* weight, const T* bias, std::int64_t N,
                  std::int64_t C, std::int64_t S, T* y) {
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) {
      const T scale = static_cast<T>(rstd[c] * weight[c]);
      const T shift = static_cast<T>(bias[c] - mean[c] * rstd[c] * weight[c]);
      const T* in = x + (n * C + c) * S;
      T* out = y + (n * C + c) * S;
      for (std::int64_t s = 0; s < S; ++s) out[s] = in[s] * scale + shift;
    }
}

// sum_dy[c] = Σ dy,  sum_dy_xhat[c] = Σ dy · (x − mean) · rstd.
template <class T>
void bn_backward_sums(const T* dy, const T* x, const double* mean, const double* rstd, std::int64_t N, std::int64_t C,
                      std::int64_t S, double* sum_dy, double* sum_dy_xhat) {
  for (std::int64_t c = 0; c < C; ++c) {
    const T m = static_cast<T>(mean[c]);
    double a = 0, b = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const T* d = dy + (n * C + c) * S;
      const T* in = x + (n * C + c) * S;
      a += detail::lane_sum<T>(S, [d](std::int64_t s) { return d[s]; });
      b += detail::lane_sum<T>(S, [d, in, m](std::int64_t s) { return d[s] * (in[s] - m); });
    }
    sum_dy[c] = a;
    sum_dy_xhat[c] = b * rstd[c];
  }
}

// dx from dy. `count` = M, the values per channel behind the statistics (global with sync);
// training = false drops the terms through the statistics (eval: they are constants). Per channel
// this is dx = a·dy + b·x + c0 with coefficients folded in double.
template <class T>
void bn_backward_input(const T* dy, const T* x, const double* mean, const double* rstd, const T* weight,
                       const double* sum_dy, const double* sum_dy_xhat, double count, bool training, std::int64_t N,
                       std::int64_t C, std::int64_t S, T* dx) {
  for (std::int64_t c = 0; c < C; ++c) {
    const double k = rstd[c] * weight[c];
    const double mdy = training ? sum_dy[c] / count : 0.0, mdx = training ? sum_dy_xhat[c] / count : 0.0;
    const T a = static_cast<T>(k), b = static_cast<T>(-k * rstd[c] * mdx),
            c0 = static_cast<T>(-k * mdy + k * rstd[c] * mdx * mean[c]);
    for (std::int64_t n = 0; n < N; ++n) {
      const T* d = dy + (n * C + c) * S;
      const T* in = x + (n * C + c) * S;
      T* out = dx + (n * C + c) * S;
      for (std::int64_t s = 0; s < S; ++s) out[s] = a * d[s] + b * in[s] + c0;
    }
  }
}

}  // namespace dpml::kernels::host
