#pragma once
// The device GEMM's one interface, shared by every policy (cublaslt.hpp; bench/gemm/kernels holds
// our own) and the dispatcher (dispatch.hpp):
//
//   C (M, N) = act( alpha · op(A) · op(B) + bias + beta · C )     op(A) (M, K), op(B) (K, N)
//
// row-major like kernels/host/gemm.hpp: lda/ldb/ldc are row strides in elements, A and B are bf16,
// accumulation is fp32, C is bf16 or fp32. The epilogue is a tag type chosen at compile time:
//
//   epilogue::None       act = identity, no bias
//   epilogue::Bias       + bias (N), one value per output column (Linear's b)
//   epilogue::BiasGelu   act = GELU (tanh), + bias; optionally stores the pre-activation
//                        (alpha·AB + bias) to `pre_gelu` (M, N, ldc) for the backward pass
//
// A residual add is beta = 1 with C holding the residual (D = AB + C in place); a gradient
// accumulation (dW += dyᵀ·x) is the same with fp32 C. beta ≠ 0 with BiasGelu is refused.
//
// A policy P provides `P::name`, `P::supports(args)` (alignment and shape limits) and
// `P::run<Epilogue>(ctx, args, stream)`. GemmContext owns what cuBLASLt keeps between calls (its
// handle, its workspace, cached algorithm choices).

#include "dpml/core/bf16.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/host/gemm.hpp"  // Trans

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <concepts>
#include <cstdint>
#include <map>
#include <string_view>
#include <type_traits>

namespace dpml::kernels::cuda {

using host::Trans;

namespace epilogue {
struct None {};
struct Bias {};
struct BiasGelu {};
}  // namespace epilogue

template <class E>
concept GemmEpilogue =
    std::same_as<E, epilogue::None> || std::same_as<E, epilogue::Bias> || std::same_as<E, epilogue::BiasGelu>;

// Operands are bf16 with a bf16 or float output, fp16 throughout (TC = f16: the fp16 precision
// policy), or fp32 throughout (TA = float: layers held in fp32 on the device, for checks against
// the host; cuBLASLt only, exact fp32 compute).
template <class TC>
using default_gemm_input_t = std::conditional_t<std::is_same_v<TC, f16>, f16, bf16>;

template <class TC, class TA = default_gemm_input_t<TC>>
struct GemmArgs {
  static_assert(std::is_same_v<TC, bf16> || std::is_same_v<TC, float> || std::is_same_v<TC, f16>,
                "GEMM output is bf16, float or f16");
  static_assert(std::is_same_v<TA, default_gemm_input_t<TC>> || (std::is_same_v<TA, float> && std::is_same_v<TC, float>),
                "GEMM operands are bf16 (bf16 or float output), f16 (f16 output) or float (float output)");
  using input_type = TA;
  Trans ta = Trans::no, tb = Trans::no;
  std::int64_t M = 0, N = 0, K = 0;
  const input_type* A = nullptr;  // op(A) (M, K): stored (M, K) if ta == no, else (K, M)
  std::int64_t lda = 0;
  const input_type* B = nullptr;  // op(B) (K, N): stored (K, N) if tb == no, else (N, K)
  std::int64_t ldb = 0;
  TC* C = nullptr;                // (M, N), read when beta ≠ 0, written always
  std::int64_t ldc = 0;
  float alpha = 1.f, beta = 0.f;
  const input_type* bias = nullptr;  // (N): Bias, BiasGelu
  input_type* pre_gelu = nullptr;    // (M, N) with row stride ldc, optional: BiasGelu
};

namespace detail {
template <GemmEpilogue Epi, class TC, class TA>
void check_gemm_args(const GemmArgs<TC, TA>& g, std::string_view policy) {
  const std::int64_t a_cols = g.ta == Trans::no ? g.K : g.M, b_cols = g.tb == Trans::no ? g.N : g.K;
  DPML_REQUIRE(g.M >= 0 && g.N >= 0 && g.K >= 0, policy << " GEMM: negative size M=" << g.M << " N=" << g.N
                                                         << " K=" << g.K);
  DPML_REQUIRE(g.lda >= a_cols && g.ldb >= b_cols && g.ldc >= g.N,
               policy << " GEMM " << g.M << "x" << g.N << "x" << g.K << ": row strides lda=" << g.lda << " ldb=" << g.ldb
                      << " ldc=" << g.ldc << " are shorter than the rows (" << a_cols << ", " << b_cols << ", " << g.N
                      << ")");
  if constexpr (!std::is_same_v<Epi, epilogue::None>)
    DPML_REQUIRE(g.bias != nullptr, policy << " GEMM: the bias epilogue needs a bias pointer");
  if constexpr (std::is_same_v<Epi, epilogue::BiasGelu>)
    DPML_REQUIRE(g.beta == 0.f, policy << " GEMM: beta=" << g.beta << " with the GELU epilogue is not supported");
  else
    DPML_REQUIRE(g.pre_gelu == nullptr, policy << " GEMM: pre_gelu is only written by the BiasGelu epilogue");
}
}  // namespace detail

// What cuBLASLt keeps between calls: its handle, workspace and per-shape algorithm cache. One per
// device and host thread, used by one stream at a time; cheap to keep for the whole run; not
// copyable.
class GemmContext {
 public:
  static constexpr std::size_t kWorkspaceBytes = 32u << 20;  // cuBLAS's recommendation for Hopper

  GemmContext() {
    DPML_CHECK_CUBLAS(cublasLtCreate(&lt_));
    DPML_CHECK_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
  }
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;
  ~GemmContext() {
    cudaFree(workspace_);
    cublasLtDestroy(lt_);
  }

  cublasLtHandle_t lt() const { return lt_; }
  void* workspace() const { return workspace_; }

  // cuBLASLt's heuristic answer per problem key, so that the heuristic runs once per shape.
  using AlgoKey = std::array<std::int64_t, 10>;
  std::map<AlgoKey, cublasLtMatmulAlgo_t>& algo_cache() { return algos_; }

 private:
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  std::map<AlgoKey, cublasLtMatmulAlgo_t> algos_;
};

}  // namespace dpml::kernels::cuda
