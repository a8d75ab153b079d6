// What train_lstm's host unit (main.cpp) and its CUDA unit (gpu.cu) share: the flags, the
// validation loss, and the training loop with its progress line and metrics — written once for
// the CPU and the GPU trainer.
#pragma once

#include <dpml/comm/mpi.hpp>
#include <dpml/data/text.hpp>
#include <dpml/data/token_shards.hpp>
#include <dpml/models/lstm_lm.hpp>
#include <dpml/optim/schedule.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/train/progress.hpp>
#include <dpml/train/tensorboard.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace train_lstm {
using namespace dpml;

struct Flags {
  int pp = 1, virtual_stages = 1;
  std::string schedule = "1f1b";
  bool zero = false;
  std::int64_t micro_batch = 8, global_batch = 32;
  std::int64_t layers = 2, hidden = 256, seq = 64;
  double forget_bias = 1.0;
  std::int64_t iters = 300, warmup = -1, eval_interval = 100, eval_iters = 8, log_interval = 20;  // warmup -1: iters / 10
  double lr = 3e-3, min_lr = 3e-4, weight_decay = 0.0, clip = 1.0;
  std::uint64_t seed = 1234;
  std::string data = data::kFortunesPath;
  std::string metrics, tensorboard;
  std::string device = "cpu";
  std::string gpu_comm = "auto";
};

// Mean loss per byte over `batches` global batches of the validation windows (wrapping around).
template <class Trainer>
double validation_loss(Trainer& trainer, const data::TokenWindows& val, std::int64_t batches) {
  double sum = 0;
  for (std::int64_t i = 0; i < batches; ++i) sum += trainer.evaluate(val.batch(i % val.batches_per_epoch()));
  return sum / static_cast<double>(batches);
}

template <class Trainer>
int train_and_validate(Trainer& trainer, const Flags& f, const comm::Mpi& world, data::LmWindows& lm) {
  const optim::WarmupCosineLR lr{.max_lr = f.lr, .min_lr = f.min_lr, .warmup_steps = f.warmup, .decay_steps = f.iters};
  train::Progress progress(f.iters, world.rank(), "tok/s");
  train::MetricsLog metrics(f.metrics, f.tensorboard, world.rank());
  const double tokens_per_step = static_cast<double>(f.global_batch * f.seq);
  std::int64_t epoch = 0, b = 0;
  lm.train.set_epoch(epoch);
  double val = NAN;
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t step = 1; step <= f.iters; ++step) {
    if (b == lm.train.batches_per_epoch()) lm.train.set_epoch(++epoch), b = 0;
    const double rate = lr(step);
    const auto r = trainer.train_step(lm.train.batch(b++), rate);
    if (step % f.eval_interval == 0 || step == f.iters) val = validation_loss(trainer, lm.validation, f.eval_iters);
    metrics.write(step, {{"loss", r.loss}, {"val_loss", val}, {"lr", rate}, {"grad_norm", r.grad_norm},
                         {"tokens_per_s", tokens_per_step / r.seconds}, {"pipeline_wait_s", r.pipeline.wait},
                         {"elapsed_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}});
    if (step % f.log_interval == 0 || step == 1 || step == f.iters)
      progress.print(step, r.loss, tokens_per_step / r.seconds,
                     {{"val", val}, {"val bpc", val / std::log(2.0)}, {"lr", rate}, {"gnorm", r.grad_norm}});
  }
  if (world.rank() == 0)
    std::printf("final validation loss %.3f nats (%.3f bits/char) vs unigram entropy %.3f nats (%.3f bits) | trained in %s\n", val,
                val / std::log(2.0), lm.unigram_entropy, lm.unigram_entropy / std::log(2.0),
                train::format_duration(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()).c_str());
  return 0;
}

#ifdef DPML_WITH_CUDA
// --device cuda (gpu.cu): the ranks placed on GPUs (--gpu-comm), models::LstmLm on each rank's
// GPU in bf16 (fp32 master weights and AdamW state), trained over the grid's device
// communicators by the same trainer, schedules and loop. Collective.
int train_on_gpus(const comm::Mpi& world, const ProcessGrid& grid, const models::LstmLmConfig& config, const Flags& f,
                  data::LmWindows& lm, int micro_batches);
#endif
}  // namespace train_lstm
