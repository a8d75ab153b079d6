// Device GEMM: the cuBLASLt policy and the dispatcher (gemm(), today cuBLASLt for every
// problem) against a float64 host loop on the same operands (gemm_check.hpp: all four (ta, tb)
// layouts, every epilogue, bf16, fp16 and fp32 outputs, shapes that are not multiples of the
// tiles, nothing written out of bounds). Our own kernels are checked beside them in bench/gemm
// (test_tiled.cu, test_wgmma.cu).
#include "gemm_check.hpp"

#include <dpml/kernels/cuda/gemm/dispatch.hpp>

#include <string>
#include <string_view>

using namespace dpml;
using namespace dpml::kernels::cuda;
using test::gemm::check_policy;

namespace {

// The dispatcher, seen as a policy.
struct Dispatch {
  static constexpr std::string_view name = "dispatch";
  template <GemmEpilogue Epi, class TC>
  static void run(GemmContext& ctx, const GemmArgs<TC>& g, cudaStream_t s) {
    gemm<Epi>(ctx, g, s);
  }
};

}  // namespace

TEST_CASE("gemm: cuBLASLt policy against float64", "[gemm][gpu]") {
  GemmContext ctx;
  check_policy<CublasLt>(ctx);
}

TEST_CASE("gemm: fp16 through cuBLASLt and the dispatcher against float64", "[gemm][gpu]") {
  GemmContext ctx;
  check_policy<CublasLt, true>(ctx);
  check_policy<Dispatch, true>(ctx);
}

TEST_CASE("gemm: the dispatcher against float64", "[gemm][gpu]") {
  GemmContext ctx;
  check_policy<Dispatch>(ctx);
}

TEST_CASE("gemm: misuse is refused with a message", "[gemm][gpu]") {
  GemmContext ctx;
  test::DeviceVec<bf16> buf(64 * 64);
  GemmArgs<bf16> g{Trans::no, Trans::no, 16, 16, 16, buf.ptr, 8, buf.ptr, 16, buf.ptr, 16};
  CHECK(test::error_of([&] { CublasLt::run<epilogue::None>(ctx, g, nullptr); }).find("lda=8") != std::string::npos);
  g.lda = 16;
  CHECK(test::error_of([&] { gemm<epilogue::Bias>(ctx, g, nullptr); }).find("bias") != std::string::npos);
}
