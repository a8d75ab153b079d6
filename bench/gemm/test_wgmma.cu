// WgmmaGemm (Hopper wgmma + TMA, sm_90a) against a float64 host product of the same bf16 operands:
// the cooperative schedule (one tile per block; also with its epilogue stored by TMA, and in 2×1
// clusters) and the persistent ping-pong one at two tile shapes each, split K in both, all four
// (ta, tb) layouts, every epilogue, bf16 and fp32 outputs, and
// shapes that exercise what the kernel does differently from the tiled one — K longer than the
// pipeline (stages reused, mbarrier phases wrapping), ragged M, N and K zero-filled by the copy
// engine (K < 64, K = 0, N < 64 boxes), more than 8 tile-rows (grouped block order), row strides
// longer than the rows. C (and pre_gelu) are poisoned with a guard band of rows below M; nothing
// outside (M, N) may change. Tolerance: relative L2 ≤ 1e-2 for bf16 outputs, 1e-5 for fp32.
//
// Registered as test_cuda_gemm_wgmma and built for sm_90a (tests/cuda/CMakeLists.txt sets the
// target's CUDA_ARCHITECTURES to 90a), so on a compute capability 9.0 device the policy must be
// available; other devices skip (exit 77).
#include "device.hpp"
#include "kernels/wgmma.hpp"

#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

using namespace dpml;
using namespace dpml::kernels::cuda;

namespace {

const bool hopper_present = [] {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9 || prop.minor != 0) {
    std::fprintf(stderr, "not a compute capability 9.0 device: the sm_90a wgmma test is skipped\n");
    std::exit(77);
  }
  return true;
}();

using Coop128 = WgmmaGemm<TileShape<128, 128, 64>, 4, wgmma_schedule::Cooperative>;
using Coop256 = WgmmaGemm<TileShape<128, 256, 64>, 3, wgmma_schedule::Cooperative>;
using CoopTmaStore128 = WgmmaGemm<TileShape<128, 128, 64>, 4, wgmma_schedule::CooperativeTmaStore>;
using CoopTmaStore256 = WgmmaGemm<TileShape<128, 256, 64>, 3, wgmma_schedule::CooperativeTmaStore>;
using CoopMulticast128 = WgmmaGemm<TileShape<128, 128, 64>, 6, wgmma_schedule::CooperativeMulticast>;
using CoopMulticast256 = WgmmaGemm<TileShape<128, 256, 64>, 4, wgmma_schedule::CooperativeMulticast>;
using Pingpong128 = WgmmaGemm<TileShape<128, 128, 64>, 6>;
using Pingpong64x256 = WgmmaGemm<TileShape<64, 256, 64>, 4>;
static_assert(GemmPolicy<Coop128> && GemmPolicy<CoopTmaStore128> && GemmPolicy<CoopMulticast128> &&
              GemmPolicy<Pingpong128>);

struct Dims {
  std::int64_t M, N, K;
};
const Dims kShapes[] = {{128, 128, 64},  {200, 136, 72},   {77, 40, 56}, {64, 75, 100}, {16, 8, 16},
                         {300, 264, 1000}, {1100, 300, 130}, {64, 128, 0}, {130, 520, 520}};

constexpr std::int64_t kGuardRows = 64;  // poisoned rows below M in C and pre_gelu

std::int64_t padded(std::int64_t n) { return (n + 7) / 8 * 8 + 8; }  // a row stride longer than the row

double gelu_ref(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

// One (layout, shape): bf16 operands on host and device, and their float64 product (M, N).
struct Operands {
  Trans ta, tb;
  std::int64_t M, N, K, lda, ldb, ldc;
  std::vector<bf16> hA, hB, hBias;
  test::DeviceVec<bf16> A, B, bias;
  std::vector<double> ab;  // (M, N)

  Operands(Trans ta_, Trans tb_, Dims s, std::mt19937_64& gen)
      : ta(ta_), tb(tb_), M(s.M), N(s.N), K(s.K), lda(padded(ta == Trans::no ? K : M)),
        ldb(padded(tb == Trans::no ? N : K)), ldc(padded(N)),
        hA(test::random_vec<bf16>(static_cast<std::size_t>((ta == Trans::no ? M : K) * lda), gen)),
        hB(test::random_vec<bf16>(static_cast<std::size_t>((tb == Trans::no ? K : N) * ldb), gen)),
        hBias(test::random_vec<bf16>(static_cast<std::size_t>(N), gen)), A(hA), B(hB), bias(hBias),
        ab(static_cast<std::size_t>(M * N), 0.0) {
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t k = 0; k < K; ++k) {
        const double a = test::as_double(ta == Trans::no ? hA[i * lda + k] : hA[k * lda + i]);
        for (std::int64_t j = 0; j < N; ++j)
          ab[i * N + j] += a * test::as_double(tb == Trans::no ? hB[k * ldb + j] : hB[j * ldb + k]);
      }
  }
};

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Runs Policy::run<Epi> on the operands with output type TC and checks it.
template <class Policy, class Epi, class TC>
void check(KernelContext& ctx, const Operands& op, float beta, std::uint64_t salt) {
  constexpr bool has_bias = !std::is_same_v<Epi, epilogue::None>, is_gelu = std::is_same_v<Epi, epilogue::BiasGelu>;
  const std::int64_t M = op.M, N = op.N, ldc = op.ldc, rows = M + kGuardRows;
  auto gen = test::rng(salt);
  const auto hC = test::random_vec<TC>(static_cast<std::size_t>(rows * ldc), gen);  // (M + guard, ldc)
  test::DeviceVec<TC> C(hC.size());
  test::DeviceVec<bf16> pre(static_cast<std::size_t>(rows * ldc));
  if (beta != 0.f) C.upload(hC);
  else C.poison();
  pre.poison();

  GemmArgs<TC> g{op.ta, op.tb, M, N, op.K, op.A.ptr, op.lda, op.B.ptr, op.ldb, C.ptr, ldc};
  g.alpha = 0.75f;
  g.beta = beta;
  if (has_bias) g.bias = op.bias.ptr;
  if (is_gelu) g.pre_gelu = pre.ptr;
  REQUIRE(Policy::supports(g));
  Policy::template run<Epi>(ctx, g, nullptr);
  const auto got = C.download();
  const auto got_pre = pre.download();

  std::vector<double> want(static_cast<std::size_t>(M * N)), want_pre(want.size());
  std::vector<TC> got_dense(want.size());
  std::vector<bf16> got_pre_dense(want.size());
  int changed_outside = 0, pre_outside = 0;
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < ldc; ++j) {
      const std::size_t at = static_cast<std::size_t>(i * ldc + j);
      if (i >= M || j >= N) {
        changed_outside += beta == 0.f ? !test::still_poisoned(got[at]) : !same_bits(got[at], hC[at]);
        pre_outside += !test::still_poisoned(got_pre[at]);
        continue;
      }
      const double v = 0.75 * op.ab[i * N + j] + (has_bias ? test::as_double(op.hBias[j]) : 0.0) +
                       beta * test::as_double(hC[at]);
      want_pre[i * N + j] = v;
      want[i * N + j] = is_gelu ? gelu_ref(v) : v;
      got_dense[i * N + j] = got[at];
      got_pre_dense[i * N + j] = got_pre[at];
    }
  const std::string policy = std::string(Policy::name) + " " + std::string(Policy::schedule::name) + " " +
                             std::to_string(Policy::tile::M) + "x" + std::to_string(Policy::tile::N);
  const int splits = Policy::split_count(M, N, op.K, ctx.sm_count());
  const bool ta = op.ta == Trans::yes, tb = op.tb == Trans::yes, fp32_out = std::is_same_v<TC, float>;
  CAPTURE(policy, M, N, op.K, splits, ta, tb, beta, has_bias, is_gelu, fp32_out);
  const double err = test::rel_l2(got_dense, want);
  CAPTURE(err);
  CHECK(err <= (fp32_out ? test::kFp32Tol : test::kBf16Tol));
  CHECK(changed_outside == 0);
  CHECK(pre_outside == 0);
  if (is_gelu) {
    const double err_pre = test::rel_l2(got_pre_dense, want_pre);
    CAPTURE(err_pre);
    CHECK(err_pre <= test::kBf16Tol);
  }
}

template <class Policy, std::size_t Count>
void check_policy(KernelContext& ctx, const Dims (&shapes)[Count], std::uint64_t salt) {
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes})
      for (const auto& s : shapes) {
        auto gen = test::rng(++salt);
        const Operands op(ta, tb, s, gen);
        check<Policy, epilogue::None, bf16>(ctx, op, 0.f, ++salt);
        check<Policy, epilogue::Bias, bf16>(ctx, op, 0.f, ++salt);
        check<Policy, epilogue::BiasGelu, bf16>(ctx, op, 0.f, ++salt);
        check<Policy, epilogue::Bias, bf16>(ctx, op, 1.f, ++salt);   // residual add
        check<Policy, epilogue::None, float>(ctx, op, 1.f, ++salt);  // gradient accumulation
        check<Policy, epilogue::None, float>(ctx, op, 0.f, ++salt);
      }
}

}  // namespace

TEST_CASE("gemm wgmma: cooperative 128x128x64, 4 stages, against float64", "[gemm][gpu][wgmma]") {
  KernelContext ctx;
  check_policy<Coop128>(ctx, kShapes, 1000);
}

TEST_CASE("gemm wgmma: cooperative 128x256x64, 3 stages, against float64", "[gemm][gpu][wgmma]") {
  KernelContext ctx;
  check_policy<Coop256>(ctx, kShapes, 2000);
}

// The staged epilogue: bf16 outputs go through shared memory and a TMA store, clipped at M and N by
// the copy engine (the guard rows and the columns past N must stay poisoned); fp32 outputs, and
// bf16 ones whose N is not a multiple of 8 (N = 75, 300 here), take the register epilogue of the
// same kernel.
TEST_CASE("gemm wgmma: cooperative with a TMA-store epilogue, 128x128 and 128x256, against float64", "[gemm][gpu][wgmma]") {
  KernelContext ctx;
  check_policy<CoopTmaStore128>(ctx, kShapes, 8000);
  check_policy<CoopTmaStore256>(ctx, kShapes, 9000);
}

// Pairs of blocks sharing B through TMA multicast: odd tile-row counts (a block past M that only
// shares), one tile row, K = 0, and both B layouts (K-major: half a box each; MN-major: half the boxes).
TEST_CASE("gemm wgmma: cooperative with 2x1 cluster multicast, 128x128 and 128x256, against float64",
          "[gemm][gpu][wgmma]") {
  KernelContext ctx;
  check_policy<CoopMulticast128>(ctx, kShapes, 6000);
  check_policy<CoopMulticast256>(ctx, kShapes, 7000);
}

TEST_CASE("gemm wgmma: persistent ping-pong 128x128x64 and 64x256x64 against float64", "[gemm][gpu][wgmma]") {
  KernelContext ctx;
  check_policy<Pingpong128>(ctx, kShapes, 3000);
  check_policy<Pingpong64x256>(ctx, kShapes, 4000);
}

// Few tiles and a long K: both schedules split K (the cooperative one per warpgroup's rows, and
// then from registers even where its epilogue would be TMA-stored), and the splits' partial tiles
// are summed in order — more splits than SMs hold blocks, a ragged last split, every epilogue — and
// the same call twice gives the same bits (the first left the arrival counters at zero).
template <class Policy>
void check_split_k(KernelContext& ctx, std::uint64_t salt) {
  const Dims split_shapes[] = {{200, 136, 3000}, {128, 128, 8192}, {77, 300, 4000}, {400, 264, 4000}};
  for (const auto& s : split_shapes) {
    CAPTURE(Policy::schedule::name, Policy::tile::N, s.M, s.N, s.K);
    CHECK(Policy::split_count(s.M, s.N, s.K, ctx.sm_count()) > 1);
  }
  check_policy<Policy>(ctx, split_shapes, salt);

  auto gen = test::rng(salt + 1000);
  const Operands op(Trans::yes, Trans::no, {300, 264, 8000}, gen);
  test::DeviceVec<float> C(static_cast<std::size_t>(op.M * op.ldc));
  GemmArgs<float> g{op.ta, op.tb, op.M, op.N, op.K, op.A.ptr, op.lda, op.B.ptr, op.ldb, C.ptr, op.ldc};
  REQUIRE(Policy::split_count(g.M, g.N, g.K, ctx.sm_count()) > 1);
  C.poison();  // the padding columns past N stay NaN in both runs: compare bits
  Policy::template run<epilogue::None>(ctx, g, nullptr);
  const auto first = C.download();
  C.poison();
  Policy::template run<epilogue::None>(ctx, g, nullptr);
  const auto second = C.download();
  CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0);
}

TEST_CASE("gemm wgmma: split K is exact, deterministic and reusable", "[gemm][gpu][wgmma]") {
  KernelContext ctx;
  check_split_k<Pingpong128>(ctx, 5000);
  check_split_k<Coop256>(ctx, 10000);
  check_split_k<CoopTmaStore128>(ctx, 11000);
}

TEST_CASE("gemm wgmma: what it cannot take is refused with a message", "[gemm][gpu][wgmma]") {
  KernelContext ctx;
  test::DeviceVec<bf16> buf(64 * 64);
  GemmArgs<bf16> g{Trans::no, Trans::no, 16, 16, 16, buf.ptr, 16, buf.ptr, 16, buf.ptr, 16};
  CHECK(Pingpong128::supports(g));
  CHECK(test::error_of([&] { Pingpong128::run<epilogue::Bias>(ctx, g, nullptr); }).find("bias") != std::string::npos);
  g.lda = 20;  // not a multiple of 8: no tensor map for it
  CHECK_FALSE(Pingpong128::supports(g));
  CHECK(test::error_of([&] { Pingpong128::run<epilogue::None>(ctx, g, nullptr); }).find("multiples of 8") !=
        std::string::npos);
  g.lda = 16;
  g.A = buf.ptr + 1;  // 2-byte aligned
  CHECK_FALSE(Pingpong128::supports(g));
}
