// Loss scaling in the one trainer (optim/loss_scale.hpp, train/trainer.hpp), on fp32 host ranks:
//
//   static   a power-of-two loss scale (2^10) leaves every bit of a run unchanged — losses,
//            reported gradient norms (unscaled) and parameters after a few steps — for a GPT
//            (vocabulary-parallel loss: on 1 rank, dp = world, and tp 2 × pp 2 where the world
//            allows) and for a Sequential with SoftmaxCrossEntropy; clipping on
//   dynamic  an initial scale of 2^140 overflows fp32 gradients: those steps are skipped
//            (overflow, no update, optimizer step count and parameters unchanged), the scale
//            halves each time, and the first clean step equals the unscaled run's first step
//            bitwise; after `window` clean steps the scale doubles
//   resume   a checkpoint saves the scaler (scale, clean steps) and a resumed run equals the
//            uninterrupted one bitwise; a checkpoint without a scaler loads at the initial scale
//
// Bitwise, because the backward is linear in the loss layer's gradient seed and a power-of-two
// scale multiplies every rounding exactly (nothing here comes near fp32's range or subnormals).
#include "test.hpp"

#include <dpml/core/philox.hpp>
#include <dpml/data/loader.hpp>
#include <dpml/data/token_shards.hpp>
#include <dpml/layers/activation.hpp>
#include <dpml/layers/cross_entropy.hpp>
#include <dpml/layers/flatten.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/layers/linear.hpp>
#include <dpml/layers/sequential.hpp>
#include <dpml/models/gpt.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/optim/loss_scale.hpp>
#include <dpml/optim/sgd.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/checkpointing.hpp>
#include <dpml/train/gpt_trainer.hpp>
#include <dpml/train/trainer.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

using namespace dpml;

namespace {
using Strategy = Parallel<TensorParallel, PipelineParallel<OneFOneB>, DataParallel<Replicated>>;
using Scaling = optim::LossScaling;
constexpr std::int64_t kGlobalBatch = 8, kSeq = 8, kVocab = 67;
constexpr double kLr = 1e-2;

// The global batch of step s (random inputs, targets a fixed function of them), rows of data rank r.
data::TokenBatch gpt_batch(int step, const ProcessGrid& grid) {
  const std::int64_t n = kGlobalBatch / grid.dp(), first = n * grid.coord(Axis::data);
  data::TokenBatch b{Tensor<std::int32_t>(Shape{n, kSeq}), Tensor<std::int32_t>(Shape{n, kSeq})};
  const PhiloxStream rng(99, static_cast<std::uint64_t>(step));
  for (std::int64_t i = 0; i < b.inputs.numel(); ++i) {
    b.inputs[i] = static_cast<std::int32_t>(rng.u32(2 * static_cast<std::uint64_t>(first * kSeq + i)) % kVocab);
    b.targets[i] = (b.inputs[i] * 7 + 3) % kVocab;
  }
  return b;
}

using Trainer = train::GptTrainer<Strategy, optim::AdamW>;

// A tiny GPT for `grid` (initialised by name, so alike in every layout) and its trainer.
struct Gpt {
  std::unique_ptr<models::Gpt<float>> model;
  std::unique_ptr<Trainer> trainer;

  Gpt(const ProcessGrid& grid, Scaling scaling)
      : model(std::make_unique<models::Gpt<float>>(
            models::GptConfig{.vocab = kVocab, .max_seq = kSeq, .layers = 2, .heads = 2, .dim = 16}, grid)) {
    layers::initialize_all(model->parameters(), 1234, &grid);
    trainer = std::make_unique<Trainer>(*model, grid, optim::AdamWOptions{.eps = 1e-3, .weight_decay = 0.1},
                                        parallel::DistributedOptimizerOptions{.bucket_bytes = 2048, .clip = 1.0},
                                        train::GptTrainOptions{.micro_batch = kGlobalBatch / grid.dp() / 2,
                                                               .global_batch = kGlobalBatch, .seed = 5,
                                                               .loss_scaling = scaling});
  }
  std::vector<std::vector<float>> values() const {
    std::vector<std::vector<float>> out;
    for (auto* p : model->parameters()) out.emplace_back(p->value().begin(), p->value().end());
    return out;
  }
};

bool bitwise_equal(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0) return false;
  return true;
}

struct TpPp {
  int tp, pp;
};
// dp = world, and tp 2 × pp 2 where the world divides by 4.
std::vector<TpPp> layouts(int n) {
  std::vector<TpPp> out{{1, 1}};
  if (n % 4 == 0) out.push_back({2, 2});
  return out;
}

std::string temp_dir(const comm::Mpi& world) {
  std::int64_t id = world.rank() == 0 ? ::getpid() : 0;
  world.broadcast(&id, 1, 0);
  return (std::filesystem::temp_directory_path() / ("dpml-loss-scale-" + std::to_string(id))).string();
}
}  // namespace

TEST_CASE("loss scale: the dynamic scaler halves on overflow, doubles after a clean window, stops at min", "[train][loss_scale]") {
  optim::DynamicLossScale s({.initial = 8.0, .window = 2, .min = 2.0});
  s.update(true);
  CHECK(s.scale() == 4.0);
  s.update(true);
  s.update(true);
  CHECK(s.scale() == 2.0);  // min
  s.update(false);
  CHECK((s.scale() == 2.0 && s.clean_steps() == 1));
  s.update(false);
  CHECK((s.scale() == 4.0 && s.clean_steps() == 0));
  s.set(16.0, 1);
  s.update(false);
  CHECK(s.scale() == 32.0);
  CHECK(test::message_of([&] { s.set(1.0, 0); }).find("does not fit min 2") != std::string::npos);
  CHECK(test::message_of([] { optim::DynamicLossScale({.initial = 0.5, .min = 1.0}); }).find("at least min 1") !=
        std::string::npos);
}

TEST_CASE("loss scale: a static power of two changes no bit of a GPT's training", "[train][loss_scale]") {
  const auto world = test::world();
  for (const TpPp l : layouts(world.size())) {
    CAPTURE(l.tp, l.pp);
    const auto grid = ProcessGrid::create(world, {.tp = l.tp, .pp = l.pp});
    Gpt plain(grid, {}), scaled(grid, Scaling::fixed_at(1024.0));
    for (int s = 0; s < 3; ++s) {
      const auto a = plain.trainer->train_step(gpt_batch(s, grid), kLr);
      const auto b = scaled.trainer->train_step(gpt_batch(s, grid), kLr);
      CAPTURE(s, a.loss, b.loss, a.grad_norm, b.grad_norm);
      CHECK(b.loss_scale == 1024.0);
      CHECK(a.loss == b.loss);            // the loss is reported unscaled
      CHECK(a.grad_norm == b.grad_norm);  // so is the norm
      CHECK(!b.skipped);
    }
    CHECK(bitwise_equal(plain.values(), scaled.values()));
  }
}

TEST_CASE("loss scale: a static power of two changes no bit of a Sequential's training", "[train][loss_scale]") {
  using Net = layers::Sequential<layers::Flatten<float>, layers::Linear<float>, layers::ReLU<float>, layers::Linear<float>>;
  using Loss = layers::SoftmaxCrossEntropy<float>;
  const auto self = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  auto make = [] {
    return Net(layers::Flatten<float>(), layers::Linear<float>(20, 24, {.name = "fc1"}), layers::ReLU<float>(),
               layers::Linear<float>(24, 5, {.name = "out"}));
  };
  auto batch = [](int step) {
    data::Batch b;
    b.global_size = 12;
    b.images = Tensor<float>(Shape{12, 1, 4, 5});
    b.labels = Tensor<std::int32_t>(Shape{12});
    const PhiloxStream rng(11, static_cast<std::uint64_t>(step));
    for (std::int64_t i = 0; i < b.images.numel(); ++i) b.images[i] = rng.normal(static_cast<std::uint64_t>(i));
    for (std::int64_t n = 0; n < 12; ++n) b.labels[n] = static_cast<std::int32_t>(n % 5);
    return b;
  };
  Net plain = make(), scaled = make();
  layers::initialize_all(plain.parameters(), 7, &self);
  layers::initialize_all(scaled.parameters(), 7, &self);
  const optim::SgdOptions sgd{.momentum = 0.9, .weight_decay = 1e-3};
  train::Trainer<Net, Loss, Strategy, optim::Sgd> a(plain, self, sgd, {.clip = 0.5}, {.micro_batches = 3});
  train::Trainer<Net, Loss, Strategy, optim::Sgd> b(scaled, self, sgd, {.clip = 0.5},
                                                    {.micro_batches = 3, .loss_scaling = Scaling::fixed_at(0x1p10)});
  for (int s = 0; s < 4; ++s) {
    const auto ra = a.train_step(batch(s), 0.1), rb = b.train_step(batch(s), 0.1);
    CAPTURE(s, ra.loss, rb.loss, ra.grad_norm, rb.grad_norm);
    CHECK(ra.loss == rb.loss);
    CHECK(ra.grad_norm == rb.grad_norm);
  }
  auto pa = plain.parameters(), pb = scaled.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i]->name());
    CHECK(std::memcmp(pa[i]->value().data(), pb[i]->value().data(), static_cast<std::size_t>(pa[i]->numel()) * sizeof(float)) == 0);
  }
}

TEST_CASE("loss scale: dynamic scaling skips overflowed steps, halving the scale, then trains as unscaled", "[train][loss_scale]") {
  const auto world = test::world();
  for (const TpPp l : layouts(world.size())) {
    CAPTURE(l.tp, l.pp);
    const auto grid = ProcessGrid::create(world, {.tp = l.tp, .pp = l.pp});
    Gpt plain(grid, {}), scaled(grid, Scaling::dynamic_from({.initial = 0x1p140, .window = 3, .min = 1.0}));
    const auto initial = scaled.values();
    double expected = 0x1p140;
    int overflows = 0;
    train::StepResult r;
    for (; overflows < 60; ++overflows) {  // batch 0 again until a step succeeds
      r = scaled.trainer->train_step(gpt_batch(0, grid), kLr);
      CAPTURE(overflows, r.loss_scale);
      REQUIRE(r.loss_scale == expected);
      if (!r.overflow) break;
      CHECK((r.skipped && std::isnan(r.grad_norm) && std::isfinite(r.loss)));
      CHECK(scaled.trainer->optimizer().optimizer().step_count() == 0);
      CHECK(bitwise_equal(scaled.values(), initial));
      expected /= 2;
      CHECK(scaled.trainer->loss_scale() == expected);
    }
    CHECK(overflows >= 1);   // 2^140 overflows fp32 gradients
    CHECK(overflows < 60);   // and some scale on the way down does not
    CHECK(!r.skipped);
    CHECK(scaled.trainer->step() == overflows + 1);  // skipped steps count as steps run
    CHECK(scaled.trainer->optimizer().optimizer().step_count() == 1);
    const auto ref = plain.trainer->train_step(gpt_batch(0, grid), kLr);
    CHECK(r.loss == ref.loss);
    CHECK(r.grad_norm == ref.grad_norm);
    CHECK(bitwise_equal(plain.values(), scaled.values()));
  }
}

TEST_CASE("loss scale: dynamic scaling doubles after each window of clean steps", "[train][loss_scale]") {
  const auto world = test::world();
  const auto grid = ProcessGrid::create(world, {});
  Gpt plain(grid, {}), scaled(grid, Scaling::dynamic_from({.initial = 0x1p10, .window = 2}));
  for (int s = 0; s < 5; ++s) {
    const auto a = plain.trainer->train_step(gpt_batch(s, grid), kLr);
    const auto b = scaled.trainer->train_step(gpt_batch(s, grid), kLr);
    CAPTURE(s, b.loss_scale);
    CHECK(b.loss_scale == std::ldexp(1.0, 10 + s / 2));  // 2^10, 2^10, 2^11, 2^11, 2^12
    CHECK(!b.overflow);
    CHECK(a.loss == b.loss);
    CHECK(scaled.trainer->dynamic_loss_scale()->clean_steps() == (s + 1) % 2);
  }
  CHECK(scaled.trainer->loss_scale() == 0x1p12);
  CHECK(bitwise_equal(plain.values(), scaled.values()));
}

TEST_CASE("loss scale: a checkpoint saves the dynamic scaler; the resumed run equals the uninterrupted one", "[train][loss_scale]") {
  const auto world = test::world();
  const auto grid = ProcessGrid::create(world, {});
  const std::string dir = temp_dir(world);
  const Scaling dynamic = Scaling::dynamic_from({.initial = 0x1p140, .window = 3});
  constexpr int kSaved = 24, kTotal = 30;  // overflows and clean steps on both sides of the save

  Gpt whole(grid, dynamic);
  std::vector<double> losses;
  for (int s = 0; s < kTotal; ++s) {
    losses.push_back(whole.trainer->train_step(gpt_batch(s, grid), kLr).loss);
    if (s + 1 == kSaved) {
      train::Checkpointer ckpt(*whole.trainer, dir, {.keep_last = 1});
      ckpt.save_async({.step = kSaved});
      ckpt.wait();
    }
  }
  Gpt resumed(grid, dynamic);
  const auto pos = train::load_checkpoint(*resumed.trainer, dir + "/step-" + std::to_string(kSaved));
  CHECK(pos.step == kSaved);
  CHECK(resumed.trainer->loss_scale() < 0x1p140);  // the saved scale, not the initial one
  for (int s = kSaved; s < kTotal; ++s) {
    const auto r = resumed.trainer->train_step(gpt_batch(s, grid), kLr);
    CAPTURE(s);
    CHECK(r.loss == losses[static_cast<std::size_t>(s)]);
  }
  CHECK(resumed.trainer->loss_scale() == whole.trainer->loss_scale());
  CHECK(resumed.trainer->dynamic_loss_scale()->clean_steps() == whole.trainer->dynamic_loss_scale()->clean_steps());
  CHECK(bitwise_equal(resumed.values(), whole.values()));

  // A checkpoint without a scaler (an unscaled run's, or one written before scalers were saved)
  // loads at the scaler's initial scale.
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
  Gpt unscaled(grid, {});
  (void)unscaled.trainer->train_step(gpt_batch(0, grid), kLr);
  {
    train::Checkpointer ckpt(*unscaled.trainer, dir, {.keep_last = 1});
    ckpt.save_async({.step = 1});
    ckpt.wait();
  }
  Gpt fresh(grid, Scaling::dynamic_from({.initial = 0x1p12, .window = 3}));
  (void)train::load_checkpoint(*fresh.trainer, dir + "/step-1");
  CHECK(fresh.trainer->loss_scale() == 0x1p12);
  CHECK(fresh.trainer->dynamic_loss_scale()->clean_steps() == 0);
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}
