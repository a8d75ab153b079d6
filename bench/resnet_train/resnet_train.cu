// resnet_train: ResNet-50 training throughput on one GPU, or data parallel on several:
// models::BottleneckResNet<bf16, CudaSpace>, the library's layers and ResNetBlock (bf16 NHWC),
// softmax cross-entropy with dlogits in place, SGD through parallel::DistributedOptimizer over a
// DeviceGrid (flat bf16 parameters and gradients, fp32 master weights and momentum; data parallel
// over the ranks: buckets reduced while the backward runs) — the minimal training loop of a library
// user. (Until Step 8 this program also ran the hand-fused GPU ResNet, --model fused; the last
// measurements of both are in bench/RESULTS.md.)
//
// SGD (momentum 0.9, weight decay 1e-4) — the setup of bench/reference/torch_resnet.py (PyTorch
// eager, channels_last, bf16 autocast; DDP under torchrun), so the two print comparable JSON
// lines. Synthetic data: one batch of random images and labels per rank, uploaded once (NHWC,
// kernels::to_layout) and reused (as the reference does), so the input pipeline is not measured.
// The input's channels are padded with zeros to a multiple of 8 (16-byte vector loads in the stem;
// the stem's weights on those channels see only zeros, so the function is the 3-channel one; the
// parameter count includes them).
//
//   img/s      K · B · timed steps / wall time of the slowest rank's timed steps (each step ends
//              with the loss copied to the host, as a training loop that prints it does)
//   TFLOP/s    3 × forward FLOPs (convolutions and classifier, 2 per multiply-add) × img/s, per GPU
//   memory     device memory this process took (cudaMemGetInfo after the Device and its NCCL
//              communicators, and after the run)
//   buffers    model_buffers_gib: the flat parameters, gradients and optimizer state and the
//              Device's scratch and shared buffers (the layers' activations are in mem_gib only)
//   phases     resnet_train_memory lines (bench/support/memory_phases.cuh), the GiB taken by the
//              end of each set-up phase, from the same start as mem_gib except that the first
//              phase is the Device and communicators (left out of mem_gib): "device and
//              communicators", "model" (the layers' parameters), "optimizer" (the flat buffers,
//              master weights and momentum), "batch", "first step" (the layers' activations, the
//              Device's scratch and shared gradient buffers, the cuDNN workspace)
//   power      power_w: the GPUs' summed mean power while training --energy-seconds more after the
//              timed steps (bench/support/power.cuh; null where not read), img_per_j = img/s ÷ W
//   ranks      K: under scripts/launch.sh -n K (mpirun/srun), one GPU per rank, each on its own
//              batch of B images (seeded by its rank); gradients summed by the
//              DistributedOptimizer's buckets (--bucket-mb; the loss divides by K · B) while the
//              backward runs, exposed_comm_ms its host time waiting for them (the launches on a
//              GPU). Only rank 0 prints.
//   sync_bn    --sync-bn: BatchNorm statistics synchronised over the ranks (PyTorch's
//              SyncBatchNorm; the reference's --sync-bn): two all-reduces of 2C floats per
//              BatchNorm and step on the compute stream. Also on one rank, where it measures the
//              cost of the split passes (PyTorch falls back to plain BatchNorm there).
// (The model's agreement with the float64 host model, one step and an SGD loss curve, is
// tests/cuda/test_resnet_composed.cu's.)
#include "../support/memory_phases.cuh"
#include "../support/power.cuh"
#include "../support/train_timing.cuh"

#include <dpml/comm/launch.hpp>
#include <dpml/comm/local_rank.hpp>
#include <dpml/comm/nccl.hpp>
#include <dpml/core/bf16.hpp>
#include <dpml/core/cuda_error.hpp>
#include <dpml/core/cuda_space.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/kernels/image.hpp>
#include <dpml/layers/cross_entropy.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/bottleneck_resnet.hpp>
#include <dpml/optim/sgd.hpp>
#include <dpml/parallel/device_grid.hpp>
#include <dpml/parallel/distributed_optimizer.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/train/args.hpp>
#include <dpml/train/flops.hpp>
#ifndef DPML_HAS_CUDNN
#define DPML_HAS_CUDNN 0
#endif
#if DPML_HAS_CUDNN
#include <dpml/kernels/cuda/conv/cudnn.hpp>
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

using namespace dpml;

namespace {

struct Options {
  models::BottleneckResNetConfig model;  // in_channels: the images' (padded on the device)
  std::int64_t batch = 256, image = 224;
  int warmup = 10, steps = 30;
  double lr = 0.1;
  optim::SgdOptions sgd{.momentum = 0.9, .weight_decay = 1e-4};
  std::string conv = DPML_HAS_CUDNN ? "cudnn" : "own";
  double bucket_mb = 25;  // data parallel: gradient all-reduce bucket (PyTorch DDP's default)
  bool sync_bn = false;   // BatchNorm statistics over all ranks' batches
  double energy_seconds = dpml::bench::kEnergySeconds;  // --energy-seconds (0: power not metered)
};

// Flags, parsed by train::Args (--help lists them with their defaults, printed by rank 0); false
// after --help. Every rank parses the same argv, so a bad flag is an Error on every rank alike.
bool parse(int argc, char** argv, Options& o, int rank) {
  std::string blocks = "3,4,6,3";
  train::Args args("resnet_train", "ResNet training throughput on one GPU, or data parallel with one GPU per rank "
                                   "under scripts/launch.sh -n K (bench/RESULTS.md): models::BottleneckResNet<bf16, "
                                   "CudaSpace>, the library's layers; prints JSON lines (bench resnet_train, "
                                   "resnet_train_memory) and a table.");
  args.flag("--batch", o.batch, "images per step", dpml::train::at_least(1))
      .flag("--image", o.image, "image side in pixels", dpml::train::at_least(1))
      .flag("--classes", o.model.classes, "classifier outputs", dpml::train::at_least(1))
      .flag("--width", o.model.width, "stem channels and stage 1's bottleneck width", dpml::train::at_least(1))
      .flag("--blocks", blocks, "bottleneck blocks per stage (3,4,6,3: ResNet-50)")
      .flag("--warmup", o.warmup, "untimed steps first", dpml::train::at_least(0))
      .flag("--steps", o.steps, "timed steps", dpml::train::at_least(1))
      .flag("--lr", o.lr, "SGD learning rate", dpml::train::at_least(0.0))
      .flag("--momentum", o.sgd.momentum, "SGD momentum", dpml::train::half_open(0.0, 1.0))
      .flag("--weight-decay", o.sgd.weight_decay, "SGD L2 weight decay", dpml::train::at_least(0.0))
      .flag("--conv", o.conv, DPML_HAS_CUDNN ? "convolutions: own (dpml's implicit GEMM) | cudnn"
                                             : "convolutions: own (dpml's implicit GEMM; built without cuDNN)")
      .flag("--bucket-mb", o.bucket_mb, "data parallel (several ranks): MB of gradients per all-reduce bucket", dpml::train::positive<double>())
      .flag("--sync-bn", o.sync_bn, "synchronised BatchNorm: statistics of all ranks' batches (SyncBatchNorm)");
  dpml::bench::energy_seconds_flag(args, o.energy_seconds);
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

constexpr std::int64_t kChannelAlign = 8;  // the input's channels padded to 16 bytes of bf16
std::int64_t padded_channels(std::int64_t c) { return (c + kChannelAlign - 1) / kChannelAlign * kChannelAlign; }

// One batch: images (N, C, S, S) NCHW float, labels (N); each rank its own.
struct HostBatch {
  std::vector<float> images;
  std::vector<std::int32_t> labels;
};
HostBatch random_batch(const Options& o, int rank) {
  HostBatch b;
  b.images.resize(static_cast<std::size_t>(o.batch * o.model.in_channels * o.image * o.image));
  b.labels.resize(static_cast<std::size_t>(o.batch));
  std::mt19937_64 gen(7 + static_cast<std::uint64_t>(rank));
  std::normal_distribution<float> normal;
  for (auto& v : b.images) v = normal(gen);
  for (auto& l : b.labels) l = static_cast<std::int32_t>(gen() % static_cast<std::uint64_t>(o.model.classes));
  return b;
}

// The model's configuration: the flags', the input channels padded.
models::BottleneckResNetConfig composed_config(const Options& o) {
  return {.in_channels = padded_channels(o.model.in_channels), .width = o.model.width, .blocks = o.model.blocks,
          .classes = o.model.classes, .sync_batch_norm = o.sync_bn};
}

// Forward FLOPs of one image through the convolutions and the classifier (2 per multiply-add;
// train/flops.hpp), the stem at its real input channels.
double forward_flops_per_image(const Options& o) {
  return train::bottleneck_resnet_forward_flops_per_image(
      {.in_channels = o.model.in_channels, .width = o.model.width, .blocks = o.model.blocks, .classes = o.model.classes}, o.image);
}

// The composed model with its step: forward, loss (dlogits in place), backward, and the update by
// the DistributedOptimizer (data parallel over every rank of `world`).
template <class Conv>
class Composed {
  using Model = models::BottleneckResNet<bf16, CudaSpace, comm::Nccl, Conv>;
  using Optimizer = parallel::DistributedOptimizer<optim::Sgd, bf16, CudaSpace, comm::Nccl>;

 public:
  Composed(const Options& o, const comm::Mpi& world)
      : opts_(o), grid_(parallel::ProcessGrid::create(world, {})), comms_(grid_, dev_),
        bn_comm_(o.sync_bn ? std::make_unique<comm::Nccl>(comm::Nccl::from(grid_.comm(Axis::data), dev_.stream()))
                           : nullptr) {}

  // The model and its optimizer (after construction, so that mem_gib leaves NCCL's memory out);
  // init: set the weights before the optimizer takes them (layers::initialize_all by default).
  // memory (may be null): told of the end of the "model" and "optimizer" phases.
  template <class Init>
  void build(Init&& init, dpml::bench::MemoryPhases* memory = nullptr) {
    net_.emplace(Model::make(composed_config(opts_), bn_comm_.get()));
    init(*net_);
    if (memory) memory->after("model");
    opt_.emplace(net_->parameters(), &grid_, opts_.sgd,
                 parallel::DistributedOptimizerOptions{.bucket_bytes = static_cast<std::size_t>(opts_.bucket_mb * (1 << 20))},
                 comms_, dev_);
    ctx_.device = &dev_;
    ctx_.grid = &grid_;
    ctx_.global_batch = opts_.batch * grid_.dp();
    ctx_.on_grad_ready = [this](std::span<ParamBase* const> ps) { opt_->on_grad_ready(ps); };
    if (memory) memory->after("optimizer");
  }
  // The batch in the model's layout: (N, S, S, Cp) bf16, the pad channels zero; labels (N).
  void upload(const HostBatch& b) {
    const std::int64_t C = opts_.model.in_channels, Cp = padded_channels(C), P = opts_.image * opts_.image;
    std::vector<float> nchw(static_cast<std::size_t>(opts_.batch * Cp * P), 0.f), nhwc(nchw.size());
    for (std::int64_t n = 0; n < opts_.batch; ++n)
      std::copy_n(b.images.begin() + n * C * P, C * P, nchw.begin() + n * Cp * P);
    kernels::to_layout(kernels::ImageLayout::nchw, kernels::ImageLayout::nhwc, nchw.data(), nhwc.data(),
                       kernels::ImageDims{opts_.batch, Cp, opts_.image, opts_.image});
    Tensor<bf16> images(Shape{opts_.batch, opts_.image, opts_.image, Cp});
    std::transform(nhwc.begin(), nhwc.end(), images.begin(), [](float v) { return bf16(v); });
    images_ = to_space<CudaSpace>(images.cview());
    Tensor<std::int32_t> labels(Shape{opts_.batch});
    std::copy(b.labels.begin(), b.labels.end(), labels.begin());
    labels_ = to_space<CudaSpace>(labels.cview());
  }
  // One training step; returns this rank's mean loss over its batch (reads it: synchronises).
  double step() {
    opt_->begin_step(1);
    const auto logits = net_->forward(ctx_, images_.cview());
    xent_.forward(ctx_, logits, labels_.cview());
    const auto dlogits = xent_.backward(ctx_);
    net_->backward_input(ctx_, dlogits);
    net_->backward_weight(ctx_, dlogits);
    exposed_ms_ = 1e3 * opt_->finish_step(opts_.lr).exposed_comm_seconds;
    return xent_.take_loss() * grid_.dp();  // the loss divides by all ranks' images
  }

  cudaStream_t stream() const noexcept { return dev_.stream(); }
  double exposed_ms() const noexcept { return exposed_ms_; }
  typename Model::Network& net() { return *net_; }
  std::int64_t parameter_count() {
    std::int64_t n = 0;
    for (auto* p : net_->parameters()) n += p->numel();
    return n;
  }
  // Flat bf16 values and gradients, fp32 master and momentum, the Device's scratch and shared buffers.
  std::size_t buffer_bytes() {
    const auto n = static_cast<std::size_t>(opt_->flat().numel());
    return n * (2 * sizeof(bf16) + 2 * sizeof(float)) + dev_.buffer_bytes();
  }

 private:
  Options opts_;
  parallel::ProcessGrid grid_;
  kernels::Device<CudaSpace> dev_;
  parallel::DeviceGrid<comm::Nccl> comms_;
  std::unique_ptr<comm::Nccl> bn_comm_;  // --sync-bn: on the compute stream, as BatchNorm2d requires
  std::optional<typename Model::Network> net_;
  std::optional<Optimizer> opt_;
  layers::Context<CudaSpace> ctx_;
  layers::SoftmaxCrossEntropy<bf16, CudaSpace> xent_{{.in_place = true}};
  Tensor<bf16, CudaSpace> images_;          // (N, S, S, Cp)
  Tensor<std::int32_t, CudaSpace> labels_;  // (N)
  double exposed_ms_ = 0;
};

// What a timed run reports.
struct Result {
  std::string impl;
  double ms_step = 0, exposed_ms = 0, mem_gib = 0, buffers_gib = 0, flops_per_image = 0;
  double power_w = NAN;  // all GPUs, while training on after the timed steps
  std::int64_t params = 0;
  std::vector<double> losses;
  dpml::bench::MemoryPhases::Phases memory;  // GiB taken by the end of each set-up phase
};

// warmup untimed steps, then steps timed; every loss kept.
template <class Step>
double time_steps(const Options& o, const comm::Mpi& world, cudaStream_t stream, std::vector<double>& losses,
                  Step&& step) {
  auto train_step = [&] { losses.push_back(step()); };
  for (int i = 0; i < o.warmup; ++i) train_step();
  if (world.size() > 1) world.barrier();  // the ranks start the timed steps together
  return world.allreduce(dpml::bench::ms_per_step(o.steps, stream, train_step), comm::ReduceOp::max);
}

std::string impl_name(const Options& o, int ranks) {
  return "dpml-composed-" + o.conv +
         (ranks > 1 ? "-dp" + std::to_string(ranks) : "") + (o.sync_bn ? "-syncbn" : "");
}

template <class Conv>
Result run_composed(const Options& o, const comm::Mpi& world) {
  dpml::bench::MemoryPhases memory;
  Composed<Conv> model(o, world);
  DPML_CHECK_CUDA(cudaDeviceSynchronize());
  memory.after("device and communicators");
  const auto init = [](auto& net) { layers::initialize_all(net.parameters(), 1337, nullptr); };  // alike on every rank
  model.build(init, &memory);
  model.upload(random_batch(o, world.rank()));
  memory.after("batch");
  Result r{.impl = impl_name(o, world.size())};
  r.ms_step = time_steps(o, world, model.stream(), r.losses, [&] {
    const double loss = model.step();
    if (r.losses.empty()) memory.after("first step");
    return loss;
  });
  r.exposed_ms = world.allreduce(model.exposed_ms(), comm::ReduceOp::max);
  r.power_w = dpml::bench::mean_power_w(world, o.energy_seconds, r.ms_step, [&] { (void)model.step(); });
  DPML_CHECK_CUDA(cudaDeviceSynchronize());
  r.mem_gib = memory.gib() - memory.phases().front().second;  // without the Device and communicators, as before
  r.memory = memory.phases();
  r.buffers_gib = static_cast<double>(model.buffer_bytes()) / (1 << 30);
  r.params = model.parameter_count();
  r.flops_per_image = forward_flops_per_image(o);
  return r;
}

// Rank 0 prints the JSON line and the table; the exit status (1: a loss was not finite on some rank).
int report(const Options& o, const comm::Mpi& world, const Result& r) {
  const int ranks = world.size();
  bool finite = true;
  for (double l : r.losses) finite = finite && std::isfinite(l);
  finite = world.allreduce(finite ? 1 : 0, comm::ReduceOp::min) == 1;  // every rank's losses
  if (world.rank() != 0) return finite ? 0 : 1;

  int device = 0;
  DPML_CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  DPML_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  const double img_s = static_cast<double>(o.batch * ranks) / (r.ms_step * 1e-3);
  const double tflops = 3.0 * r.flops_per_image * img_s / ranks / 1e12;  // per GPU
  const char* impl = r.impl.c_str();
  const std::string on = ranks > 1 ? std::to_string(ranks) + " × " + prop.name : std::string(prop.name);
  std::printf("{\"bench\":\"resnet_train\",\"impl\":\"%s\",\"device\":\"%s\",\"batch\":%lld,"
              "\"image\":%lld,\"width\":%lld,\"blocks\":[%lld,%lld,%lld,%lld],\"classes\":%lld,\"params\":%lld,"
              "\"steps\":%d,\"warmup\":%d,\"ms_per_step\":%.3f,\"img_per_s\":%.1f,\"model_tflops\":%.2f,"
              "\"mem_gib\":%.3f,\"model_buffers_gib\":%.3f,\"loss_first\":%.4f,\"loss_last\":%.4f,\"finite\":%s,"
              "\"ranks\":%d,\"bucket_mb\":%.1f,\"exposed_comm_ms\":%.3f,\"sync_bn\":%s,\"power_w\":%s,\"img_per_j\":%s}\n",
              impl, prop.name, static_cast<long long>(o.batch), static_cast<long long>(o.image),
              static_cast<long long>(o.model.width), static_cast<long long>(o.model.blocks[0]),
              static_cast<long long>(o.model.blocks[1]), static_cast<long long>(o.model.blocks[2]),
              static_cast<long long>(o.model.blocks[3]), static_cast<long long>(o.model.classes),
              static_cast<long long>(r.params), o.steps, o.warmup, r.ms_step, img_s, tflops, r.mem_gib, r.buffers_gib,
              r.losses.front(), r.losses.back(), finite ? "true" : "false", ranks, o.bucket_mb, r.exposed_ms,
              o.sync_bn ? "true" : "false", dpml::bench::json_number(r.power_w).c_str(),
              dpml::bench::json_number(img_s / r.power_w, 2).c_str());
  dpml::bench::print_memory_phases("resnet_train_memory", impl, r.memory);
  std::printf("\nResNet (width %lld, blocks %lld,%lld,%lld,%lld) B=%lld %lldpx on %s, bf16 + fp32 master, SGD, %s\n",
              static_cast<long long>(o.model.width), static_cast<long long>(o.model.blocks[0]),
              static_cast<long long>(o.model.blocks[1]), static_cast<long long>(o.model.blocks[2]),
              static_cast<long long>(o.model.blocks[3]), static_cast<long long>(o.batch),
              static_cast<long long>(o.image), on.c_str(), impl);
  std::printf("| img/s | ms/step | model TFLOP/s | memory GiB | loss first → last |\n|---|---|---|---|---|\n");
  std::printf("| %.0f | %.2f | %.1f | %.2f | %.3f → %.3f |\n\n", img_s, r.ms_step, tflops, r.mem_gib,
              r.losses.front(), r.losses.back());
  if (ranks > 1)
    std::printf("Data parallel: %d ranks of B=%lld, gradients in %.1f MB buckets; the last step waited %.2f ms "
                "for its all-reduces; BatchNorm statistics %s; TFLOP/s and memory per GPU, losses rank 0's.\n\n",
                ranks, static_cast<long long>(o.batch), o.bucket_mb, r.exposed_ms,
                o.sync_bn ? "synchronised over the ranks" : "per rank");
  if (!finite) {
    std::fprintf(stderr, "resnet_train: a loss was not finite\n");
    return 1;
  }
  return 0;
}

template <class Conv>
int run(const Options& o, const comm::Mpi& world) {
  return report(o, world, run_composed<Conv>(o, world));
}

}  // namespace

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
