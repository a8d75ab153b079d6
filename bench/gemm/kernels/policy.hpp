#pragma once
// What bench/gemm's own GEMM policies (tiled.hpp: mma.sync, wgmma.hpp: Hopper wgmma) share beyond
// the library's interface (include/dpml/kernels/cuda/gemm/gemm.hpp):
//
//  * KernelContext: a GemmContext (so that CublasLt runs on it too) that also keeps the device's
//    SM count (persistent grids, split counts) and the split-K scratch of the wgmma kernels: fp32
//    partial tiles and one arrival counter per output tile (or per consumer's rows of one). The
//    scratch grows on the first call of a larger problem (a cudaMalloc then, never in later
//    calls); the counters are zero between calls (the last split of a tile resets its counter).
//  * vector_rows() / require_vector_rows(): the operand layout our tensor-core kernels take.
//  * with_transposes(): the problem's (ta, tb) as compile-time flags.
//  * GemmPolicy: the concept every policy here (and CublasLt) meets.
//
// None of these kernels is selected by the library's dispatch (dispatch.hpp): cuBLASLt beats them
// on every shape measured (README.md). A kernel that wins a shape earns a dispatch row, and moves
// back into include/ with what it needs of this header.

#include "dpml/core/bf16.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/gemm/gemm.hpp"

#include <cuda_runtime.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dpml::kernels::cuda {

class KernelContext : public GemmContext {
 public:
  KernelContext() {
    int device = 0;
    DPML_CHECK_CUDA(cudaGetDevice(&device));
    DPML_CHECK_CUDA(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  }
  ~KernelContext() {
    cudaFree(split_partials_);
    cudaFree(split_arrivals_);
  }

  int sm_count() const { return sm_count_; }

  // Split-K scratch: `floats` fp32 partial sums and `counters` per-tile counters (zeroed when
  // allocated).
  struct SplitScratch {
    float* partials;
    int* arrivals;
  };
  SplitScratch split_scratch(std::size_t floats, std::size_t counters) {
    if (floats > partial_floats_) {
      DPML_CHECK_CUDA(cudaFree(split_partials_));
      split_partials_ = nullptr;
      DPML_CHECK_CUDA(cudaMalloc(&split_partials_, floats * sizeof(float)));
      partial_floats_ = floats;
    }
    if (counters > arrival_count_) {
      DPML_CHECK_CUDA(cudaFree(split_arrivals_));
      split_arrivals_ = nullptr;
      DPML_CHECK_CUDA(cudaMalloc(&split_arrivals_, counters * sizeof(int)));
      DPML_CHECK_CUDA(cudaMemset(split_arrivals_, 0, counters * sizeof(int)));
      arrival_count_ = counters;
    }
    return {split_partials_, split_arrivals_};
  }

 private:
  int sm_count_ = 0;
  float* split_partials_ = nullptr;
  int* split_arrivals_ = nullptr;
  std::size_t partial_floats_ = 0, arrival_count_ = 0;
};

namespace detail {
// What our tensor-core kernels need of the operands' layout: 16-byte vectors on every operand
// row (16-byte aligned A and B, lda and ldb multiples of 8), paired stores into C (even ldc,
// C aligned to two elements), and fewer than 2^31 tiles of TileM × TileN.
template <std::int64_t TileM, std::int64_t TileN, class TC>
bool vector_rows(const GemmArgs<TC>& g) {
  return g.lda % 8 == 0 && g.ldb % 8 == 0 && g.ldc % 2 == 0 && aligned16(g.A) && aligned16(g.B) &&
         reinterpret_cast<std::uintptr_t>(g.C) % (2 * sizeof(TC)) == 0 &&
         ceil_div(g.M, TileM) * ceil_div(g.N, TileN) < (std::int64_t{1} << 31);
}
template <class TC>
void require_vector_rows(bool ok, const GemmArgs<TC>& g, std::string_view policy) {
  DPML_REQUIRE(ok, policy << " GEMM " << g.M << "x" << g.N << "x" << g.K
                          << ": needs 16-byte aligned A and B with lda, ldb multiples of 8 (lda=" << g.lda
                          << ", ldb=" << g.ldb << ") and an even ldc (" << g.ldc << ")");
}

// launch.template operator()<TA, TB>() for the problem's transposes, as compile-time flags.
template <class TC, class Launch>
void with_transposes(const GemmArgs<TC>& g, Launch&& launch) {
  const bool ta = g.ta == Trans::yes, tb = g.tb == Trans::yes;
  if (ta && tb) launch.template operator()<true, true>();
  else if (ta) launch.template operator()<true, false>();
  else if (tb) launch.template operator()<false, true>();
  else launch.template operator()<false, false>();
}
}  // namespace detail

template <class P>
concept GemmPolicy = requires(KernelContext& ctx, const GemmArgs<bf16>& gb, const GemmArgs<float>& gf, cudaStream_t s) {
  { P::name } -> std::convertible_to<std::string_view>;
  { P::supports(gb) } -> std::same_as<bool>;
  { P::supports(gf) } -> std::same_as<bool>;
  P::template run<epilogue::None>(ctx, gb, s);
  P::template run<epilogue::BiasGelu>(ctx, gb, s);
  P::template run<epilogue::Bias>(ctx, gf, s);
};

}  // namespace dpml::kernels::cuda
