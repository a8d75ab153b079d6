// Element-wise layers and containers on CudaSpace against the same layers on the host in float64
// (layer_check.hpp), in bf16 and fp32: ReLU, GELU, Dropout (train: the host's mask exactly, eval:
// the identity), Flatten (a view), and Sequential, Stack and Residual of Linear and activation
// layers, each parameter reported grad-ready exactly once on the device context. Sizes are not
// multiples of the kernels' 8-element packs or of Philox's 4-word blocks.
#include "layer_check.hpp"

#include <dpml/layers/activation.hpp>
#include <dpml/layers/dropout.hpp>
#include <dpml/layers/flatten.hpp>
#include <dpml/layers/linear.hpp>
#include <dpml/layers/residual.hpp>
#include <dpml/layers/sequential.hpp>
#include <dpml/layers/stack.hpp>

#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

using namespace dpml;
using namespace dpml::layers;

namespace {

// Grad-ready reports per parameter name, as a gradient bucket would receive them.
struct ReadyCounts {
  std::map<std::string, int> counts;
  void attach(Context<CudaSpace>& ctx) {
    ctx.on_grad_ready = [this](std::span<ParamBase* const> ps) {
      for (ParamBase* p : ps) ++counts[p->name()];
    };
  }
  // Every parameter of `layer` reported exactly once, nothing else reported.
  template <class L>
  void check_once(L& layer) {
    const auto params = layer.parameters();
    CHECK(counts.size() == params.size());
    for (auto* p : params) {
      CAPTURE(p->name());
      CHECK(counts[p->name()] == 1);
    }
    counts.clear();
  }
};

}  // namespace

TEMPLATE_TEST_CASE("ReLU and GELU on the GPU equal the float64 host layers", "[cuda][layers]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(21);
  for (Shape shape : {Shape{3, 7, 45}, Shape{130, 64}}) {  // a scalar tail, whole 8-element packs
    CAPTURE(shape.str());
    ReLU<double> host_relu;
    ReLU<T, CudaSpace> dev_relu;
    check.run(host_relu, dev_relu, shape, test::kLayerTol<T>);
    GELU<double> host_gelu;
    GELU<T, CudaSpace> dev_gelu;
    check.run(host_gelu, dev_gelu, shape, test::kLayerTol<T>);
  }
}

// Training: the same elements kept as on the host (compared exactly: the mask holds 0 or
// 1/(1 − p) rounded to T), y and dx within tolerance; samples of 21 and 1001 elements (not a
// multiple of 4: the last Philox block of a sample is partly used), a sample offset, a step.
TEMPLATE_TEST_CASE("Dropout on the GPU draws the host's mask; eval is the identity", "[cuda][layers]", bf16, float) {
  using T = TestType;
  const double p = 0.3;
  test::DeviceLayerCheck<T> check(22);
  auto& dctx = check.device_context();
  auto place = [](auto& ctx) {  // both contexts at the same step and samples
    ctx.seed = 0xfeed'beefull;
    ctx.step = 4;
    ctx.sample_offset = 13;
  };
  place(check.host_context());
  place(dctx);
  const double keep = test::as_double(static_cast<T>(static_cast<float>(1.0 / (1.0 - p))));
  for (Shape shape : {Shape{37, 3, 7}, Shape{6, 1001}}) {
    CAPTURE(shape.str());
    Dropout<double> host(p, 5);
    Dropout<T, CudaSpace> dev(p, 5);
    check.run(host, dev, shape, test::kLayerTol<T>);
    const auto want = host.mask(0);
    const auto got = test::download_doubles(dev.mask(0));
    REQUIRE(got.size() == static_cast<std::size_t>(want.numel()));
    std::int64_t kept = 0, mismatched = 0;
    for (std::int64_t i = 0; i < want.numel(); ++i) {
      const double expected = want[i] != 0.0 ? keep : 0.0;
      mismatched += got[static_cast<std::size_t>(i)] != expected;
      kept += want[i] != 0.0;
    }
    CHECK(mismatched == 0);
    CHECK(kept > 0);
    CHECK(kept < want.numel());
  }

  dctx.mode = Mode::eval;
  Dropout<T, CudaSpace> dev(p, 5);
  const auto x = test::upload_as<T>(test::random_tensor<double>(Shape{4, 9}, check.gen()));
  CHECK(dev.forward(dctx, x.cview()).data() == x.data());
  CHECK(dev.backward_input(dctx, x.cview()).data() == x.data());
}

TEMPLATE_TEST_CASE("Flatten on the GPU is a view: (N, C, H, W) → (N, C·H·W) and back", "[cuda][layers]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(23);
  Flatten<double> host;
  Flatten<T, CudaSpace> dev;
  check.run(host, dev, Shape{5, 3, 4, 7}, test::kLayerTol<T>);
  const auto x = test::upload_as<T>(test::random_tensor<double>(Shape{5, 3, 4, 7}, check.gen()));
  const auto y = dev.forward(check.device_context(), x.cview());
  CHECK(y.data() == x.data());
  CHECK(y.shape() == Shape{5, 84});
  const auto dx = dev.backward_input(check.device_context(), y);
  CHECK(dx.data() == x.data());
  CHECK(dx.shape() == Shape{5, 3, 4, 7});
}

TEMPLATE_TEST_CASE("Sequential<Linear, ReLU, Linear> on the GPU equals the float64 host one", "[cuda][layers]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(24);
  ReadyCounts ready;
  ready.attach(check.device_context());
  Sequential<Linear<double>, ReLU<double>, Linear<double>> host(Linear<double>(45, 29, {.name = "fc1"}), ReLU<double>{},
                                                                Linear<double>(29, 13, {.name = "fc2"}));
  Sequential<Linear<T, CudaSpace>, ReLU<T, CudaSpace>, Linear<T, CudaSpace>> dev(
      Linear<T, CudaSpace>(45, 29, {.name = "fc1"}), ReLU<T, CudaSpace>{}, Linear<T, CudaSpace>(29, 13, {.name = "fc2"}));
  check.run(host, dev, Shape{3, 11, 45}, test::kLayerTol<T>);
  ready.check_once(dev);
}

TEMPLATE_TEST_CASE("A Stack of Linear + GELU blocks on the GPU equals the float64 host one", "[cuda][layers]", bf16, float) {
  using T = TestType;
  const std::int64_t C = 37, depth = 3;
  auto make = [&]<class Space, class E>() {
    using Block = Sequential<Linear<E, Space>, GELU<E, Space>>;
    std::vector<Block> blocks;
    for (std::int64_t i = 0; i < depth; ++i) blocks.emplace_back(Linear<E, Space>(C, C, {.name = "fc"}), GELU<E, Space>{});
    return Stack<Block>(std::move(blocks), "blocks");
  };
  test::DeviceLayerCheck<T> check(25);
  ReadyCounts ready;
  ready.attach(check.device_context());
  auto host = make.template operator()<HostSpace, double>();
  auto dev = make.template operator()<CudaSpace, T>();
  check.run(host, dev, Shape{5, 7, C}, test::kLayerTol<T>);
  ready.check_once(dev);
}

TEMPLATE_TEST_CASE("Residual<Sequential<Linear, GELU, Linear>> on the GPU equals the float64 host one", "[cuda][layers]", bf16,
                   float) {
  // GELU, not ReLU, inside: a bf16 GEMM's rounding flips the sign of the few pre-activations within
  // 1e-3 of zero, and at ReLU's kink that moves fc1's gradient by percents (measured 2.7 % rel L2
  // at these shapes, H100) — a property of ReLU in bf16, not of the container under test.
  using T = TestType;
  const std::int64_t C = 45;
  auto make = [&]<class Space, class E>() {
    using Body = Sequential<Linear<E, Space>, GELU<E, Space>, Linear<E, Space>>;
    return Residual<Body>(Body(Linear<E, Space>(C, 29, {.name = "fc1"}), GELU<E, Space>{}, Linear<E, Space>(29, C, {.name = "fc2"})));
  };
  test::DeviceLayerCheck<T> check(26);
  ReadyCounts ready;
  ready.attach(check.device_context());
  auto host = make.template operator()<HostSpace, double>();
  auto dev = make.template operator()<CudaSpace, T>();
  check.run(host, dev, Shape{2, 19, C}, test::kLayerTol<T>);
  ready.check_once(dev);
}
