#pragma once
// CublasLt: the GEMM policy that calls cuBLASLt (bf16 operands with bf16/fp32 output, fp16 or fp32
// throughout; fp32 compute).
//
// cuBLASLt is column-major; dpml is row-major. A row-major (R, C) matrix with row stride ld is the
// column-major (C, R) matrix with leading dimension ld, its transpose, so the row-major
//   C (M, N) = op(A) · op(B)   is computed as the column-major   Cᵀ (N, M) = op(B)ᵀ · op(A)ᵀ,
// i.e. cuBLASLt's "A" is our B (transposed iff tb), its "B" is our A (transposed iff ta), with
// the sizes m = N, n = M. The bias is then a vector over cuBLASLt's rows, which are our columns —
// exactly Linear's per-output bias. Epilogues map to CUBLASLT_EPILOGUE_DEFAULT / _BIAS /
// _GELU_BIAS (or _GELU_AUX_BIAS when the pre-activation is kept); the residual add is beta = 1
// with C = D in place. The heuristic's first algorithm is cached per problem in the GemmContext.

#include "dpml/kernels/cuda/gemm/gemm.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

namespace dpml::kernels::cuda {

namespace detail {
// RAII for the three descriptor kinds of one call.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The largest power of two (≤ 256) dividing a pointer's address: cuBLASLt's heuristic assumes
// 256-byte aligned matrices unless told otherwise, and slices of flat buffers may be less.
inline std::uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

template <class T>
void lt_set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  DPML_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}
}  // namespace detail

struct CublasLt {
  static constexpr std::string_view name = "cublaslt";

  template <class TC>
  static bool supports(const GemmArgs<TC>&) {
    return true;  // cuBLASLt picks an algorithm for any layout; run() fails loudly if none exists
  }

  template <GemmEpilogue Epi, class TC, class TA>
  static void run(GemmContext& ctx, const GemmArgs<TC, TA>& g, cudaStream_t stream) {
    detail::check_gemm_args<Epi>(g, name);
    if (g.M == 0 || g.N == 0) return;
    constexpr bool fp16 = std::is_same_v<TC, f16>, fp32_in = std::is_same_v<TA, float>;
    constexpr cudaDataType_t in_type = fp32_in ? CUDA_R_32F : fp16 ? CUDA_R_16F : CUDA_R_16BF;
    constexpr cudaDataType_t c_type = std::is_same_v<TC, float> ? CUDA_R_32F : in_type;
    const bool keep_pre = std::is_same_v<Epi, epilogue::BiasGelu> && g.pre_gelu != nullptr;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if constexpr (std::is_same_v<Epi, epilogue::Bias>) epi = CUBLASLT_EPILOGUE_BIAS;
    if constexpr (std::is_same_v<Epi, epilogue::BiasGelu>)
      epi = keep_pre ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;

    detail::LtDescriptors d;
    const cublasOperation_t op_a = g.tb == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A = our B
    const cublasOperation_t op_b = g.ta == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B = our A
    DPML_CHECK_CUBLAS(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    detail::lt_set(d.op, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
    detail::lt_set(d.op, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
    detail::lt_set(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
    if constexpr (!std::is_same_v<Epi, epilogue::None>) {
      detail::lt_set(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(g.bias));
      detail::lt_set(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, in_type);
    }
    if (keep_pre) {
      detail::lt_set(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(g.pre_gelu));
      detail::lt_set(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ldc);
      detail::lt_set(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, in_type);
    }
    // Column-major views: cuBLASLt's A is op_a-stored (rows, cols) = (N, K) or (K, N), ld = ldb.
    const std::uint64_t N = static_cast<std::uint64_t>(g.N), M = static_cast<std::uint64_t>(g.M),
                        K = static_cast<std::uint64_t>(g.K);
    DPML_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&d.a, in_type, op_a == CUBLAS_OP_N ? N : K,
                                                 op_a == CUBLAS_OP_N ? K : N, g.ldb));
    DPML_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&d.b, in_type, op_b == CUBLAS_OP_N ? K : M,
                                                 op_b == CUBLAS_OP_N ? M : K, g.lda));
    DPML_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&d.c, c_type, N, M, g.ldc));

    // Alignments in bytes of cuBLASLt's A (our B), B (our A) and C = D: preferences and cache key.
    const std::uint32_t al_a = detail::alignment_of(g.B), al_b = detail::alignment_of(g.A),
                        al_c = detail::alignment_of(g.C);
    const GemmContext::AlgoKey key{g.M, g.N, g.K, g.lda, g.ldb, g.ldc,
                                   static_cast<std::int64_t>(g.ta == Trans::yes) * 2 + (g.tb == Trans::yes),
                                   static_cast<std::int64_t>(epi) * 16 + fp32_in * 8 + fp16 * 4 + (c_type == CUDA_R_32F) * 2 + (g.beta != 0.f),
                                   static_cast<std::int64_t>(al_a) << 16 | al_b, static_cast<std::int64_t>(al_c)};
    auto& cache = ctx.algo_cache();
    auto it = cache.find(key);
    if (it == cache.end()) {
      DPML_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&d.pref));
      const std::size_t ws = GemmContext::kWorkspaceBytes;
      DPML_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                             sizeof(ws)));
      const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> alignments[] = {
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c},
          {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_c}};
      for (const auto& [attr, value] : alignments)
        DPML_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(d.pref, attr, &value, sizeof(value)));
      cublasLtMatmulHeuristicResult_t h{};
      int found = 0;
      DPML_CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(ctx.lt(), d.op, d.a, d.b, d.c, d.c, d.pref, 1, &h, &found));
      DPML_REQUIRE(found > 0, "cuBLASLt has no algorithm for the GEMM M=" << g.M << " N=" << g.N << " K=" << g.K
                                                                         << " (ta=" << (g.ta == Trans::yes)
                                                                         << ", tb=" << (g.tb == Trans::yes)
                                                                         << ", epilogue " << static_cast<int>(epi)
                                                                         << ")");
      it = cache.emplace(key, h.algo).first;
    }
    DPML_CHECK_CUBLAS(cublasLtMatmul(ctx.lt(), d.op, &g.alpha, g.B, d.a, g.A, d.b, &g.beta, g.C, d.c, g.C, d.c,
                                     &it->second, ctx.workspace(), GemmContext::kWorkspaceBytes, stream));
  }
};

}  // namespace dpml::kernels::cuda
