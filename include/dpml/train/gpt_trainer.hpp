#pragma once
// GptTrainer<Strategy, Rule>: one training step of a GPT under any (dp, tp, pp) layout.
//
//   this data rank's batch (B_local, T) → m micro-batches of --micro-batch sequences
//   pipeline schedule (Strategy::schedule: GPipe | 1F1B | ZB-H1), this stage's actions:
//     F  forward of micro-batch i (first stage: tokens; others: the activation received)
//     B  backward_input (last stage: from its loss; others: the gradient received)
//     W  backward_weight (→ gradient buckets reduce over the data axis as layers finish)
//   tied embedding gradient summed over first and last stage (pp > 1)
//   DistributedOptimizer: global norm over all axes, clip, AdamW, ZeRO-1 all-gather (Strategy::zero)
//
// The loss divides by the tokens of the whole step (Context::global_batch), so the summed
// gradients equal the sequential run's on the same global batch, whatever the layout.
// The step's loss is reported on every rank (summed over the data axis, from the last stage).
//
// Non-finite steps (GptTrainOptions::on_nonfinite): after the data-parallel reduction and before
// the update, one all-reduce asks whether the loss or any gradient this rank updates is NaN/inf.
// `skip` drops the step (no update, the optimizer's step count unchanged; rank 0 prints a line
// naming the step), `stop` raises an Error on every rank naming the step and the first
// non-finite gradient in the model's name order (pipeline stage, then registration order:
// wte.weight, wpe.weight, h.0.ln_1.weight, …), `ignore` updates anyway (no check).
//
// Checkpoints (train/checkpointing.hpp) read and restore the trainer's state through model(),
// optimizer(), step() / set_step(). The trainer names the grid's communicators for the collective
// watchdog (comm/watchdog.hpp) and tells it the step being run.
//
// generate() samples text through the same pipeline: each stage runs its blocks on the context,
// the last stage gathers the next-token logits over the tensor axis and samples (temperature,
// top-k, Philox), and the token is broadcast back down the pipeline.

#include "dpml/comm/mpi.hpp"
#include "dpml/comm/watchdog.hpp"
#include "dpml/core/philox.hpp"
#include "dpml/data/token_shards.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/models/gpt.hpp"
#include "dpml/optim/optimizer.hpp"
#include "dpml/parallel/distributed_optimizer.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/parallel/pipeline/executor.hpp"
#include "dpml/parallel/pipeline/schedule.hpp"
#include "dpml/parallel/strategy.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

namespace dpml::train {

struct GptStepResult {
  double loss = 0.0;                 // mean per token over the global batch
  double grad_norm = 0.0;            // NaN when the step was skipped
  bool skipped = false;              // non-finite, --on-nonfinite skip: no update
  double seconds = 0.0;
  double exposed_comm_seconds = 0.0; // waiting for data-parallel reductions after backward
  parallel::pipeline::StepTimings pipeline;  // this stage: busy per op kind, waits, total
};

// What a step with a non-finite loss or gradient does (--on-nonfinite).
enum class NonFinite { stop, skip, ignore };

inline NonFinite parse_nonfinite(const std::string& s) {
  DPML_REQUIRE_EVERYWHERE(s == "stop" || s == "skip" || s == "ignore", "--on-nonfinite " << s << " is not one of stop, skip, ignore");
  return s == "stop" ? NonFinite::stop : s == "skip" ? NonFinite::skip : NonFinite::ignore;
}

struct GptTrainOptions {
  std::int64_t micro_batch = 1;      // sequences per micro-batch (--micro-batch)
  std::int64_t global_batch = 1;     // sequences per step over all data ranks (--global-batch)
  std::uint64_t seed = 0;
  NonFinite on_nonfinite = NonFinite::stop;
};

namespace detail {
// pipeline::Stage over one step of a models::Gpt: per-micro-batch token views and message buffers.
template <class T>
class GptStage {
 public:
  using value_type = T;
  using View = TensorView<const T>;

  GptStage(models::Gpt<T>& model, layers::Context<HostSpace>& ctx) : model_(model), ctx_(ctx) {}

  // inputs/targets (B_local, T); micro-batches of `mb_size` rows.
  void set_batch(TensorView<const std::int32_t> inputs, TensorView<const std::int32_t> targets, std::int64_t mb_size,
                 bool with_targets = true) {
    const std::int64_t m = inputs.size(0) / mb_size, len = inputs.size(1), C = model_.config().dim;
    inputs_.clear();
    targets_.clear();
    for (std::int64_t i = 0; i < m; ++i) {
      inputs_.push_back(inputs.slice(0, i * mb_size, (i + 1) * mb_size));
      targets_.push_back(with_targets ? targets.slice(0, i * mb_size, (i + 1) * mb_size) : TensorView<const std::int32_t>());
    }
    recv_fwd_.resize(static_cast<std::size_t>(m));
    recv_bwd_.resize(static_cast<std::size_t>(m));
    sent_fwd_.assign(static_cast<std::size_t>(m), View());
    sent_bwd_.assign(static_cast<std::size_t>(m), View());
    for (auto* v : {&recv_fwd_, &recv_bwd_})
      for (auto& t : *v) t.resize(Shape{mb_size, len, C});
  }

  void forward(int mb) {
    ctx_.micro_batch = mb;
    const auto i = static_cast<std::size_t>(mb);
    sent_fwd_[i] = model_.forward(ctx_, inputs_[i], recv_fwd_[i].cview(), targets_[i]);
  }
  void backward_input(int mb) {
    ctx_.micro_batch = mb;
    const auto i = static_cast<std::size_t>(mb);
    sent_bwd_[i] = model_.backward_input(ctx_, recv_bwd_[i].cview());
  }
  void backward_weight(int mb) {
    ctx_.micro_batch = mb;
    model_.backward_weight(ctx_);
  }
  TensorView<T> recv_forward_buffer(int mb) { return recv_fwd_[static_cast<std::size_t>(mb)].view(); }
  TensorView<T> recv_backward_buffer(int mb) { return recv_bwd_[static_cast<std::size_t>(mb)].view(); }
  View send_forward_buffer(int mb) { return sent_fwd_[static_cast<std::size_t>(mb)]; }
  View send_backward_buffer(int mb) { return sent_bwd_[static_cast<std::size_t>(mb)]; }

  double take_loss() { return model_.take_loss(); }  // this stage's summed micro-batch losses (last stage)
  int micro_batches() const noexcept { return static_cast<int>(inputs_.size()); }

 private:
  models::Gpt<T>& model_;
  layers::Context<HostSpace>& ctx_;
  std::vector<TensorView<const std::int32_t>> inputs_, targets_;
  std::vector<Tensor<T>> recv_fwd_, recv_bwd_;  // (mb, T, C)
  std::vector<View> sent_fwd_, sent_bwd_;
};
}  // namespace detail

template <class Strategy, optim::UpdateRule Rule, class T = float>
class GptTrainer {
 public:
  using Schedule = typename Strategy::schedule;

  GptTrainer(models::Gpt<T>& model, const parallel::ProcessGrid& grid, typename Rule::Options rule,
             parallel::DistributedOptimizerOptions dist, GptTrainOptions options)
      : model_(model), grid_(grid), options_(options), optimizer_(model.parameters(), &grid, rule, with_zero(dist)),
        stage_(model, ctx_) {
    const std::int64_t per_rank = options.micro_batch * grid.dp();
    DPML_REQUIRE_EVERYWHERE(options.micro_batch >= 1 && options.global_batch >= 1,
                            "--micro-batch " << options.micro_batch << " and --global-batch " << options.global_batch
                                             << " must be positive");
    DPML_REQUIRE_EVERYWHERE(options.global_batch % per_rank == 0,
                            "--global-batch " << options.global_batch << " is not a multiple of --micro-batch "
                                              << options.micro_batch << " × dp " << grid.dp()
                                              << ": the micro-batches do not divide the batch");
    micro_batches_ = static_cast<int>(options.global_batch / per_rank);
    schedule_ = parallel::pipeline::make_schedule(Schedule{}, grid.pp(), micro_batches_);
    ctx_.grid = &grid;
    ctx_.seed = options.seed;
    for (Axis a : parallel::kAxes) {
      comm::watchdog::name_group(grid.comm(a).native(), parallel::axis_name(a));
      for (Axis b : parallel::kAxes)
        if (static_cast<int>(a) < static_cast<int>(b))
          comm::watchdog::name_group(grid.comm(a, b).native(), std::string(parallel::axis_name(a)) + "+" + parallel::axis_name(b));
    }
    ctx_.on_grad_ready = [this](std::span<ParamBase* const> ps) { optimizer_.on_grad_ready(ps); };
    if (const auto* tied = model.tied_parameter()) optimizer_.buckets().hold(tied);
  }

  int micro_batches() const noexcept { return micro_batches_; }
  std::int64_t local_batch() const noexcept { return options_.global_batch / grid_.dp(); }

  // One step on this data rank's (B_local, T) inputs and targets; lr from the caller's schedule.
  GptStepResult train_step(const data::TokenBatch& batch, double lr) {
    const auto t0 = std::chrono::steady_clock::now();
    check_batch(batch);
    ctx_.mode = layers::Mode::train;
    ctx_.global_batch = options_.global_batch * batch.inputs.size(1);  // tokens of the step
    stage_.set_batch(batch.inputs.cview(), batch.targets.cview(), options_.micro_batch);
    optimizer_.begin_step(micro_batches_);
    comm::watchdog::set_step(ctx_.step + 1);
    GptStepResult r;
    r.pipeline = parallel::pipeline::run_stage(actions(), stage_, grid_.comm(Axis::pipeline));
    model_.finish_tied_gradients();
    optimizer_.buckets().finish();  // reduced gradients, checked before the update
    r.loss = step_loss(stage_.take_loss());
    ++ctx_.step;
    if (options_.on_nonfinite != NonFinite::ignore && !finite_step(r.loss)) {
      handle_nonfinite(r.loss);  // throws with `stop`
      r.skipped = true;
      r.grad_norm = std::numeric_limits<double>::quiet_NaN();
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return r;
    }
    const auto report = optimizer_.finish_step(lr);
    r.grad_norm = report.grad_norm;
    r.exposed_comm_seconds = report.exposed_comm_seconds;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  // Mean per-token loss on a batch without training (forward actions of the schedule only).
  double evaluate(const data::TokenBatch& batch) {
    check_batch(batch);
    ctx_.mode = layers::Mode::eval;
    ctx_.global_batch = options_.global_batch * batch.inputs.size(1);
    stage_.set_batch(batch.inputs.cview(), batch.targets.cview(), options_.micro_batch);
    std::vector<parallel::pipeline::Action> forward_only;
    for (const auto& a : actions())
      if (a.op == parallel::pipeline::Op::Forward || a.op == parallel::pipeline::Op::SendForward ||
          a.op == parallel::pipeline::Op::RecvForward)
        forward_only.push_back(a);
    (void)parallel::pipeline::run_stage(forward_only, stage_, grid_.comm(Axis::pipeline));
    ctx_.mode = layers::Mode::train;
    return step_loss(stage_.take_loss());
  }

  // Continues `prompt` by `count` tokens (temperature > 0, top_k ≤ 0: the whole vocabulary).
  // Every rank returns the same tokens.
  std::vector<std::int32_t> generate(std::vector<std::int32_t> prompt, int count, double temperature, int top_k,
                                     std::uint64_t seed) {
    DPML_REQUIRE(!prompt.empty(), "generate: empty prompt");
    const auto& pipe = grid_.comm(Axis::pipeline);
    const std::int64_t C = model_.config().dim, max_seq = model_.config().max_seq;
    const PhiloxStream rng(seed, 0x47454e);  // "GEN"
    ctx_.mode = layers::Mode::eval;
    ctx_.micro_batch = 0;
    for (int i = 0; i < count; ++i) {
      const std::int64_t len = std::min<std::int64_t>(static_cast<std::int64_t>(prompt.size()), max_seq);
      Tensor<std::int32_t> tokens(Shape{1, len});
      std::copy(prompt.end() - len, prompt.end(), tokens.begin());
      Tensor<T> received(Shape{1, len, C});
      if (!model_.is_first_stage()) pipe.recv(received.data(), static_cast<std::size_t>(received.numel()), pipe.rank() - 1, 0);
      auto out = model_.forward(ctx_, tokens.cview(), received.cview(), TensorView<const std::int32_t>());
      std::int32_t next = 0;
      if (!model_.is_last_stage()) {
        pipe.send(out.data(), static_cast<std::size_t>(out.numel()), pipe.rank() + 1, 0);
      } else {
        next = sample(model_.next_token_logits(ctx_, 0), temperature, top_k, rng.uniform(static_cast<std::uint64_t>(i)));
      }
      pipe.broadcast(&next, 1, pipe.size() - 1);
      prompt.push_back(next);
    }
    ctx_.mode = layers::Mode::train;
    return prompt;
  }

  parallel::DistributedOptimizer<Rule, T>& optimizer() noexcept { return optimizer_; }
  layers::Context<HostSpace>& context() noexcept { return ctx_; }
  models::Gpt<T>& model() noexcept { return model_; }
  const parallel::ProcessGrid& grid() const noexcept { return grid_; }
  const GptTrainOptions& train_options() const noexcept { return options_; }
  static constexpr bool zero = Strategy::zero;
  // Steps run so far (skipped ones included); a checkpoint restores it with set_step, together
  // with the optimizer's own count of updates.
  std::int64_t step() const noexcept { return ctx_.step; }
  void set_step(std::int64_t step) {
    DPML_REQUIRE(step >= 0, "trainer step " << step << " is negative");
    ctx_.step = step;
  }
  const parallel::pipeline::Schedule& schedule() const noexcept { return schedule_; }

 private:
  static parallel::DistributedOptimizerOptions with_zero(parallel::DistributedOptimizerOptions d) {
    d.zero = Strategy::zero;
    return d;
  }
  const std::vector<parallel::pipeline::Action>& actions() const {
    return schedule_[static_cast<std::size_t>(grid_.coord(Axis::pipeline))];
  }
  void check_batch(const data::TokenBatch& batch) const {
    DPML_REQUIRE(batch.inputs.size(0) == local_batch(), "rank " << grid_.world_rank() << " got " << batch.inputs.size(0)
                                                                << " sequences, expected global batch "
                                                                << options_.global_batch << " / dp " << grid_.dp());
    DPML_REQUIRE(batch.inputs.size(1) <= model_.config().max_seq,
                 "sequence length " << batch.inputs.size(1) << " exceeds the model's " << model_.config().max_seq);
  }
  static constexpr int kNoParam = std::numeric_limits<int>::max();
  // Collective: the loss and every reduced gradient this rank updates are finite on all ranks.
  bool finite_step(double loss) {
    int bad = std::isfinite(loss) ? 0 : 1;
    if (!bad) bad = first_nonfinite_local() != kNoParam;
    return grid_.world().allreduce(bad, comm::ReduceOp::max) == 0;
  }
  // Index (registration order) of this rank's first parameter with a non-finite reduced
  // gradient among the ranges it updates, or kNoParam.
  int first_nonfinite_local() {
    auto& buckets = optimizer_.buckets();
    const auto& offsets = optimizer_.flat().offsets();
    const T* shard = buckets.shard_grads().data();
    int first = kNoParam;
    for (const auto& s : buckets.own_segments())
      for (std::int64_t i = 0; i < s.count; ++i)
        if (!std::isfinite(static_cast<double>(shard[s.shard_offset + i]))) {
          const auto at = std::upper_bound(offsets.begin(), offsets.end(), s.flat_offset + i) - offsets.begin() - 1;
          first = std::min(first, static_cast<int>(at));
          break;  // later elements of the segment belong to the same or later parameters
        }
    return first;
  }
  // After finite_step() returned false (collective): names the first non-finite gradient in
  // model order, then stops (Error on every rank) or reports the skip (rank 0).
  void handle_nonfinite(double loss) {
    const auto& world = grid_.world();
    const int local = first_nonfinite_local();
    // Model order: pipeline stage first, then registration order within the stage.
    constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
    const std::int64_t key = local == kNoParam ? none : std::int64_t{grid_.coord(Axis::pipeline)} * kNoParam + local;
    const std::int64_t best = world.allreduce(key, comm::ReduceOp::min);
    const int holder = world.allreduce(key == best && best != none ? world.rank() : kNoParam, comm::ReduceOp::min);
    std::string name;
    if (holder != kNoParam) {
      if (world.rank() == holder) name = optimizer_.flat().params()[static_cast<std::size_t>(local)]->name();
      std::uint64_t n = name.size();
      world.broadcast(&n, 1, holder);
      name.resize(n);
      world.broadcast(name.data(), n, holder);
    }
    std::string what = "step " + std::to_string(ctx_.step) + ": non-finite ";
    what += std::isfinite(loss) ? "gradient" : "loss (" + std::to_string(loss) + ")";
    what += name.empty() ? "; every gradient is finite" : "; first non-finite gradient: '" + name + "'";
    DPML_REQUIRE_EVERYWHERE(options_.on_nonfinite != NonFinite::stop, what << " — stopping (--on-nonfinite stop)");
    if (world.rank() == 0) std::printf("dpml: %s — skipping the step, no update (--on-nonfinite skip)\n", what.c_str());
  }
  // Sum of the last stages' losses over the data axis, the same on every rank.
  double step_loss(double stage_loss) const {
    const bool counts = model_.is_last_stage() && grid_.coord(Axis::tensor) == 0;
    return grid_.world().allreduce(counts ? stage_loss : 0.0, comm::ReduceOp::sum);
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

  models::Gpt<T>& model_;
  const parallel::ProcessGrid& grid_;
  GptTrainOptions options_;
  layers::Context<HostSpace> ctx_;
  parallel::DistributedOptimizer<Rule, T> optimizer_;
  detail::GptStage<T> stage_;
  int micro_batches_ = 1;
  parallel::pipeline::Schedule schedule_;
};

}  // namespace dpml::train
