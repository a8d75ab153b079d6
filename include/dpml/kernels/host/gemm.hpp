#pragma once
// Host GEMM through OpenBLAS (cblas_sgemm / cblas_dgemm), row-major:
//
//   C (M, N) = alpha · op(A) · op(B) + beta · C,   op(A) (M, K), op(B) (K, N)
//
// lda/ldb/ldc are row strides in elements, so sub-matrices of larger tensors work directly.
// Other element types fall back to a plain triple loop (float64 accumulation), for references.

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

}  // namespace dpml::kernels::host
