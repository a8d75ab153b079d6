// Data parallel equals sequential (Step 2): from the same initial weights and the same global
// batches, K = 1, 2, 3, 4 ranks give the sequential run's loss at every step and its weights after
// 5 steps. Models: the ResNet-style CNN with synchronised BatchNorm (SGD + Nesterov momentum,
// weight decay) and the MLP with gradient accumulation (AdamW, clipping), with and without ZeRO-1;
// the MLP also with the hierarchical all-reduce (DataParallel<…, Hierarchical>), the ranks as nodes
// of 2 (4 ranks: 2 nodes; 3 ranks: 3 nodes of 1).
//
// Tolerance: float32, relative error ≤ 1e-5 for each loss and each parameter tensor (L2 over the
// tensor): only the order of float sums differs between layouts.
#include "test.hpp"

#include <dpml/data/loader.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/mlp.hpp>
#include <dpml/models/resnet.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/optim/sgd.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/classifier.hpp>

#include <map>
#include <string>
#include <vector>

using namespace dpml;

namespace {
constexpr double kTolerance = 1e-5;
constexpr int kSteps = 5;
constexpr std::int64_t kGlobalBatch = 24;

// Rows [lo, hi) of the global batch of `step` (random images; labels a function of the image).
data::Batch batch_rows(int step, std::int64_t lo, std::int64_t hi) {
  data::Batch b;
  b.global_size = kGlobalBatch;
  b.images = Tensor<float>(Shape{hi - lo, 1, 12, 12});
  b.labels = Tensor<std::int32_t>(Shape{hi - lo});
  const PhiloxStream rng(7, static_cast<std::uint64_t>(step));
  for (std::int64_t n = lo; n < hi; ++n) {
    double mean = 0;
    for (std::int64_t i = 0; i < 144; ++i) {
      const float v = rng.normal(static_cast<std::uint64_t>(n * 144 + i));
      b.images[(n - lo) * 144 + i] = v;
      mean += v * (i % 12 < 6 ? 1 : -1);
    }
    b.labels[n - lo] = mean > 0 ? 1 + static_cast<std::int32_t>(n % 3) : static_cast<std::int32_t>(n % 4) * 2;
  }
  return b;
}

template <class Model, class Rule, class AllReduce = parallel::Flat>
std::vector<double> train_steps(Model& model, const ProcessGrid& grid, typename Rule::Options rule, bool zero, int micro_batches) {
  layers::initialize_all(model.parameters(), 42, &grid);
  std::vector<double> losses;
  parallel::with_strategy<AllReduce>(parallel::pipeline::OneFOneB{}, zero, [&]<class Strategy>() {
    train::ClassifierTrainer<Model, Rule, Strategy> trainer(model, grid, rule, {.bucket_bytes = 512, .clip = 0.5},
                                                            {.micro_batches = micro_batches});
    const int r = grid.coord(Axis::data), k = grid.dp();
    for (int s = 0; s < kSteps; ++s)
      losses.push_back(trainer.train_step(batch_rows(s, kGlobalBatch * r / k, kGlobalBatch * (r + 1) / k), 0.05).loss);
  });
  return losses;
}

template <class Model>
void compare(Model& run, Model& reference, const std::vector<double>& losses, const std::vector<double>& ref_losses) {
  for (int s = 0; s < kSteps; ++s) {
    CAPTURE(s, losses[s], ref_losses[s]);
    CHECK(std::abs(losses[s] - ref_losses[s]) <= kTolerance * std::abs(ref_losses[s]));
  }
  auto a = run.parameters();
  auto b = reference.parameters();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i]->name() == b[i]->name());
    const double e = test::rel_error(a[i]->value(), b[i]->value());
    CAPTURE(a[i]->name(), e);
    CHECK(e <= kTolerance);
  }
}
}  // namespace

TEST_CASE("data parallel CNN with synchronised BatchNorm equals sequential", "[train][dp]") {
  const auto world = test::world();
  const auto grid = ProcessGrid::create(world, {});
  const auto self = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  const models::ResNetConfig cfg{.width = 4, .blocks_per_stage = 1, .sync_batch_norm = true};
  const optim::SgdOptions sgd{.momentum = 0.9, .weight_decay = 5e-4, .nesterov = true};
  for (bool zero : {false, true}) {
    CAPTURE(zero);
    auto reference = models::ResNet<float>::make(cfg);
    const auto ref_losses = train_steps<decltype(reference), optim::Sgd>(reference, self, sgd, false, 1);
    auto model = models::ResNet<float>::make(cfg);
    const auto losses = train_steps<decltype(model), optim::Sgd>(model, grid, sgd, zero, 1);
    compare(model, reference, losses, ref_losses);
  }
}

TEST_CASE("data parallel MLP with gradient accumulation equals sequential", "[train][dp]") {
  const auto world = test::world();
  const auto grid = ProcessGrid::create(world, {});
  const auto self = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  const models::MlpConfig cfg{.inputs = 144, .hidden = 32, .depth = 2};
  for (bool zero : {false, true}) {
    CAPTURE(zero);
    auto reference = models::Mlp<float>::make(cfg);
    const auto ref_losses = train_steps<decltype(reference), optim::AdamW>(reference, self, {.weight_decay = 0.1}, false, 1);
    auto model = models::Mlp<float>::make(cfg);
    const auto losses = train_steps<decltype(model), optim::AdamW>(model, grid, {.weight_decay = 0.1}, zero, 2);
    compare(model, reference, losses, ref_losses);
  }
}

TEST_CASE("data parallel MLP with a hierarchical all-reduce equals sequential", "[train][dp]") {
  const auto world = test::world();
  const auto grid = ProcessGrid::create(world, {.ranks_per_node = world.size() % 2 == 0 ? 2 : 1});
  const auto self = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  const models::MlpConfig cfg{.inputs = 144, .hidden = 32, .depth = 2};
  auto reference = models::Mlp<float>::make(cfg);
  const auto ref_losses = train_steps<decltype(reference), optim::AdamW>(reference, self, {.weight_decay = 0.1}, false, 1);
  for (bool zero : {false, true}) {
    CAPTURE(zero);
    auto model = models::Mlp<float>::make(cfg);
    const auto losses =
        train_steps<decltype(model), optim::AdamW, parallel::Hierarchical>(model, grid, {.weight_decay = 0.1}, zero, 2);
    compare(model, reference, losses, ref_losses);
  }
}
