#pragma once
// Host GEMM through OpenBLAS (cblas_sgemm / cblas_dgemm), row-major:
//
//   C (M, N) = alpha · op(A) · op(B) + beta · C,   op(A) (M, K), op(B) (K, N)
//
// lda/ldb/ldc are row strides in elements, so sub-matrices of larger tensors work directly.
// Other element types fall back to a plain triple loop (float64 accumulation), for references.

#include "dpml/kernels/device.hpp"
#include "dpml/kernels/host/activation.hpp"
#include "dpml/kernels/host/elementwise.hpp"

#include <cblas.h>

#include <cstdint>

namespace dpml::kernels::host {

enum class Trans { no, yes };

namespace detail {
inline CBLAS_TRANSPOSE cblas_trans(Trans t) { return t == Trans::yes ? CblasTrans : CblasNoTrans; }
}  // namespace detail

inline void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
                 std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, detail::cblas_trans(ta), detail::cblas_trans(tb), static_cast<int>(M),
              static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
}
inline void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, double alpha, const double* A,
                 std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C, std::int64_t ldc) {
  cblas_dgemm(CblasRowMajor, detail::cblas_trans(ta), detail::cblas_trans(tb), static_cast<int>(M),
              static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
}

// Contiguous shorthand: lda/ldb/ldc implied by the shapes.
template <class T>
void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A, const T* B, T beta,
          T* C) {
  gemm(ta, tb, M, N, K, alpha, A, ta == Trans::no ? K : M, B, tb == Trans::no ? N : K, beta, C, N);
}

// Ops<HostSpace>'s linear family: the three products of a Linear layer (y = x·Wᵀ + b; W (out, in)
// as nn.Linear), with the epilogues the device kernels fuse done here as separate loops.
struct LinearOps {
  using Dev = Device<HostSpace>;
  // y (rows, out) = x (rows, in) · Wᵀ + bias (out; null: none) [+ y when accumulate: a residual
  // already in y]
  template <class T>
  static void linear_forward(Dev&, const T* x, const T* W, const T* bias, T* y, std::int64_t rows, std::int64_t in,
                             std::int64_t out, bool accumulate = false) {
    gemm(Trans::no, Trans::yes, rows, out, in, T(1), x, W, T(accumulate ? 1 : 0), y);
    if (bias) host::bias_add_rows(y, bias, rows, out);
  }
  // pre (rows, out) = x · Wᵀ + bias; y = gelu(pre) (the MLP's first product with its activation)
  template <class T>
  static void linear_gelu_forward(Dev& dev, const T* x, const T* W, const T* bias, T* pre, T* y, std::int64_t rows,
                                  std::int64_t in, std::int64_t out) {
    linear_forward(dev, x, W, bias, pre, rows, in, out);
    host::gelu_forward(pre, y, rows * out);
  }
  // dx (rows, in) = dy (rows, out) · W
  template <class T>
  static void linear_backward_input(Dev&, const T* dy, const T* W, T* dx, std::int64_t rows, std::int64_t in,
                                    std::int64_t out) {
    gemm(Trans::no, Trans::no, rows, in, out, T(1), dy, W, T(0), dx);
  }
  // dW (out, in) += dyᵀ · x (overwrite: dW = dyᵀ · x);  dbias (out) += Σ_rows dy (dbias null: none)
  template <class T>
  static void linear_backward_weight(Dev&, const T* dy, const T* x, T* dW, T* dbias, std::int64_t rows,
                                     std::int64_t in, std::int64_t out, bool overwrite = false) {
    gemm(Trans::yes, Trans::no, out, in, rows, T(1), dy, x, T(overwrite ? 0 : 1), dW);
    if (dbias) host::bias_grad_rows(dy, dbias, rows, out);
  }
};

}  // namespace dpml::kernels::host
