// The single-GPU GPT (models/cuda/gpt.hpp) against the host GPT (models::Gpt<float> +
// train::GptTrainer with AdamW) from identical initial weights, on a tiny configuration
// (L=2, C=64, H=2 so D=32, V=67 padded to 128, T=32, B=4), with and without the GELU recompute.
// Activations are poisoned (NaN) first.
//
// Both precision policies (Bf16; Fp16 with dynamic loss scaling, whose loss-scale mechanics have a
// test of their own). Tolerances (16-bit activations and weights against float32; one bf16
// rounding is 2^-9 relative, fp16's 2^-12; a step holds a few dozen roundings in sequence):
//   step 1 loss            relative 2e-2
//   step 1 gradients       relative L2 ≤ 5e-2 for every parameter tensor
//   50 steps, fixed batch  each step's loss within 8e-2 relative + 3e-2 absolute of the host's
//                          (Adam amplifies rounding noise a little over the run), and the final
//                          loss below a tenth of the initial one (host, float32: 4.22 → 0.088)
#include "device.hpp"

#include <dpml/data/token_shards.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/cuda/gpt.hpp>
#include <dpml/models/gpt.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/gpt_trainer.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace dpml;

namespace {

constexpr std::int64_t kBatch = 4, kSeq = 32, kVocab = 67;
constexpr int kSteps = 50;
constexpr double kLr = 3e-3, kClip = 1.0;
const optim::AdamWOptions kAdam{.eps = 1e-6, .weight_decay = 0.1};

models::GptConfig host_config() {
  return {.vocab = kVocab, .max_seq = kSeq, .layers = 2, .heads = 2, .dim = 64};
}
models::cuda::GptCudaConfig device_config(bool recompute_gelu = true) {
  return {.vocab = kVocab, .max_seq = kSeq, .layers = 2, .heads = 2, .dim = 64, .recompute_gelu = recompute_gelu};
}

// Random inputs; targets a fixed function of them, so that the loss can fall far.
data::TokenBatch fixed_batch() {
  data::TokenBatch b{Tensor<std::int32_t>(Shape{kBatch, kSeq}), Tensor<std::int32_t>(Shape{kBatch, kSeq})};
  auto gen = test::rng(17);
  for (std::int64_t i = 0; i < b.inputs.numel(); ++i) {
    b.inputs[i] = static_cast<std::int32_t>(gen() % kVocab);
    b.targets[i] = (b.inputs[i] * 7 + 3) % kVocab;
  }
  return b;
}

std::vector<std::int32_t> as_vector(const Tensor<std::int32_t>& t) { return std::vector<std::int32_t>(t.begin(), t.end()); }

// Host training run; calls after(step, loss, model) after each step.
template <class After>
void host_run(int steps, double clip, After&& after) {
  const auto grid = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  models::Gpt<float> model(host_config(), grid);
  layers::initialize_all(model.parameters(), 1234, &grid);
  after(0, 0.0, model);
  parallel::with_strategy("1f1b", false, [&]<class Strategy>() {
    train::GptTrainer<Strategy, optim::AdamW> trainer(model, grid, kAdam, {.clip = clip},
                                                      {.micro_batch = kBatch, .global_batch = kBatch, .seed = 5});
    const auto batch = fixed_batch();
    for (int s = 1; s <= steps; ++s) after(s, trainer.train_step(batch, kLr).loss, model);
  });
}

// The host's first step on fixed_batch() (clip 0: the gradients stay as the backward left them;
// its clipping scales them in place); `gpu` gets the host's initial weights.
struct HostStep {
  double loss = 0;
  std::map<std::string, std::vector<double>> grads;
};
template <class Gpu>
HostStep host_first_step(Gpu& gpu) {
  HostStep h;
  host_run(1, 0.0, [&](int s, double loss, models::Gpt<float>& model) {
    if (s == 0) {
      gpu.copy_from(model.parameters());
      return;
    }
    h.loss = loss;
    for (auto* p : model.parameters()) {
      const auto g = p->grad();
      h.grads[p->name()] = std::vector<double>(g.data(), g.data() + g.numel());
    }
  });
  return h;
}

// The GPU's loss and every gradient against the host step's (tolerances at the top).
template <class Gpu>
void check_against_host(const Gpu& gpu, double loss, const HostStep& host) {
  CAPTURE(loss, host.loss);
  REQUIRE(std::isfinite(loss));
  CHECK(std::abs(loss - host.loss) <= 2e-2 * host.loss);
  REQUIRE(host.grads.size() == gpu.parameter_names().size());
  for (const auto& name : gpu.parameter_names()) {
    const double err = test::rel_l2(gpu.gradient(name), host.grads.at(name));
    CAPTURE(name, err);
    CHECK(err <= 5e-2);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("GPU GPT step equals the host GPT: loss and every gradient", "[gpu][gpt]", models::cuda::Bf16,
                   models::cuda::Fp16) {
  const bool recompute_gelu = GENERATE(true, false);
  const std::string precision(TestType::name);
  CAPTURE(precision, recompute_gelu);
  const auto batch = fixed_batch();
  test::DeviceVec<std::int32_t> tokens(as_vector(batch.inputs)), targets(as_vector(batch.targets));
  DPML_CHECK_CUDA(cudaDeviceSynchronize());  // the model's stream does not wait for the legacy one
  models::cuda::Gpt<TestType> gpu(device_config(recompute_gelu), kBatch, kSeq);
  const HostStep host = host_first_step(gpu);
  gpu.poison_activations();
  gpu.forward_backward(tokens.ptr, targets.ptr);
  check_against_host(gpu, gpu.loss(), host);
}

// Gradient accumulation: a model built for half the batch, run on its two halves, holds the
// gradient of the whole batch's mean loss.
TEMPLATE_TEST_CASE("GPU GPT: two micro-batches accumulate the whole batch's gradient", "[gpu][gpt]", models::cuda::Bf16,
                   models::cuda::Fp16) {
  const std::string precision(TestType::name);
  CAPTURE(precision);
  const auto batch = fixed_batch();
  test::DeviceVec<std::int32_t> tokens(as_vector(batch.inputs)), targets(as_vector(batch.targets));
  DPML_CHECK_CUDA(cudaDeviceSynchronize());
  models::cuda::Gpt<TestType> gpu(device_config(), kBatch / 2, kSeq);
  const HostStep host = host_first_step(gpu);
  gpu.poison_activations();
  const std::int64_t half = kBatch / 2 * kSeq;
  gpu.forward_backward(tokens.ptr, targets.ptr, /*accumulate=*/false, 2);
  const double first = gpu.loss();
  gpu.forward_backward(tokens.ptr + half, targets.ptr + half, /*accumulate=*/true, 2);
  check_against_host(gpu, (first + gpu.loss()) / 2, host);
}

TEMPLATE_TEST_CASE("GPU GPT follows the host loss curve over 50 AdamW steps on a fixed batch", "[gpu][gpt]",
                   models::cuda::Bf16, models::cuda::Fp16) {
  const std::string precision(TestType::name);
  CAPTURE(precision);
  const auto batch = fixed_batch();
  test::DeviceVec<std::int32_t> tokens(as_vector(batch.inputs)), targets(as_vector(batch.targets));
  DPML_CHECK_CUDA(cudaDeviceSynchronize());  // the model's stream does not wait for the legacy one
  models::cuda::Gpt<TestType> gpu(device_config(), kBatch, kSeq);
  std::vector<double> host_losses;
  host_run(kSteps, kClip, [&](int s, double loss, models::Gpt<float>& model) {
    if (s == 0) gpu.copy_from(model.parameters());
    else host_losses.push_back(loss);
  });
  gpu.poison_activations();
  std::vector<double> gpu_losses;
  std::size_t free_after_first = 0, free_now = 0, total = 0;
  for (int s = 1; s <= kSteps; ++s) {
    gpu.forward_backward(tokens.ptr, targets.ptr);
    gpu.update(kLr, s, kAdam, kClip);
    gpu_losses.push_back(gpu.loss());
    CHECK(std::isfinite(gpu.finish_step()));  // fp16: the initial scale 2^16 does not overflow here
    // The device's free memory: exact only while no other program uses the GPU (GPU tests hold
    // the CTest resource lock "gpu", so they never run side by side).
    if (s == 1) DPML_CHECK_CUDA(cudaMemGetInfo(&free_after_first, &total));
  }
  DPML_CHECK_CUDA(cudaMemGetInfo(&free_now, &total));
  CHECK(free_now == free_after_first);  // no allocation inside a step after the first
  for (int s = 0; s < kSteps; ++s) {
    CAPTURE(s + 1, gpu_losses[s], host_losses[s]);
    CHECK(std::abs(gpu_losses[s] - host_losses[s]) <= 8e-2 * host_losses[s] + 3e-2);
  }
  CAPTURE(gpu_losses.front(), gpu_losses.back(), host_losses.back());
  CHECK(gpu_losses.back() < 0.1 * gpu_losses.front());
  CHECK(std::isfinite(gpu.grad_norm()));
}

// Dynamic loss scaling (fp16): from a scale far too large, each overflowed step is skipped (the
// weights stay bit for bit) and halves the scale; a clean window of 3 steps doubles it; training
// then goes on with finite steps.
TEST_CASE("GPU GPT fp16: overflowed steps are skipped and halve the loss scale; clean windows double it", "[gpu][gpt]") {
  const auto batch = fixed_batch();
  test::DeviceVec<std::int32_t> tokens(as_vector(batch.inputs)), targets(as_vector(batch.targets));
  DPML_CHECK_CUDA(cudaDeviceSynchronize());
  auto cfg = device_config();
  cfg.loss_scale = {.initial = 0x1p40, .window = 3};
  models::cuda::Gpt<models::cuda::Fp16> gpu(cfg, kBatch, kSeq);
  const auto grid = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  models::Gpt<float> host(host_config(), grid), before(host_config(), grid);
  layers::initialize_all(host.parameters(), 1234, &grid);
  gpu.copy_from(host.parameters());
  int skipped = 0, doubled = 0, updated = 0;
  for (int s = 1, step = 1; s <= 40; ++s) {
    const double scale = gpu.loss_scale();
    gpu.copy_to(before.parameters());
    gpu.forward_backward(tokens.ptr, targets.ptr);
    gpu.update(kLr, step, kAdam, kClip);
    const double norm = gpu.finish_step();
    gpu.copy_to(host.parameters());
    std::int64_t changed = 0;
    const auto a = before.parameters(), b = host.parameters();
    for (std::size_t i = 0; i < a.size(); ++i)
      changed += std::memcmp(a[i]->value().data(), b[i]->value().data(), static_cast<std::size_t>(a[i]->numel()) * sizeof(float)) != 0;
    CAPTURE(s, scale, norm, gpu.loss_scale(), changed);
    if (!std::isfinite(norm)) {
      ++skipped;
      CHECK(changed == 0);
      CHECK(gpu.loss_scale() == scale / 2);
    } else {
      ++updated, ++step;
      CHECK(changed > 0);
      CHECK((gpu.loss_scale() == scale || gpu.loss_scale() == 2 * scale));
      doubled += gpu.loss_scale() == 2 * scale;
    }
  }
  CAPTURE(skipped, doubled, updated);
  CHECK(skipped >= 17);  // every scale from 2^40 down to 2^24 overflows: dlogit ≈ S/N = S/128 > 65504
  CHECK(doubled >= 1);
  CHECK(updated >= 3);
  CHECK(std::isfinite(gpu.loss()));
}

TEST_CASE("GPU GPT copy_from then copy_to gives back the host weights exactly", "[gpu][gpt]") {
  const auto grid = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  models::Gpt<float> source(host_config(), grid), target(host_config(), grid);
  layers::initialize_all(source.parameters(), 1, &grid);
  layers::initialize_all(target.parameters(), 2, &grid);
  models::cuda::Gpt<> gpu(device_config(), kBatch, kSeq);
  gpu.copy_from(source.parameters());
  gpu.copy_to(target.parameters());
  const auto src = source.parameters(), dst = target.parameters();
  REQUIRE(src.size() == dst.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    const auto a = src[i]->value(), b = dst[i]->value();
    std::int64_t differ = 0;
    for (std::int64_t j = 0; j < a.numel(); ++j) differ += a.data()[j] != b.data()[j];
    CAPTURE(src[i]->name(), differ);
    CHECK(differ == 0);
  }
}
