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

// sum[c] = Σ_{n, s} x (N, C, S).
template <class T>
void bn_channel_sum(const T* x, std::int64_t N, std::int64_t C, std::int64_t S, double* sum) {
  for (std::int64_t c = 0; c < C; ++c) {
    double acc = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const T* p = x + (n * C + c) * S;
      for (std::int64_t s = 0; s < S; ++s) acc += p[s];
    }
    sum[c] = acc;
  }
}

// sqdev[c] = Σ_{n, s} (x − mean[c])².
template <class T>
void bn_channel_sqdev(const T* x, const double* mean, std::int64_t N, std::int64_t C, std::int64_t S, double* sqdev) {
  for (std::int64_t c = 0; c < C; ++c) {
    double acc = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const T* p = x + (n * C + c) * S;
      for (std::int64_t s = 0; s < S; ++s) acc += (p[s] - mean[c]) * (p[s] - mean[c]);
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
    double a = 0, b = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const T* d = dy + (n * C + c) * S;
      const T* in = x + (n * C + c) * S;
      for (std::int64_t s = 0; s < S; ++s) {
        a += d[s];
        b += d[s] * (in[s] - mean[c]);
      }
    }
    sum_dy[c] = a;
    sum_dy_xhat[c] = b * rstd[c];
  }
}

// dx from dy. `count` = M, the values per channel behind the statistics (global with sync);
// training = false drops the terms through the statistics (eval: they are constants).
template <class T>
void bn_backward_input(const T* dy, const T* x, const double* mean, const double* rstd, const T* weight,
                       const double* sum_dy, const double* sum_dy_xhat, double count, bool training, std::int64_t N,
                       std::int64_t C, std::int64_t S, T* dx) {
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) {
      const double k = rstd[c] * weight[c];
      const double mdy = training ? sum_dy[c] / count : 0.0, mdx = training ? sum_dy_xhat[c] / count : 0.0;
      const T* d = dy + (n * C + c) * S;
      const T* in = x + (n * C + c) * S;
      T* out = dx + (n * C + c) * S;
      for (std::int64_t s = 0; s < S; ++s)
        out[s] = static_cast<T>(k * (d[s] - mdy - (in[s] - mean[c]) * rstd[c] * mdx));
    }
}

}  // namespace dpml::kernels::host
