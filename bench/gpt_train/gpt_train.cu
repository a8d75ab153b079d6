// gpt_train: GPT-2 training throughput on one GPU or tensor/pipeline/data parallel on several: models::Gpt<T, CudaSpace>
// composed from the layers (models/gpt.hpp), trained by the library's trainer (train::GptTrainer over a
// parallel::DeviceGrid), bf16 (or --precision fp16, with dynamic loss scaling) with fp32 master weights, AdamW (β = 0.9,
// 0.95, weight decay 0.1), global-norm clipping at 1.0 — the setup of bench/reference/torch_gpt.py, so the two print
// comparable JSON lines. (Until Step 8 this program also ran the hand-fused GPU model, --model fused; the last
// measurements of both are in bench/RESULTS.md.)
//
// Flags: train::Args (parse below; --help lists each with its default and range, printed by rank 0 before any CUDA
// call; a bad value exits 1 on every rank naming the flag). Counts and sizes are ≥ 1 (--warmup, --micro-batch ≥ 0:
// 0 is --batch), --lr and --bucket-mb > 0, --recompute-granularity none|selective|full; --pp and --tp also answer to
// Megatron's --pipeline-model-parallel-size and --tensor-model-parallel-size; --use-distributed-optimizer and
// --cuda-profile are switches (--no-… turns them off). Choices (--precision, --pipeline-schedule) and the flags'
// relations (--micro-batch divides --batch, --layers ≥ --pp, …) are checked right after.
//
//   tokens/s   B·T · timed steps / wall time of the timed steps (each step ends with the loss
//              copied to the host, as a training loop that prints it does)
//   MFU        (6·N + 12·L·T·d) FLOPs per token × tokens/s / peak, N the unpadded parameter count;
//              peak = a bf16 8192³ cuBLASLt GEMM measured in the same run
//   memory     device memory this process took (cudaMemGetInfo before the model and after the run);
//              gpt_train_memory lines split it by set-up phase (device, communicators, model,
//              trainer, first step); model_buffers_gib counts the flat parameters, gradients and
//              optimizer state (activations are tensors of the layers': mem_gib counts them)
//   ranks      under mpirun/srun (scripts/launch.sh -n K), one GPU per rank, each data-parallel
//              replica on its own batch of B sequences, gradients summed by the trainer's buckets
//              (parallel/data.hpp) while the backward runs; tokens/s counts all replicas (dp·B·T
//              per step over the slowest rank's step time) and MFU is per GPU; exposed_comm_ms: the
//              last timed step's host time waiting for its reductions
//   ZeRO-1     --use-distributed-optimizer (Megatron's flag): each data rank holds the fp32 master
//              weights and AdamW moments of its 1/dp of the parameters only (gradients
//              reduce-scattered, weights all-gathered); model_buffers_gib shows the saving
//   pipeline   --pp P cuts the blocks into P stages, one per rank; ranks = N × P × dp with --tp N
//              (parallel::ProcessGrid, data parallel takes the rest). A step is --batch sequences per
//              data-parallel replica, in micro-batches of --micro-batch run by --pipeline-schedule
//              (gpipe, 1f1b, zb-h1); memory is the largest rank's
//   tensor     --tp N: groups of N consecutive ranks (tensor axis fastest) split each block's heads
//              and MLP and the vocabulary, and see the same tokens; MFU is per GPU
//   sizes      --model-size 124m|350m|1.3b|2.7b|6.7b (models/gpt.hpp); --dry-run prints the memory
//              estimate per rank kind (models/gpt_memory.hpp) and exits; every run prints it beside
//              the measured phases (gpt_train_memory "after":"estimate": the largest rank's)
//   bytes      wire_bytes, tensor_bytes, pipeline_bytes: what a rank sent in a step over the data axis
//              (gradients), the tensor axis (activations) and the pipeline (messages), the most of
//              any rank (train::StepResult)
//   power      power_w: the GPUs' summed mean power while training --energy-seconds more after the
//              timed steps (bench/support/power.cuh: NVML's energy counters; null where not read),
//              and tokens_per_j = tokens/s ÷ power_w
//   profile    --cuda-profile: one more step between cudaProfilerStart and cudaProfilerStop, for
//              ncu --profile-from-start off (bench/gpt_train/kernel-diff.sh compares two such runs)
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
#include <dpml/data/token_shards.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/kernels/cuda/gemm/dispatch.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/gpt.hpp>
#include <dpml/models/gpt_memory.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/optim/loss_scale.hpp>
#include <dpml/parallel/device_grid.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/args.hpp>
#include <dpml/train/gpt_trainer.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

using namespace dpml;
namespace kc = dpml::kernels::cuda;

namespace {

struct Options {
  models::GptConfig model{.vocab = 50257, .max_seq = 1024, .layers = 12, .heads = 12, .dim = 768, .pad_multiple = 128,
                          .recompute_gelu = true};
  std::int64_t batch = 16, seq = 1024;
  int warmup = 5, steps = 20;
  double lr = 6e-4;
  std::string data;  // llm.c token shards (file or glob); empty: random tokens
  std::string precision = "bf16";
  double bucket_mb = 25;              // data parallel: gradient bucket size
  bool distributed_optimizer = false; // ZeRO-1: optimizer state sharded over the data ranks
  int pp = 1;                         // pipeline stages
  int tp = 1;                         // tensor-parallel degree
  std::int64_t micro_batch = 0;       // sequences per micro-batch (0: --batch, one micro-batch)
  std::string schedule = "1f1b";      // pipeline schedule
  bool cuda_profile = false;          // one more step between cudaProfilerStart/Stop (ncu --profile-from-start off)
  double energy_seconds = dpml::bench::kEnergySeconds;  // --energy-seconds (0: power not metered)
  std::string model_size;             // a named shape (models::kGptPresets); --layers/--dim/--heads/--seq override it
  bool dry_run = false;               // print the memory estimate and exit before any CUDA call
  int micro_batches() const { return static_cast<int>(batch / micro_batch); }
};

// Parses argv into o (a bad flag throws, Scope::everywhere); false after --help (printed by rank 0).
// Before any CUDA call, so that --help and bad flags need no GPU.
bool parse(int argc, char** argv, int rank, Options& o) {
  std::string recompute = "selective";  // --recompute-granularity
  train::Args args(
      "gpt_train",
      "GPT-2 training throughput (tokens/s, MFU, memory) on one GPU, or data, tensor and pipeline parallel on\n"
      "several: bf16 (or fp16 with dynamic loss scaling), fp32 master weights, AdamW, clipping at 1.0; the setup of\n"
      "bench/reference/torch_gpt.py. Data parallel: scripts/launch.sh -n K gpt_train ... (one GPU per rank, each on\n"
      "its own batch of B); with --pp P and --tp N, K = N x P x dp ranks (a tensor group shares its batch).\n"
      "The model is composed from the layers (models/gpt.hpp) and trained by train::GptTrainer.\n"
      "Prints JSON lines (bench gpt_train, gpt_train_memory) and a table.");
  args.flag("--batch", o.batch, "sequences per step and data-parallel replica", train::at_least(1))
      .flag("--micro-batch", o.micro_batch, "sequences per micro-batch, --batch / B micro-batches per step (0: --batch)",
            train::at_least(0))
      .flag("--pp", o.pp, "pipeline stages, one per rank", train::at_least(1))
      .flag("--pipeline-model-parallel-size", o.pp, "Megatron's name for --pp", train::at_least(1))
      .flag("--tp", o.tp, "tensor-parallel degree: groups of N consecutive ranks split each block's heads and MLP",
            train::at_least(1))
      .flag("--tensor-model-parallel-size", o.tp, "Megatron's name for --tp", train::at_least(1))
      .flag("--pipeline-schedule", o.schedule, "the micro-batches' order on the stages: gpipe | 1f1b | zb-h1")
      .flag("--seq", o.seq, "tokens per sequence", train::at_least(1))
      .flag("--model-size", o.model_size, "a named shape: 124m | 350m | 1.3b | 2.7b | 6.7b (models/gpt.hpp); --layers, --dim, "
            "--heads, --seq beside it override its values", [](const std::string& v) { (void)models::gpt_preset(v); })
      .flag("--dry-run", o.dry_run, "print each rank kind's estimated memory (models/gpt_memory.hpp) and exit, no GPU needed")
      .flag("--layers", o.model.layers, "transformer blocks (GPT-2 124M: 12)", train::at_least(1))
      .flag("--heads", o.model.heads, "attention heads (GPT-2 124M: 12)", train::at_least(1))
      .flag("--dim", o.model.dim, "model width (GPT-2 124M: 768)", train::at_least(1))
      .flag("--vocab", o.model.vocab, "vocabulary (GPT-2: 50257; padded to a multiple of 128 · tp)", train::at_least(1))
      .flag("--warmup", o.warmup, "untimed steps first", train::at_least(0))
      .flag("--steps", o.steps, "timed steps", train::at_least(1))
      .flag("--lr", o.lr, "peak learning rate, linear warm-up over the warm-up steps", train::positive<double>())
      .flag("--data", o.data, "llm.c token shards (uint16 .bin, glob allowed); \"\": random tokens")
      .flag("--recompute-granularity", recompute,
            "activation recomputation (Megatron's name): none (the GELU output saved per block) | selective (the GELU "
            "output recomputed in the backward; attention keeps no (T, T) scores anyway) | full (each block keeps only "
            "its input and runs its forward again in the backward)",
            [](const std::string& v) {
              models::GptConfig c;
              models::apply_recompute_granularity(v, c);
            })
      .flag("--precision", o.precision, "storage of weights, activations, gradients: bf16 | fp16 (dynamic loss scaling)")
      .flag("--bucket-mb", o.bucket_mb, "data parallel (several ranks): MB per gradient all-reduce bucket",
            train::positive<double>())
      .flag("--use-distributed-optimizer", o.distributed_optimizer,
            "ZeRO-1: shard the fp32 master weights and AdamW moments over the data-parallel ranks")
      .flag("--cuda-profile", o.cuda_profile,
            "after the timed steps, one more step between cudaProfilerStart and cudaProfilerStop, for ncu "
            "--profile-from-start off (bench/gpt_train/kernel-diff.sh: per-kernel time of two runs)");
  dpml::bench::energy_seconds_flag(args, o.energy_seconds);
  if (!args.parse(argc, argv, rank)) return false;
  const char* shape_flags[] = {"--layers", "--dim", "--heads", "--seq"};
  models::apply_gpt_preset(o.model_size, [&](int i) { return args.given(shape_flags[i]); }, o.model.layers, o.model.dim,
                           o.model.heads, o.seq);
  models::apply_recompute_granularity(recompute, o.model);
  DPML_REQUIRE_EVERYWHERE(o.schedule == "gpipe" || o.schedule == "1f1b" || o.schedule == "zb-h1" || o.schedule == "zbh1",
                          "gpt_train: --pipeline-schedule " << o.schedule << " is not gpipe, 1f1b or zb-h1");
  DPML_REQUIRE_EVERYWHERE(o.precision == "bf16" || o.precision == "fp16", "gpt_train: --precision " << o.precision << " is not bf16 or fp16");
  if (o.micro_batch == 0) o.micro_batch = o.batch;
  DPML_REQUIRE_EVERYWHERE(o.micro_batch > 0 && o.batch % o.micro_batch == 0,
                          "gpt_train: --micro-batch " << o.micro_batch << " does not divide --batch " << o.batch);
  DPML_REQUIRE_EVERYWHERE(o.model.layers >= o.pp, "gpt_train: --layers " << o.model.layers << " cannot fill --pp " << o.pp
                                                                         << " stages (every stage needs a block)");
  o.model.max_seq = std::max(o.model.max_seq, o.seq);
  return true;
}

// The estimate of models/gpt_memory.hpp for this launch (every rank kind), GPU terms.
models::GptMemoryEstimate estimate(const Options& o, int ranks) {
  const int dp = ranks / (o.tp * o.pp);
  models::GptConfig c = o.model;
  c.pad_multiple = std::max(1, 128 / o.tp);
  return models::estimate_gpt_memory(c, {.tp = o.tp, .pp = o.pp, .dp = std::max(dp, 1), .micro_batch = o.micro_batch, .seq = o.seq,
                                         .micro_batches = o.micro_batches(), .schedule = o.schedule == "zbh1" ? "zb-h1" : o.schedule,
                                         .zero = o.distributed_optimizer},
                                     models::GptMemoryTerms::gpu());
}

// Inputs and targets of one step, (B, T) each, from a token stream or random (the trainer uploads them).
class Batches {
 public:
  // Rank r of K reads its own batches: another random stream, or every K-th window of the data.
  Batches(const Options& o, int rank, int ranks) : n_(o.batch * o.seq), vocab_(o.model.vocab), rank_(rank), ranks_(ranks) {
    if (o.data.empty()) return;
    const auto t = data::read_token_shards({o.data});
    DPML_REQUIRE(static_cast<std::int64_t>(t.size()) > n_ + 1,
                 "gpt_train: --data " << o.data << " holds " << t.size() << " tokens, fewer than one batch (" << n_ + 1 << ")");
    stream_.assign(t.begin(), t.end());
  }
  // Step s's batch.
  void load(std::int64_t s, data::TokenBatch& b) const { fill(s, b.inputs.data(), b.targets.data()); }

 private:
  // inputs, targets (n) of step s.
  void fill(std::int64_t s, std::int32_t* inputs, std::int32_t* targets) const {
    if (stream_.empty()) {
      std::uint64_t x = 0x243F6A8885A308D3ull ^ static_cast<std::uint64_t>(s) ^ (static_cast<std::uint64_t>(rank_) << 40);
      for (std::int64_t i = 0; i < 2 * n_; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (i < n_ ? inputs[i] : targets[i - n_]) = static_cast<std::int32_t>(x % static_cast<std::uint64_t>(vocab_));
      }
    } else {
      const std::int64_t windows = (static_cast<std::int64_t>(stream_.size()) - 1) / n_;
      const std::int64_t base = ((s * ranks_ + rank_) % windows) * n_;
      for (std::int64_t i = 0; i < n_; ++i) {
        inputs[i] = stream_[base + i];
        targets[i] = stream_[base + i + 1];
        DPML_REQUIRE(inputs[i] < vocab_ && targets[i] < vocab_, "gpt_train: --data has token " << std::max(inputs[i], targets[i])
                                                                                               << " outside --vocab " << vocab_);
      }
    }
  }

  std::int64_t n_, vocab_;
  int rank_, ranks_;
  std::vector<std::int32_t> stream_;
};

}  // namespace

// What one run measured, on every rank alike (the slowest rank's times, the largest memory).
struct Measured {
  double ms_step = 0, exposed_ms = 0, ms_min = 0, ms_median = 0, launch_median = 0, mem_gib = 0, buffers_gib = 0;
  double power_w = NAN;           // all GPUs, while training on after the timed steps
  std::int64_t sent[3] = {};      // bytes a rank sent in a step, the most of any rank: gradients (data axis), tensor axis, pipeline
  std::vector<double> losses;     // per step of the warm-up and the timed steps (the last pipeline stage's, broadcast)
  std::int64_t skipped = 0;       // steps without an update (fp16 overflows)
  dpml::bench::MemoryPhases::Phases mem_parts;  // GiB taken by the end of each set-up phase
};

// Times `train_step` (which appends its step's host time to step_ms and its launch time to
// launch_ms, and ends synchronised) over the warm-up and timed steps; fills the times of `m`.
template <class Step>
void time_steps(const Options& o, const comm::Mpi& world, cudaStream_t stream, std::vector<double>& step_ms,
                std::vector<double>& launch_ms, Step&& train_step, Measured& m) {
  for (int i = 0; i < o.warmup; ++i) train_step();
  if (world.size() > 1) world.barrier();  // the ranks start the timed steps together
  m.ms_step = world.allreduce(dpml::bench::ms_per_step(o.steps, stream, train_step), comm::ReduceOp::max);
  // The timed steps' fastest and median host times, the slowest rank's: a DP step slower at its
  // minimum pays a fixed cost; one slower at the median only, jitter that the other rank waits for.
  std::vector<double> timed(step_ms.end() - o.steps, step_ms.end());
  std::sort(timed.begin(), timed.end());
  m.ms_min = world.allreduce(timed.front(), comm::ReduceOp::max);
  m.ms_median = world.allreduce(timed[timed.size() / 2], comm::ReduceOp::max);
  std::vector<double> launches(launch_ms.end() - o.steps, launch_ms.end());
  std::sort(launches.begin(), launches.end());
  m.launch_median = world.allreduce(launches[launches.size() / 2], comm::ReduceOp::max);
}

auto since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// The model (models/gpt.hpp) in T (bf16 or fp16) under the library's trainer, train::GptTrainer
// over a DeviceGrid; fp16 with dynamic loss scaling (train_gpt --fp16's defaults: from 2^16,
// doubling after 1000 clean steps).
template <class T>
Measured run_model(const Options& o, const comm::Mpi& world, const parallel::ProcessGrid& grid) {
  constexpr bool fp16 = std::is_same_v<T, kc::f16>;
  const int dp = grid.dp();
  Measured m;
  dpml::bench::MemoryPhases memory;  // where the composed model's memory goes
  kernels::Device<CudaSpace> dev;
  memory.after("device");
  const parallel::DeviceGrid<comm::Nccl> comms(grid, dev);
  memory.after("communicators");
  models::Gpt<T, CudaSpace> model(o.model, comms);
  layers::initialize_all(model.parameters(), 1337, &grid);  // GPT-2's: N(0, 0.02), LayerNorms 1 and 0, biases 0
  memory.after("model");
  Batches batches(o, grid.coord(Axis::data), dp);
  data::TokenBatch batch{Tensor<std::int32_t>(Shape{o.batch, o.seq}), Tensor<std::int32_t>(Shape{o.batch, o.seq})};
  const optim::AdamWOptions adam{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const parallel::DistributedOptimizerOptions dist{.bucket_bytes = static_cast<std::size_t>(o.bucket_mb * (1 << 20)), .clip = 1.0};
  const train::GptTrainOptions topt{
      .micro_batch = o.micro_batch, .global_batch = o.batch * dp, .seed = 1337, .on_nonfinite = train::NonFinite::skip,
      .loss_scaling = fp16 ? optim::LossScaling::dynamic_from({.initial = 65536.0, .window = 1000, .min = 1.0})
                           : optim::LossScaling{}};
  parallel::with_strategy(parallel::staged_model_schedule(o.schedule), o.distributed_optimizer, [&]<class Strategy>() {
    train::GptTrainer<Strategy, optim::AdamW, T, CudaSpace, comm::Nccl> trainer(model, comms, dev, adam, dist, topt);
    memory.after("trainer");
    std::int64_t step = 0;
    std::vector<double> step_ms, launch_ms;
    double exposed_s = 0;
    auto train_step = [&] {
      const auto start = std::chrono::steady_clock::now();
      ++step;
      batches.load(step, batch);
      const double lr = o.lr * std::min(1.0, static_cast<double>(step) / std::max(1, o.warmup));
      const auto r = trainer.train_step(batch, lr);  // ends with the norm and the loss read: synchronised
      m.losses.push_back(r.loss);
      m.skipped += r.skipped;
      exposed_s = r.exposed_comm_seconds;
      m.sent[0] = r.wire_bytes, m.sent[1] = r.tensor_bytes, m.sent[2] = r.pipeline.sent_bytes;
      launch_ms.push_back(r.pipeline.total * 1e3);  // the host's launches of the forward and backward
      step_ms.push_back(since(start));
      if (step == 1) memory.after("first step");
    };
    time_steps(o, world, dev.stream(), step_ms, launch_ms, train_step, m);
    m.exposed_ms = world.allreduce(exposed_s * 1e3, comm::ReduceOp::max);
    world.allreduce(m.sent, 3, comm::ReduceOp::max);
    const std::size_t timed = m.losses.size();
    m.power_w = dpml::bench::mean_power_w(world, o.energy_seconds, m.ms_step, train_step);
    if (o.cuda_profile) dpml::bench::profiled_step(train_step);
    m.losses.resize(timed);
    auto& opt = trainer.optimizer();
    std::size_t owned = 0;  // elements of optimizer state this rank holds (its shard under ZeRO-1)
    for (std::size_t i = 0; i < opt.optimizer().range_count(); ++i) owned += opt.optimizer().range(i).value.size();
    using Opt = std::remove_reference_t<decltype(opt.optimizer())>;
    const std::size_t bytes = 2 * static_cast<std::size_t>(opt.flat().numel()) * sizeof(T) +
                              owned * (Opt::kStates + (Opt::keeps_master ? 1 : 0)) * sizeof(typename Opt::master_type);
    m.buffers_gib = world.allreduce(static_cast<double>(bytes) / (1 << 30), comm::ReduceOp::max);
    dev.synchronize();
    m.mem_gib = world.allreduce(memory.gib(), comm::ReduceOp::max);
  });
  m.mem_parts = memory.phases();
  return m;
}

template <class T>
int run(const Options& o, const comm::Mpi& world) {
  const auto grid = parallel::ProcessGrid::create(world, {.tp = o.tp, .pp = o.pp});
  const int ranks = world.size(), dp = grid.dp();
  cudaDeviceProp prop{};
  int device = 0;
  DPML_CHECK_CUDA(cudaGetDevice(&device));
  DPML_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  const double peak = dpml::bench::measure_peak_tflops(8192);
  Measured r = run_model<T>(o, world, grid);
  grid.comm(Axis::pipeline).broadcast(r.losses.data(), r.losses.size(), o.pp - 1);  // the last stage has them
  if (world.rank() != 0) return 0;

  const auto& losses = r.losses;
  const double ms_step = r.ms_step;
  const double tokens = static_cast<double>(o.batch * o.seq) * dp;
  const double tok_s = tokens / (ms_step * 1e-3);
  const double n_params = static_cast<double>(o.model.parameter_count());
  const double flops_per_token = 6.0 * n_params + 12.0 * o.model.layers * o.seq * o.model.dim;
  const double model_tflops = flops_per_token * tok_s / ranks / 1e12;  // per GPU
  bool finite = true;
  for (double l : losses) finite = finite && std::isfinite(l);

  const int m = o.micro_batches();
  // "dpml-composed…": the impl names of the composed runs measured before the fused model's removal
  const std::string name = std::string("dpml-composed") + (o.model.recompute_gelu ? "" : "-saved-gelu") +
                           (o.model.recompute ? "-full-recompute" : "") +
                           (o.precision == "fp16" ? "-fp16" : "") + (o.tp > 1 ? "-tp" + std::to_string(o.tp) : "") +
                           (dp > 1 ? "-dp" + std::to_string(dp) : "") + (o.distributed_optimizer ? "-zero1" : "") +
                           (o.pp > 1 ? "-pp" + std::to_string(o.pp) + "-" + o.schedule : "") +
                           (m > 1 ? "-m" + std::to_string(m) : "");
  const char* impl = name.c_str();
  std::printf("{\"bench\":\"gpt_train\",\"impl\":\"%s\",\"device\":\"%s\",\"batch\":%lld,\"seq\":%lld,\"layers\":%lld,"
              "\"dim\":%lld,\"heads\":%lld,\"vocab\":%lld,\"recompute_gelu\":%s,\"recompute\":%s,\"params\":%.0f,\"steps\":%d,\"warmup\":%d,\"ms_per_step\":%.3f,"
              "\"tokens_per_s\":%.1f,\"model_tflops\":%.2f,\"peak_tflops\":%.1f,\"mfu\":%.4f,\"mem_gib\":%.3f,"
              "\"model_buffers_gib\":%.3f,\"loss_first\":%.4f,\"loss_last\":%.4f,\"finite\":%s,\"precision\":\"%s\",\"skipped_steps\":%lld,"
              "\"ranks\":%d,\"tp\":%d,\"dp\":%d,\"pp\":%d,\"schedule\":\"%s\",\"micro_batch\":%lld,\"micro_batches\":%d,"
              "\"bucket_mb\":%.1f,\"distributed_optimizer\":%s,\"exposed_comm_ms\":%.3f,\"step_ms_min\":%.3f,\"step_ms_median\":%.3f,\"launch_ms_median\":%.3f,"
              "\"power_w\":%s,\"tokens_per_j\":%s,\"wire_bytes\":%lld,\"tensor_bytes\":%lld,\"pipeline_bytes\":%lld}\n",
              impl, prop.name, static_cast<long long>(o.batch), static_cast<long long>(o.seq),
              static_cast<long long>(o.model.layers), static_cast<long long>(o.model.dim),
              static_cast<long long>(o.model.heads), static_cast<long long>(o.model.vocab),
              o.model.recompute_gelu ? "true" : "false", o.model.recompute ? "true" : "false", n_params, o.steps, o.warmup,
              ms_step, tok_s, model_tflops, peak, model_tflops / peak, r.mem_gib, r.buffers_gib, losses.front(), losses.back(),
              finite ? "true" : "false", o.precision.c_str(), static_cast<long long>(r.skipped), ranks, o.tp, dp, o.pp,
              o.pp > 1 || m > 1 ? o.schedule.c_str() : "none", static_cast<long long>(o.micro_batch), m, o.bucket_mb,
              o.distributed_optimizer ? "true" : "false",
              r.exposed_ms, r.ms_min, r.ms_median, r.launch_median, dpml::bench::json_number(r.power_w).c_str(),
              dpml::bench::json_number(tok_s / r.power_w).c_str(), static_cast<long long>(r.sent[0]),
              static_cast<long long>(r.sent[1]), static_cast<long long>(r.sent[2]));
  dpml::bench::print_memory_phases("gpt_train_memory", impl, r.mem_parts);  // rank 0's
  std::printf("{\"bench\":\"gpt_train_memory\",\"impl\":\"%s\",\"after\":\"estimate\",\"gib\":%.3f}\n", impl,
              estimate(o, ranks).largest().total() / (1 << 30));  // models/gpt_memory.hpp's, beside mem_gib (the largest rank's)

  std::printf("\nGPT-2 (L=%lld d=%lld H=%lld V=%lld) B=%lld (%d × %lld) T=%lld on %d × %s (tp %d × dp %d × pp %d), %s + fp32 master, AdamW, clip 1.0\n",
              static_cast<long long>(o.model.layers), static_cast<long long>(o.model.dim),
              static_cast<long long>(o.model.heads), static_cast<long long>(o.model.vocab),
              static_cast<long long>(o.batch), m, static_cast<long long>(o.micro_batch), static_cast<long long>(o.seq), ranks,
              prop.name, o.tp, dp, o.pp, o.precision.c_str());
  std::printf("| tokens/s | ms/step | MFU (vs %.0f TFLOP/s measured) | memory GiB | loss first → last |\n|---|---|---|---|---|\n",
              peak);
  std::printf("| %.0f | %.2f | %.1f%% | %.2f | %.3f → %.3f |\n\n", tok_s, ms_step, 100 * model_tflops / peak, r.mem_gib,
              losses.front(), losses.back());
  if (!finite) {
    std::fprintf(stderr, "gpt_train: a loss was not finite\n");
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const comm::Mpi& world) {
    Options o;
    if (!parse(argc, argv, world.rank(), o)) return 0;  // --help: printed, before any CUDA call
    if (o.dry_run) {
      if (world.rank() == 0) std::fputs(models::memory_table(estimate(o, world.size()), 0, "GPU").c_str(), stdout);
      return 0;
    }
    DPML_REQUIRE_EVERYWHERE(cuda_device_count() > 0, "gpt_train: no CUDA device");
    comm::select_device(world);
    return o.precision == "fp16" ? run<kc::f16>(o, world) : run<bf16>(o, world);
  });
}
