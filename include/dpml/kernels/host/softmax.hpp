#pragma once
// Numerically safe softmax on rows, forward and backward, for the host.
//
//   forward   p_j = exp(x_j − max x) / Σ_k exp(x_k − max x)       (the max keeps exp() ≤ 1)
//   backward  dx_j = p_j · (dp_j − Σ_k p_k · dp_k)                 (the softmax Jacobian)
//
// The row functions work on the first `n` elements of a row, so that causal attention can
// normalise row i over its i + 1 visible keys. Sums run in double for float rows: a row of
// tens of thousands of vocabulary entries loses no precision to the accumulation.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace dpml::kernels::host {

namespace detail {
template <class T>
using Accum = std::conditional_t<(sizeof(T) < sizeof(double)), double, T>;
}  // namespace detail

// y[0, n) = softmax(x[0, n)); x may alias y. n ≥ 1.
template <class T>
void softmax_row(const T* x, T* y, std::int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
  for (std::int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  detail::Accum<T> sum = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    y[j] = std::exp(x[j] - m);
    sum += y[j];
  }
  const T inv = static_cast<T>(1.0 / sum);
  for (std::int64_t j = 0; j < n; ++j) y[j] *= inv;
}

// dx[0, n) from the probabilities p and their gradient dp; dx may alias dp.
template <class T>
void softmax_backward_row(const T* p, const T* dp, T* dx, std::int64_t n) {
  detail::Accum<T> dot = 0;
  for (std::int64_t j = 0; j < n; ++j) dot += static_cast<detail::Accum<T>>(p[j]) * dp[j];
  const T d = static_cast<T>(dot);
  for (std::int64_t j = 0; j < n; ++j) dx[j] = p[j] * (dp[j] - d);
}

// Whole rows: x, y (rows, cols).
template <class T>
void softmax_forward(const T* x, T* y, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) softmax_row(x + r * cols, y + r * cols, cols);
}
template <class T>
void softmax_backward(const T* p, const T* dp, T* dx, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) softmax_backward_row(p + r * cols, dp + r * cols, dx + r * cols, cols);
}

}  // namespace dpml::kernels::host
