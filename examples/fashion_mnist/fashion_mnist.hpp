// What fashion_mnist's translation units share: its flags, the epochs of training and
// evaluation (examples/common/fashion_mnist_epochs.hpp) and the choice of strategy and optimizer
// — for the CPU trainers (main.cpp) and the GPU ones (gpu.cu, a CUDA unit of its own, so that the
// host program compiles as plain C++ beside it).
#pragma once

#include "fashion_mnist_epochs.hpp"

#include <dpml/comm/mpi.hpp>
#include <dpml/core/error.hpp>
#include <dpml/data/image.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/optim/sgd.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/classifier.hpp>
#include <dpml/train/data_axis_flags.hpp>
#include <dpml/train/flops.hpp>

#include <cstdint>
#include <string>

namespace fashion_mnist {
using namespace dpml;

struct Flags {
  std::string model = "resnet";
  std::string profile_steps;  // --profile-steps A:B
  std::int64_t width = 16, blocks = 1, hidden = 256, depth = 2;
  std::int64_t epochs = 6, global_batch = 128;
  int micro_batches = 1;
  std::string optimizer = "sgd";
  double lr = 0.1, min_lr = 0.0, momentum = 0.9, weight_decay = 5e-4, clip = 0.0;
  std::int64_t warmup = 100;
  bool nesterov = true, sync_bn = false, zero = false, augment = true;
  train::DataAxisFlags axis;  // --dp-allreduce, --ranks-per-node, --grad-compression and its sizes
  std::string data_dir = data::kFashionMnistDir;
  std::string metrics = "", tensorboard = "";
  std::int64_t log_interval = 50;
  std::uint64_t seed = 1;
  std::string device = "cpu";
  std::string gpu_comm = "auto";
};

// Model FLOPs of one training image (train/flops.hpp: counted conv by conv, 3 × the forward).
inline double training_flops_per_image(const Flags& f) {
  const double forward = f.model == "mlp" ? train::mlp_forward_flops_per_sample({.hidden = f.hidden, .depth = f.depth})
                                          : train::resnet_forward_flops_per_image({.width = f.width, .blocks_per_stage = f.blocks}, 28, 28);
  return train::training_flops(forward);
}

// The epochs of training and evaluation (examples/common/fashion_mnist_epochs.hpp), on either space.
template <class Trainer>
int run_epochs(const Flags& f, const ProcessGrid& grid, Trainer& trainer, bool own_gpus = false) {
  return examples::train_epochs({.data_dir = f.data_dir, .epochs = f.epochs, .global_batch = f.global_batch,
                                 .crop_padding = f.augment ? 2 : 0, .flip = f.augment, .lr = f.lr, .min_lr = f.min_lr,
                                 .warmup = f.warmup, .log_interval = f.log_interval, .seed = f.seed, .metrics = f.metrics,
                                 .tensorboard = f.tensorboard, .flops_per_image = training_flops_per_image(f),
                                 .profile = train::ProfileSteps::parse("--profile-steps", f.profile_steps)},
                                grid, trainer, own_gpus);
}

// body.template operator()<Strategy, Rule>(rule options) for --zero, --dp-allreduce, --optimizer
// and (host buckets only: Compressed) --grad-compression.
template <bool Compressed = false, class Body>
int with_optimizer(const Flags& f, Body&& body) {
  const auto pick = [&]<class Strategy>() {
    if (f.optimizer == "sgd")
      return body.template operator()<Strategy, optim::Sgd>(
          optim::SgdOptions{.momentum = f.momentum, .weight_decay = f.weight_decay, .nesterov = f.nesterov});
    DPML_REQUIRE_EVERYWHERE(f.optimizer == "adamw", "--optimizer " << f.optimizer << " is not one of sgd, adamw");
    return body.template operator()<Strategy, optim::AdamW>(optim::AdamWOptions{.weight_decay = f.weight_decay});
  };
  if constexpr (Compressed) return parallel::with_strategy(OneFOneB{}, f.zero, f.axis.dp_allreduce, f.axis.grad_compression, pick);
  else return parallel::with_strategy(OneFOneB{}, f.zero, f.axis.dp_allreduce, pick);
}

inline parallel::DistributedOptimizerOptions dist_of(const Flags& f) {
  return {.clip = f.clip, .compression = f.axis.compression(f.seed)};
}

inline train::ClassifierOptions options_of(const Flags& f) { return {.micro_batches = f.micro_batches, .seed = f.seed}; }

#ifdef DPML_WITH_CUDA
// --device cuda (gpu.cu): the ranks placed on GPUs (--gpu-comm), the model on each rank's GPU in
// bf16 and trained there. Collective.
int train_on_gpus(const Flags& f, const comm::Mpi& world, const ProcessGrid& grid);
#endif
}  // namespace fashion_mnist
