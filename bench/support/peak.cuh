#pragma once
// The GPU's bf16 GEMM peak as the training benches measure it (bench/gpt_train, bench/encoder_train):
// TFLOP/s of a square cuBLASLt GEMM, the denominator of their MFU, measured in the same run as the
// training it divides. Included by relative path; this folder is not a program.
#include <dpml/core/bf16.hpp>
#include <dpml/core/cuda_error.hpp>
#include <dpml/kernels/cuda/gemm/dispatch.hpp>

#include <cuda_runtime.h>

#include <cstdint>

namespace dpml::bench {

// bf16 GEMM peak: TFLOP/s of a square cuBLASLt GEMM of side n.
inline double measure_peak_tflops(std::int64_t n) {
  namespace kc = dpml::kernels::cuda;
  bf16 *a = nullptr, *c = nullptr;
  DPML_CHECK_CUDA(cudaMalloc(&a, n * n * sizeof(bf16)));
  DPML_CHECK_CUDA(cudaMalloc(&c, n * n * sizeof(bf16)));
  DPML_CHECK_CUDA(cudaMemset(a, 0x3c, n * n * sizeof(bf16)));  // 0x3c3c ≈ 0.0115: finite operands
  double tflops = 0;
  {
    kc::GemmContext ctx;
    const kc::GemmArgs<bf16> g{.ta = kc::Trans::no, .tb = kc::Trans::yes, .M = n, .N = n, .K = n, .A = a, .lda = n,
                               .B = a, .ldb = n, .C = c, .ldc = n};
    for (int i = 0; i < 3; ++i) kc::CublasLt::run<kc::epilogue::None>(ctx, g, nullptr);
    cudaEvent_t e0, e1;
    DPML_CHECK_CUDA(cudaEventCreate(&e0));
    DPML_CHECK_CUDA(cudaEventCreate(&e1));
    constexpr int kIters = 20;
    DPML_CHECK_CUDA(cudaEventRecord(e0));
    for (int i = 0; i < kIters; ++i) kc::CublasLt::run<kc::epilogue::None>(ctx, g, nullptr);
    DPML_CHECK_CUDA(cudaEventRecord(e1));
    DPML_CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    DPML_CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    tflops = 2.0 * n * n * n * kIters / (ms * 1e-3) / 1e12;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  cudaFree(a);
  cudaFree(c);
  return tflops;
}

}  // namespace dpml::bench
