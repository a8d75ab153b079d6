#pragma once
// Element-wise activations and dropout for the host: plain loops over n contiguous elements that
// the compiler vectorises. Backward takes the forward *input* x (not y), so a layer keeps one
// buffer per slot and both halves recompute what they need.
//
//   relu   y = max(x, 0)                          dx = dy · [x > 0]
//   gelu   y = ½x(1 + tanh(u)), u = √(2/π)(x + 0.044715x³)   (tanh approximation, as GPT-2)
//          dx = dy · (½(1 + tanh u) + ½x(1 − tanh²u) · √(2/π)(1 + 3·0.044715x²))
//   dropout_mask   mask (samples, per_sample) ∈ {0, 1/(1−p)}, kept as kernels/dropout_rule.hpp says
//                  (the same rule as the device kernel: the same mask on both spaces)
//   dropout_apply  y = x · mask

#include "dpml/kernels/device.hpp"
#include "dpml/kernels/dropout_rule.hpp"

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

// mask (samples, per_sample) = scale where `rule` keeps the element of global sample
// first_sample + n, else 0; four elements per Philox block (DropoutRule::kept4).
template <class T>
void dropout_mask(T* mask, std::int64_t samples, std::int64_t per_sample, std::int64_t first_sample,
                  const DropoutRule& rule, T scale) {
  for (std::int64_t n = 0; n < samples; ++n) {
    T* row = mask + n * per_sample;  // (per_sample)
    const auto g = static_cast<std::uint64_t>(first_sample + n);
    for (std::int64_t q = 0; 4 * q < per_sample; ++q) {
      const unsigned bits = rule.kept4(g, static_cast<std::uint64_t>(q));
      for (std::int64_t j = 0; j < 4 && 4 * q + j < per_sample; ++j) row[4 * q + j] = (bits >> j) & 1u ? scale : T(0);
    }
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

// Ops<HostSpace>'s dropout family (kernels/cuda/dropout.hpp's DropoutOps is the twin).
struct DropoutOps {
  using Dev = Device<HostSpace>;
  // mask (samples, per_sample) ∈ {0, scale}: element e of row n kept as rule.kept4 says for global
  // sample first_sample + n; scale (1/(1−p)) rounded once to T
  template <class T>
  static void dropout_mask(Dev&, T* mask, std::int64_t samples, std::int64_t per_sample, std::int64_t first_sample,
                           const DropoutRule& rule, double scale) {
    host::dropout_mask(mask, samples, per_sample, first_sample, rule, static_cast<T>(scale));
  }
  // y (n) = x (n) · mask (n)
  template <class T>
  static void dropout_apply(Dev&, const T* x, const T* mask, T* y, std::int64_t n) {
    host::dropout_apply(x, mask, y, n);
  }
};

}  // namespace dpml::kernels::host
