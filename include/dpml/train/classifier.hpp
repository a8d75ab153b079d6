#pragma once
// ClassifierTrainer: train::Trainer (train/trainer.hpp) for an image classifier — any Layer from
// images (N, C, H, W) to logits (N, classes), softmax cross-entropy — that also counts correct
// predictions: the step's accuracy on its global batch, and evaluate() over a loader.
//
// The default Strategy is plain data parallelism (what the launch leaves after tp and pp, which
// the grid gives); tensor-parallel layers and pipeline stages of a Sequential work as in Trainer.
// So K data ranks compute exactly the sequential step on the same global batch.
//
// evaluate() runs the model in eval mode (BatchNorm uses running statistics) over a loader and
// returns the accuracy over all data ranks (counts summed over the data axis).

#include "dpml/core/tensor.hpp"
#include "dpml/data/loader.hpp"
#include "dpml/layers/cross_entropy.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/optim/optimizer.hpp"
#include "dpml/parallel/distributed_optimizer.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/parallel/strategy.hpp"
#include "dpml/train/trainer.hpp"

#include <algorithm>
#include <cstdint>

namespace dpml::train {

struct ClassifierOptions {
  int micro_batches = 1;        // gradient-accumulation chunks of each rank's batch
  std::uint64_t seed = 0;       // dropout and other in-model randomness
  NonFinite on_nonfinite = NonFinite::stop;
  parallel::pipeline::Partition partition = {};  // pp > 1: where the model's chain is cut
};

struct ClassifierStepResult : StepResult {
  double accuracy = 0.0;        // on the global batch (training mode)
};

using DataParallelOnly = parallel::Parallel<parallel::TensorParallel, parallel::PipelineParallel<>, parallel::DataParallel<>>;

template <layers::Layer Model, optim::UpdateRule Rule, class Strategy = DataParallelOnly>
class ClassifierTrainer
    : public Trainer<Model, layers::SoftmaxCrossEntropy<typename Model::value_type, typename Model::space>, Strategy, Rule> {
  using Base = Trainer<Model, layers::SoftmaxCrossEntropy<typename Model::value_type, typename Model::space>, Strategy, Rule>;
  using Stage = typename Base::Stage;

 public:
  ClassifierTrainer(Model& model, const parallel::ProcessGrid& grid, typename Rule::Options rule,
                    parallel::DistributedOptimizerOptions dist, ClassifierOptions options)
      : Base(model, grid, rule, dist,
             {.micro_batches = options.micro_batches, .seed = options.seed, .on_nonfinite = options.on_nonfinite,
              .partition = options.partition}) {
    this->stage().on_output = [this](const typename Stage::Output& logits, const typename Stage::Target& labels) {
      correct_ += count_correct(logits, labels);
    };
  }

  // One optimizer step on this rank's part of a global batch; lr from the caller's schedule.
  ClassifierStepResult train_step(const data::Batch& batch, double lr) {
    ClassifierStepResult r{Base::train_step(batch, lr)};
    r.accuracy = batch.global_size > 0 ? take_correct() / static_cast<double>(batch.global_size) : 0.0;
    return r;
  }

  // Accuracy over every batch of `loader` (its sampler shards the data over the data axis).
  template <class Source>
  double evaluate(data::Loader<Source>& loader, std::int64_t epoch = 0) {
    loader.start_epoch(epoch);
    std::int64_t seen = 0;
    while (const data::Batch* b = loader.next()) {
      seen += b->global_size;
      (void)Base::evaluate(*b);
    }
    return seen > 0 ? take_correct() / static_cast<double>(seen) : 0.0;
  }

 private:
  template <class Logits, class Labels>
  static std::int64_t count_correct(const Logits& logits, const Labels& labels) {
    const std::int64_t n = logits.size(0), c = logits.size(1);
    std::int64_t correct = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto* row = logits.data() + i * c;
      correct += std::max_element(row, row + c) - row == labels[i];
    }
    return correct;
  }
  // Correct predictions counted since the last take, over all data ranks (collective).
  double take_correct() {
    const double all = this->sum_over_last_stage(static_cast<double>(correct_));
    correct_ = 0;
    return all;
  }

  std::int64_t correct_ = 0;
};

}  // namespace dpml::train
