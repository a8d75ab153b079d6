// CNN layers on CudaSpace against the same layers on the host in float64 (layer_check.hpp), across
// layouts: host images are NCHW, device ones NHWC (kernels/image.hpp), so inputs are uploaded and
// outputs compared through kernels::to_layout, and a convolution's weight in its logical order
// (core/parameter.hpp's StorageOrder; DeviceLayerCheck converts). Forward, backward_input and
// every parameter's gradient at odd sizes (N = 3, C = 5…24, H = W = 9, stride 2, padding 1): bf16
// everywhere, fp32 where the GPU kernels take it (BatchNorm, pooling; Conv2d's kernels are bf16
// only). Conv2d under both policies where cuDNN exists; BatchNorm with its fused ReLU and residual,
// in eval mode, and its running statistics; a small network conv → BatchNorm + ReLU → pool →
// global average pool → Linear; the ViT's token layers (PatchTokens from NHWC images, ClassToken,
// TakeClassToken).
#include "layer_check.hpp"

#include <dpml/kernels/image.hpp>
#include <dpml/layers/batch_norm.hpp>
#include <dpml/layers/conv2d.hpp>
#include <dpml/layers/linear.hpp>
#include <dpml/layers/pool.hpp>
#include <dpml/layers/sequential.hpp>
#include <dpml/layers/vision.hpp>

#include <cstdint>
#include <vector>

using namespace dpml;
using namespace dpml::layers;
using kernels::ImageDims;
using kernels::ImageLayout;

namespace {

// A host NCHW image batch as a device NHWC one of element type T (rounded).
template <class T>
Tensor<T, CudaSpace> upload_image(const Tensor<double>& nchw) {
  const ImageDims d{nchw.size(0), nchw.size(1), nchw.size(2), nchw.size(3)};
  Tensor<double> nhwc(Shape{d.N, d.H, d.W, d.C});
  kernels::to_layout(ImageLayout::nchw, ImageLayout::nhwc, nchw.data(), nhwc.data(), d);
  return test::upload_as<T>(nhwc);
}

// A device tensor as host doubles in the host's layout: NHWC images to NCHW, others as they are.
template <class T>
std::vector<double> download_host_layout(TensorView<const T, CudaSpace> v) {
  std::vector<double> h = test::download_doubles(v);
  if (v.rank() != 4) return h;
  const ImageDims d{v.size(0), v.size(3), v.size(1), v.size(2)};
  std::vector<double> nchw(h.size());
  kernels::to_layout(ImageLayout::nhwc, ImageLayout::nchw, h.data(), nchw.data(), d);
  return nchw;
}
template <class T>
Tensor<T, CudaSpace> upload_host_layout(const Tensor<double>& h) {
  return h.rank() == 4 ? upload_image<T>(h) : test::upload_as<T>(h);
}

template <class V>
std::vector<double> values(const V& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Tolerances of a check: the output, the input gradient, the parameters' gradients.
struct Tolerances {
  double y, dx, dw;
};

// DeviceLayerCheck::run for image layers: x (N, C, H, W) (or a tensor of another rank) random,
// rounded to T, on both;
// forward, a random dy, backward_input and backward_weight; all compared in the host's layout.
template <class T, class HostLayer, class DevLayer>
void check_image_layer(test::DeviceLayerCheck<T>& check, HostLayer& host, DevLayer& dev, Shape x_shape,
                       Tolerances tol) {
  check.copy_parameters(host, dev);
  auto& hctx = check.host_context();
  auto& dctx = check.device_context();
  Tensor<double> x = test::random_tensor<double>(x_shape, check.gen());
  test::round_to<T>(x);
  const auto xd = upload_host_layout<T>(x);
  const auto y = host.forward(hctx, x.cview());
  const auto yd = dev.forward(dctx, xd.cview());
  CHECK(test::rel_l2(download_host_layout(yd), values(y)) < tol.y);

  Tensor<double> g = test::random_tensor<double>(y.shape(), check.gen());
  test::round_to<T>(g);
  const auto gd = upload_host_layout<T>(g);
  const auto dx = host.backward_input(hctx, g.cview());
  const auto dxd = dev.backward_input(dctx, gd.cview());
  CHECK((dx.data() == nullptr) == (dxd.data() == nullptr));
  if (dx.data() != nullptr) CHECK(test::rel_l2(download_host_layout(dxd), values(dx)) < tol.dx);
  for (auto* p : host.parameters()) std::fill(p->grad().begin(), p->grad().end(), 0.0);
  host.backward_weight(hctx, g.cview());
  dev.backward_weight(dctx, gd.cview());
  check.compare_gradients(host, dev, tol.dw);
}

struct ConvCase {
  std::int64_t N, Cin, Cout, H, W, k, stride, pad;
  bool bias;
};

template <class Policy>
void conv_matches_host() {
  using T = bf16;
  constexpr double tol = test::kLayerTol<T>;
  test::DeviceLayerCheck<T> check(21);
  for (const ConvCase c : {ConvCase{3, 5, 7, 9, 9, 3, 2, 1, true},     // odd channels: the scalar paths
                           ConvCase{3, 16, 24, 9, 9, 3, 1, 1, false},  // 16-byte channel packs
                           ConvCase{3, 8, 16, 9, 9, 1, 2, 0, true},    // 1×1, stride 2 (odd phases: no taps)
                           ConvCase{2, 3, 8, 11, 9, 7, 2, 3, false}}) {  // a stem on RGB, H ≠ W
    CAPTURE(c.N, c.Cin, c.Cout, c.H, c.W, c.k, c.stride, c.pad, c.bias);
    const Conv2dOptions o{.stride = c.stride, .padding = c.pad, .bias = c.bias, .name = "conv"};
    Conv2d<double> host(c.Cin, c.Cout, c.k, o);
    Conv2d<T, CudaSpace, Policy> dev(c.Cin, c.Cout, c.k, o);
    check_image_layer(check, host, dev, Shape{c.N, c.Cin, c.H, c.W}, {tol, tol, tol});
  }
  SECTION("input_gradient = false: backward_input computes nothing, the weight gradients still come") {
    const Conv2dOptions o{.stride = 2, .padding = 1, .input_gradient = false, .name = "stem"};
    Conv2d<double> host(6, 10, 3, o);
    Conv2d<T, CudaSpace, Policy> dev(6, 10, 3, o);
    check_image_layer(check, host, dev, Shape{3, 6, 9, 9}, {tol, tol, tol});
  }
}

}  // namespace

TEST_CASE("Conv2d on the GPU (our implicit GEMM) equals the float64 host Conv2d", "[cuda][layers][cnn]") {
  conv_matches_host<kernels::cuda::ImplicitGemmConv<>>();
}

#if DPML_HAS_CUDNN
TEST_CASE("Conv2d on the GPU (cuDNN) equals the float64 host Conv2d", "[cuda][layers][cnn]") {
  conv_matches_host<kernels::cuda::CudnnConv>();
}
#endif

TEST_CASE("Conv2d's weight is initialised by its logical index on the GPU too", "[cuda][layers][cnn]") {
  // Stored (Cout, kh, kw, Cin) on the device, (Cout, Cin, kh, kw) on the host: initialize_all draws
  // each element from its logical global index, so both hold the same logical tensor.
  Conv2d<double> host(5, 7, 3, {.name = "conv"});
  Conv2d<bf16, CudaSpace> dev(5, 7, 3, {.name = "conv"});
  CHECK(dev.parameters()[0]->storage_order() == StorageOrder(std::array<int, 4>{0, 2, 3, 1}));
  CHECK(host.parameters()[0]->storage_order().is_identity());
  initialize_all(host.parameters(), 7, nullptr);
  initialize_all(dev.parameters(), 7, nullptr);
  for (std::size_t i = 0; i < 2; ++i) {
    const ParamBase& p = *dev.parameters()[i];
    CAPTURE(p.name());
    const auto stored = test::download_doubles(dev.parameters()[i]->value());
    std::vector<double> got(stored.size());
    to_logical_order(p, stored.data(), got.data());
    Tensor<double> want(p.shape());
    copy(want.view(), TensorView<const double>(host.parameters()[i]->value()));
    test::round_to<bf16>(want);
    CHECK(got == values(want));
  }
}

TEMPLATE_TEST_CASE("BatchNorm2d on the GPU equals the float64 host BatchNorm2d", "[cuda][layers][cnn]", bf16, float) {
  using T = TestType;
  constexpr double tol = test::kLayerTol<T>;
  test::DeviceLayerCheck<T> check(22);
  for (std::int64_t C : {5, 24}) {  // scalar channels, 8-channel packs
    for (bool relu : {false, true}) {
      CAPTURE(C, relu);
      BatchNorm2d<double> host(C, {.momentum = 0.25, .relu = relu});
      BatchNorm2d<T, CudaSpace> dev(C, {.momentum = 0.25, .relu = relu});
      check_image_layer(check, host, dev, Shape{3, C, 9, 9}, {tol, tol, tol});
      // the running statistics, moved once by the training forward
      CHECK(test::rel_l2(test::download_doubles(dev.running_mean()), values(host.running_mean())) < 1e-4);
      CHECK(test::rel_l2(test::download_doubles(dev.running_var()), values(host.running_var())) < 1e-4);

      // eval: the running statistics normalise, and stay as they are
      auto& hctx = check.host_context();
      auto& dctx = check.device_context();
      hctx.mode = dctx.mode = Mode::eval;
      const auto mean_before = test::download_doubles(dev.running_mean());
      auto x = test::random_tensor<double>(Shape{3, C, 9, 9}, check.gen(), -2, 3);
      test::round_to<T>(x);
      const auto xd = upload_image<T>(x);
      CHECK(test::rel_l2(download_host_layout(dev.forward(dctx, xd.cview())), values(host.forward(hctx, x.cview()))) <
            tol);
      auto g = test::random_tensor<double>(x.shape(), check.gen());
      test::round_to<T>(g);
      const auto gd = upload_image<T>(g);
      CHECK(test::rel_l2(download_host_layout(dev.backward_input(dctx, gd.cview())),
                         values(host.backward_input(hctx, g.cview()))) < tol);
      CHECK(test::download_doubles(dev.running_mean()) == mean_before);
      hctx.mode = dctx.mode = Mode::train;
    }
  }
}

TEMPLATE_TEST_CASE("BatchNorm2d joins a residual before its ReLU on the GPU", "[cuda][layers][cnn]", bf16, float) {
  using T = TestType;
  constexpr double tol = test::kLayerTol<T>;
  test::DeviceLayerCheck<T> check(23);
  const std::int64_t C = 16;
  BatchNorm2d<double> host(C, {.relu = true});
  BatchNorm2d<T, CudaSpace> dev(C, {.relu = true});
  check.copy_parameters(host, dev);
  auto x = test::random_tensor<double>(Shape{3, C, 9, 9}, check.gen()), r = test::random_tensor<double>(x.shape(), check.gen()),
       g = test::random_tensor<double>(x.shape(), check.gen());
  for (auto* t : {&x, &r, &g}) test::round_to<T>(*t);
  const auto xd = upload_image<T>(x), rd = upload_image<T>(r), gd = upload_image<T>(g);
  auto& hctx = check.host_context();
  auto& dctx = check.device_context();
  CHECK(test::rel_l2(download_host_layout(dev.forward(dctx, xd.cview(), rd.cview())),
                     values(host.forward(hctx, x.cview(), r.cview()))) < tol);
  CHECK(test::rel_l2(download_host_layout(dev.backward_input(dctx, gd.cview())),
                     values(host.backward_input(hctx, g.cview()))) < tol);
  const auto dres = values(host.residual_grad(hctx));
  CHECK(test::rel_l2(download_host_layout(dev.residual_grad(dctx)), dres) < tol);
  host.backward_weight(hctx, g.cview());
  dev.backward_weight(dctx, gd.cview());
  check.compare_gradients(host, dev, tol);
  // and the residual's gradient is dy through the ReLU: where the output is positive
  const auto y = host.forward(hctx, x.cview(), r.cview());
  for (std::int64_t i = 0; i < y.numel(); ++i) CHECK(dres[static_cast<std::size_t>(i)] == (y[i] > 0 ? g[i] : 0.0));
}

TEMPLATE_TEST_CASE("Pooling on the GPU equals the float64 host pooling", "[cuda][layers][cnn]", bf16, float) {
  using T = TestType;
  constexpr double tol = test::kLayerTol<T>;
  test::DeviceLayerCheck<T> check(24);
  struct Window {
    std::int64_t k, stride, pad;
  };
  for (std::int64_t C : {5, 24}) {
    for (const Window w : {Window{3, 2, 1}, Window{2, 2, 0}, Window{3, 1, 1}}) {
      CAPTURE(C, w.k, w.stride, w.pad);
      MaxPool2d<double> hmax(w.k, w.stride, w.pad);
      MaxPool2d<T, CudaSpace> dmax(w.k, w.stride, w.pad);
      check_image_layer(check, hmax, dmax, Shape{3, C, 9, 9}, {tol, tol, tol});
      AvgPool2d<double> havg(w.k, w.stride, w.pad);
      AvgPool2d<T, CudaSpace> davg(w.k, w.stride, w.pad);
      check_image_layer(check, havg, davg, Shape{3, C, 9, 9}, {tol, tol, tol});
    }
    GlobalAvgPool<double> hgap;
    GlobalAvgPool<T, CudaSpace> dgap;
    check_image_layer(check, hgap, dgap, Shape{3, C, 9, 9}, {tol, tol, tol});
  }
}

TEMPLATE_TEST_CASE("The ViT's token layers on the GPU (NHWC images) equal the float64 host ones", "[cuda][layers][vit]", bf16,
                   float) {
  using T = TestType;
  constexpr double tol = test::kLayerTol<T>;
  test::DeviceLayerCheck<T> check(25);
  for (const std::int64_t P : {1, 3}) {  // 3 channels: the NHWC read differs from NCHW's
    CAPTURE(P);
    PatchTokens<double> hpatch(P);
    PatchTokens<T, CudaSpace> dpatch(P);
    check_image_layer(check, hpatch, dpatch, Shape{2, 3, 9, 6}, {tol, tol, tol});
  }
  PatchTokens<double> hpatch(7);
  PatchTokens<T, CudaSpace> dpatch(7);
  check_image_layer(check, hpatch, dpatch, Shape{3, 1, 28, 28}, {tol, tol, tol});  // train_vit's
  ClassToken<double> hcls(5, 7, "embed");
  ClassToken<T, CudaSpace> dcls(5, 7, "embed");
  check_image_layer(check, hcls, dcls, Shape{3, 5, 7}, {tol, tol, tol});  // dcls and dpos summed over 3 images
  TakeClassToken<double> htake;
  TakeClassToken<T, CudaSpace> dtake;
  check_image_layer(check, htake, dtake, Shape{3, 6, 7}, {tol, tol, tol});
}

TEST_CASE("A small CNN (conv → BatchNorm + ReLU → pool → global pool → Linear) on the GPU equals the host one",
          "[cuda][layers][cnn]") {
  // Every activation is rounded to bf16 on the device, so a few ReLU inputs (those within bf16
  // error of 0, some 0.3 % of them) fall on the other side than in float64: each moves one element
  // of the gradient by its whole size, a few percent of relative L2 error upstream of the ReLU —
  // where a layout or wiring mistake between the layers would be O(1). Pooling is the average
  // (a max pool's ties would route gradients alike); the max pool is checked alone above, on
  // inputs both sides hold exactly.
  using T = bf16;
  using Host = Sequential<Conv2d<double>, BatchNorm2d<double>, AvgPool2d<double>, GlobalAvgPool<double>, Linear<double>>;
  using Dev = Sequential<Conv2d<T, CudaSpace>, BatchNorm2d<T, CudaSpace>, AvgPool2d<T, CudaSpace>,
                         GlobalAvgPool<T, CudaSpace>, Linear<T, CudaSpace>>;
  const Conv2dOptions conv{.padding = 1, .bias = false};
  const BatchNormOptions bn{.relu = true};
  Host host(Conv2d<double>(5, 12, 3, conv), BatchNorm2d<double>(12, bn), AvgPool2d<double>(3, 2, 1),
            GlobalAvgPool<double>(), Linear<double>(12, 7, {.name = "fc"}));
  Dev dev(Conv2d<T, CudaSpace>(5, 12, 3, conv), BatchNorm2d<T, CudaSpace>(12, bn), AvgPool2d<T, CudaSpace>(3, 2, 1),
          GlobalAvgPool<T, CudaSpace>(), Linear<T, CudaSpace>(12, 7, {.name = "fc"}));
  test::DeviceLayerCheck<T> check(25);
  std::vector<std::string> reported;
  check.device_context().on_grad_ready = [&](std::span<ParamBase* const> ps) {
    for (const ParamBase* p : ps) reported.push_back(p->name());
  };
  check_image_layer(check, host, dev, Shape{3, 5, 9, 9}, {2e-2, 0.1, 0.1});
  // the last layer's gradients see no ReLU decision
  auto hp = host.parameters();
  auto dp = dev.parameters();
  for (std::size_t i = hp.size() - 2; i < hp.size(); ++i) {
    CAPTURE(hp[i]->name());
    CHECK(test::rel_l2(test::download_doubles(dp[i]->grad()), values(hp[i]->grad())) < 2e-2);
  }
  // every parameter reported once, the last layer's first
  CHECK(reported == std::vector<std::string>{"4.fc.weight", "4.fc.bias", "1.bn.weight", "1.bn.bias", "0.conv.weight"});
}
