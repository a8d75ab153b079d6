// The composed bottleneck ResNet (models/bottleneck_resnet.hpp: layers and ResNetBlock, bf16 NHWC on
// CudaSpace) against the same model on the host in float64, both from the same weights (the host's
// initialisation rounded to bf16) and the same batch, on a small configuration with every kind of
// block: width 8, blocks {1, 1, 1, 1} (a projected block per stage, stride 2 in stages 2–4), 3
// input channels, 10 classes, 32×32 images, batch 4 (stage 4 at 1×1: BatchNorm over 4 values per
// channel). Both convolution policies: ImplicitGemmConv, and CudnnConv where dpml was built with
// cuDNN.
//
//   one step    the loss, the logits and every parameter gradient against the float64 host model
//   SGD steps   the composed model trained by optim::Optimizer<Sgd, bf16, CudaSpace> over its flat
//               parameters follows the loss curve of the float64 host model trained by the same
//               rule (optim::Optimizer<Sgd, double>); no device allocation after step 1
//   refusals    a label outside the classes (found on the device, raised by take_loss), images of
//               the wrong channel count and labels of the wrong count are refused with dpml::Error
//
// Tolerances: the gradients of a freshly initialised BatchNorm ResNet are chaotic in its inputs —
// moving every weight and input of the host model by a random 2^-8 relative (one bf16 rounding)
// moves its gradients by tens of percent (10–70 % per tensor at width 8), so a fixed bound such as
// GPT's 5 % cannot hold for any bf16 implementation — so each tensor's bound is measured: within 2·s + 0.05 (relative L2) of the reference, s being the
// host's own change under that perturbation, and, where s < 0.25, better than no gradient at all
// (error below 1). The logits: 2·s + 0.02; the loss: 2·s + 5e-3 relative. A wiring error (a wrong
// scratch buffer, a missing shortcut gradient) gives errors near or above 1.
#include "layer_check.hpp"

#include <dpml/core/flat_parameters.hpp>
#include <dpml/kernels/image.hpp>
#include <dpml/layers/cross_entropy.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/bottleneck_resnet.hpp>
#include <dpml/optim/optimizer.hpp>
#include <dpml/optim/sgd.hpp>
#if DPML_HAS_CUDNN
#include <dpml/kernels/cuda/conv/cudnn.hpp>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <tuple>
#include <vector>

using namespace dpml;

namespace {

constexpr std::int64_t kBatch = 4, kImage = 32, kChannels = 3, kClasses = 10;
constexpr std::uint64_t kSeed = 41;
constexpr double kPerturbation = 0x1p-8;  // relative, uniform in ±: about one bf16 rounding

models::BottleneckResNetConfig config() {
  return {.in_channels = kChannels, .width = 8, .blocks = {1, 1, 1, 1}, .classes = kClasses};
}
template <class Policy>
using Composed = models::BottleneckResNet<bf16, CudaSpace, parallel::default_comm_t<CudaSpace>, Policy>;
#if DPML_HAS_CUDNN
using ConvPolicies = std::tuple<kernels::cuda::ImplicitGemmConv<>, kernels::cuda::CudnnConv>;
#else
using ConvPolicies = std::tuple<kernels::cuda::ImplicitGemmConv<>>;
#endif

using Grads = std::vector<std::vector<double>>;

// Images (N, 3, S, S) NCHW rounded to bf16, and labels.
struct Batch {
  Tensor<double> images{Shape{kBatch, kChannels, kImage, kImage}};
  Tensor<std::int32_t> labels{Shape{kBatch}};
};
Batch make_batch() {
  Batch b;
  auto gen = test::rng(43);
  std::normal_distribution<double> normal;
  for (auto& v : b.images) v = normal(gen);
  test::round_to<bf16>(b.images);
  for (std::int64_t n = 0; n < kBatch; ++n) b.labels[n] = static_cast<std::int32_t>((3 * n + 1) % kClasses);
  return b;
}

// The host model with the seed's initial weights rounded to bf16 (what the GPU models start from);
// perturb > 0 multiplies every weight by 1 + u, u uniform in ±perturb (draws from `salt`).
models::BottleneckResNet<double>::Network host_model(double perturb = 0.0, std::uint64_t salt = 0) {
  auto net = models::BottleneckResNet<double>::make(config());
  layers::initialize_all(net.parameters(), kSeed, nullptr);
  auto gen = test::rng(47 + salt);
  std::uniform_real_distribution<double> u(-perturb, perturb);
  for (auto* p : net.parameters())
    for (auto& v : p->value()) {
      v = test::as_double(bf16(static_cast<float>(v)));
      if (perturb > 0) v *= 1 + u(gen);
    }
  return net;
}

// The host's loss, logits and gradients (per parameter, logical order) of one training step;
// perturb as host_model's, applied to the images too.
struct Reference {
  double loss = 0;
  std::vector<double> logits;
  Grads grads;
};
// make_batch()'s images, each multiplied by 1 + u, u uniform in ±perturb (draws from `salt`).
Batch perturbed_batch(double perturb, std::uint64_t salt = 0) {
  Batch b = make_batch();
  auto gen = test::rng(53 + salt);
  std::uniform_real_distribution<double> u(-perturb, perturb);
  if (perturb > 0)
    for (auto& v : b.images) v *= 1 + u(gen);
  return b;
}

Reference host_step(double perturb) {
  auto net = host_model(perturb);
  const Batch b = perturbed_batch(perturb);
  layers::Context<HostSpace> ctx;
  layers::SoftmaxCrossEntropy<double> xent;
  const auto logits = net.forward(ctx, b.images.cview());
  Reference r;
  r.logits.assign(logits.begin(), logits.end());
  xent.forward(ctx, logits, b.labels.cview());
  const auto dlogits = xent.backward(ctx);
  net.backward_input(ctx, dlogits);
  net.backward_weight(ctx, dlogits);
  r.loss = xent.take_loss();
  for (auto* p : net.parameters()) r.grads.emplace_back(p->grad().begin(), p->grad().end());
  return r;
}

// dev's parameters := host's (any element type, logical order), in dev's storage order, as bf16;
// gradients zeroed.
template <class HostNet, class DevNet>
void copy_weights(HostNet& host, DevNet& dev) {
  auto hp = host.parameters();
  auto dp = dev.parameters();
  REQUIRE(hp.size() == dp.size());
  for (std::size_t i = 0; i < hp.size(); ++i) {
    CAPTURE(hp[i]->name());
    REQUIRE(hp[i]->name() == dp[i]->name());
    REQUIRE(hp[i]->shape() == dp[i]->shape());
    Tensor<double> logical(hp[i]->shape()), stored(hp[i]->shape());
    const auto v = hp[i]->value();
    for (std::int64_t k = 0; k < v.numel(); ++k) logical[k] = static_cast<double>(v[k]);
    to_storage_order(*dp[i], logical.data(), stored.data());
    copy(dp[i]->value(), test::upload_as<bf16>(stored).cview());
    layers::zero_grad(*dp[i]);
  }
}

// Every parameter gradient of a device model, logical order, as doubles.
template <class DevNet>
Grads device_grads(DevNet& dev) {
  Grads g;
  for (auto* p : dev.parameters()) {
    const auto stored = test::download_doubles(p->grad());
    std::vector<double> logical(stored.size());
    to_logical_order(*p, stored.data(), logical.data());
    g.push_back(std::move(logical));
  }
  return g;
}

// The composed model on one device with its loss: a training step is forward, loss, backward.
template <class Policy>
struct ComposedRun {
  kernels::Device<CudaSpace> device;
  typename Composed<Policy>::Network net = Composed<Policy>::make(config());
  layers::SoftmaxCrossEntropy<bf16, CudaSpace> xent{{.in_place = true}};  // dlogits over the logits
  layers::Context<CudaSpace> ctx;
  Tensor<bf16, CudaSpace> images;          // (N, S, S, 3) NHWC
  Tensor<std::int32_t, CudaSpace> labels;  // (N)

  explicit ComposedRun(const Batch& b) {
    ctx.device = &device;
    ctx.global_batch = kBatch;
    Tensor<double> nhwc(Shape{kBatch, kImage, kImage, kChannels});
    kernels::to_layout(kernels::ImageLayout::nchw, kernels::ImageLayout::nhwc, b.images.data(), nhwc.data(),
                       kernels::ImageDims{kBatch, kChannels, kImage, kImage});
    images = test::upload_as<bf16>(nhwc);
    labels = to_space<CudaSpace>(b.labels.cview());
  }
  // One forward and backward; the logits (before the loss overwrites them) when asked.
  void step(std::vector<double>* logits = nullptr) {
    const auto y = net.forward(ctx, images.cview());
    if (logits) *logits = test::download_doubles(y);
    xent.forward(ctx, y, labels.cview());
    const auto dlogits = xent.backward(ctx);
    net.backward_input(ctx, dlogits);
    net.backward_weight(ctx, dlogits);
  }
};

// The host's own change under the perturbation, per gradient tensor (relative L2).
std::vector<double> sensitivities(const Reference& host, const Reference& shaken) {
  std::vector<double> s;
  for (std::size_t i = 0; i < host.grads.size(); ++i) s.push_back(test::rel_l2(shaken.grads[i], host.grads[i]));
  return s;
}
// Each gradient within 2·s + 0.05 of the reference's, and better than none where s < 0.25.
void check_grads(const Grads& got, const Grads& want, const std::vector<double>& sensitivity,
                 const std::vector<ParamBase*>& params) {
  REQUIRE(got.size() == want.size());
  REQUIRE(sensitivity.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = test::rel_l2(got[i], want[i]);
    CAPTURE(params[i]->name(), err, sensitivity[i]);
    CHECK(err <= 2 * sensitivity[i] + 0.05);
    if (sensitivity[i] < 0.25) CHECK(err < 1.0);
  }
}
// The loss within 2·|the host's change| + 5e-3 relative of the reference's.
void check_loss(double got, double want, double sensitivity) {
  CAPTURE(got, want, sensitivity);
  CHECK(std::isfinite(got));
  CHECK(std::abs(got - want) <= 2 * sensitivity + 5e-3 * want);
}
// The float64 host model trained `steps` SGD updates on the batch from host_model(perturb, salt)'s
// weights (the images perturbed alike): the loss of each step (before its update).
std::vector<double> host_losses(int steps, double lr, const optim::SgdOptions& sgd, double perturb = 0.0,
                                 std::uint64_t salt = 0) {
  auto net = host_model(perturb, salt);
  const Batch b = perturbed_batch(perturb, salt);
  layers::Context<HostSpace> ctx;
  layers::SoftmaxCrossEntropy<double> xent;
  std::vector<optim::Range<double>> ranges;
  for (auto* p : net.parameters()) {
    const auto n = static_cast<std::size_t>(p->numel());
    ranges.push_back({p->name(), std::span<double>(p->value().data(), n), std::span<const double>(p->grad().data(), n)});
  }
  optim::Optimizer<optim::Sgd, double> opt(std::move(ranges), sgd);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    for (auto* p : net.parameters()) layers::zero_grad(*p);
    const auto logits = net.forward(ctx, b.images.cview());
    xent.forward(ctx, logits, b.labels.cview());
    const auto dlogits = xent.backward(ctx);
    net.backward_input(ctx, dlogits);
    net.backward_weight(ctx, dlogits);
    losses.push_back(xent.take_loss());
    opt.step(lr);
  }
  return losses;
}

template <class Net>
std::vector<ParamBase*> bases(Net& net) {
  std::vector<ParamBase*> b;
  for (auto* p : net.parameters()) b.push_back(p);
  return b;
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("Composed ResNet on the GPU equals the float64 host ResNet: loss, logits, gradients",
                        "[gpu][resnet]", ConvPolicies) {
  const Reference host = host_step(0.0), shaken = host_step(kPerturbation);
  auto weights = host_model();
  ComposedRun<TestType> gpu(make_batch());
  copy_weights(weights, gpu.net);
  std::vector<double> logits;
  gpu.step(&logits);
  check_loss(gpu.xent.take_loss(), host.loss, std::abs(shaken.loss - host.loss));
  const double logit_err = test::rel_l2(logits, host.logits), logit_s = test::rel_l2(shaken.logits, host.logits);
  CAPTURE(logit_err, logit_s);
  CHECK(logit_err <= 2 * logit_s + 0.02);
  check_grads(device_grads(gpu.net), host.grads, sensitivities(host, shaken), bases(gpu.net));
}

TEMPLATE_LIST_TEST_CASE("Composed ResNet trained by the library's SGD follows the float64 host ResNet's loss curve",
                        "[gpu][resnet]", ConvPolicies) {
  constexpr int kSteps = 20;
  constexpr double kLr = 0.05;
  const optim::SgdOptions sgd{.momentum = 0.9, .weight_decay = 1e-4};
  const std::vector<double> host = host_losses(kSteps, kLr, sgd);
  // How far the host's own curve moves when its start moves by about one bf16 rounding: four
  // perturbed runs. This 4-image batch under BatchNorm is ill-conditioned: their second-step
  // losses are 1.28–1.51 around the unperturbed 1.43 (float64, 2026-11-27), and the GPU, which
  // rounds every activation of every step rather than only the start, gave 1.71 (2×H200).
  std::vector<double> spread(kSteps, 0.0);
  for (std::uint64_t salt = 1; salt <= 4; ++salt) {
    const auto shaken = host_losses(kSteps, kLr, sgd, kPerturbation, 100 * salt);
    for (int s = 0; s < kSteps; ++s) spread[s] = std::max(spread[s], std::abs(shaken[s] - host[s]));
  }
  auto weights = host_model();
  const Batch b = make_batch();

  ComposedRun<TestType> gpu(b);
  copy_weights(weights, gpu.net);
  FlatParameters<bf16, CudaSpace> flat(gpu.net.parameters());  // one buffer: one update launch
  const auto n = static_cast<std::size_t>(flat.numel());
  optim::Optimizer<optim::Sgd, bf16, CudaSpace> opt(
      {{"flat", std::span<bf16>(flat.values().data(), n), std::span<const bf16>(flat.grads().data(), n)}}, sgd,
      gpu.device);
  std::vector<double> losses;
  std::size_t free_after_first = 0, free_now = 0, total = 0;
  for (int s = 1; s <= kSteps; ++s) {
    kernels::Ops<CudaSpace>::zero(gpu.device, flat.grads().data(), flat.numel());
    gpu.step();
    opt.step(kLr);
    losses.push_back(gpu.xent.take_loss());
    if (s == 1) DPML_CHECK_CUDA(cudaMemGetInfo(&free_after_first, &total));
  }
  DPML_CHECK_CUDA(cudaMemGetInfo(&free_now, &total));
  CHECK(free_now == free_after_first);  // no allocation inside a step after the first
  // The first two steps within 3× the perturbed runs' spread (+0.02): an update that is missing
  // or of the wrong size moves the second loss by ~1; later steps, once the batch is being
  // memorised, must stay finite, and both curves end far below the start.
  for (int s = 0; s < kSteps; ++s) {
    CAPTURE(s + 1, losses[s], host[s], spread[s]);
    CHECK(std::isfinite(losses[s]));
    if (s < 2) CHECK(std::abs(losses[s] - host[s]) <= 3 * spread[s] + 0.02);
  }
  CAPTURE(losses.front(), losses.back(), host.front(), host.back());
  CHECK(host.back() < 0.5 * host.front());
  CHECK(losses.back() < 0.5 * losses.front());
}

TEST_CASE("Composed ResNet refuses a label outside the classes, images of another channel count and unmatched labels",
          "[gpu][resnet]") {
  using Policy = kernels::cuda::ImplicitGemmConv<>;
  auto weights = host_model();
  Batch b = make_batch();
  {
    b.labels[3] = static_cast<std::int32_t>(kClasses);  // found on the device, raised where the host waits
    ComposedRun<Policy> gpu(b);
    copy_weights(weights, gpu.net);
    gpu.step();
    CHECK_THROWS_AS(gpu.xent.take_loss(), dpml::Error);
  }
  ComposedRun<Policy> gpu(make_batch());
  copy_weights(weights, gpu.net);
  const Tensor<bf16, CudaSpace> four(Shape{kBatch, kImage, kImage, kChannels + 1});  // (N, S, S, 4)
  CHECK_THROWS_AS(gpu.net.forward(gpu.ctx, four.cview()), dpml::Error);
  const auto logits = gpu.net.forward(gpu.ctx, gpu.images.cview());
  const Tensor<std::int32_t, CudaSpace> three(Shape{kBatch - 1});
  CHECK_THROWS_AS(gpu.xent.forward(gpu.ctx, logits, three.cview()), dpml::Error);
}
