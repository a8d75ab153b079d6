#pragma once
// ClassifierTrainer: train::Trainer (train/trainer.hpp) for an image classifier — any Layer from
// images (N, C, H, W) to logits (N, classes), softmax cross-entropy — that also counts correct
// predictions: the step's accuracy on its global batch, and evaluate() over a loader.
//
// The default Strategy is plain data parallelism (what the launch leaves after tp and pp, which
// the grid gives); tensor-parallel layers and pipeline stages of a Sequential work as in Trainer.
// So K data ranks compute exactly the sequential step on the same global batch.
//
// Any space, as Trainer: on the host over the grid's MPI groups; on a GPU (a model on CudaSpace,
// CUDA translation units) over a parallel::DeviceGrid<Comm, DataComm> and the kernels::Device the
// model runs on. The loader's batches (float NCHW) go to a model that reads them as they are;
// any other model (a GPU's: bf16, NHWC) gets each batch converted on the host first (ImageBatch,
// train/batch.hpp), which the trainer uploads in one copy per step. Correct predictions are
// counted where the logits are (Ops::count_correct, before the loss may overwrite them) into a
// running sum in the model's memory, read once per step with the loss.
//
// evaluate() runs the model in eval mode (BatchNorm uses running statistics) over a loader and
// returns the accuracy over all data ranks (counts summed over the data axis).

#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/data/loader.hpp"
#include "dpml/kernels/device.hpp"
#include "dpml/kernels/image.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/cross_entropy.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/optim/optimizer.hpp"
#include "dpml/parallel/distributed_optimizer.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/parallel/strategy.hpp"
#include "dpml/train/batch.hpp"
#include "dpml/train/trainer.hpp"

#include <concepts>
#include <cstdint>
#include <type_traits>

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

template <layers::Layer Model, optim::UpdateRule Rule, class Strategy = DataParallelOnly,
          class Comm = parallel::default_comm_t<typename Model::space>,
          class DataComm = parallel::data_comm_t<Strategy, Comm>>
class ClassifierTrainer : public Trainer<Model, layers::SoftmaxCrossEntropy<typename Model::value_type, typename Model::space>,
                                         Strategy, Rule, typename Model::space, Comm, DataComm> {
  using T = typename Model::value_type;
  using Space = typename Model::space;
  using Base = Trainer<Model, layers::SoftmaxCrossEntropy<T, Space>, Strategy, Rule, Space, Comm, DataComm>;
  using Stage = typename Base::Stage;
  using Ops = kernels::Ops<Space>;
  // Whether the model reads the loader's batches as they are (float NCHW).
  static constexpr bool kAsLoaded = std::is_same_v<T, float> && Ops::image_layout == kernels::ImageLayout::nchw;

 public:
  // Host: the grid's MPI groups.
  ClassifierTrainer(Model& model, const parallel::ProcessGrid& grid, typename Rule::Options rule,
                    parallel::DistributedOptimizerOptions dist, ClassifierOptions options)
    requires std::same_as<Space, HostSpace>
      : Base(model, grid, rule, dist, generic(options)) {
    count_outputs();
  }
  // A GPU: the device communicators of `comms` and the Device whose stream the model's layers run
  // on (the one `comms` was built with); both outlive the trainer.
  ClassifierTrainer(Model& model, const typename Base::Comms& comms, kernels::Device<Space>& dev, typename Rule::Options rule,
                    parallel::DistributedOptimizerOptions dist, ClassifierOptions options)
      : Base(model, comms, dev, rule, dist, generic(options)) {
    count_outputs();
  }

  // One optimizer step on this rank's part of a global batch (a loader's data::Batch, or any
  // TrainBatch in the model's element type and layout: a ResidentBatch already on the GPU); lr
  // from the caller's schedule.
  template <TrainBatch Batch>
  ClassifierStepResult train_step(const Batch& batch, double lr) {
    ClassifierStepResult r{Base::train_step(as_input(batch), lr)};
    const std::int64_t n = BatchTraits<Batch>::global_rows(batch);
    r.accuracy = n > 0 ? take_correct() / static_cast<double>(n) : 0.0;
    return r;
  }

  // Accuracy over every batch of `loader` (its sampler shards the data over the data axis).
  template <class Source>
  double evaluate(data::Loader<Source>& loader, std::int64_t epoch = 0) {
    loader.start_epoch(epoch);
    std::int64_t seen = 0;
    while (const data::Batch* b = loader.next()) {
      seen += b->global_size;
      (void)Base::evaluate(as_input(*b));
    }
    return seen > 0 ? take_correct() / static_cast<double>(seen) : 0.0;
  }

 private:
  static TrainOptions generic(const ClassifierOptions& o) {
    return {.micro_batches = o.micro_batches, .seed = o.seed, .on_nonfinite = o.on_nonfinite, .partition = o.partition};
  }
  // The last stage counts each micro-batch's correct predictions on the model's space.
  void count_outputs() {
    this->stage().on_output = [this](const typename Stage::Output& logits, const typename Stage::Target& labels) {
      DPML_REQUIRE(logits.rank() == 2 && logits.is_contiguous(), "ClassifierTrainer: logits " << logits.shape().str()
                                                                                               << " are not (N, classes)");
      const std::int64_t n = logits.size(0), c = logits.size(1);
      Ops::count_correct(this->device(), logits.data(), labels.data(), correct_.running(this->context()), n, c, c);
    };
  }
  // The batch as the model reads it: the loader's own, or its images converted into images_; a
  // batch of another type as it is.
  template <class Batch>
  const auto& as_input(const Batch& batch) {
    if constexpr (kAsLoaded || !std::is_same_v<Batch, data::Batch>) {
      return batch;
    } else {
      images_.assign(batch, Ops::image_layout);
      return images_;
    }
  }
  // Correct predictions counted since the last take, over all data ranks (collective).
  double take_correct() { return this->sum_over_last_stage(correct_.take()); }

  layers::LossSum<Space> correct_;          // a running count in the model's memory
  [[no_unique_address]] std::conditional_t<kAsLoaded, std::false_type, ImageBatch<T>> images_;
};

}  // namespace dpml::train
