// Layers on CudaSpace against the same layers on the host in float64 (layer_check.hpp): forward,
// backward_input and backward_weight, in bf16 and fp32, at sizes that are not multiples of the
// kernels' tiles or vector packs; the LSTM (its GEMMs and cell kernels) over several time steps.
#include "layer_check.hpp"

#include <dpml/layers/layer_norm.hpp>
#include <dpml/layers/linear.hpp>
#include <dpml/layers/lstm.hpp>

using namespace dpml;
using namespace dpml::layers;

TEMPLATE_TEST_CASE("Linear on the GPU equals the float64 host Linear", "[cuda][layers]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(11);
  for (bool bias : {true, false}) {
    CAPTURE(bias);
    Linear<double> host(45, 29, {.bias = bias, .name = "fc"});
    Linear<T, CudaSpace> dev(45, 29, {.bias = bias, .name = "fc"});
    check.run(host, dev, Shape{3, 13, 45}, test::kLayerTol<T>);
  }
  Linear<double> host(64, 96, {.name = "wide"});  // vector-friendly sizes take the other paths
  Linear<T, CudaSpace> dev(64, 96, {.name = "wide"});
  check.run(host, dev, Shape{130, 64}, test::kLayerTol<T>);
}

TEMPLATE_TEST_CASE("LayerNorm on the GPU equals the float64 host LayerNorm", "[cuda][layers]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(12);
  for (std::int64_t C : {45, 64}) {  // scalar rows, 8-element packs
    CAPTURE(C);
    LayerNorm<double> host(C, "ln");
    LayerNorm<T, CudaSpace> dev(C, "ln");
    check.run(host, dev, Shape{37, C}, test::kLayerTol<T>);
  }
}

TEMPLATE_TEST_CASE("LayerNorm joins a residual gradient in its backward on the GPU", "[cuda][layers]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(13);
  const std::int64_t C = 48;
  LayerNorm<double> host(C, "ln");
  LayerNorm<T, CudaSpace> dev(C, "ln");
  check.copy_parameters(host, dev);
  auto x = test::random_tensor<double>(Shape{21, C}, check.gen()), dy = test::random_tensor<double>(Shape{21, C}, check.gen()),
       dres = test::random_tensor<double>(Shape{21, C}, check.gen());
  for (auto* t : {&x, &dy, &dres}) test::round_to<T>(*t);
  const auto xd = test::upload_as<T>(x), dyd = test::upload_as<T>(dy), dresd = test::upload_as<T>(dres);
  host.forward(check.host_context(), x.cview());
  dev.forward(check.device_context(), xd.cview());
  const auto dx = host.backward_input(check.host_context(), dy.cview(), dres.cview());
  const auto dxd = dev.backward_input(check.device_context(), dyd.cview(), dresd.cview());
  std::vector<double> want(dx.begin(), dx.end());
  CHECK(test::rel_l2(test::download_doubles(dxd), want) < test::kLayerTol<T>);
  // and the join is what it says: dres + the plain input gradient
  const auto plain = host.backward_input(check.host_context(), dy.cview());
  for (std::int64_t i = 0; i < plain.numel(); ++i) CHECK(want[static_cast<std::size_t>(i)] == test::Approx(plain[i] + dres[i]).margin(1e-12));
}

TEMPLATE_TEST_CASE("Lstm on the GPU equals the float64 host Lstm", "[cuda][layers][lstm]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(14);
  // 7 steps: the recurrence carries each step's bf16 rounding into the next (2× the layer tolerance).
  const double tol = 2 * test::kLayerTol<T>;
  Lstm<double> host(19, 24, {.name = "lstm", .forget_bias = 1.0});
  Lstm<T, CudaSpace> dev(19, 24, {.name = "lstm", .forget_bias = 1.0});
  check.run(host, dev, Shape{3, 7, 19}, tol);
  Lstm<double> one_step(8, 16, {.name = "cell"});  // T = 1: no recurrent GEMM, no W_hh gradient
  Lstm<T, CudaSpace> dev_one_step(8, 16, {.name = "cell"});
  check.run(one_step, dev_one_step, Shape{5, 1, 8}, test::kLayerTol<T>);
}
