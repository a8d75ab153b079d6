#pragma once
// GptTrainer<Strategy, Rule>: train::Trainer (train/trainer.hpp) for a models::Gpt, whose stages
// are its own (first stage: embedding and its blocks; last: its blocks, ln_f and the tied,
// vocabulary-parallel head that computes the loss: Loss = ModelLoss) — or for the v chunks per
// pipeline rank of a models::GptChunks under the interleaved schedule — plus what is GPT's alone:
//
//   GptTrainOptions     Megatron's names: --micro-batch sequences per micro-batch and
//                       --global-batch sequences per step (micro-batches = global / (micro · dp),
//                       refused on every rank when that does not divide)
//   generate()          samples text through the same pipeline: each (virtual) stage in turn runs
//                       its blocks on the context, the last stage gathers the next-token logits
//                       over the tensor axis and samples (temperature, top-k, Philox), and the
//                       token is broadcast back down the pipeline
//
// The step, non-finite handling (GptTrainOptions::on_nonfinite), the tied embedding's gradient
// (held back from its bucket until summed over the first and last stage), the watchdog and the
// checkpoint interface are the Trainer's — on the host (models::Gpt<T>, the grid's MPI groups) or
// on GPUs (models::Gpt<T, CudaSpace, Comm> and a parallel::DeviceGrid<Comm, DataComm>; sampling
// then moves its few tokens and activations through the host).

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/philox.hpp"
#include "dpml/data/token_shards.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/models/gpt.hpp"
#include "dpml/optim/loss_scale.hpp"
#include "dpml/optim/optimizer.hpp"
#include "dpml/parallel/distributed_optimizer.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace dpml::train {

using GptStepResult = StepResult;

struct GptTrainOptions {
  std::int64_t micro_batch = 1;      // sequences per micro-batch (--micro-batch)
  std::int64_t global_batch = 1;     // sequences per step over all data ranks (--global-batch)
  std::uint64_t seed = 0;
  NonFinite on_nonfinite = NonFinite::stop;
  optim::LossScaling loss_scaling = {};  // --fp16 (dynamic), --loss-scale S (fixed): TrainOptions'
};

// Model: models::Gpt (one stage per pipeline rank), or models::GptChunks (v chunks per rank under
// the interleaved schedule: TrainOptions::virtual_stages is its chunks()).
template <class Strategy, optim::UpdateRule Rule, class T = float, class Space = HostSpace,
          class Comm = parallel::default_comm_t<Space>, class DataComm = parallel::data_comm_t<Strategy, Comm>,
          class GptModel = models::Gpt<T, Space, Comm>>
class GptTrainer : public Trainer<GptModel, ModelLoss, Strategy, Rule, Space, Comm, DataComm> {
  using Base = Trainer<GptModel, ModelLoss, Strategy, Rule, Space, Comm, DataComm>;

 public:
  using Model = GptModel;

  // Host: the grid's MPI groups.
  GptTrainer(Model& model, const parallel::ProcessGrid& grid, typename Rule::Options rule,
             parallel::DistributedOptimizerOptions dist, GptTrainOptions options)
    requires std::same_as<Space, HostSpace>
      : Base(model, grid, rule, dist, generic(options, grid.dp(), chunks_of(model))), gpt_options_(options) {}
  // GPUs: the model's device communicators and the Device its layers run on.
  GptTrainer(Model& model, const typename Base::Comms& comms, kernels::Device<Space>& dev, typename Rule::Options rule,
             parallel::DistributedOptimizerOptions dist, GptTrainOptions options)
      : Base(model, comms, dev, rule, dist, generic(options, comms.grid().dp(), chunks_of(model))), gpt_options_(options) {}

  std::int64_t local_batch() const noexcept { return gpt_options_.global_batch / this->grid().dp(); }
  const GptTrainOptions& train_options() const noexcept { return gpt_options_; }

  // One step on this data rank's (B_local, T) inputs and targets; lr from the caller's schedule.
  GptStepResult train_step(const data::TokenBatch& batch, double lr) {
    check_length(batch);
    return Base::train_step(batch, lr);
  }
  // Mean per-token loss on a batch without training.
  double evaluate(const data::TokenBatch& batch) {
    check_length(batch);
    return Base::evaluate(batch);
  }

  // Continues `prompt` by `count` tokens (temperature > 0, top_k ≤ 0: the whole vocabulary).
  // Every rank returns the same tokens.
  std::vector<std::int32_t> generate(std::vector<std::int32_t> prompt, int count, double temperature, int top_k,
                                     std::uint64_t seed) {
    DPML_REQUIRE(!prompt.empty(), "generate: empty prompt");
    auto& ctx = this->context();
    const auto& pipe = this->grid().comm(Axis::pipeline);
    const int p = pipe.size(), r = pipe.rank(), v = this->chunks();
    const std::int64_t C = this->model().config().dim, max_seq = this->model().config().max_seq;
    const PhiloxStream rng(seed, 0x47454e);  // "GEN"
    ctx.mode = layers::Mode::eval;
    ctx.micro_batch = 0;
    for (int i = 0; i < count; ++i) {
      const std::int64_t len = std::min<std::int64_t>(static_cast<std::int64_t>(prompt.size()), max_seq);
      Tensor<std::int32_t> tokens(Shape{1, len});
      std::copy(prompt.end() - len, prompt.end(), tokens.begin());
      Tensor<T> received(Shape{1, len, C});  // host memory: the pipeline's MPI carries it
      std::int32_t next = 0;
      for (int c = 0; c < v; ++c) {  // the virtual stages in order: chunk c of rank r is c·p + r
        auto& stage = this->chunk(c);
        if (!stage.is_first_stage()) pipe.recv(received.data(), static_cast<std::size_t>(received.numel()), (r + p - 1) % p, 0);
        const auto out = stage.forward(ctx, in_space(tokens, tokens_), in_space(received, received_), TensorView<const std::int32_t, Space>());
        if (!stage.is_last_stage()) {
          copy(received.view(), out);
          pipe.send(received.data(), static_cast<std::size_t>(received.numel()), (r + 1) % p, 0);
        } else {
          next = sample(stage.next_token_logits(ctx, 0), temperature, top_k, rng.uniform(static_cast<std::uint64_t>(i)));
        }
      }
      pipe.broadcast(&next, 1, p - 1);
      prompt.push_back(next);
    }
    ctx.mode = layers::Mode::train;
    return prompt;
  }

 private:
  // A host tensor in the model's space: itself on the host, else copied into `buffer`.
  template <class E>
  TensorView<const E, Space> in_space(const Tensor<E>& host, Tensor<E, Space>& buffer) {
    if constexpr (std::is_same_v<Space, HostSpace>) {
      return host.cview();
    } else {
      auto out = layers::ensure(buffer, host.shape());
      copy(out, host.cview());
      return TensorView<const E, Space>(out);
    }
  }

  static TrainOptions generic(const GptTrainOptions& o, int dp, int chunks) {
    return {.micro_batches = micro_batches_of(o.micro_batch, o.global_batch, dp), .global_batch = o.global_batch,
            .seed = o.seed, .on_nonfinite = o.on_nonfinite, .virtual_stages = chunks, .loss_scaling = o.loss_scaling};
  }
  static int chunks_of(const Model& model) {
    if constexpr (ChunkedModel<Model>) return model.chunks();
    else return 1;
  }
  void check_length(const data::TokenBatch& batch) {
    DPML_REQUIRE(batch.inputs.size(1) <= this->model().config().max_seq,
                 "sequence length " << batch.inputs.size(1) << " exceeds the model's " << this->model().config().max_seq);
  }
  static std::int32_t sample(std::vector<float> logits, double temperature, int top_k, float u) {
    std::vector<std::int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)]; });
    const std::size_t k = top_k > 0 ? std::min<std::size_t>(static_cast<std::size_t>(top_k), order.size()) : order.size();
    if (temperature <= 0) return order[0];
    std::vector<double> p(k);
    const double top = logits[static_cast<std::size_t>(order[0])];
    double sum = 0;
    for (std::size_t j = 0; j < k; ++j) sum += p[j] = std::exp((logits[static_cast<std::size_t>(order[j])] - top) / temperature);
    double acc = 0;
    for (std::size_t j = 0; j < k; ++j)
      if ((acc += p[j] / sum) > u) return order[j];
    return order[k - 1];
  }

  GptTrainOptions gpt_options_;
  Tensor<std::int32_t, Space> tokens_;  // generate() on a GPU: the context and the activation received
  Tensor<T, Space> received_;
};

}  // namespace dpml::train
