#pragma once
// Element-wise sums for the host: the residual add and bias add / bias gradient, for row-major
// (rows, cols) activations (Linear: a bias per column) and NCHW images (Conv2d, BatchNorm: a value
// per channel). Plain contiguous loops; the inner loop runs over the fastest dimension so the
// compiler vectorises it. Gradients accumulate (+=), as parameter gradients do. ElementwiseOps
// adds the copies: whole buffers, blocks of columns into or out of a wider matrix, upload (host
// memory into the space's: a plain copy here) and the copies to and from page-locked memory with
// the Mark a GPU's host waits for (plain copies and no-ops here).

#include "dpml/kernels/device.hpp"

#include <algorithm>
#include <cstdint>

namespace dpml::kernels::host {

// y = a + b, n elements; y may alias a or b.
template <class T>
void add(const T* a, const T* b, T* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

// y (rows, cols) += bias (cols) on every row.
template <class T>
void bias_add_rows(T* y, const T* bias, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) y[r * cols + c] += bias[c];
}

// dbias (cols) += Σ_rows dy (rows, cols).
template <class T>
void bias_grad_rows(const T* dy, T* dbias, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) dbias[c] += dy[r * cols + c];
}

// y (N, C, S) += bias (C): S = H·W spatial positions per channel.
template <class T>
void bias_add_channels(T* y, const T* bias, std::int64_t N, std::int64_t C, std::int64_t S) {
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) {
      T* p = y + (n * C + c) * S;
      const T b = bias[c];
      for (std::int64_t s = 0; s < S; ++s) p[s] += b;
    }
}

// dbias (C) += Σ_{n, s} dy (N, C, S); the sums run in double.
template <class T>
void bias_grad_channels(const T* dy, T* dbias, std::int64_t N, std::int64_t C, std::int64_t S) {
  for (std::int64_t c = 0; c < C; ++c) {
    double sum = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const T* p = dy + (n * C + c) * S;
      for (std::int64_t s = 0; s < S; ++s) sum += p[s];
    }
    dbias[c] += static_cast<T>(sum);
  }
}

// Ops<HostSpace>'s memory and element-wise family (kernels/ops.hpp; Ops<CudaSpace>'s twin is
// kernels/cuda/elementwise.hpp's ElementwiseOps).
struct ElementwiseOps {
  using Dev = Device<HostSpace>;
  // p (n) = 0
  template <class T>
  static void zero(Dev&, T* p, std::int64_t n) {
    std::fill_n(p, n, T(0));
  }
  // dst (n) = src (n)
  template <class T>
  static void copy(Dev&, const T* src, T* dst, std::int64_t n) {
    std::copy_n(src, n, dst);
  }
  // dst (n) = host (n): a step's input from host memory (the GPU's stages it through pinned memory)
  template <class T>
  static void upload(Dev&, const T* host, T* dst, std::int64_t n) {
    std::copy_n(host, n, dst);
  }
  // host (n) = src (n) and dst (n) = host (n), host in page-locked memory, in the order of the
  // device's work (the GPU's are asynchronous copies on its stream; here, plain copies). A Mark
  // records the position reached (mark), and wait_for holds the host until the device passed it.
  template <class T>
  static void copy_to_host(Dev&, const T* src, T* host, std::int64_t n) {
    std::copy_n(src, n, host);
  }
  template <class T>
  static void copy_from_host(Dev&, const T* host, T* dst, std::int64_t n) {
    std::copy_n(host, n, dst);
  }
  struct Mark {};
  static void mark(Dev&, Mark&) noexcept {}
  static void wait_for(const Mark&) noexcept {}
  // y (n) = a + b; y may alias a or b
  template <class T>
  static void add(Dev&, const T* a, const T* b, T* y, std::int64_t n) {
    host::add(a, b, y, n);
  }
  // dst (rows, cols; row stride dst_ld) = src (rows, cols; row stride src_ld): a block of columns
  // into or out of a wider matrix (the tensor axis' gather and scatter of the last dimension)
  template <class T>
  static void copy_columns(Dev&, const T* src, std::int64_t src_ld, T* dst, std::int64_t dst_ld, std::int64_t rows,
                           std::int64_t cols) {
    for (std::int64_t r = 0; r < rows; ++r) std::copy_n(src + r * src_ld, cols, dst + r * dst_ld);
  }
  // y (rows, cols) += bias (cols)
  template <class T>
  static void bias_add_rows(Dev&, T* y, const T* bias, std::int64_t rows, std::int64_t cols) {
    host::bias_add_rows(y, bias, rows, cols);
  }
  // dbias (cols) += Σ_rows dy (rows, cols)
  template <class T>
  static void bias_grad_rows(Dev&, const T* dy, T* dbias, std::int64_t rows, std::int64_t cols) {
    host::bias_grad_rows(dy, dbias, rows, cols);
  }
};

}  // namespace dpml::kernels::host
