#pragma once
// The device GEMM check shared by tests/cuda/test_gemm.cu (cuBLASLt and the dispatcher) and
// bench/gemm/test_tiled.cu (our mma.sync TiledGemm): a policy P (P::name, P::run<Epilogue>(ctx,
// args, stream)) against a float64 host loop on the same bf16 (or f16) operands, for all four
// (ta, tb) layouts, every epilogue, bf16 and fp32 outputs, and shapes that are not multiples of
// the tiles (ragged M, N, K; odd N; row strides longer than the rows). Outputs are poisoned before
// each run; the padding between N and ldc must stay poisoned (nothing written out of bounds).
// Tolerances: relative L2 ≤ 1e-2 for bf16 outputs, ≤ 1e-5 for fp32 outputs (bf16 operands are
// exact in the reference, so only fp32 accumulation differs).
#include "device.hpp"

#include <dpml/kernels/cuda/gemm/gemm.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace dpml::test::gemm {

using kernels::cuda::f16;
using kernels::cuda::GemmArgs;
using kernels::cuda::Trans;
namespace epilogue = kernels::cuda::epilogue;

struct Problem {
  std::int64_t M, N, K;
};
inline const Problem kProblems[] = {{128, 128, 64}, {200, 136, 72}, {77, 40, 56}, {64, 75, 100}, {300, 264, 260}, {16, 8, 16}};

inline std::int64_t pad8(std::int64_t n) { return (n + 7) / 8 * 8 + 8; }  // a row stride longer than the row

inline double gelu_ref(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

struct Case {
  Trans ta, tb;
  Problem p;
};

// Runs Policy::run<Epi> on one problem and checks it.
template <class Policy, class Epi, class TC>
void check_one(kernels::cuda::GemmContext& ctx, const Case& cs, float beta, std::uint64_t salt) {
  const auto [M, N, K] = cs.p;
  auto gen = rng(salt);
  const std::int64_t a_rows = cs.ta == Trans::no ? M : K, a_cols = cs.ta == Trans::no ? K : M;
  const std::int64_t b_rows = cs.tb == Trans::no ? K : N, b_cols = cs.tb == Trans::no ? N : K;
  const std::int64_t lda = pad8(a_cols), ldb = pad8(b_cols), ldc = pad8(N);
  using In = typename GemmArgs<TC>::input_type;  // bf16, or f16 with an f16 output
  auto hA = random_vec<In>(static_cast<std::size_t>(a_rows * lda), gen);
  auto hB = random_vec<In>(static_cast<std::size_t>(b_rows * ldb), gen);
  auto hBias = random_vec<In>(static_cast<std::size_t>(N), gen);
  auto hC = random_vec<TC>(static_cast<std::size_t>(M * ldc), gen);
  DeviceVec<In> A(hA), B(hB), bias(hBias), pre(static_cast<std::size_t>(M * ldc));
  DeviceVec<TC> C(static_cast<std::size_t>(M * ldc));
  if (beta != 0.f) C.upload(hC);
  else C.poison();
  pre.poison();

  constexpr bool has_bias = !std::is_same_v<Epi, epilogue::None>, is_gelu = std::is_same_v<Epi, epilogue::BiasGelu>;
  GemmArgs<TC> g;
  g.ta = cs.ta;
  g.tb = cs.tb;
  g.M = M;
  g.N = N;
  g.K = K;
  g.A = A.ptr;
  g.lda = lda;
  g.B = B.ptr;
  g.ldb = ldb;
  g.C = C.ptr;
  g.ldc = ldc;
  g.alpha = 0.75f;
  g.beta = beta;
  if (has_bias) g.bias = bias.ptr;
  if (is_gelu) g.pre_gelu = pre.ptr;
  Policy::template run<Epi>(ctx, g, nullptr);
  const auto got = C.download();
  const auto got_pre = pre.download();

  std::vector<double> want(static_cast<std::size_t>(M * N)), want_pre(want.size());
  std::vector<TC> got_dense(want.size());
  std::vector<In> got_pre_dense(want.size());
  int written_outside = 0;
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double a = as_double(cs.ta == Trans::no ? hA[i * lda + k] : hA[k * lda + i]);
        const double b = as_double(cs.tb == Trans::no ? hB[k * ldb + j] : hB[j * ldb + k]);
        s += a * b;
      }
      double v = 0.75 * s + (has_bias ? as_double(hBias[j]) : 0.0) + beta * as_double(hC[i * ldc + j]);
      want_pre[i * N + j] = v;
      want[i * N + j] = is_gelu ? gelu_ref(v) : v;
      got_dense[i * N + j] = got[i * ldc + j];
      got_pre_dense[i * N + j] = got_pre[i * ldc + j];
    }
    for (std::int64_t j = N; j < ldc; ++j) written_outside += !still_poisoned(got[i * ldc + j]) && beta == 0.f;
  }
  const double tol = std::is_same_v<TC, float> ? kFp32Tol : kBf16Tol;
  const std::string policy(Policy::name);
  const bool fp32_out = std::is_same_v<TC, float>, fp16 = std::is_same_v<TC, f16>;  // named: CAPTURE splits template commas
  CAPTURE(policy, M, N, K, cs.ta == Trans::yes, cs.tb == Trans::yes, beta, has_bias, is_gelu, fp32_out, fp16);
  const double err = rel_l2(got_dense, want);
  CAPTURE(err);
  CHECK(err <= tol);
  CHECK(written_outside == 0);
  if (is_gelu) {
    const double err_pre = rel_l2(got_pre_dense, want_pre);
    CAPTURE(err_pre);
    CHECK(err_pre <= kBf16Tol);
  }
}

// Fp16: operands and output f16 (the fp16 precision policy; cuBLASLt and the dispatcher only).
template <class Policy, bool Fp16 = false>
void check_policy(kernels::cuda::GemmContext& ctx) {
  std::uint64_t salt = Fp16 ? 5000 : 100;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes})
      for (const auto& p : kProblems) {
        const Case cs{ta, tb, p};
        if constexpr (Fp16) {
          check_one<Policy, epilogue::None, f16>(ctx, cs, 0.f, ++salt);
          check_one<Policy, epilogue::Bias, f16>(ctx, cs, 0.f, ++salt);
          check_one<Policy, epilogue::BiasGelu, f16>(ctx, cs, 0.f, ++salt);
          check_one<Policy, epilogue::Bias, f16>(ctx, cs, 1.f, ++salt);  // residual add
        } else {
          check_one<Policy, epilogue::None, bf16>(ctx, cs, 0.f, ++salt);
          check_one<Policy, epilogue::Bias, bf16>(ctx, cs, 0.f, ++salt);
          check_one<Policy, epilogue::BiasGelu, bf16>(ctx, cs, 0.f, ++salt);
          check_one<Policy, epilogue::Bias, bf16>(ctx, cs, 1.f, ++salt);   // residual add
          check_one<Policy, epilogue::None, float>(ctx, cs, 1.f, ++salt);  // gradient accumulation
          check_one<Policy, epilogue::None, float>(ctx, cs, 0.f, ++salt);
        }
      }
}

}  // namespace dpml::test::gemm
