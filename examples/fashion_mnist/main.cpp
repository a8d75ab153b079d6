// fashion_mnist: trains a ResNet-style CNN (or an MLP) on Fashion-MNIST with data parallelism over
// the CPU ranks of an MPI launch or over GPUs (--device cuda), evaluating on the full 10k test set
// after every epoch.
//
//   mpiexec -n 4 build/cpu/examples/fashion_mnist/fashion_mnist --epochs 3
//   mpiexec -n 2 build/cuda/examples/fashion_mnist/fashion_mnist --device cuda --sync-bn
//
// Every rank reads its shard of each global batch; gradients are reduced in buckets while
// backward runs; the result equals one process training on the same global batches. The trainer
// is train::ClassifierTrainer (train::Trainer with softmax cross-entropy and accuracy); --zero picks
// the strategy type DataParallel<Zero1>, --dp-allreduce hierarchical DataParallel<…, Hierarchical>
// (inside each node, across nodes, inside each node; nodes of --ranks-per-node ranks, or hosts);
// --grad-compression bf16 | fp16 | powersgd | topk the buckets' compression (DataParallel<…,
// WirePrecision<bf16>>, …: parallel/compression/policy.hpp; CPU ranks only), --powersgd-rank and
// --topk-ratio its sizes; the progress line shows the gradient megabytes each rank sent per step.
//
// --device cuda (CUDA builds): the same models (models::ResNet, models::Mlp) built on CudaSpace in
// bf16 — the GPU convolutions are bf16 kernels; the MLP follows for one precision per run — with
// fp32 master weights and optimizer state, trained by the same ClassifierTrainer: each rank on its
// own GPU over NCCL, or, where a node has fewer GPUs than ranks (or --gpu-comm staged), its ranks
// share them round robin and talk through comm::Staged (comm/cuda_placement.hpp). The loader's
// images are converted to bf16 NHWC on the host and uploaded once per step; evaluation runs on
// the GPU too. --sync-bn synchronises BatchNorm over the data axis through a communicator on the
// model's stream.
//
// --metrics FILE.jsonl and --tensorboard DIR (a run directory per launch in it): rank 0 records
// every step (loss, accuracy, img/s, MFU against the GPUs' bf16 peak, memory, GPU power and energy
// per image where NVML meters them) and each epoch's test accuracy (train/progress.hpp).
#include "fashion_mnist.hpp"

#include <dpml/comm/launch.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/mlp.hpp>
#include <dpml/models/resnet.hpp>
#include <dpml/train/args.hpp>

#include <cstdio>

using namespace dpml;
using namespace fashion_mnist;

namespace {
template <class Model>
int train_on_host(const Flags& f, const ProcessGrid& grid, Model& model) {
  return with_optimizer<true>(f, [&]<class Strategy, class Rule>(typename Rule::Options rule) {
    train::ClassifierTrainer<Model, Rule, Strategy> trainer(model, grid, rule, dist_of(f), options_of(f));
    return run_epochs(f, grid, trainer);
  });
}
}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const comm::Mpi& world) {
    Flags f;
    train::Args args("fashion_mnist", "Trains a ResNet-style CNN (or an MLP) on Fashion-MNIST with data parallelism over\n"
                                      "all ranks of the launch, on CPU ranks or GPUs (--device cuda); prints test accuracy\n"
                                      "after every epoch.");
    args.flag("--device", f.device, "cpu (the ranks' cores, float) | cuda (a GPU per rank, bf16 with fp32 master weights)")
        .flag("--gpu-comm", f.gpu_comm, "--device cuda: auto | nccl (a GPU per rank) | staged (ranks sharing GPUs, through the host)")
        .flag("--model", f.model, "resnet | mlp")
        .flag("--width", f.width, "ResNet: channels of the first stage (then 2w, 4w)", train::at_least(1))
        .flag("--blocks", f.blocks, "ResNet: basic blocks per stage", train::at_least(1))
        .flag("--hidden", f.hidden, "MLP: hidden width", train::at_least(1))
        .flag("--depth", f.depth, "MLP: hidden layers", train::at_least(1))
        .flag("--epochs", f.epochs, "passes over the 60k training images", train::at_least(1))
        .flag("--global-batch", f.global_batch, "images per step over all ranks", train::at_least(1))
        .flag("--micro-batches", f.micro_batches, "gradient-accumulation chunks of each rank's batch", train::at_least(1))
        .flag("--optimizer", f.optimizer, "sgd | adamw")
        .flag("--lr", f.lr, "peak learning rate (linear warm-up, then cosine decay to --min-lr)", train::at_least(0.0))
        .flag("--min-lr", f.min_lr, "final learning rate", train::at_least(0.0))
        .flag("--lr-warmup-iters", f.warmup, "warm-up steps", train::at_least(0))
        .flag("--momentum", f.momentum, "SGD momentum", train::half_open(0.0, 1.0))
        .flag("--nesterov", f.nesterov, "SGD Nesterov momentum")
        .flag("--weight-decay", f.weight_decay, "weight decay (L2 for SGD, decoupled for AdamW)", train::at_least(0.0))
        .flag("--clip-grad", f.clip, "global gradient-norm clipping (0: off)", train::at_least(0.0))
        .flag("--sync-bn", f.sync_bn, "batch-norm statistics over the whole data-parallel batch")
        .flag("--zero", f.zero, "ZeRO-1: shard optimizer state over the ranks")
        .flag("--augment", f.augment, "random crop (pad 2) and horizontal flip")
        .flag("--data-dir", f.data_dir, "directory of the four Fashion-MNIST IDX files (gzipped or not)")
        .flag("--metrics", f.metrics, "JSON-lines metrics file (rank 0)")
        .flag("--tensorboard", f.tensorboard, "TensorBoard log directory: rank 0 writes this launch's scalars to a run directory in it")
        .flag("--log-interval", f.log_interval, "steps between progress lines", train::at_least(1))
        .flag("--seed", f.seed, "seed of initialisation, data order and augmentation");
    examples::profile_steps_flag(args, f.profile_steps);
    train::data_axis_flags(args, f.axis);
    if (!args.parse(argc, argv, world.rank())) return 0;
    train::require_writable_output("--metrics", f.metrics);
    train::require_writable_directory("--tensorboard", f.tensorboard);
    DPML_REQUIRE_EVERYWHERE(f.device == "cpu" || f.device == "cuda", "--device " << f.device << " is not one of cpu, cuda");
    DPML_REQUIRE_EVERYWHERE(f.model == "resnet" || f.model == "mlp", "--model " << f.model << " is not one of resnet, mlp");
    f.axis.require_device(f.device);
#ifndef DPML_WITH_CUDA
    DPML_REQUIRE_EVERYWHERE(f.device == "cpu", "--device cuda: this fashion_mnist was built without CUDA (build it with the cuda preset)");
#endif
    auto grid = ProcessGrid::create(world, {.ranks_per_node = f.axis.ranks_per_node});
    if (world.rank() == 0)
      std::printf("dpml fashion_mnist: %d data-parallel ranks%s%s | model %s | global batch %lld | %s\n", grid.dp(),
                  f.device == "cpu" ? "" : " on GPUs (bf16)",
                  f.axis.describe(", ").c_str(),
                  f.model.c_str(), static_cast<long long>(f.global_batch),
                  f.optimizer.c_str());
#ifdef DPML_WITH_CUDA
    if (f.device == "cuda") return train_on_gpus(f, world, grid);
#endif
    if (f.model == "mlp") {
      auto model = models::Mlp<float>::make({.hidden = f.hidden, .depth = f.depth});
      layers::initialize_all(model.parameters(), f.seed, &grid);
      return train_on_host(f, grid, model);
    }
    auto model = models::ResNet<float>::make({.width = f.width, .blocks_per_stage = f.blocks, .sync_batch_norm = f.sync_bn});
    layers::initialize_all(model.parameters(), f.seed, &grid);
    return train_on_host(f, grid, model);
  });
}
