// TiledGemm (kernels/tiled.hpp: mma.sync, cp.async pipeline) against a float64 host loop on the
// same bf16 operands, in two tile configurations (tests/cuda/gemm_check.hpp: all four (ta, tb)
// layouts, every epilogue, bf16 and fp32 outputs, shapes that are not multiples of the tiles,
// nothing written out of bounds), and what it cannot take refused with a message. Registered as
// test_cuda_gemm_tiled in tests/cuda/CMakeLists.txt.
#include "gemm_check.hpp"
#include "kernels/tiled.hpp"

#include <string>

using namespace dpml;
using namespace dpml::kernels::cuda;
using test::gemm::check_policy;

namespace {
using Tiled128 = TiledGemm<TileShape<128, 128, 32>, 4>;
using Tiled64 = TiledGemm<TileShape<64, 64, 32>, 3, WarpTile<32, 32>>;
static_assert(GemmPolicy<Tiled128> && GemmPolicy<Tiled64>);
}  // namespace

TEST_CASE("gemm tiled: 128x128x32, 4 stages, against float64", "[gemm][gpu]") {
  GemmContext ctx;
  check_policy<Tiled128>(ctx);
}

TEST_CASE("gemm tiled: 64x64x32, 3 stages, 32x32 warps, against float64", "[gemm][gpu]") {
  GemmContext ctx;
  check_policy<Tiled64>(ctx);
}

TEST_CASE("gemm tiled: misuse is refused with a message", "[gemm][gpu]") {
  GemmContext ctx;
  test::DeviceVec<bf16> buf(64 * 64);
  GemmArgs<bf16> g{Trans::no, Trans::no, 16, 16, 16, buf.ptr, 16, buf.ptr, 16, buf.ptr, 16};
  CHECK(Tiled128::supports(g));
  CHECK(test::error_of([&] { Tiled128::run<epilogue::Bias>(ctx, g, nullptr); }).find("bias") != std::string::npos);
  g.lda = 20;  // not a multiple of 8: no 16-byte cp.async rows
  CHECK_FALSE(Tiled128::supports(g));
  CHECK(test::error_of([&] { Tiled128::run<epilogue::None>(ctx, g, nullptr); }).find("multiples of 8") !=
        std::string::npos);
}
