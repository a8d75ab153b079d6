#pragma once
// Training a GPT on one GPU (train_gpt --device cuda): models::cuda::Gpt does the steps; a host
// train::GptTrainer on a (1, 1, 1) grid is its *mirror* — the layout-independent form of the
// state that checkpoints, export, import and sampling already know (train/checkpointing.hpp).
//
//   host trainer (fp32 weights, AdamW exp_avg / exp_avg_sq, step counts)
//        │ from_host(): at start (initialisation, --import, --resume)
//        ▼
//   device model (bf16 working weights, fp32 master + moments, one flat buffer each)
//        │ to_host(): before a checkpoint is staged, an export, a sample
//        ▼
//   host trainer → Checkpointer / export_gpt2 / generate, unchanged
//
// So a checkpoint written on the GPU is the same file set as one written by CPU ranks: it
// resumes on the GPU or on any CPU layout, and the other way round. The device is the truth
// while training; the mirror is stale between to_host() calls.
//
// A step: tokens and targets go to the device through pinned buffers; forward + backward; the
// update (global norm → clip → AdamW, all on the device); the loss and the gradient norm come
// back (one synchronisation per step). A non-finite gradient norm makes the fused AdamW skip the
// update on the device whatever the flag; --on-nonfinite stop then raises an Error naming the
// step and the first non-finite gradient, skip reports it and goes on (the optimizer's step
// count does not advance, as on the host).
//
// Precision: models::cuda::Bf16 (default) or Fp16 (train_gpt --fp16). With Fp16 an overflow of
// the scaled gradients is the expected way the dynamic loss scale finds its level: the step is
// skipped and the scale halved, and it is reported only when --on-nonfinite stop or skip asks.
//
// Micro-batches: the device model is built for --micro-batch sequences; a step runs
// global / micro of them, accumulating gradients (in the gradients' 16-bit type) before one
// update, and its loss is their mean. Limit: one GPU (one rank: tp = pp = dp = 1).

#include "dpml/checkpoint/json.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/data/token_shards.hpp"
#include "dpml/models/cuda/gpt.hpp"
#include "dpml/optim/adamw.hpp"
#include "dpml/train/gpt_trainer.hpp"

#include <cuda_runtime.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace dpml::train::cuda {

struct DeviceOptions {
  optim::AdamWOptions adamw;  // the host trainer's (the device AdamW is the same update)
  double clip = 1.0;          // global gradient-norm clipping (≤ 0: off)
  bool recompute_gelu = true; // models::cuda::GptCudaConfig::recompute_gelu
  models::cuda::LossScaleOptions loss_scale;  // Precision = Fp16 only
};

template <class HostTrainer, class Precision = models::cuda::Bf16>
class GptTrainer {
  using Model = models::cuda::Gpt<Precision>;
  using State = typename Model::State;
  static constexpr std::array<State, 2> kMoments{State::exp_avg, State::exp_avg_sq};  // AdamW::state_names' order

 public:
  // `host` is the mirror: a trainer on a grid of one rank; the device model is built for its
  // micro-batch.
  GptTrainer(HostTrainer& host, std::int64_t seq_len, DeviceOptions options)
      : host_(host), options_(options),
        model_(config_of(host, options), check_layout(host), seq_len),
        batch_(host.train_options().micro_batch), seq_(seq_len) {
    const std::size_t n = static_cast<std::size_t>(batch_ * seq_);
    DPML_CHECK_CUDA(cudaMallocHost(&pinned_, 2 * n * sizeof(std::int32_t)));
    DPML_CHECK_CUDA(cudaMalloc(&tokens_, 2 * n * sizeof(std::int32_t)));
    pin_mirror();
    from_host();
  }
  GptTrainer(const GptTrainer&) = delete;
  GptTrainer& operator=(const GptTrainer&) = delete;
  ~GptTrainer() {
    for (void* p : pinned_ranges_) cudaHostUnregister(p);
    cudaFree(tokens_);
    cudaFreeHost(pinned_);
  }

  Model& model() noexcept { return model_; }

  // Mirror → device: weights, moments, step counts.
  void from_host() {
    for_each_state([&](State s, const std::string& name, std::span<float> h) { model_.write_state(s, name, h); });
    optimizer_step_ = host_.optimizer().optimizer().step_count();
    step_ = host_.step();
  }
  // Device → mirror (synchronises): what a checkpoint, an export or a sample reads.
  void to_host() {
    for_each_state([&](State s, const std::string& name, std::span<float> h) { model_.read_state(s, name, h); });
    host_.optimizer().optimizer().set_step_count(optimizer_step_);
    host_.set_step(step_);
  }

  GptStepResult train_step(const data::TokenBatch& batch, double lr) {
    const auto t0 = std::chrono::steady_clock::now();
    const double scale = model_.loss_scale();
    const int m = micro_batches(batch);
    GptStepResult r;
    for (int mb = 0; mb < m; ++mb) {
      upload(batch, mb);
      model_.forward_backward(tokens_, targets(), /*accumulate=*/mb > 0, m);
      r.loss += model_.loss() / m;  // synchronises: the pinned inputs are free again
    }
    model_.update(lr, optimizer_step_ + 1, options_.adamw, options_.clip);
    ++step_;
    r.grad_norm = model_.finish_step();
    if (std::isfinite(r.grad_norm) && std::isfinite(r.loss)) {
      ++optimizer_step_;
    } else {
      // The device AdamW skipped the update (a non-finite norm).
      r.skipped = true;
      if (Precision::loss_scaling && std::isfinite(r.loss))  // the loss scale finding its level
        std::printf("dpml: step %lld: %s gradients overflowed at loss scale %g: step skipped, loss scale now %g\n",
                    static_cast<long long>(step_), Precision::name.data(), scale, model_.loss_scale());
      else if (host_.train_options().on_nonfinite != NonFinite::ignore)
        report_nonfinite(r.loss);
      r.grad_norm = std::numeric_limits<double>::quiet_NaN();
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  // The loss scale (Fp16) in a checkpoint's config, and back: "train.loss_scale" and
  // "train.loss_scale_clean_steps". A checkpoint without them (bf16, or the CPU) leaves the
  // scale at its initial value.
  void save_config(checkpoint::Json& config) {
    if constexpr (Precision::loss_scaling) {
      config.set("train.loss_scale", model_.loss_scaler().scale());
      config.set("train.loss_scale_clean_steps", model_.loss_scaler().clean_steps());
    }
  }
  void load_config(const checkpoint::Json& config) {
    if constexpr (Precision::loss_scaling) {
      const checkpoint::Json* scale = config.find("train.loss_scale");
      const checkpoint::Json* clean = config.find("train.loss_scale_clean_steps");
      if (scale && clean) model_.loss_scaler().set(scale->as_double(), clean->as_int());
    }
  }

  // Mean per-token loss on a batch of the training shape, without training.
  double evaluate(const data::TokenBatch& batch) {
    const int m = micro_batches(batch);
    double loss = 0.0;
    for (int mb = 0; mb < m; ++mb) {
      upload(batch, mb);
      model_.evaluate(tokens_, targets());
      loss += model_.loss() / m;
    }
    return loss;
  }

 private:
  static models::cuda::GptCudaConfig config_of(HostTrainer& host, const DeviceOptions& o) {
    const auto& c = host.model().config();
    return {.vocab = c.vocab, .max_seq = c.max_seq, .layers = c.layers, .heads = c.heads, .dim = c.dim,
            .recompute_gelu = o.recompute_gelu, .loss_scale = o.loss_scale};
  }
  static std::int64_t check_layout(const HostTrainer& host) {
    const auto& g = host.grid();
    DPML_REQUIRE_EVERYWHERE(g.world().size() == 1, "--device cuda trains on one GPU from one rank; this launch has "
                                                       << g.world().size() << " ranks (data, tensor and pipeline "
                                                       "parallelism over GPUs are not built yet)");
    return host.train_options().micro_batch;  // the host trainer has checked that it divides the global batch
  }
  // f(which, tensor name, the mirror's host span) for every tensor's master weights and moments.
  template <class F>
  void for_each_state(F&& f) {
    auto& opt = host_.optimizer().optimizer();
    const auto& params = host_.optimizer().flat().params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto* p = params[i];
      f(State::master, p->name(), std::span<float>(p->value().data(), static_cast<std::size_t>(p->numel())));
      for (std::size_t k = 0; k < kMoments.size(); ++k) f(kMoments[k], p->name(), opt.state(i, k));
    }
  }
  std::int32_t* targets() const noexcept { return tokens_ + batch_ * seq_; }

  // Page-locks the mirror's weights and optimizer state, so that to_host() copies at the link's
  // speed (2–3× pageable memory's). Where the system refuses (a locked-memory limit), the copies
  // stay pageable: slower, not wrong.
  void pin_mirror() {
    auto pin = [&](void* p, std::size_t bytes) {
      if (bytes == 0) return;
      if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess) pinned_ranges_.push_back(p);
      else (void)cudaGetLastError();  // clear the error: nothing else went wrong
    };
    auto values = host_.optimizer().flat().values();
    pin(values.data(), static_cast<std::size_t>(values.numel()) * sizeof(*values.data()));
    auto& opt = host_.optimizer().optimizer();
    for (std::size_t i = 0; i < opt.range_count(); ++i)
      for (std::size_t k = 0; k < kMoments.size(); ++k) pin(opt.state(i, k).data(), opt.state(i, k).size_bytes());
  }

  // Micro-batches in a batch of the global batch's shape.
  int micro_batches(const data::TokenBatch& batch) const {
    DPML_REQUIRE(batch.inputs.size(0) % batch_ == 0 && batch.inputs.size(1) == seq_,
                 "--device cuda: a batch of " << batch.inputs.size(0) << " x " << batch.inputs.size(1)
                                              << " tokens is not a whole number of micro-batches of " << batch_ << " x "
                                              << seq_);
    return static_cast<int>(batch.inputs.size(0) / batch_);
  }
  // Rows [mb·B, (mb + 1)·B) of the batch to the device.
  void upload(const data::TokenBatch& batch, int mb) {
    const std::size_t n = static_cast<std::size_t>(batch_ * seq_), first = static_cast<std::size_t>(mb) * n;
    // The previous micro-batch has synchronised (loss()), so the pinned buffer is free to overwrite.
    std::copy_n(batch.inputs.data() + first, n, pinned_);
    std::copy_n(batch.targets.data() + first, n, pinned_ + n);
    DPML_CHECK_CUDA(cudaMemcpyAsync(tokens_, pinned_, 2 * n * sizeof(std::int32_t), cudaMemcpyHostToDevice, model_.stream()));
  }

  // The message of a non-finite step: the step, the loss, the first non-finite gradient in model
  // order. Stops (an Error) or reports the skip, by --on-nonfinite.
  void report_nonfinite(double loss) {
    std::string name;
    for (const auto& n : model_.parameter_names()) {
      for (const float g : model_.gradient(n))
        if (!std::isfinite(g)) {
          name = n;
          break;
        }
      if (!name.empty()) break;
    }
    std::string what = "step " + std::to_string(step_) + ": non-finite ";
    what += std::isfinite(loss) ? "gradient" : "loss (" + std::to_string(loss) + ")";
    what += name.empty() ? "; every gradient is finite" : "; first non-finite gradient: '" + name + "'";
    DPML_REQUIRE_EVERYWHERE(host_.train_options().on_nonfinite != NonFinite::stop, what << " — stopping (--on-nonfinite stop)");
    std::printf("dpml: %s — skipping the step, no update (--on-nonfinite skip)\n", what.c_str());
  }

  HostTrainer& host_;
  DeviceOptions options_;
  Model model_;
  std::int64_t batch_, seq_;
  std::int32_t* pinned_ = nullptr;  // (2, B, T): inputs then targets
  std::int32_t* tokens_ = nullptr;  // device copy of the same
  std::int64_t step_ = 0, optimizer_step_ = 0;
  std::vector<void*> pinned_ranges_;  // host ranges registered with cudaHostRegister
};

}  // namespace dpml::train::cuda
