#pragma once
// Element-wise activations and dropout for the host: plain loops over n contiguous elements that
// the compiler vectorises. Backward takes the forward *input* x (not y), so a layer keeps one
// buffer per slot and both halves recompute what they need.
//
//   relu   y = max(x, 0)                          dx = dy · [x > 0]
//   gelu   y = ½x(1 + tanh(u)), u = √(2/π)(x + 0.044715x³)   (tanh approximation, as GPT-2)
//          dx = dy · (½(1 + tanh u) + ½x(1 − tanh²u) · √(2/π)(1 + 3·0.044715x²))
//   dropout_apply  y = x · mask, mask ∈ {0, 1/(1−p)} precomputed (the layer draws it from Philox)

#include "dpml/kernels/device.hpp"

#include <cmath>
#include <cstdint>

namespace dpml::kernels::host {

template <class T>
void relu_forward(const T* x, T* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] : T(0);
}

template <class T>
void relu_backward(const T* x, const T* dy, T* dx, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dx[i] = x[i] > T(0) ? dy[i] : T(0);
}

namespace detail {
template <class T>
inline constexpr T kGeluC = T(0.7978845608028654);  // √(2/π)
template <class T>
inline constexpr T kGeluA = T(0.044715);
}  // namespace detail

template <class T>
void gelu_forward(const T* x, T* y, std::int64_t n) {
  using detail::kGeluA, detail::kGeluC;
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    y[i] = T(0.5) * v * (T(1) + std::tanh(kGeluC<T> * (v + kGeluA<T> * v * v * v)));
  }
}

template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, std::int64_t n) {
  using detail::kGeluA, detail::kGeluC;
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T t = std::tanh(kGeluC<T> * (v + kGeluA<T> * v * v * v));
    const T du = kGeluC<T> * (T(1) + T(3) * kGeluA<T> * v * v);
    dx[i] = dy[i] * (T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * du);
  }
}

// y = x · mask (forward) or dx = dy · mask (backward): the same loop.
template <class T>
void dropout_apply(const T* x, const T* mask, T* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * mask[i];
}

// Ops<HostSpace>'s activation family. Backward halves take the forward input x.
struct ActivationOps {
  using Dev = Device<HostSpace>;
  template <class T>
  static void relu_forward(Dev&, const T* x, T* y, std::int64_t n) {
    host::relu_forward(x, y, n);
  }
  template <class T>
  static void relu_backward(Dev&, const T* x, const T* dy, T* dx, std::int64_t n) {
    host::relu_backward(x, dy, dx, n);
  }
  template <class T>
  static void gelu_forward(Dev&, const T* x, T* y, std::int64_t n) {
    host::gelu_forward(x, y, n);
  }
  template <class T>
  static void gelu_backward(Dev&, const T* x, const T* dy, T* dx, std::int64_t n) {
    host::gelu_backward(x, dy, dx, n);
  }
};

}  // namespace dpml::kernels::host
