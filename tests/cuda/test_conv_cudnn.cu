// CudnnConv (kernels/cuda/conv/cudnn.hpp) against dpml's implicit-GEMM Conv2d (conv2d.hpp), which
// test_conv.cu checks against float64: forward, backward_input and backward_weight on fresh random
// inputs at ResNet's shapes — 1×1 stride 1 and 2, 3×3 stride 1 and 2 with padding 1, the 7×7
// stride-2 stem on 8 and on 3 channels — and odd channel counts. Tolerances, relative L2: 1e-2 for
// bf16 outputs (two roundings to 8 bits); for dw, 2e-3 where cuDNN writes it in fp32 and 1e-2
// where it writes bf16 (backward_weight_rounds_to_bf16; that rounding alone gives ~2e-3). Outputs
// are poisoned (NaN) before each run; dw is checked overwritten (beta = 0, poisoned) and
// accumulated (beta = 1 onto random values). Every pass runs twice: the second round finds its
// plans cached, builds none and grows no buffer. Tensors only 2-byte aligned get plans of their own.
#include "device.hpp"

#include <dpml/core/error.hpp>
#include <dpml/kernels/cuda/conv/conv2d.hpp>
#include <dpml/kernels/cuda/conv/cudnn.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

using namespace dpml;
namespace kc = dpml::kernels::cuda;
namespace kh = dpml::kernels::host;

namespace {

constexpr double kFp32DwTol = 2e-3;

struct ConvCase {
  std::int64_t N, H, W, Cin, Cout, k, stride, pad;
};

kc::Conv2dShape shape_of(const ConvCase& c) {
  return {c.N, c.Cout, kh::ConvGeometry{c.Cin, c.H, c.W, c.k, c.k, c.stride, c.pad}};
}

// One case's random inputs and outputs on the device. `offset` elements in front of every bf16
// tensor make its address only 2-byte aligned (offset 1), as a view into a larger buffer can be.
struct ConvData {
  kc::Conv2dShape s;
  std::int64_t offset;
  std::size_t nx, nw, ny;
  std::vector<bf16> hx, hw, hdy;
  std::vector<float> hdw0;  // what dw holds before an accumulating (beta = 1) backward_weight
  test::DeviceVec<bf16> x, w, dy, y, dx;
  test::DeviceVec<float> dw, scratch;
  std::int64_t scratch_floats;

  ConvData(const ConvCase& c, std::int64_t off, std::mt19937_64& gen)
      : s(shape_of(c)),
        offset(off),
        nx(static_cast<std::size_t>(c.N * c.H * c.W * c.Cin)),
        nw(static_cast<std::size_t>(c.Cout * s.taps())),
        ny(static_cast<std::size_t>(s.pixels() * c.Cout)),
        hx(test::random_vec<bf16>(nx + static_cast<std::size_t>(off), gen)),
        hw(test::random_vec<bf16>(nw + static_cast<std::size_t>(off), gen)),
        hdy(test::random_vec<bf16>(ny + static_cast<std::size_t>(off), gen)),
        hdw0(test::random_vec<float>(nw, gen)),
        x(hx),
        w(hw),
        dy(hdy),
        y(ny + static_cast<std::size_t>(off)),
        dx(nx + static_cast<std::size_t>(off)),
        dw(nw),
        scratch(static_cast<std::size_t>(std::max<std::int64_t>(kc::conv2d_weight_scratch(s), 1))),
        scratch_floats(kc::conv2d_weight_scratch(s)) {}

  const bf16* px() const { return x.ptr + offset; }
  const bf16* pw() const { return w.ptr + offset; }
  const bf16* pdy() const { return dy.ptr + offset; }
  bf16* py() { return y.ptr + offset; }
  bf16* pdx() { return dx.ptr + offset; }

  // The elements of a bf16 output past the offset, as doubles.
  std::vector<double> result(const test::DeviceVec<bf16>& v) const {
    const auto h = v.download();
    return test::to_double(std::vector<bf16>(h.begin() + offset, h.end()));
  }
};

// dw before a backward_weight with this beta: poisoned for beta = 0 (it must not be read).
void reset_dw(ConvData& d, float beta) {
  if (beta == 0.f) d.dw.poison();
  else d.dw.upload(d.hdw0);
}

// Our kernels' three results, then CudnnConv's on the same inputs, compared.
void compare_passes(kc::CudnnConv& conv, ConvData& d) {
  d.y.poison();
  kc::conv2d_forward(d.px(), d.pw(), nullptr, d.py(), d.s, nullptr);
  const auto want_y = d.result(d.y);
  d.dx.poison();
  kc::conv2d_backward_input(d.pdy(), d.pw(), d.pdx(), d.s, nullptr);
  const auto want_dx = d.result(d.dx);

  d.y.poison();
  conv.forward(d.px(), d.pw(), d.py(), d.s, nullptr);
  CHECK(test::rel_l2(d.result(d.y), want_y) <= test::kBf16Tol);
  d.dx.poison();
  conv.backward_input(d.pdy(), d.pw(), d.pdx(), d.s, nullptr);
  CHECK(test::rel_l2(d.result(d.dx), want_dx) <= test::kBf16Tol);

  const bool dw_bf16 = conv.backward_weight_rounds_to_bf16(d.pdy(), d.px(), d.dw.ptr, d.s);
  const double dw_tol = dw_bf16 ? test::kBf16Tol : kFp32DwTol;
  for (const float beta : {0.f, 1.f}) {
    CAPTURE(beta, dw_bf16);
    reset_dw(d, beta);
    d.scratch.poison();
    kc::conv2d_backward_weight(d.pdy(), d.px(), d.dw.ptr, beta, d.scratch.ptr, d.scratch_floats, d.s, nullptr);
    const auto want_dw = test::to_double(d.dw.download());
    reset_dw(d, beta);
    conv.backward_weight(d.pdy(), d.px(), d.dw.ptr, beta, d.s, nullptr);
    CHECK(test::rel_l2(d.dw.download(), want_dw) <= dw_tol);
  }
}

}  // namespace

TEST_CASE("CudnnConv: the three passes against the implicit-GEMM kernels, twice (plan cache)", "[conv][cudnn][gpu]") {
  const ConvCase cases[] = {
      {4, 14, 14, 64, 256, 1, 1, 0},   // 1×1 stride 1: a bottleneck's expansion
      {4, 28, 28, 128, 256, 1, 2, 0},  // 1×1 stride 2: a downsampling shortcut
      {4, 14, 14, 64, 64, 3, 1, 1},    // 3×3 stride 1, padding 1
      {4, 15, 15, 32, 64, 3, 2, 1},    // 3×3 stride 2, padding 1, odd size
      {2, 32, 32, 8, 64, 7, 2, 3},     // the 7×7 stride-2 stem, RGB padded to 8 channels
      {2, 32, 32, 3, 64, 7, 2, 3},     // the stem on RGB itself: Cin = 3
      {2, 10, 9, 5, 7, 3, 1, 1},       // odd Cin and Cout
  };
  kc::CudnnConv conv;
  std::size_t plans = 0, bytes = 0;
  for (int round = 0; round < 2; ++round) {
    for (const ConvCase& c : cases) {
      CAPTURE(round, c.N, c.H, c.W, c.Cin, c.Cout, c.k, c.stride, c.pad);
      auto gen = test::rng(static_cast<std::uint64_t>(round * 7919 + c.H * 1009 + c.Cin * 31 + c.Cout * 7 + c.k));
      ConvData d(c, 0, gen);
      compare_passes(conv, d);
    }
    if (round == 0) {
      plans = conv.plan_count();
      bytes = conv.workspace_bytes();
      CHECK(plans == 3 * std::size(cases));  // cudaMalloc'd tensors: one alignment, three passes a shape
    }
  }
  CHECK(conv.plan_count() == plans);  // the second round built no plan…
  CHECK(conv.workspace_bytes() == bytes);  // …and allocated nothing
}

TEST_CASE("CudnnConv: prepare() builds every plan a step needs; 2-byte aligned tensors get their own",
          "[conv][cudnn][gpu]") {
  const ConvCase c{2, 16, 16, 32, 64, 3, 2, 1};
  kc::CudnnConv conv;
  conv.prepare(shape_of(c));
  const std::size_t bytes = conv.workspace_bytes();
  CHECK(conv.plan_count() == 3);

  auto gen = test::rng(0xC0DE);
  ConvData aligned(c, 0, gen);
  compare_passes(conv, aligned);  // beta 0 and 1 included
  CHECK(conv.plan_count() == 3);
  CHECK(conv.workspace_bytes() == bytes);

  ConvData misaligned(c, 1, gen);  // every bf16 tensor one element into its buffer
  compare_passes(conv, misaligned);
  CHECK(conv.plan_count() == 6);
}

TEST_CASE("CudnnConv: a shape with no convolution is refused with a message", "[conv][cudnn][gpu]") {
  const ConvCase c{1, 2, 2, 8, 8, 7, 1, 0};  // a 7×7 kernel on a 2×2 image without padding
  kc::CudnnConv conv;
  test::DeviceVec<bf16> x(64), w(64 * 49), y(64);
  test::DeviceVec<float> dw(64 * 49);
  CHECK_THROWS_AS(conv.forward(x.ptr, w.ptr, y.ptr, shape_of(c), nullptr), dpml::Error);
  CHECK_THROWS_AS(conv.backward_weight(y.ptr, x.ptr, dw.ptr, 0.f, shape_of(c), nullptr), dpml::Error);
  CHECK(conv.plan_count() == 0);
}
