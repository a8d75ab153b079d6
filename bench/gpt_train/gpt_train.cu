// gpt_train: GPT-2 training throughput on one GPU or tensor/pipeline/data parallel on several, bf16 (or --precision
// fp16, with dynamic loss scaling) with fp32 master weights, AdamW (β = 0.9, 0.95, weight decay 0.1), global-norm clipping at 1.0 — the setup of
// bench/reference/torch_gpt.py, so the two print comparable JSON lines.
//
// Flags: train::Args (parse below; --help lists each with its default and range, printed by rank 0 before any CUDA
// call; a bad value exits 1 on every rank naming the flag). Counts and sizes are ≥ 1 (--warmup, --micro-batch ≥ 0:
// 0 is --batch), --lr and --bucket-mb > 0, --recompute-gelu 0|1 (a value, not a switch); --pp and --tp also answer to
// Megatron's --pipeline-model-parallel-size and --tensor-model-parallel-size; --use-distributed-optimizer and
// --cuda-profile are switches (--no-… turns them off). Choices (--model, --precision, …) and the flags' relations
// (--micro-batch divides --batch, --layers ≥ --pp, …) are checked right after.
//
//   --model fused      models/cuda/gpt.hpp, the hand-fused GPU model (default), and its own multi-GPU wiring (StageTrainer below)
//   --model composed   models::Gpt<bf16, CudaSpace> composed from the layers (models/gpt.hpp), trained by the library's trainer
//              (train::GptTrainer over a parallel::DeviceGrid: the same --tp, --pp, --pipeline-schedule, --micro-batch and
//              --use-distributed-optimizer); bf16 only, NCCL for the data axis; no per-family profile (the layers carry no
//              profiler); model_buffers_gib counts its flat parameters, gradients and optimizer state (activations are
//              tensors of the layers': mem_gib counts them). Run both in one job to compare them on the same GPU.
//
//   tokens/s   B·T · timed steps / wall time of the timed steps (each step ends with the loss
//              copied to the host, as a training loop that prints it does)
//   MFU        (6·N + 12·L·T·d) FLOPs per token × tokens/s / peak, N the unpadded parameter count;
//              peak = a bf16 8192³ cuBLASLt GEMM measured in the same run
//   memory     device memory this process took (cudaMemGetInfo before the model and after the run)
//   ranks      under mpirun/srun (scripts/launch.sh -n K), one GPU per rank, each on its own batch
//              of B sequences, gradients averaged by parallel/cuda/gradient_sync.hpp while the
//              backward runs; tokens/s counts all ranks (K·B·T per step over the slowest rank's
//              step time) and MFU is per GPU; exposed_comm_ms: how long the last timed step's
//              compute stream waited for its all-reduces
//   ZeRO-1     --use-distributed-optimizer (Megatron's flag): parallel/cuda/distributed_optimizer.hpp,
//              each rank holds the fp32 master weights and AdamW moments of its 1/K of the
//              parameters only (gradients reduce-scattered, weights all-gathered); mem_gib and
//              model_buffers_gib show the saving (12 bytes per parameter × (1 − 1/K));
//              exposed_comm_ms adds the norm's all-reduce and the all-gathers' tail
//   families   one extra step with CUDA events around each kernel family (a little slower than
//              the timed steps: the events serialise nothing but cost launches)
//   pipeline   --pp P (Megatron: --pipeline-model-parallel-size) cuts the blocks into P stages, one
//              per rank (models/cuda/gpt_pipeline.hpp); ranks = P × dp (parallel::ProcessGrid, data
//              parallel takes the rest). A step is --batch sequences per data-parallel replica, in
//              micro-batches of --micro-batch run by --pipeline-schedule (gpipe, 1f1b, zb-h1);
//              tokens/s counts dp · B · T per step, MFU is per GPU, memory the largest rank's, the
//              families stage 0's. pp = 1 with micro-batches accumulates them on one stage the same
//              way; pp = 1 with one micro-batch is the plain single-model step.
//   tensor     --tp N (Megatron: --tensor-model-parallel-size): groups of N consecutive ranks
//              (parallel::ProcessGrid, tensor axis fastest) split each block's heads and MLP
//              (models/cuda/gpt.hpp) and see the same tokens; ranks = N × P × dp with --pp P (each
//              stage tensor-parallel). tokens/s counts each token once (dp · B · T per step), MFU is
//              per GPU. With --use-distributed-optimizer the optimizer state is sharded over the
//              data axis of each tensor rank and pipeline stage.
#include "../support/memory_phases.cuh"
#include "../support/train_timing.cuh"

#include <dpml/comm/launch.hpp>
#include <dpml/comm/local_rank.hpp>
#include <dpml/comm/nccl.hpp>
#include <dpml/comm/nccl_copy_engine.hpp>
#include <dpml/core/bf16.hpp>
#include <dpml/core/cuda_error.hpp>
#include <dpml/core/cuda_space.hpp>
#include <dpml/data/token_shards.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/kernels/cuda/gemm/dispatch.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/cuda/gpt.hpp>
#include <dpml/models/cuda/gpt_pipeline.hpp>
#include <dpml/models/gpt.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/parallel/cuda/distributed_optimizer.hpp>
#include <dpml/parallel/cuda/gradient_sync.hpp>
#include <dpml/parallel/device_grid.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/parallel/pipeline/schedule.hpp>
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
  models::cuda::GptCudaConfig model;
  std::int64_t batch = 16, seq = 1024;
  int warmup = 5, steps = 20;
  double lr = 6e-4;
  std::string data;  // llm.c token shards (file or glob); empty: random tokens
  std::string precision = "bf16";
  double bucket_mb = 25;             // data parallel: all-reduce bucket size
  std::string grad_reduce = "bf16";  // data parallel: the type the gradients are averaged in
  std::string dp_comm = "nccl";      // data parallel: what all-reduces the buckets (nccl, copy-engine)
  std::string tied_grad = "auto";     // data parallel: how the tied wte gradient is reduced
  bool distributed_optimizer = false; // ZeRO-1: optimizer state sharded over the ranks
  int pp = 1;                        // pipeline stages
  int tp = 1;                        // tensor-parallel degree
  std::int64_t micro_batch = 0;      // sequences per micro-batch (0: --batch, one micro-batch)
  std::string schedule = "1f1b";     // pipeline schedule
  std::string model_kind = "fused";  // fused | composed
  bool cuda_profile = false;         // one more step between cudaProfilerStart/Stop (ncu --profile-from-start off)
  int micro_batches() const { return static_cast<int>(batch / micro_batch); }
};

models::cuda::TiedGradSync tied_grad_sync(const std::string& flag) {
  using models::cuda::TiedGradSync;
  return flag == "gather" ? TiedGradSync::gather : flag == "allreduce" ? TiedGradSync::all_reduce : TiedGradSync::automatic;
}

// Parses argv into o (a bad flag throws, Scope::everywhere); false after --help (printed by rank 0).
// Before any CUDA call, so that --help and bad flags need no GPU.
bool parse(int argc, char** argv, int rank, Options& o) {
  int recompute_gelu = o.model.recompute_gelu ? 1 : 0;  // a value (0|1), not a switch: scripts pass "--recompute-gelu 0"
  train::Args args(
      "gpt_train",
      "GPT-2 training throughput (tokens/s, MFU, memory) on one GPU, or data, tensor and pipeline parallel on\n"
      "several: bf16 (or fp16 with dynamic loss scaling), fp32 master weights, AdamW, clipping at 1.0; the setup of\n"
      "bench/reference/torch_gpt.py. Data parallel: scripts/launch.sh -n K gpt_train ... (one GPU per rank, each on\n"
      "its own batch of B); with --pp P and --tp N, K = N x P x dp ranks (a tensor group shares its batch).\n"
      "Prints JSON lines (bench gpt_train, gpt_train_family) and a table.");
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
      .flag("--layers", o.model.layers, "transformer blocks (GPT-2 124M: 12)", train::at_least(1))
      .flag("--heads", o.model.heads, "attention heads (GPT-2 124M: 12)", train::at_least(1))
      .flag("--dim", o.model.dim, "model width (GPT-2 124M: 768)", train::at_least(1))
      .flag("--vocab", o.model.vocab, "vocabulary (GPT-2: 50257; padded to a multiple of 128)", train::at_least(1))
      .flag("--warmup", o.warmup, "untimed steps first", train::at_least(0))
      .flag("--steps", o.steps, "timed steps", train::at_least(1))
      .flag("--lr", o.lr, "peak learning rate, linear warm-up over the warm-up steps", train::positive<double>())
      .flag("--data", o.data, "llm.c token shards (uint16 .bin, glob allowed); \"\": random tokens")
      .flag("--recompute-gelu", recompute_gelu,
            "1: recompute the GELU output in the backward; 0: save it per block", train::between(0, 1))
      .flag("--precision", o.precision, "storage of weights, activations, gradients: bf16 | fp16 (dynamic loss scaling)")
      .flag("--bucket-mb", o.bucket_mb, "data parallel (several ranks): MB per gradient all-reduce bucket",
            train::positive<double>())
      .flag("--grad-reduce", o.grad_reduce, "data parallel: average the gradients in their own 16-bit type or in fp32: bf16 | fp32")
      .flag("--dp-comm", o.dp_comm,
            "data parallel: all-reduce the buckets with NCCL's kernels, or (2 GPUs of one host) on the GPUs' copy engines, "
            "leaving the SMs to the backward (comm/nccl_copy_engine.hpp): nccl | copy-engine")
      .flag("--use-distributed-optimizer", o.distributed_optimizer,
            "ZeRO-1: shard the fp32 master weights and AdamW moments over the data-parallel ranks")
      .flag("--model", o.model_kind,
            "fused: the hand-fused GPU model (models/cuda/gpt.hpp) | composed: the layers' (models/gpt.hpp), trained by "
            "train::GptTrainer")
      .flag("--tied-grad", o.tied_grad,
            "data parallel, the tied wte gradient: gather (its embedding part from all ranks' token rows, its LM-head part "
            "all-reduced during the backward) | allreduce (wte whole, after the backward) | auto (gather where it moves "
            "fewer bytes)")
      .flag("--cuda-profile", o.cuda_profile,
            "after the timed steps, one more step between cudaProfilerStart and cudaProfilerStop, for ncu "
            "--profile-from-start off (bench/gpt_train/kernel_diff.py: per-kernel time, fused vs composed)");
  if (!args.parse(argc, argv, rank)) return false;
  o.model.recompute_gelu = recompute_gelu != 0;
  DPML_REQUIRE_EVERYWHERE(o.schedule == "gpipe" || o.schedule == "1f1b" || o.schedule == "zb-h1" || o.schedule == "zbh1",
                          "gpt_train: --pipeline-schedule " << o.schedule << " is not gpipe, 1f1b or zb-h1");
  DPML_REQUIRE_EVERYWHERE(o.precision == "bf16" || o.precision == "fp16", "gpt_train: --precision " << o.precision << " is not bf16 or fp16");
  DPML_REQUIRE_EVERYWHERE(o.grad_reduce == "bf16" || o.grad_reduce == "fp32", "gpt_train: --grad-reduce " << o.grad_reduce << " is not bf16 or fp32");
  DPML_REQUIRE_EVERYWHERE(!o.distributed_optimizer || o.grad_reduce == "bf16",
                          "gpt_train: --use-distributed-optimizer reduces the gradients in their own type; --grad-reduce "
                              << o.grad_reduce << " is not supported with it");
  DPML_REQUIRE_EVERYWHERE(o.tied_grad == "auto" || o.tied_grad == "gather" || o.tied_grad == "allreduce",
                          "gpt_train: --tied-grad " << o.tied_grad << " is not auto, gather or allreduce");
  DPML_REQUIRE_EVERYWHERE(o.dp_comm == "nccl" || o.dp_comm == "copy-engine",
                          "gpt_train: --dp-comm " << o.dp_comm << " is not nccl or copy-engine");
  DPML_REQUIRE_EVERYWHERE(!o.distributed_optimizer || o.dp_comm == "nccl",
                          "gpt_train: --use-distributed-optimizer reduce-scatters over NCCL; --dp-comm " << o.dp_comm
                              << " is not supported with it");
  DPML_REQUIRE_EVERYWHERE(o.model_kind == "fused" || o.model_kind == "composed",
                          "gpt_train: --model " << o.model_kind << " is not fused or composed");
  DPML_REQUIRE_EVERYWHERE(o.model_kind == "fused" || (o.precision == "bf16" && o.grad_reduce == "bf16" && o.dp_comm == "nccl"),
                          "gpt_train: --model composed trains in bf16 and reduces the gradients in bf16 over NCCL (--precision "
                              << o.precision << ", --grad-reduce " << o.grad_reduce << ", --dp-comm " << o.dp_comm << ")");
  if (o.micro_batch == 0) o.micro_batch = o.batch;
  DPML_REQUIRE_EVERYWHERE(o.micro_batch > 0 && o.batch % o.micro_batch == 0,
                          "gpt_train: --micro-batch " << o.micro_batch << " does not divide --batch " << o.batch);
  DPML_REQUIRE_EVERYWHERE(o.model.layers >= o.pp, "gpt_train: --layers " << o.model.layers << " cannot fill --pp " << o.pp
                                                                         << " stages (every stage needs a block)");
  o.model.max_seq = std::max(o.model.max_seq, o.seq);
  return true;
}

// bf16 GEMM peak: TFLOP/s of a square cuBLASLt GEMM of side n.
double measure_peak_tflops(std::int64_t n) {
  bf16 *a = nullptr, *c = nullptr;
  DPML_CHECK_CUDA(cudaMalloc(&a, n * n * sizeof(bf16)));
  DPML_CHECK_CUDA(cudaMalloc(&c, n * n * sizeof(bf16)));
  DPML_CHECK_CUDA(cudaMemset(a, 0x3c, n * n * sizeof(bf16)));  // 0x3c3c ≈ 0.0115: finite operands
  double tflops = 0;
  {
    kc::GemmContext ctx;
    const kc::GemmArgs<bf16> g{.ta = kc::Trans::no, .tb = kc::Trans::yes, .M = n, .N = n, .K = n, .A = a, .lda = n,
                               .B = a, .ldb = n, .C = c, .ldc = n};
    for (int i = 0; i < 3; ++i) kc::CublasLt::run<kc::epilogue::None>(ctx, g, nullptr);
    cudaEvent_t e0, e1;
    DPML_CHECK_CUDA(cudaEventCreate(&e0));
    DPML_CHECK_CUDA(cudaEventCreate(&e1));
    constexpr int kIters = 20;
    DPML_CHECK_CUDA(cudaEventRecord(e0));
    for (int i = 0; i < kIters; ++i) kc::CublasLt::run<kc::epilogue::None>(ctx, g, nullptr);
    DPML_CHECK_CUDA(cudaEventRecord(e1));
    DPML_CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    DPML_CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    tflops = 2.0 * n * n * n * kIters / (ms * 1e-3) / 1e12;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  cudaFree(a);
  cudaFree(c);
  return tflops;
}

// Inputs and targets of one step, (B, T) each, from a token stream or random.
class Batches {
 public:
  // Rank r of K reads its own batches: another random stream, or every K-th window of the data.
  Batches(const Options& o, int rank, int ranks) : n_(o.batch * o.seq), vocab_(o.model.vocab), rank_(rank), ranks_(ranks) {
    if (!o.data.empty()) {
      const auto t = data::read_token_shards({o.data});
      DPML_REQUIRE(static_cast<std::int64_t>(t.size()) > n_ + 1,
                   "gpt_train: --data " << o.data << " holds " << t.size() << " tokens, fewer than one batch (" << n_ + 1 << ")");
      stream_.assign(t.begin(), t.end());
    }
    DPML_CHECK_CUDA(cudaMallocHost(&host_, 2 * n_ * sizeof(std::int32_t)));
    DPML_CHECK_CUDA(cudaMalloc(&device_, 2 * n_ * sizeof(std::int32_t)));
  }
  ~Batches() {
    cudaFreeHost(host_);
    cudaFree(device_);
  }
  // Uploads step s's batch on `stream` (the fused model).
  void load(std::int64_t s, cudaStream_t stream) {
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream));  // the host buffer is free again
    fill(s, host_, host_ + n_);
    DPML_CHECK_CUDA(cudaMemcpyAsync(device_, host_, 2 * n_ * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream));
  }
  // Step s's batch in host memory (the composed model's trainer uploads it).
  void load(std::int64_t s, data::TokenBatch& b) { fill(s, b.inputs.data(), b.targets.data()); }
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
  const std::int32_t* inputs() const { return device_; }
  const std::int32_t* targets() const { return device_ + n_; }

 private:
  std::int64_t n_, vocab_;
  int rank_, ranks_;
  std::vector<std::int32_t> stream_;
  std::int32_t* host_ = nullptr;
  std::int32_t* device_ = nullptr;
};

}  // namespace

// This rank's share of the model: the whole model (pp = 1, one micro-batch: the plain step) or one
// pipeline stage (models/cuda/gpt_pipeline.hpp; pp = 1 with micro-batches: a one-stage pipeline).
template <class Precision>
class StageTrainer {
 public:
  using Model = models::cuda::Gpt<Precision>;
  StageTrainer(const Options& o, const parallel::ProcessGrid& grid) {
    const int m = o.micro_batches();
    if (o.pp == 1 && m == 1) {  // tensor parallel over the grid's tensor axis (a group of one: tp = 1)
      whole_ = std::make_unique<Model>(o.model, o.batch, o.seq, models::cuda::GptStagePlan{}, &grid.comm(Axis::tensor));
    } else {
      const auto schedule = parallel::with_strategy(o.schedule, false, [&]<class Strategy>() {
        return parallel::pipeline::make_schedule(typename Strategy::schedule{}, o.pp, m);
      });
      stages_ = std::make_unique<models::cuda::GptPipeline<Precision>>(o.model, o.micro_batch, o.seq, schedule, m,
                                                                       grid.comm(Axis::pipeline), &grid.comm(Axis::tensor));
    }
  }
  Model& model() { return stages_ ? stages_->model() : *whole_; }
  bool has_loss() const { return !stages_ || stages_->model().is_last_stage(); }
  void forward_backward(const std::int32_t* tokens, const std::int32_t* targets) {
    if (stages_) stages_->forward_backward(tokens, targets);
    else whole_->forward_backward(tokens, targets);
  }
  void update(double lr, std::int64_t step, const optim::AdamWOptions& opt, double clip) {
    if (stages_) stages_->update(lr, step, opt, clip);
    else whole_->update(lr, step, opt, clip);
  }
  // The step's mean loss (NaN on a stage without it); synchronises.
  double loss() {
    DPML_CHECK_CUDA(cudaStreamSynchronize(model().stream()));
    return stages_ ? stages_->loss() : whole_->loss();
  }
  double finish_step() { return stages_ ? stages_->finish_step() : whole_->finish_step(); }

 private:
  std::unique_ptr<Model> whole_;
  std::unique_ptr<models::cuda::GptPipeline<Precision>> stages_;
};

// What one run measured, on every rank alike (the slowest rank's times, the largest memory).
struct Measured {
  double ms_step = 0, exposed_ms = 0, ms_min = 0, ms_median = 0, launch_median = 0, mem_gib = 0, buffers_gib = 0;
  std::vector<double> losses;     // per step (the last pipeline stage's, broadcast)
  std::int64_t skipped = 0;       // steps without an update (fp16 overflows)
  const char* tied_grad = "none"; // how the tied wte gradient was reduced over the data axis
  std::vector<double> family_ms;  // per kernel family of models::cuda::kFamilyNames (the fused model only)
  dpml::bench::MemoryPhases::Phases mem_parts;  // GiB taken by the end of each set-up phase (the composed model)
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

// The fused model (models/cuda/gpt.hpp) and its own wiring.
template <class Precision>
Measured run_fused(const Options& o, const comm::Mpi& world, const parallel::ProcessGrid& grid) {
  using Act = typename Precision::type;
  const int dp = grid.dp();
  DPML_REQUIRE_EVERYWHERE(o.dp_comm != "copy-engine" || dp == 2,
                          "gpt_train: --dp-comm copy-engine needs a data axis of 2 ranks on one host; this layout has dp = "
                              << dp << " (" << world.size() << " ranks, --tp " << o.tp << ", --pp " << o.pp << ")");
  Measured m;
  const dpml::bench::MemoryPhases memory;  // no phases: the whole run's memory
  StageTrainer<Precision> trainer(o, grid);
  auto& model = trainer.model();
  Batches batches(o, grid.coord(Axis::data), dp);  // a pipeline's stages, a tensor group read the same batch
  // Data parallel: the gradients averaged in their own type or widened to fp32; or ZeRO-1, attached
  // before the weights are initialised (the model never allocates the full optimizer state).
  std::unique_ptr<parallel::cuda::GradientListener> sync;
  std::function<double()> exposed_ms = [] { return 0.0; };
  const parallel::cuda::GradientSyncOptions sync_opt{.bucket_bytes = static_cast<std::size_t>(o.bucket_mb * (1 << 20))};
  const auto flat = static_cast<std::size_t>(model.parameter_count());
  if (o.distributed_optimizer) {
    auto z = std::make_unique<parallel::cuda::DistributedOptimizer<Act>>(
        comm::Nccl::from(grid.comm(Axis::data)), model.weights(), model.gradients(), flat, model.stream(), sync_opt);
    exposed_ms = [p = z.get()] { return p->exposed_ms(); };
    model.set_distributed_optimizer(z.get(), tied_grad_sync(o.tied_grad));
    sync = std::move(z);
  } else if (dp > 1) {
    auto attach = [&]<class Wire, class Comm>(std::type_identity<Wire>, Comm comm) {
      auto s = std::make_unique<parallel::cuda::GradientSync<Act, Wire, Comm>>(std::move(comm), model.gradients(), flat,
                                                                               model.stream(), sync_opt);
      exposed_ms = [p = s.get()] { return p->exposed_ms(); };
      sync = std::move(s);
    };
    auto over = [&]<class Wire>(std::type_identity<Wire> wire) {
      if (o.dp_comm == "copy-engine") attach(wire, comm::CopyEngine::from(grid.comm(Axis::data)));
      else attach(wire, comm::Nccl::from(grid.comm(Axis::data)));
    };
    if (o.grad_reduce == "fp32") over(std::type_identity<float>{});
    else over(std::type_identity<Act>{});
    model.set_gradient_sync(sync.get(), tied_grad_sync(o.tied_grad));
  }
  model.init_random(1337);  // the same on every rank
  const optim::AdamWOptions adam{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const cudaStream_t s = model.stream();
  std::int64_t step = 0;
  // step_ms: host wall time of each step (each ends synchronised); launch_ms: of its launches alone
  // (until the loss read): near step_ms, the GPU waits for the host.
  std::vector<double> step_ms, launch_ms;
  auto train_step = [&] {
    const auto start = std::chrono::steady_clock::now();
    ++step;
    batches.load(step, s);
    trainer.forward_backward(batches.inputs(), batches.targets());
    const double lr = o.lr * std::min(1.0, static_cast<double>(step) / std::max(1, o.warmup));
    trainer.update(lr, step - m.skipped, adam, 1.0);
    launch_ms.push_back(since(start));
    m.losses.push_back(trainer.loss());  // synchronises: the step is done
    if constexpr (Precision::loss_scaling) m.skipped += !std::isfinite(trainer.finish_step());  // the loss scale
    step_ms.push_back(since(start));
  };
  time_steps(o, world, s, step_ms, launch_ms, train_step, m);
  m.exposed_ms = world.allreduce(exposed_ms(), comm::ReduceOp::max);
  if (o.cuda_profile) dpml::bench::profiled_step(train_step);
  const auto families = dpml::bench::family_ms<models::cuda::Profiler>(model, train_step);
  m.family_ms.assign(families.begin(), families.end());
  DPML_CHECK_CUDA(cudaDeviceSynchronize());
  m.mem_gib = world.allreduce(memory.gib(), comm::ReduceOp::max);
  m.buffers_gib = world.allreduce(static_cast<double>(model.device_bytes()) / (1 << 30), comm::ReduceOp::max);
  m.tied_grad = dp == 1 ? "none" : model.gathers_tied_gradient() ? "gather" : "allreduce";
  return m;
}

// The composed model (models/gpt.hpp) under the library's trainer: the same step on the same
// batches, through train::GptTrainer over a DeviceGrid.
Measured run_composed(const Options& o, const comm::Mpi& world, const parallel::ProcessGrid& grid) {
  using T = bf16;
  const int dp = grid.dp();
  Measured m;
  dpml::bench::MemoryPhases memory;  // where the composed model's memory goes
  kernels::Device<CudaSpace> dev;
  memory.after("device");
  const parallel::DeviceGrid<comm::Nccl> comms(grid, dev);
  memory.after("communicators");
  const models::GptConfig cfg{.vocab = o.model.vocab, .max_seq = o.model.max_seq, .layers = o.model.layers,
                              .heads = o.model.heads, .dim = o.model.dim, .pad_multiple = 128,
                              .recompute_gelu = o.model.recompute_gelu};
  models::Gpt<T, CudaSpace> model(cfg, comms);
  layers::initialize_all(model.parameters(), 1337, &grid);  // GPT-2's: N(0, 0.02), LayerNorms 1 and 0, biases 0
  memory.after("model");
  Batches batches(o, grid.coord(Axis::data), dp);
  data::TokenBatch batch{Tensor<std::int32_t>(Shape{o.batch, o.seq}), Tensor<std::int32_t>(Shape{o.batch, o.seq})};
  const optim::AdamWOptions adam{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const parallel::DistributedOptimizerOptions dist{.bucket_bytes = static_cast<std::size_t>(o.bucket_mb * (1 << 20)), .clip = 1.0};
  const train::GptTrainOptions topt{.micro_batch = o.micro_batch, .global_batch = o.batch * dp, .seed = 1337,
                                    .on_nonfinite = train::NonFinite::skip};
  parallel::with_strategy(o.schedule, o.distributed_optimizer, [&]<class Strategy>() {
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
      launch_ms.push_back(r.pipeline.total * 1e3);  // the host's launches of the forward and backward
      step_ms.push_back(since(start));
      if (step == 1) memory.after("first step");
    };
    time_steps(o, world, dev.stream(), step_ms, launch_ms, train_step, m);
    m.exposed_ms = world.allreduce(exposed_s * 1e3, comm::ReduceOp::max);
    if (o.cuda_profile) dpml::bench::profiled_step(train_step);
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
  m.tied_grad = dp == 1 ? "none" : "allreduce";
  m.mem_parts = memory.phases();
  return m;
}

template <class Precision>
int run(const Options& o, const comm::Mpi& world) {
  const auto grid = parallel::ProcessGrid::create(world, {.tp = o.tp, .pp = o.pp});
  const int ranks = world.size(), dp = grid.dp();
  cudaDeviceProp prop{};
  int device = 0;
  DPML_CHECK_CUDA(cudaGetDevice(&device));
  DPML_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  const double peak = measure_peak_tflops(8192);
  const bool composed = o.model_kind == "composed";
  Measured r = composed ? run_composed(o, world, grid) : run_fused<Precision>(o, world, grid);
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
  const std::string name = std::string("dpml") + (composed ? "-composed" : "") + (o.model.recompute_gelu ? "" : "-saved-gelu") +
                           (Precision::loss_scaling ? "-fp16" : "") + (o.tp > 1 ? "-tp" + std::to_string(o.tp) : "") +
                           (dp > 1 ? "-dp" + std::to_string(dp) : "") +
                           (dp > 1 && o.grad_reduce == "fp32" ? "-fp32-reduce" : "") +
                           (dp > 1 && o.dp_comm == "copy-engine" ? "-copy-engine" : "") +
                           (o.distributed_optimizer ? "-zero1" : "") +
                           (o.pp > 1 ? "-pp" + std::to_string(o.pp) + "-" + o.schedule : "") +
                           (m > 1 ? "-m" + std::to_string(m) : "");
  const char* impl = name.c_str();
  std::printf("{\"bench\":\"gpt_train\",\"impl\":\"%s\",\"model\":\"%s\",\"device\":\"%s\",\"batch\":%lld,\"seq\":%lld,\"layers\":%lld,"
              "\"dim\":%lld,\"heads\":%lld,\"vocab\":%lld,\"recompute_gelu\":%s,\"params\":%.0f,\"steps\":%d,\"warmup\":%d,\"ms_per_step\":%.3f,"
              "\"tokens_per_s\":%.1f,\"model_tflops\":%.2f,\"peak_tflops\":%.1f,\"mfu\":%.4f,\"mem_gib\":%.3f,"
              "\"model_buffers_gib\":%.3f,\"loss_first\":%.4f,\"loss_last\":%.4f,\"finite\":%s,\"precision\":\"%s\",\"skipped_steps\":%lld,"
              "\"ranks\":%d,\"tp\":%d,\"dp\":%d,\"pp\":%d,\"schedule\":\"%s\",\"micro_batch\":%lld,\"micro_batches\":%d,"
              "\"bucket_mb\":%.1f,\"grad_reduce\":\"%s\",\"dp_comm\":\"%s\",\"distributed_optimizer\":%s,\"tied_grad\":\"%s\",\"exposed_comm_ms\":%.3f,\"step_ms_min\":%.3f,\"step_ms_median\":%.3f,\"launch_ms_median\":%.3f}\n",
              impl, o.model_kind.c_str(), prop.name, static_cast<long long>(o.batch), static_cast<long long>(o.seq),
              static_cast<long long>(o.model.layers), static_cast<long long>(o.model.dim),
              static_cast<long long>(o.model.heads), static_cast<long long>(o.model.vocab),
              o.model.recompute_gelu ? "true" : "false", n_params, o.steps, o.warmup,
              ms_step, tok_s, model_tflops, peak, model_tflops / peak, r.mem_gib, r.buffers_gib, losses.front(), losses.back(),
              finite ? "true" : "false", Precision::name.data(), static_cast<long long>(r.skipped), ranks, o.tp, dp, o.pp,
              o.pp > 1 || m > 1 ? o.schedule.c_str() : "none", static_cast<long long>(o.micro_batch), m, o.bucket_mb,
              o.grad_reduce.c_str(), dp > 1 ? o.dp_comm.c_str() : "none", o.distributed_optimizer ? "true" : "false", r.tied_grad,
              r.exposed_ms, r.ms_min, r.ms_median, r.launch_median);
  std::array<double, static_cast<int>(models::cuda::Family::count)> families{};
  if (!r.family_ms.empty()) {
    std::copy(r.family_ms.begin(), r.family_ms.end(), families.begin());
    dpml::bench::print_families("gpt_train_family", impl, families, models::cuda::kFamilyNames);
  }
  dpml::bench::print_memory_phases("gpt_train_memory", impl, r.mem_parts);  // rank 0's

  std::printf("\nGPT-2 (L=%lld d=%lld H=%lld V=%lld) B=%lld (%d × %lld) T=%lld on %d × %s (tp %d × dp %d × pp %d), %s + fp32 master, AdamW, clip 1.0, %s model\n",
              static_cast<long long>(o.model.layers), static_cast<long long>(o.model.dim),
              static_cast<long long>(o.model.heads), static_cast<long long>(o.model.vocab),
              static_cast<long long>(o.batch), m, static_cast<long long>(o.micro_batch), static_cast<long long>(o.seq), ranks,
              prop.name, o.tp, dp, o.pp, Precision::name.data(), o.model_kind.c_str());
  std::printf("| tokens/s | ms/step | MFU (vs %.0f TFLOP/s measured) | memory GiB | loss first → last |\n|---|---|---|---|---|\n",
              peak);
  std::printf("| %.0f | %.2f | %.1f%% | %.2f | %.3f → %.3f |\n\n", tok_s, ms_step, 100 * model_tflops / peak, r.mem_gib,
              losses.front(), losses.back());
  if (!r.family_ms.empty()) dpml::bench::print_family_table(families, models::cuda::kFamilyNames);
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
    DPML_REQUIRE_EVERYWHERE(cuda_device_count() > 0, "gpt_train: no CUDA device");
    comm::select_device(world);
    return o.precision == "fp16" ? run<models::cuda::Fp16>(o, world) : run<models::cuda::Bf16>(o, world);
  });
}
