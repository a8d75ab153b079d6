// train_vit: trains a Vision Transformer (models::Vit) on Fashion-MNIST over the CPU ranks of an MPI
// launch or over GPUs (--device cuda), with data parallelism over what --tp leaves of the world and tensor parallelism (attention
// heads and MLP split, Megatron-LM) over --tp ranks, evaluating on the full 10k test set after
// every epoch.
//
//   mpiexec -n 2 build/cpu/examples/train_vit/train_vit --epochs 1
//   mpiexec -n 4 build/cpu/examples/train_vit/train_vit --tp 2 --patch-size 4 --hidden-size 128
//   scripts/launch.sh -n 2 build/cuda-openmpi/examples/train_vit/train_vit --device cuda --hidden-size 128
//
// The images (28×28) are cut into --patch-size patches (4: 49 tokens, 7: 16), embedded, given a
// class token and position embeddings, and run through --num-layers pre-LN blocks of bidirectional
// attention; the head reads the class token. The epochs are fashion_mnist's
// (examples/common/fashion_mnist_epochs.hpp): random crop with --crop-padding and horizontal flip
// drawn from Philox by --seed, so every layout sees the same images; AdamW with warm-up and cosine
// decay, trained by train::ClassifierTrainer. --device cuda (CUDA builds; gpu.cu) builds the same
// model on CudaSpace in bf16 with fp32 master weights and AdamW state, a GPU per rank over NCCL or
// ranks sharing GPUs over comm::Staged (--gpu-comm); its attention's head dim (--hidden-size /
// --num-attention-heads) must be 32, 64 or 128 there, so the default 64 / 4 is refused: take
// --hidden-size 128.
#include "train_vit.hpp"

#include <dpml/comm/launch.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/vit.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/parallel/tensor.hpp>
#include <dpml/train/args.hpp>
#include <dpml/train/classifier.hpp>
#include <dpml/train/flops.hpp>

#include <cstdio>
#include <string>

using namespace dpml;
using namespace train_vit;

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const comm::Mpi& world) {
    models::VitConfig vit{.image = 28, .channels = 1, .patch = 7, .dim = 64, .layers = 4, .heads = 4};
    examples::EpochOptions o{.epochs = 2, .global_batch = 128, .lr = 1e-3, .min_lr = 1e-5, .warmup = 100};
    int tp = 1;
    Training t;
    bool augment = true;
    std::string device = "cpu";
    train::Args args("train_vit", "Trains a Vision Transformer on Fashion-MNIST with data parallelism over the rest of\n"
                                  "the launch and tensor parallelism over --tp ranks, on CPU ranks or GPUs (--device cuda);\n"
                                  "prints test accuracy after every epoch.");
    args.flag("--device", device, "cpu (the ranks' cores, float) | cuda (a GPU per rank, bf16 with fp32 master weights)")
        .flag("--gpu-comm", t.gpu_comm, "--device cuda: auto | nccl (a GPU per rank) | staged (ranks sharing GPUs, through the host)")
        .flag("--patch-size", vit.patch, "side of the square patches: 1, 2, 4, 7, 14 or 28 (it divides 28)", train::between<std::int64_t>(1, 28))
        .flag("--hidden-size", vit.dim, "model width C", train::at_least(1))
        .flag("--num-layers", vit.layers, "transformer blocks", train::at_least(1))
        .flag("--num-attention-heads", vit.heads, "attention heads (dividing --hidden-size; divisible by --tp)", train::at_least(1))
        .flag("--ffn-hidden-size", vit.mlp_hidden, "MLP hidden width (0: 4 × --hidden-size)", train::at_least(0))
        .flag("--tp", tp, "tensor-parallel degree (data parallel over the rest of the world)", train::at_least(1))
        .flag("--epochs", o.epochs, "passes over the 60k training images", train::at_least(1))
        .flag("--global-batch", o.global_batch, "images per step over all data-parallel ranks", train::at_least(1))
        .flag("--micro-batches", t.micro_batches, "gradient-accumulation chunks of each rank's batch", train::at_least(1))
        .flag("--lr", o.lr, "peak learning rate (linear warm-up, then cosine decay to --min-lr)", train::at_least(0.0))
        .flag("--min-lr", o.min_lr, "final learning rate", train::at_least(0.0))
        .flag("--lr-warmup-iters", o.warmup, "warm-up steps", train::at_least(0))
        .flag("--weight-decay", t.weight_decay, "AdamW's decoupled weight decay", train::at_least(0.0))
        .flag("--clip-grad", t.clip, "global gradient-norm clipping (0: off)", train::at_least(0.0))
        .flag("--zero", t.zero, "ZeRO-1: shard optimizer state over the data-parallel ranks")
        .flag("--augment", augment, "random crop (padded by --crop-padding) and horizontal flip")
        .flag("--crop-padding", o.crop_padding, "pixels of zero padding around the image before the random 28×28 crop",
              train::between(0, 4))
        .flag("--data-dir", o.data_dir, "directory of the four Fashion-MNIST IDX files (gzipped or not)")
        .flag("--metrics", o.metrics, "JSON-lines metrics file (rank 0)")
        .flag("--tensorboard", o.tensorboard, "TensorBoard log directory: rank 0 writes this launch's scalars to a run directory in it")
        .flag("--log-interval", o.log_interval, "steps between progress lines", train::at_least(1))
        .flag("--seed", o.seed, "seed of initialisation, data order and augmentation");
    std::string profile_steps;
    examples::profile_steps_flag(args, profile_steps);
    if (!args.parse(argc, argv, world.rank())) return 0;
    o.profile = train::ProfileSteps::parse("--profile-steps", profile_steps);
    train::require_writable_output("--metrics", o.metrics);
    train::require_writable_directory("--tensorboard", o.tensorboard);
    DPML_REQUIRE_EVERYWHERE(device == "cpu" || device == "cuda", "--device " << device << " is not one of cpu, cuda");
    DPML_REQUIRE_EVERYWHERE(28 % vit.patch == 0, "--patch-size " << vit.patch << " does not divide the 28×28 image (1, 2, 4, 7, 14 or 28)");
    DPML_REQUIRE_EVERYWHERE(vit.dim % vit.heads == 0, "--hidden-size " << vit.dim << " is not divisible by --num-attention-heads "
                                                                       << vit.heads);
    const std::int64_t head_dim = vit.dim / vit.heads;
    DPML_REQUIRE_EVERYWHERE(device == "cpu" || head_dim == 32 || head_dim == 64 || head_dim == 128,
                            "--device cuda: the attention's head dim --hidden-size " << vit.dim << " / --num-attention-heads "
                                << vit.heads << " = " << head_dim << " is not 32, 64 or 128 (the GPU kernels')");
#ifndef DPML_WITH_CUDA
    DPML_REQUIRE_EVERYWHERE(device == "cpu", "--device cuda: this train_vit was built without CUDA (build it with the cuda preset)");
#endif
    if (!augment) o.crop_padding = 0;
    o.flip = augment;
    o.flops_per_image = train::training_flops(train::vit_forward_flops_per_image(vit));

    auto grid = ProcessGrid::create(world, {.tp = tp});
    if (world.rank() == 0)
      std::printf("dpml train_vit: %sworld %d = tp %d × dp %d | patch %lld (%lld tokens) | %lld layers, hidden %lld, %lld heads | "
                  "%lld parameters | global batch %lld | AdamW\n",
                  device == "cuda" ? "GPUs (bf16) " : "", grid.world_size(), grid.tp(), grid.dp(), static_cast<long long>(vit.patch),
                  static_cast<long long>(vit.tokens()), static_cast<long long>(vit.layers), static_cast<long long>(vit.dim),
                  static_cast<long long>(vit.heads), static_cast<long long>(vit.parameter_count()), static_cast<long long>(o.global_batch));
#ifdef DPML_WITH_CUDA
    if (device == "cuda") return train_on_gpus(world, grid, vit, o, t);
#endif
    const parallel::TensorRegion<comm::Mpi> region(&grid.comm(Axis::tensor));
    auto model = models::Vit<float>::make(vit, region);
    layers::initialize_all(model.parameters(), o.seed, &grid);
    return parallel::with_strategy(OneFOneB{}, t.zero, [&]<class Strategy>() {
      train::ClassifierTrainer<decltype(model), optim::AdamW, Strategy> trainer(
          model, grid, {.weight_decay = t.weight_decay}, {.clip = t.clip}, {.micro_batches = t.micro_batches, .seed = o.seed});
      return examples::train_epochs(o, grid, trainer);
    });
  });
}
