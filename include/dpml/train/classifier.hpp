#pragma once
// ClassifierTrainer: data-parallel training of an image classifier (any Layer from images
// (N, C, H, W) to logits (N, classes)) with softmax cross-entropy.
//
// One step, for this rank's slice of the global batch (the loader's Batch):
//   split into `micro_batches` chunks (gradient accumulation); for each chunk:
//     forward → loss (divided by the *global* batch size) → backward_input → backward_weight
//     (containers report finished parameters: gradient buckets start their all-reduce at once)
//   DistributedOptimizer::finish_step: wait for buckets, global-norm clip, update (ZeRO-1 optional)
// so K data ranks compute exactly the sequential step on the same global batch.
//
// evaluate() runs the model in eval mode (BatchNorm uses running statistics) over a loader and
// returns the accuracy over all data ranks (counts summed over the data axis).

#include "dpml/comm/mpi.hpp"
#include "dpml/data/loader.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/cross_entropy.hpp"
#include "dpml/parallel/distributed_optimizer.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/train/progress.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

namespace dpml::train {

struct ClassifierOptions {
  int micro_batches = 1;        // gradient-accumulation chunks of each rank's batch
  std::uint64_t seed = 0;       // dropout and other in-model randomness
  int log_every = 50;           // steps between progress lines (rank 0)
};

struct StepResult {
  double loss = 0.0;            // mean over the global batch
  double accuracy = 0.0;        // on the global batch (training mode)
  double grad_norm = 0.0;
  double seconds = 0.0;
  double exposed_comm_seconds = 0.0;
};

template <layers::Layer Model, optim::UpdateRule Rule>
class ClassifierTrainer {
 public:
  ClassifierTrainer(Model& model, const parallel::ProcessGrid& grid, typename Rule::Options rule,
                    parallel::DistributedOptimizerOptions dist, ClassifierOptions options)
      : model_(model), grid_(grid), options_(options), optimizer_(model.parameters(), &grid, rule, dist) {
    DPML_REQUIRE_EVERYWHERE(options.micro_batches >= 1, "--micro-batches must be at least 1, got " << options.micro_batches);
    ctx_.grid = &grid;
    ctx_.seed = options.seed;
    ctx_.on_grad_ready = [this](std::span<ParamBase* const> ps) { optimizer_.on_grad_ready(ps); };
  }

  // One optimizer step on this rank's part of a global batch; lr from the caller's schedule.
  StepResult train_step(const data::Batch& batch, double lr) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::int64_t n = batch.size();
    DPML_REQUIRE(n >= options_.micro_batches || n == 0, "rank " << grid_.world_rank() << " holds " << n
                                                                 << " samples, fewer than --micro-batches " << options_.micro_batches);
    ctx_.mode = layers::Mode::train;
    ctx_.global_batch = batch.global_size;
    optimizer_.begin_step(options_.micro_batches);
    std::int64_t correct = 0;
    const auto images = batch.images.cview();
    // The loader's convention: data rank r of K holds [⌊r·G/K⌋, ⌊(r+1)·G/K⌋) of the G samples.
    const std::int64_t ranks = grid_.size(Axis::data), first = grid_.coord(Axis::data) * batch.global_size / ranks;
    for (int mb = 0; mb < options_.micro_batches; ++mb) {
      const std::int64_t lo = n * mb / options_.micro_batches, hi = n * (mb + 1) / options_.micro_batches;
      ctx_.micro_batch = mb;
      ctx_.sample_offset = first + lo;
      auto x = images.slice(0, lo, hi);
      auto labels = batch.labels.cview().slice(0, lo, hi);
      auto logits = model_.forward(ctx_, x);
      loss_.forward(ctx_, logits, labels);
      correct += count_correct(logits, labels);
      auto dlogits = loss_.backward(ctx_);
      model_.backward_input(ctx_, dlogits);
      model_.backward_weight(ctx_, dlogits);
    }
    const auto report = optimizer_.finish_step(lr);
    ++ctx_.step;
    double sums[2] = {loss_.take_loss(), static_cast<double>(correct)};
    grid_.comm(Axis::data).allreduce(sums, 2, comm::ReduceOp::sum);
    StepResult r;
    r.loss = sums[0];
    r.accuracy = batch.global_size > 0 ? sums[1] / static_cast<double>(batch.global_size) : 0.0;
    r.grad_norm = report.grad_norm;
    r.exposed_comm_seconds = report.exposed_comm_seconds;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  // Accuracy over every batch of `loader` (its sampler shards the data over the data axis).
  template <class Source>
  double evaluate(data::Loader<Source>& loader, std::int64_t epoch = 0) {
    ctx_.mode = layers::Mode::eval;
    ctx_.micro_batch = 0;
    loader.start_epoch(epoch);
    std::int64_t counts[2] = {0, 0};  // correct, seen
    while (const data::Batch* b = loader.next()) {
      if (b->size() == 0) continue;
      auto logits = model_.forward(ctx_, b->images.cview());
      counts[0] += count_correct(logits, b->labels.cview());
      counts[1] += b->size();
    }
    grid_.comm(Axis::data).allreduce(counts, 2, comm::ReduceOp::sum);
    ctx_.mode = layers::Mode::train;
    return counts[1] > 0 ? static_cast<double>(counts[0]) / static_cast<double>(counts[1]) : 0.0;
  }

  layers::Context<HostSpace>& context() noexcept { return ctx_; }
  parallel::DistributedOptimizer<Rule, float>& optimizer() noexcept { return optimizer_; }

 private:
  static std::int64_t count_correct(TensorView<const float> logits, TensorView<const std::int32_t> labels) {
    const std::int64_t n = logits.size(0), c = logits.size(1);
    std::int64_t correct = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const float* row = logits.data() + i * c;
      correct += std::max_element(row, row + c) - row == labels[i];
    }
    return correct;
  }

  Model& model_;
  const parallel::ProcessGrid& grid_;
  ClassifierOptions options_;
  layers::Context<HostSpace> ctx_;
  layers::SoftmaxCrossEntropy<float> loss_;
  parallel::DistributedOptimizer<Rule, float> optimizer_;
};

}  // namespace dpml::train
