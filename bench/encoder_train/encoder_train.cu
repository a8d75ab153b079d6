// encoder_train: training throughput of the bidirectional-attention families on one GPU (or data
// parallel on several) — BERT-base as a masked LM (models::Bert) and ViT-B/16 as an image
// classifier (models::Vit) — composed from the library's layers and trained by its trainers, in
// bf16 with fp32 master weights, AdamW and global-norm clipping at 1.0: the setup of
// bench/reference/torch_encoder.py, so the two print comparable JSON lines
// (scripts/encoder-bench.sh runs them in one job).
//
//   --model bert   L=12, d=768, 12 heads, V=30522 (padded to a multiple of 128), T=512, B=32;
//                  each sequence has round(0.15·T) positions chosen (a Fisher–Yates draw per row),
//                  replaced by [MASK] (token 103) in the input, their original token the target
//                  and −1 elsewhere: the loss is the cross-entropy over the chosen positions
//                  (computed on every position's logits, as BERT's MLM head does). Random tokens,
//                  a new batch per step (made on the host and uploaded, 128 KiB).
//                  AdamW β = (0.9, 0.98), weight decay 0.01.
//   --model vit    224 × 224 × 3 images, patches of 16 (196 tokens and the class token), L=12,
//                  d=768, 12 heads, MLP 3072, 1000 classes, B=128. One batch of random images
//                  (bf16 NHWC) and labels made once on the GPU's memory and reused every step,
//                  given to the trainer as a train::ResidentBatch (no per-step upload), as the
//                  reference keeps its one batch on the GPU. AdamW β = (0.9, 0.999), weight decay 0.05.
//
//   samples/s  K · B · timed steps / wall time of the slowest rank's timed steps (each step ends
//              with the loss read on the host, as a training loop that prints it does)
//   MFU        (6·N + 12·L·T·d) FLOPs per token × tokens/s / peak, N the unpadded parameter count,
//              T the sequence (BERT) or 197 tokens (ViT); peak = a bf16 8192³ cuBLASLt GEMM
//              measured in the same run (bench/support/peak.cuh)
//   memory     device memory this process took (cudaMemGetInfo before the model and after the
//              run); encoder_train_memory lines split it by set-up phase
//   power      power_w: the GPUs' summed mean power while training --energy-seconds more after the
//              timed steps (bench/support/power.cuh; null where not read), samples_per_j = samples/s ÷ W
//   ranks      under scripts/launch.sh -n K: one GPU per rank, each replica on its own batch of B,
//              gradients summed by the trainer's buckets while the backward runs
//
// Flags: train::Args (--help lists them with their defaults; a bad value exits 1 naming it).
#include "../support/memory_phases.cuh"
#include "../support/peak.cuh"
#include "../support/power.cuh"
#include "../support/train_timing.cuh"

#include <dpml/comm/launch.hpp>
#include <dpml/comm/local_rank.hpp>
#include <dpml/comm/nccl.hpp>
#include <dpml/core/bf16.hpp>
#include <dpml/core/cuda_error.hpp>
#include <dpml/core/cuda_space.hpp>
#include <dpml/core/philox.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/bert.hpp>
#include <dpml/models/vit.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/parallel/device_grid.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/parallel/tensor.hpp>
#include <dpml/train/args.hpp>
#include <dpml/train/batch.hpp>
#include <dpml/train/classifier.hpp>
#include <dpml/train/trainer.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

using namespace dpml;

namespace {

struct Options {
  std::string model = "bert";
  std::int64_t batch = 0;  // 0: the model's default (BERT 32, ViT 128)
  std::int64_t seq = 512, vocab = 30522, mask_token = 103;
  double mask_prob = 0.15;
  std::int64_t image = 224, patch = 16, classes = 1000;
  std::int64_t layers = 12, dim = 768, heads = 12;
  int warmup = 5, steps = 20;
  double lr = 1e-4;
  int recompute_gelu = 1;
  double bucket_mb = 25;
  bool cuda_profile = false;  // one more step between cudaProfilerStart/Stop (bench/timeline's CUPTI tracer, ncu)
  double energy_seconds = dpml::bench::kEnergySeconds;  // --energy-seconds (0: power not metered)
  bool bert() const { return model == "bert"; }
  std::int64_t tokens() const { return bert() ? seq : (image / patch) * (image / patch) + 1; }  // per sample
};

bool parse(int argc, char** argv, int rank, Options& o) {
  train::Args args("encoder_train",
                   "Training throughput of BERT-base (masked LM, --model bert) or ViT-B/16 (image classifier, --model vit)\n"
                   "on one GPU, or data parallel under scripts/launch.sh -n K: models::Bert / models::Vit in bf16 with fp32\n"
                   "master weights, AdamW, clipping at 1.0; the setup of bench/reference/torch_encoder.py.\n"
                   "Prints JSON lines (bench encoder_train, encoder_train_memory) and a table.");
  args.flag("--model", o.model, "bert | vit", [](const std::string& v) {
        DPML_REQUIRE_EVERYWHERE(v == "bert" || v == "vit", "encoder_train: --model " << v << " is not bert or vit");
      })
      .flag("--batch", o.batch, "samples per step and data-parallel replica (0: BERT 32, ViT 128)", train::at_least(0))
      .flag("--seq", o.seq, "BERT: tokens per sequence", train::at_least(1))
      .flag("--vocab", o.vocab, "BERT: vocabulary (padded to a multiple of 128)", train::at_least(2))
      .flag("--mask-prob", o.mask_prob, "BERT: share of each sequence's positions chosen for the loss", train::Range<double>(0.0, 1.0, true))
      .flag("--image", o.image, "ViT: image side in pixels", train::at_least(1))
      .flag("--patch", o.patch, "ViT: patch side in pixels (dividing --image)", train::at_least(1))
      .flag("--classes", o.classes, "ViT: classes", train::at_least(2))
      .flag("--layers", o.layers, "encoder blocks", train::at_least(1))
      .flag("--dim", o.dim, "model width", train::at_least(1))
      .flag("--heads", o.heads, "attention heads (head dim 32, 64 or 128)", train::at_least(1))
      .flag("--warmup", o.warmup, "untimed steps first", train::at_least(0))
      .flag("--steps", o.steps, "timed steps", train::at_least(1))
      .flag("--lr", o.lr, "peak learning rate, linear warm-up over the warm-up steps", train::positive<double>())
      .flag("--recompute-gelu", o.recompute_gelu, "1: the GELU output recomputed in the backward; 0: saved per block",
            train::between(0, 1))
      .flag("--bucket-mb", o.bucket_mb, "data parallel: MB per gradient all-reduce bucket", train::positive<double>())
      .flag("--cuda-profile", o.cuda_profile,
            "after the timed steps, one more step between cudaProfilerStart and cudaProfilerStop (bench/timeline's "
            "CUPTI tracer, ncu --profile-from-start off)");
  dpml::bench::energy_seconds_flag(args, o.energy_seconds);
  if (!args.parse(argc, argv, rank)) return false;
  if (o.batch == 0) o.batch = o.bert() ? 32 : 128;
  DPML_REQUIRE_EVERYWHERE(o.mask_token < o.vocab, "encoder_train: [MASK] (" << o.mask_token << ") is not below --vocab " << o.vocab);
  return true;
}

// BERT's step s on data rank r: random tokens (B, T), round(mask_prob·T) positions per row chosen
// (a partial Fisher–Yates shuffle of the row's positions), [MASK] in the input, the original token
// the target there, −1 elsewhere. xorshift64 seeded by (s, r): a batch costs ~0.1 ms of the host's
// time, which a step that ends synchronised would otherwise add to the GPU's.
data::MaskedLmBatch masked_batch(const Options& o, std::int64_t step, int rank, int ranks) {
  const std::int64_t B = o.batch, T = o.seq, chosen = std::llround(o.mask_prob * static_cast<double>(T));
  data::MaskedLmBatch b{Tensor<std::int32_t>(Shape{B, T}), Tensor<std::int32_t>(Shape{B, T}, -1), B * ranks, B * ranks * chosen};
  std::uint64_t x = 0x243F6A8885A308D3ull ^ static_cast<std::uint64_t>(step) ^ (static_cast<std::uint64_t>(rank) << 40);
  const auto below = [&x](std::int64_t n) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return static_cast<std::int64_t>(x % static_cast<std::uint64_t>(n));
  };
  std::vector<std::int64_t> positions(static_cast<std::size_t>(T));
  for (std::int64_t i = 0; i < B; ++i) {
    std::int32_t* in = b.inputs.data() + i * T;
    std::int32_t* target = b.targets.data() + i * T;
    for (std::int64_t t = 0; t < T; ++t) in[t] = static_cast<std::int32_t>(below(o.vocab));
    std::iota(positions.begin(), positions.end(), 0);
    for (std::int64_t k = 0; k < chosen; ++k) {
      std::swap(positions[static_cast<std::size_t>(k)], positions[static_cast<std::size_t>(k + below(T - k))]);
      const std::int64_t p = positions[static_cast<std::size_t>(k)];
      target[p] = in[p];
      in[p] = static_cast<std::int32_t>(o.mask_token);
    }
  }
  return b;
}

struct Measured {
  double ms_step = 0, mem_gib = 0;
  double power_w = NAN;        // all GPUs, while training on after the timed steps
  std::vector<double> losses;  // the warm-up and timed steps'
  dpml::bench::MemoryPhases::Phases mem_parts;
};

// What both models' runs share: the Device and the grid's communicators, and the device memory
// taken from before them on (MemoryPhases).
struct Gpu {
  dpml::bench::MemoryPhases memory;
  kernels::Device<CudaSpace> dev;
  parallel::DeviceGrid<comm::Nccl> comms;
  explicit Gpu(const parallel::ProcessGrid& grid) : comms(grid, dev) { memory.after("device and communicators"); }
};

// Warm-up steps, then the timed ones (the slowest rank's mean), then with --cuda-profile one
// more; `step(s)` trains step s and returns its loss (read on the host). The memory is taken
// after step 1 and at the end.
template <class Step>
Measured time_steps(const Options& o, const comm::Mpi& world, Gpu& gpu, Step&& step) {
  Measured m;
  std::int64_t s = 0;
  const auto next = [&] {
    m.losses.push_back(step(++s));
    if (s == 1) gpu.memory.after("first step");
  };
  for (int i = 0; i < o.warmup; ++i) next();
  if (world.size() > 1) world.barrier();
  m.ms_step = world.allreduce(dpml::bench::ms_per_step(o.steps, gpu.dev.stream(), next), comm::ReduceOp::max);
  m.power_w = dpml::bench::mean_power_w(world, o.energy_seconds, m.ms_step, [&] { (void)step(++s); });
  if (o.cuda_profile) dpml::bench::profiled_step([&] { (void)step(++s); });
  gpu.dev.synchronize();
  m.mem_gib = world.allreduce(gpu.memory.gib(), comm::ReduceOp::max);
  m.mem_parts = gpu.memory.phases();
  return m;
}

double lr_at(const Options& o, std::int64_t step) { return o.lr * std::min(1.0, static_cast<double>(step) / std::max(1, o.warmup)); }

using Strategy = train::DataParallelOnly;
parallel::DistributedOptimizerOptions buckets(const Options& o) {
  return {.bucket_bytes = static_cast<std::size_t>(o.bucket_mb * (1 << 20)), .clip = 1.0};
}

Measured run_bert(const Options& o, const comm::Mpi& world, const parallel::ProcessGrid& grid) {
  Gpu gpu(grid);
  const models::BertConfig config{.vocab = o.vocab, .max_seq = o.seq, .layers = o.layers, .heads = o.heads, .dim = o.dim,
                                  .pad_multiple = 128, .recompute_gelu = o.recompute_gelu != 0};
  models::Bert<bf16, CudaSpace, comm::Nccl> model(config, gpu.comms);
  layers::initialize_all(model.parameters(), 1337, &grid);
  gpu.memory.after("model");
  train::Trainer<decltype(model), train::ModelLoss, Strategy, optim::AdamW, CudaSpace, comm::Nccl> trainer(
      model, gpu.comms, gpu.dev, {.beta1 = 0.9, .beta2 = 0.98, .eps = 1e-8, .weight_decay = 0.01}, buckets(o), {.seed = 1337});
  gpu.memory.after("trainer");
  const int rank = grid.coord(Axis::data), ranks = grid.dp();
  return time_steps(o, world, gpu, [&](std::int64_t s) { return trainer.train_step(masked_batch(o, s, rank, ranks), lr_at(o, s)).loss; });
}

Measured run_vit(const Options& o, const comm::Mpi& world, const parallel::ProcessGrid& grid) {
  Gpu gpu(grid);
  const models::VitConfig config{.image = o.image, .channels = 3, .patch = o.patch, .dim = o.dim, .layers = o.layers,
                                 .heads = o.heads, .classes = o.classes, .recompute_gelu = o.recompute_gelu != 0};
  auto model = models::Vit<bf16, CudaSpace, comm::Nccl>::make(config, parallel::TensorRegion<comm::Nccl>(&gpu.comms.tensor()));
  layers::initialize_all(model.parameters(), 1337, &grid);
  gpu.memory.after("model");
  train::ClassifierTrainer<decltype(model), optim::AdamW, Strategy, comm::Nccl> trainer(
      model, gpu.comms, gpu.dev, {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.05}, buckets(o), {.seed = 1337});
  gpu.memory.after("trainer");
  // One batch in the GPU's memory: images (B, H, W, 3) bf16 ~ N(0, 1), labels uniform, per rank.
  const std::int64_t B = o.batch, pixels = o.image * o.image * 3;
  Tensor<bf16> images(Shape{B, o.image, o.image, 3});
  Tensor<std::int32_t> labels(Shape{B});
  const PhiloxStream rng(1337, static_cast<std::uint64_t>(grid.coord(Axis::data)));
  for (std::int64_t i = 0; i < B * pixels; ++i) images[i] = static_cast<bf16>(rng.normal(static_cast<std::uint64_t>(i)));
  for (std::int64_t i = 0; i < B; ++i)
    labels[i] = static_cast<std::int32_t>(rng.u32(static_cast<std::uint64_t>(B * pixels + i)) % static_cast<std::uint64_t>(o.classes));
  const auto images_on_gpu = to_space<CudaSpace>(images.cview());
  const auto labels_on_gpu = to_space<CudaSpace>(labels.cview());
  const train::ResidentBatch<bf16, std::int32_t, CudaSpace> batch{images_on_gpu.cview(), labels_on_gpu.cview(), B * grid.dp()};
  gpu.memory.after("batch");
  return time_steps(o, world, gpu, [&](std::int64_t s) { return trainer.train_step(batch, lr_at(o, s)).loss; });
}

int run(const Options& o, const comm::Mpi& world) {
  const auto grid = parallel::ProcessGrid::create(world, {});
  cudaDeviceProp prop{};
  int device = 0;
  DPML_CHECK_CUDA(cudaGetDevice(&device));
  DPML_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  const double peak = dpml::bench::measure_peak_tflops(8192);
  const Measured r = o.bert() ? run_bert(o, world, grid) : run_vit(o, world, grid);
  if (world.rank() != 0) return 0;

  const int ranks = world.size();
  const double n_params = o.bert()
                              ? static_cast<double>(models::BertConfig{.vocab = o.vocab, .max_seq = o.seq, .layers = o.layers,
                                                                       .heads = o.heads, .dim = o.dim}.parameter_count())
                              : static_cast<double>(models::VitConfig{.image = o.image, .channels = 3, .patch = o.patch, .dim = o.dim,
                                                                      .layers = o.layers, .heads = o.heads, .classes = o.classes}
                                                        .parameter_count());
  const double samples_s = static_cast<double>(o.batch) * ranks / (r.ms_step * 1e-3);
  const double T = static_cast<double>(o.tokens());
  const double flops_per_token = 6.0 * n_params + 12.0 * static_cast<double>(o.layers) * T * static_cast<double>(o.dim);
  const double tflops = flops_per_token * T * samples_s / ranks / 1e12;  // per GPU
  bool finite = true;
  for (double l : r.losses) finite = finite && std::isfinite(l);
  const std::string impl = "dpml" + std::string(o.recompute_gelu ? "" : "-saved-gelu") + (ranks > 1 ? "-dp" + std::to_string(ranks) : "");
  std::printf("{\"bench\":\"encoder_train\",\"model\":\"%s\",\"impl\":\"%s\",\"device\":\"%s\",\"batch\":%lld,\"tokens\":%lld,"
              "\"layers\":%lld,\"dim\":%lld,\"heads\":%lld,\"params\":%.0f,\"steps\":%d,\"warmup\":%d,\"ms_per_step\":%.3f,"
              "\"samples_per_s\":%.1f,\"model_tflops\":%.2f,\"peak_tflops\":%.1f,\"mfu\":%.4f,\"mem_gib\":%.3f,"
              "\"loss_first\":%.4f,\"loss_last\":%.4f,\"finite\":%s,\"ranks\":%d,\"power_w\":%s,\"samples_per_j\":%s}\n",
              o.model.c_str(), impl.c_str(), prop.name, static_cast<long long>(o.batch), static_cast<long long>(o.tokens()),
              static_cast<long long>(o.layers), static_cast<long long>(o.dim), static_cast<long long>(o.heads), n_params, o.steps,
              o.warmup, r.ms_step, samples_s, tflops, peak, tflops / peak, r.mem_gib, r.losses.front(), r.losses.back(),
              finite ? "true" : "false", ranks, dpml::bench::json_number(r.power_w).c_str(),
              dpml::bench::json_number(samples_s / r.power_w, 2).c_str());
  dpml::bench::print_memory_phases("encoder_train_memory", impl.c_str(), r.mem_parts);
  std::printf("\n%s (L=%lld d=%lld H=%lld, %lld tokens per sample) B=%lld on %d × %s, bf16 + fp32 master, AdamW, clip 1.0\n",
              o.bert() ? "BERT (masked LM)" : "ViT (classifier)", static_cast<long long>(o.layers), static_cast<long long>(o.dim),
              static_cast<long long>(o.heads), static_cast<long long>(o.tokens()), static_cast<long long>(o.batch), ranks, prop.name);
  std::printf("| samples/s | ms/step | MFU (vs %.0f TFLOP/s measured) | memory GiB | loss first → last |\n|---|---|---|---|---|\n", peak);
  std::printf("| %.0f | %.2f | %.1f%% | %.2f | %.3f → %.3f |\n\n", samples_s, r.ms_step, 100 * tflops / peak, r.mem_gib,
              r.losses.front(), r.losses.back());
  if (!finite) {
    std::fprintf(stderr, "encoder_train: a loss was not finite\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const comm::Mpi& world) {
    Options o;
    if (!parse(argc, argv, world.rank(), o)) return 0;  // --help: printed, before any CUDA call
    DPML_REQUIRE_EVERYWHERE(cuda_device_count() > 0, "encoder_train: no CUDA device");
    comm::select_device(world);
    return run(o, world);
  });
}
