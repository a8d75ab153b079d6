#pragma once
// gemm<Epilogue>(ctx, args, stream): the device GEMM entry point, today cuBLASLt for every problem
// (cublaslt.hpp checks the arguments).
//
// Our own kernels — the mma.sync TiledGemm and the Hopper WgmmaGemm — live in bench/gemm/kernels:
// measured on GPT-2 124M's shapes on an H100 they reach a quarter and 0.74–0.98 of cuBLASLt and
// win none (bench/gemm/README.md keeps the table of figures, bench/RESULTS.md the runs). When a
// kernel of ours wins a shape by a margin (e.g. with a fused epilogue cuBLASLt lacks; Step 12),
// it comes back into include/ and the constexpr table of measured choices returns here (STYLE.md
// item 3: tuning is data): a lookup by (M, N, K, ta, tb) naming the policy and the measurement
// behind the choice, cuBLASLt for shapes it does not list.

#include "dpml/kernels/cuda/gemm/cublaslt.hpp"
#include "dpml/kernels/cuda/gemm/gemm.hpp"

#include <cuda_runtime.h>

namespace dpml::kernels::cuda {

template <GemmEpilogue Epi, class TC, class TA>
void gemm(GemmContext& ctx, const GemmArgs<TC, TA>& g, cudaStream_t stream) {
  CublasLt::run<Epi>(ctx, g, stream);
}

}  // namespace dpml::kernels::cuda
