// resnet_train: ResNet-50 training throughput on one GPU, or data parallel on several
// (models/cuda/resnet.hpp): bf16 NHWC activations and weights with fp32 master weights and
// gradients, SGD (momentum 0.9, weight decay 1e-4) — the setup of bench/reference/torch_resnet.py
// (PyTorch eager, channels_last, bf16 autocast; DDP under torchrun), so the two print comparable
// JSON lines. Synthetic data: one batch of random images and labels per rank, uploaded once and
// reused (as the reference does), so the input pipeline is not measured.
//
//   img/s      K · B · timed steps / wall time of the slowest rank's timed steps (each step ends
//              with the loss copied to the host, as a training loop that prints it does)
//   TFLOP/s    3 × forward FLOPs (convolutions and classifier, 2 per multiply-add) × img/s, per GPU
//   memory     device memory this process took (cudaMemGetInfo before the model and after the run)
//   ranks      K: under scripts/launch.sh -n K (mpirun/srun), one GPU per rank, each on its own
//              batch of B images (seeded by its rank), the gradients averaged by
//              parallel/cuda/gradient_sync.hpp in fp32 while the backward runs (--bucket-mb);
//              exposed_comm_ms: how long the last timed step's compute stream waited for its
//              all-reduces (the slowest rank; 0 on one rank). Only rank 0 prints.
//   sync_bn    --sync-bn: BatchNorm statistics synchronised over the ranks (PyTorch's
//              SyncBatchNorm; the reference's --sync-bn): two all-reduces of 2C floats per
//              BatchNorm and step on the compute stream, timed within the batch_norm family. Also
//              on one rank, where it measures the cost of the split passes (PyTorch falls back to
//              plain BatchNorm there).
//   families   one extra step with CUDA events around each kernel family
#include "../support/train_timing.cuh"

#include <dpml/comm/launch.hpp>
#include <dpml/comm/local_rank.hpp>
#include <dpml/comm/nccl.hpp>
#include <dpml/core/cuda_error.hpp>
#include <dpml/core/cuda_space.hpp>
#include <dpml/models/cuda/resnet.hpp>
#include <dpml/parallel/cuda/gradient_sync.hpp>
#include <dpml/train/args.hpp>
#ifndef DPML_HAS_CUDNN
#define DPML_HAS_CUDNN 0
#endif
#if DPML_HAS_CUDNN
#include <dpml/kernels/cuda/conv/cudnn.hpp>
#endif

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace dpml;

namespace {

struct Options {
  models::cuda::ResNetCudaConfig model;
  std::int64_t batch = 256, image = 224;
  int warmup = 10, steps = 30;
  double lr = 0.1;
  optim::SgdOptions sgd{.momentum = 0.9, .weight_decay = 1e-4};
  std::string conv = DPML_HAS_CUDNN ? "cudnn" : "own";
  double bucket_mb = 25;  // data parallel: gradient all-reduce bucket (PyTorch DDP's default)
  bool sync_bn = false;   // BatchNorm statistics over all ranks' batches
};

// Flags, parsed by train::Args (--help lists them with their defaults, printed by rank 0); false
// after --help. Every rank parses the same argv, so a bad flag is an Error on every rank alike.
bool parse(int argc, char** argv, Options& o, int rank) {
  std::string blocks = "3,4,6,3";
  train::Args args("resnet_train", "ResNet training throughput on one GPU, or data parallel with one GPU per rank "
                                   "under scripts/launch.sh -n K (bench/RESULTS.md); prints JSON lines "
                                   "(bench resnet_train, resnet_train_family) and a table.");
  args.flag("--batch", o.batch, "images per step")
      .flag("--image", o.image, "image side in pixels")
      .flag("--classes", o.model.classes, "classifier outputs")
      .flag("--width", o.model.width, "stem channels and stage 1's bottleneck width")
      .flag("--blocks", blocks, "bottleneck blocks per stage (3,4,6,3: ResNet-50)")
      .flag("--warmup", o.warmup, "untimed steps first")
      .flag("--steps", o.steps, "timed steps")
      .flag("--lr", o.lr, "SGD learning rate")
      .flag("--momentum", o.sgd.momentum, "SGD momentum")
      .flag("--weight-decay", o.sgd.weight_decay, "SGD L2 weight decay")
      .flag("--conv", o.conv, DPML_HAS_CUDNN ? "convolutions: own (dpml's implicit GEMM) | cudnn"
                                             : "convolutions: own (dpml's implicit GEMM; built without cuDNN)")
      .flag("--bucket-mb", o.bucket_mb, "data parallel (several ranks): MB of fp32 gradients per all-reduce bucket")
      .flag("--sync-bn", o.sync_bn, "synchronised BatchNorm: statistics of all ranks' batches (SyncBatchNorm)");
  if (!args.parse(argc, argv, rank)) return false;
  std::istringstream in(blocks);
  std::string part;
  int k = 0;
  while (std::getline(in, part, ',')) {
    DPML_REQUIRE_EVERYWHERE(k < 4 && !part.empty() && part.find_first_not_of("0123456789") == std::string::npos,
                            "resnet_train: --blocks " << blocks << " is not four counts like 3,4,6,3");
    o.model.blocks[static_cast<std::size_t>(k++)] = std::stoll(part);
  }
  DPML_REQUIRE_EVERYWHERE(k == 4, "resnet_train: --blocks " << blocks << " is not four counts like 3,4,6,3");
  DPML_REQUIRE_EVERYWHERE(o.batch > 1 && o.image > 0 && o.steps > 0 && o.warmup >= 0,
                          "resnet_train: --batch must be > 1, --image and --steps positive, --warmup non-negative");
  DPML_REQUIRE_EVERYWHERE(o.conv == "own" || (o.conv == "cudnn" && DPML_HAS_CUDNN),
                          "resnet_train: --conv " << o.conv << " is not own"
                                                  << (DPML_HAS_CUDNN ? " or cudnn" : " (built without cuDNN)"));
  DPML_REQUIRE_EVERYWHERE(o.bucket_mb > 0, "resnet_train: --bucket-mb " << o.bucket_mb << " must be positive");
  return true;
}

}  // namespace

// The bench on this rank's GPU (comm::select_device made it current); only rank 0 prints.
template <class Conv>
int run(const Options& o, const comm::Mpi& world) {
  const int ranks = world.size();
  int device = 0;
  DPML_CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  DPML_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  std::size_t free0 = 0, total = 0, free1 = 0;
  DPML_CHECK_CUDA(cudaMemGetInfo(&free0, &total));
  models::cuda::ResNet<Conv> model(o.model, o.batch, o.image);
  model.init_random(1337);  // the same on every rank
  std::unique_ptr<parallel::cuda::GradientSync<float>> sync;  // data parallel (several ranks)
  if (ranks > 1) {
    const parallel::cuda::GradientSyncOptions opt{.bucket_bytes = static_cast<std::size_t>(o.bucket_mb * (1 << 20))};
    sync = std::make_unique<parallel::cuda::GradientSync<float>>(
        comm::Nccl::from(world), model.gradients(), static_cast<std::size_t>(model.flat_size()), model.stream(), opt);
    model.set_gradient_sync(sync.get());
  }
  std::unique_ptr<comm::Nccl> bn_comm;  // --sync-bn: the BatchNorm sums' all-reduces, on the model's stream
  if (o.sync_bn) {
    bn_comm = std::make_unique<comm::Nccl>(comm::Nccl::from(world, model.stream()));
    model.set_batch_norm_sync(bn_comm.get());
  }
  {
    const std::int64_t C = o.model.in_channels;
    std::vector<float> images(static_cast<std::size_t>(o.batch * C * o.image * o.image));
    std::vector<std::int32_t> labels(static_cast<std::size_t>(o.batch));
    std::mt19937_64 gen(7 + static_cast<std::uint64_t>(world.rank()));  // each rank its own batch
    std::normal_distribution<float> normal;
    for (auto& v : images) v = normal(gen);
    for (auto& l : labels) l = static_cast<std::int32_t>(gen() % static_cast<std::uint64_t>(o.model.classes));
    model.upload_batch(images, labels);
  }
  std::vector<double> losses;
  auto train_step = [&] {
    model.forward_backward();
    model.update(o.lr, o.sgd);
    losses.push_back(model.loss());  // synchronises: the step is done
  };
  for (int i = 0; i < o.warmup; ++i) train_step();
  if (ranks > 1) world.barrier();  // the ranks start the timed steps together
  const double ms_step =
      world.allreduce(dpml::bench::ms_per_step(o.steps, model.stream(), train_step), comm::ReduceOp::max);
  const double exposed_ms = world.allreduce(sync ? sync->exposed_ms() : 0.0, comm::ReduceOp::max);
  const auto family_ms = dpml::bench::family_ms<models::cuda::CnnProfiler>(model, train_step);
  DPML_CHECK_CUDA(cudaDeviceSynchronize());
  DPML_CHECK_CUDA(cudaMemGetInfo(&free1, &total));
  bool finite = true;
  for (double l : losses) finite = finite && std::isfinite(l);
  finite = world.allreduce(finite ? 1 : 0, comm::ReduceOp::min) == 1;  // every rank's losses
  if (world.rank() != 0) return finite ? 0 : 1;

  const double img_s = static_cast<double>(o.batch * ranks) / (ms_step * 1e-3);
  const double tflops = 3.0 * model.forward_flops_per_image() * img_s / ranks / 1e12;  // per GPU
  const double mem_gib = static_cast<double>(free0 - free1) / (1 << 30);
  const std::string name =
      "dpml-" + o.conv + (ranks > 1 ? "-dp" + std::to_string(ranks) : "") + (o.sync_bn ? "-syncbn" : "");
  const char* impl = name.c_str();
  const std::string on = ranks > 1 ? std::to_string(ranks) + " × " + prop.name : std::string(prop.name);
  std::printf("{\"bench\":\"resnet_train\",\"impl\":\"%s\",\"device\":\"%s\",\"batch\":%lld,\"image\":%lld,"
              "\"width\":%lld,\"blocks\":[%lld,%lld,%lld,%lld],\"classes\":%lld,\"params\":%lld,\"steps\":%d,"
              "\"warmup\":%d,\"ms_per_step\":%.3f,\"img_per_s\":%.1f,\"model_tflops\":%.2f,\"mem_gib\":%.3f,"
              "\"model_buffers_gib\":%.3f,\"loss_first\":%.4f,\"loss_last\":%.4f,\"finite\":%s,"
              "\"ranks\":%d,\"bucket_mb\":%.1f,\"exposed_comm_ms\":%.3f,\"sync_bn\":%s}\n",
              impl, prop.name, static_cast<long long>(o.batch), static_cast<long long>(o.image),
              static_cast<long long>(o.model.width), static_cast<long long>(o.model.blocks[0]),
              static_cast<long long>(o.model.blocks[1]), static_cast<long long>(o.model.blocks[2]),
              static_cast<long long>(o.model.blocks[3]), static_cast<long long>(o.model.classes),
              static_cast<long long>(model.parameter_count()), o.steps, o.warmup, ms_step, img_s, tflops, mem_gib,
              static_cast<double>(model.device_bytes()) / (1 << 30), losses.front(), losses.back(),
              finite ? "true" : "false", ranks, o.bucket_mb, exposed_ms, o.sync_bn ? "true" : "false");
  dpml::bench::print_families("resnet_train_family", impl, family_ms, models::cuda::kCnnFamilyNames);
  std::printf("\nResNet (width %lld, blocks %lld,%lld,%lld,%lld) B=%lld %lldpx on %s, bf16 + fp32 master, SGD, %s\n",
              static_cast<long long>(o.model.width), static_cast<long long>(o.model.blocks[0]),
              static_cast<long long>(o.model.blocks[1]), static_cast<long long>(o.model.blocks[2]),
              static_cast<long long>(o.model.blocks[3]), static_cast<long long>(o.batch),
              static_cast<long long>(o.image), on.c_str(), impl);
  std::printf("| img/s | ms/step | model TFLOP/s | memory GiB | loss first → last |\n|---|---|---|---|---|\n");
  std::printf("| %.0f | %.2f | %.1f | %.2f | %.3f → %.3f |\n\n", img_s, ms_step, tflops, mem_gib, losses.front(),
              losses.back());
  if (ranks > 1)
    std::printf("Data parallel: %d ranks of B=%lld, fp32 gradients in %.1f MB buckets; the last step waited %.2f ms "
                "for its all-reduces; BatchNorm statistics %s; TFLOP/s and memory per GPU, losses rank 0's.\n\n",
                ranks, static_cast<long long>(o.batch), o.bucket_mb, exposed_ms,
                o.sync_bn ? "synchronised over the ranks" : "per rank");
  dpml::bench::print_family_table(family_ms, models::cuda::kCnnFamilyNames);
  if (!finite) {
    std::fprintf(stderr, "resnet_train: a loss was not finite\n");
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const comm::Mpi& world) {
    Options o;
    if (!parse(argc, argv, o, world.rank())) return 0;
    DPML_REQUIRE_EVERYWHERE(world.allreduce(cuda_device_count() > 0 ? 1 : 0, comm::ReduceOp::min) == 1,
                            "resnet_train: no CUDA device" << (world.size() > 1 ? " on some rank" : ""));
    comm::select_device(world);  // before any CUDA allocation
#if DPML_HAS_CUDNN
    if (o.conv == "cudnn") return run<kernels::cuda::CudnnConv>(o, world);
#endif
    return run<kernels::cuda::ImplicitGemmConv<>>(o, world);
  });
}
