#pragma once
// Pooling on the host over planes: x (P, H, W) with P = N·C independent planes of NCHW images;
// Ops<HostSpace>'s pooling family at the end.
//
//   max pool      y[p, ho, wo] = max of the window; argmax[p, ho, wo] = flat index h·W + w of the
//                 winner in its plane (the first one on ties), so backward is a scatter
//   avg pool      y = Σ window / (kh·kw), padding counted as zeros (PyTorch's default
//                 count_include_pad=True); backward spreads dy / (kh·kw) over the window
//   global avg    y[p] = mean of the plane; backward spreads dy[p] / (H·W)
//
// Windows start at ho·stride − pad. Out-of-image positions never win a max (a window lies at least
// partly inside the image as long as pad < kernel size, which the layers check).

#include "dpml/kernels/device.hpp"

#include <cstdint>

namespace dpml::kernels::host {

struct PoolGeometry {
  std::int64_t H, W;      // plane size
  std::int64_t kh, kw;    // window
  std::int64_t stride, pad;
  std::int64_t out_h() const noexcept { return (H + 2 * pad - kh) / stride + 1; }
  std::int64_t out_w() const noexcept { return (W + 2 * pad - kw) / stride + 1; }
  // The window of output (ho, wo) clipped to the image: rows [h0, h1), columns [w0, w1).
  struct Window {
    std::int64_t h0, h1, w0, w1;
  };
  Window window(std::int64_t ho, std::int64_t wo) const noexcept {
    const std::int64_t h = ho * stride - pad, w = wo * stride - pad;
    return {h < 0 ? 0 : h, h + kh < H ? h + kh : H, w < 0 ? 0 : w, w + kw < W ? w + kw : W};
  }
};

// y, argmax (P, Ho, Wo) from x (P, H, W).
template <class T>
void max_pool_forward(const T* x, const PoolGeometry& g, std::int64_t P, T* y, std::int32_t* argmax) {
  const std::int64_t Ho = g.out_h(), Wo = g.out_w();
  for (std::int64_t p = 0; p < P; ++p) {
    const T* plane = x + p * g.H * g.W;
    for (std::int64_t ho = 0; ho < Ho; ++ho)
      for (std::int64_t wo = 0; wo < Wo; ++wo) {
        const auto win = g.window(ho, wo);
        std::int64_t where = win.h0 * g.W + win.w0;
        T best = plane[where];
        for (std::int64_t h = win.h0; h < win.h1; ++h)
          for (std::int64_t w = win.w0; w < win.w1; ++w)
            if (plane[h * g.W + w] > best) {
              best = plane[h * g.W + w];
              where = h * g.W + w;
            }
        const std::int64_t o = (p * Ho + ho) * Wo + wo;
        y[o] = best;
        argmax[o] = static_cast<std::int32_t>(where);
      }
  }
}

// dx (P, H, W) = scatter of dy (P, Ho, Wo) onto the winners (dx is overwritten).
template <class T>
void max_pool_backward(const T* dy, const std::int32_t* argmax, const PoolGeometry& g, std::int64_t P, T* dx) {
  const std::int64_t HoWo = g.out_h() * g.out_w(), HW = g.H * g.W;
  for (std::int64_t i = 0; i < P * HW; ++i) dx[i] = T(0);
  for (std::int64_t p = 0; p < P; ++p)
    for (std::int64_t o = 0; o < HoWo; ++o) dx[p * HW + argmax[p * HoWo + o]] += dy[p * HoWo + o];
}

// y (P, Ho, Wo) from x (P, H, W).
template <class T>
void avg_pool_forward(const T* x, const PoolGeometry& g, std::int64_t P, T* y) {
  const std::int64_t Ho = g.out_h(), Wo = g.out_w();
  const T inv = T(1) / static_cast<T>(g.kh * g.kw);
  for (std::int64_t p = 0; p < P; ++p)
    for (std::int64_t ho = 0; ho < Ho; ++ho)
      for (std::int64_t wo = 0; wo < Wo; ++wo) {
        const auto win = g.window(ho, wo);
        const T* plane = x + p * g.H * g.W;
        T sum = 0;
        for (std::int64_t h = win.h0; h < win.h1; ++h)
          for (std::int64_t w = win.w0; w < win.w1; ++w) sum += plane[h * g.W + w];
        y[(p * Ho + ho) * Wo + wo] = sum * inv;
      }
}

// dx (P, H, W) from dy (P, Ho, Wo) (dx is overwritten).
template <class T>
void avg_pool_backward(const T* dy, const PoolGeometry& g, std::int64_t P, T* dx) {
  const std::int64_t Ho = g.out_h(), Wo = g.out_w();
  const T inv = T(1) / static_cast<T>(g.kh * g.kw);
  for (std::int64_t i = 0; i < P * g.H * g.W; ++i) dx[i] = T(0);
  for (std::int64_t p = 0; p < P; ++p)
    for (std::int64_t ho = 0; ho < Ho; ++ho)
      for (std::int64_t wo = 0; wo < Wo; ++wo) {
        const T d = dy[(p * Ho + ho) * Wo + wo] * inv;
        const auto win = g.window(ho, wo);
        T* plane = dx + p * g.H * g.W;
        for (std::int64_t h = win.h0; h < win.h1; ++h)
          for (std::int64_t w = win.w0; w < win.w1; ++w) plane[h * g.W + w] += d;
      }
}

// y (P) = mean of each plane of x (P, S).
template <class T>
void global_avg_pool_forward(const T* x, std::int64_t P, std::int64_t S, T* y) {
  for (std::int64_t p = 0; p < P; ++p) {
    T sum = 0;
    for (std::int64_t s = 0; s < S; ++s) sum += x[p * S + s];
    y[p] = sum / static_cast<T>(S);
  }
}

// dx (P, S) = dy (P) / S spread over each plane.
template <class T>
void global_avg_pool_backward(const T* dy, std::int64_t P, std::int64_t S, T* dx) {
  for (std::int64_t p = 0; p < P; ++p) {
    const T d = dy[p] / static_cast<T>(S);
    for (std::int64_t s = 0; s < S; ++s) dx[p * S + s] = d;
  }
}

// Ops<HostSpace>'s pooling family: NCHW images of N·C planes, geometry g (kernels/cuda/conv/
// pool.hpp's PoolOps is the twin, over NHWC). dx is overwritten.
struct PoolOps {
  using Dev = Device<HostSpace>;
  // y, argmax (N, C, Ho, Wo) from x (N, C, H, W); argmax = h·W + w of each window's maximum
  template <class T>
  static void max_pool_forward(Dev&, const T* x, T* y, std::int32_t* argmax, std::int64_t N, std::int64_t C,
                               const PoolGeometry& g) {
    host::max_pool_forward(x, g, N * C, y, argmax);
  }
  template <class T>
  static void max_pool_backward(Dev&, const T* dy, const std::int32_t* argmax, T* dx, std::int64_t N, std::int64_t C,
                                const PoolGeometry& g) {
    host::max_pool_backward(dy, argmax, g, N * C, dx);
  }
  template <class T>
  static void avg_pool_forward(Dev&, const T* x, T* y, std::int64_t N, std::int64_t C, const PoolGeometry& g) {
    host::avg_pool_forward(x, g, N * C, y);
  }
  template <class T>
  static void avg_pool_backward(Dev&, const T* dy, T* dx, std::int64_t N, std::int64_t C, const PoolGeometry& g) {
    host::avg_pool_backward(dy, g, N * C, dx);
  }
  // y (N, C) = the mean of each plane of x (N, C, S), S = H·W
  template <class T>
  static void global_avg_pool_forward(Dev&, const T* x, T* y, std::int64_t N, std::int64_t S, std::int64_t C) {
    host::global_avg_pool_forward(x, N * C, S, y);
  }
  template <class T>
  static void global_avg_pool_backward(Dev&, const T* dy, T* dx, std::int64_t N, std::int64_t S, std::int64_t C) {
    host::global_avg_pool_backward(dy, N * C, S, dx);
  }
};

}  // namespace dpml::kernels::host
