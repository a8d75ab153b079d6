#pragma once
// The epochs of an image classifier on Fashion-MNIST, shared by examples/fashion_mnist and
// examples/train_vit: each data rank's loader over its shard of every global batch (random crop
// with padding and horizontal flip drawn from Philox by the seed, so every layout sees the same
// images), warm-up + cosine learning rate, a progress line every --log-interval steps, the
// metrics sinks, the steps a profiler records (--profile-steps A:B: cudaProfilerStart/Stop, for
// Nsight or bench/timeline's CUPTI tracer), and the test accuracy on the full 10k test set after
// every epoch. Any trainer with ClassifierTrainer's train_step / evaluate / model(), on either space.

#include <dpml/data/image.hpp>
#include <dpml/data/loader.hpp>
#include <dpml/data/sampler.hpp>
#include <dpml/optim/schedule.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/train/args.hpp>
#include <dpml/train/profile_steps.hpp>
#include <dpml/train/progress.hpp>
#include <dpml/train/step_meter.hpp>
#include <dpml/train/tensorboard.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <type_traits>

namespace dpml::examples {

struct EpochOptions {
  std::string data_dir = data::kFashionMnistDir;
  std::int64_t epochs = 1, global_batch = 128;
  int crop_padding = 2;           // random crop of the image padded by this many pixels; 0: none
  bool flip = true;               // random horizontal flip
  double lr = 0.1, min_lr = 0.0;
  std::int64_t warmup = 100;
  std::int64_t log_interval = 50;
  std::uint64_t seed = 1;
  std::string metrics = "", tensorboard = "";
  double flops_per_image = 0;     // a training step's model FLOPs per image (train/flops.hpp)
  train::ProfileSteps profile;    // --profile-steps A:B (none by default)
};

// --profile-steps A:B, parsed into `text` (checked at parse time, naming the flag).
inline void profile_steps_flag(train::Args& args, std::string& text) {
  args.flag("--profile-steps", text, "A:B: a profiler records steps A to B (cudaProfilerStart/Stop; nsys --capture-range=cudaProfilerApi)",
            [](const std::string& v) { (void)train::ProfileSteps::parse("--profile-steps", v); });
}

// own_gpus: a GPU per rank (MFU against their peak, their power: train/step_meter.hpp).
template <class Trainer>
int train_epochs(const EpochOptions& o, const ProcessGrid& grid, Trainer& trainer, bool own_gpus = false) {
  const int rank = grid.world_rank(), dp = grid.dp(), dp_rank = grid.coord(Axis::data);
  const auto train_set = data::fashion_mnist(data::Split::train, o.data_dir);
  const auto test_set = data::fashion_mnist(data::Split::test, o.data_dir);
  data::Loader train_loader(train_set, data::DistributedSampler(train_set.size(), {.global_batch = o.global_batch, .seed = o.seed}, dp_rank, dp),
                            {.mean = data::kFashionMnistMean, .std = data::kFashionMnistStd, .pad = o.crop_padding,
                             .flip = o.flip, .seed = o.seed});
  data::Loader test_loader(test_set, data::DistributedSampler(test_set.size(), {.global_batch = 1000, .shuffle = false, .drop_last = false}, dp_rank, dp),
                           {.mean = data::kFashionMnistMean, .std = data::kFashionMnistStd});

  const std::int64_t steps_per_epoch = train_loader.batches_per_epoch(), total = steps_per_epoch * o.epochs;
  const optim::WarmupCosineLR schedule{.max_lr = o.lr, .min_lr = o.min_lr, .warmup_steps = std::min(o.warmup, total - 1),
                                       .decay_steps = total};
  train::Progress progress(total, rank, "img/s");
  train::MetricsLog metrics(o.metrics, o.tensorboard, rank);
  train::StepMeter<typename std::remove_reference_t<decltype(trainer.model())>::space> meter(grid.world(), own_gpus);  // collective
  std::int64_t step = 0;
  double accuracy = 0;
  for (std::int64_t epoch = 0; epoch < o.epochs; ++epoch) {
    train_loader.start_epoch(epoch);
    double loss_sum = 0;
    std::int64_t seen = 0;
    while (const data::Batch* batch = train_loader.next()) {
      ++step;
      const double lr = schedule(step);
      o.profile.before(step);
      const auto r = trainer.train_step(*batch, lr);
      o.profile.after(step);
      loss_sum += r.loss;
      ++seen;
      const double images = static_cast<double>(batch->global_size), ips = images / r.seconds;
      const auto hw = meter.lap(o.flops_per_image * images, r.seconds);  // collective: every rank, every step
      metrics.write(step, {{"epoch", double(epoch)}, {"loss", r.loss}, {"train_acc", r.accuracy},
                           {"lr", lr}, {"img_per_s", ips}, {"grad_norm", r.grad_norm}, {"exposed_comm_s", r.exposed_comm_seconds},
                           {"wire_bytes", double(r.wire_bytes)}, {"dense_bytes", double(r.dense_bytes)}},
                    hw.metrics("energy_j_per_image", images));
      if (step % o.log_interval == 0 || step == 1) {
        // A named list: nvcc's front end mangles this braced list written in the call.
        // Gradient megabytes this rank sent (NaN, not shown, on one data rank).
        const double wire_mb = r.dense_bytes > 0 ? double(r.wire_bytes) / 1e6 : std::nan("");
        const std::initializer_list<train::Metric> extra = {{"epoch", double(epoch + 1)}, {"train-acc", r.accuracy}, {"lr", lr},
                                                            {"mfu%", 100 * hw.mfu}, {"mem GiB", hw.peak_memory_gib},
                                                            {"W", hw.power.watts}, {"wire MB", wire_mb}};
        progress.print(step, loss_sum / static_cast<double>(seen), ips, extra);
      }
    }
    accuracy = trainer.evaluate(test_loader);
    // At the epoch's last step in TensorBoard; its JSON line has never named a step.
    metrics.write(step, {{"epoch", double(epoch + 1)}, {"test_accuracy", accuracy}, {"elapsed_s", progress.elapsed()}},
                  train::JsonStep::omitted);
    if (rank == 0)
      std::printf("epoch %lld/%lld: train loss %.4f | test accuracy %.2f%% (10000 images) | %s elapsed\n",
                  static_cast<long long>(epoch + 1), static_cast<long long>(o.epochs), loss_sum / static_cast<double>(seen),
                  100.0 * accuracy, train::format_duration(progress.elapsed()).c_str());
  }
  if (rank == 0)
    std::printf("final test accuracy %.2f%% after %lld epochs, %s on %d ranks\n", 100.0 * accuracy,
                static_cast<long long>(o.epochs), train::format_duration(progress.elapsed()).c_str(), grid.world_size());
  return 0;
}

}  // namespace dpml::examples
