#pragma once
// models::cuda::GptPipeline: pipeline parallelism for the GPU GPT (models/cuda/gpt.hpp). Each rank
// of the pipeline axis is one stage: a Gpt built for that stage (its contiguous blocks; stage 0
// also wte and wpe, the last stage ln_f and the LM head with its copy of the tied wte) and sized
// from the schedule table (parallel/pipeline/partition.hpp), so that it keeps what the table needs:
//
//   activation sets       plan_buffers(row, m, {F, RecvBackward, B, W}): GPipe m, 1F1B
//                         min(p − s, m), ZB-H1 min(p, m) micro-batches of activations
//   input sets            plan_buffers(row, m, {RecvForward, F, B, W}): the stage input, which is
//                         received one action before its F
//   weight-gradient sets  none where every W follows its B (GPipe, 1F1B, ZB-H1's stage 0): B forms
//                         the weight gradients as the unsplit backward does and W is empty; else
//                         plan_buffers(row, m, {B, W}) sets of the dy's a delayed W reads (ZB-H1:
//                         11·B·T·C elements per block each, see gpt.hpp)
//
// A step, forward_backward(tokens, targets): the executor (parallel/pipeline/executor.hpp) runs this
// stage's row of the table, its messages through a cuda::StreamTransport over Comm on the
// communication stream (Comm's own), ordered against the model's stream by CUDA events: nothing in
// the step waits on the host. The transport launches its groups alike on both sides of each pair
// of stages (pipeline::peer_batches, from the whole table). Then the first and the last stage sum
// the two copies of the tied wte gradient (a Comm of those two ranks, on the model's stream:
// Gpt::link_stages) — before its data-parallel reduction, when a GradientSync or a ZeRO-1
// DistributedOptimizer over the data axis is attached to model(): the step's last W's launch the
// buckets block by block, and wte's, first in a stage's buffer, only after the sum. update(): every
// stage's squared gradient norm (the last stage leaves its wte copy out) summed over the
// pipeline, then clip and AdamW on each stage, identically on both wte copies, which therefore
// stay equal.
//
// The loss is the mean over all the step's tokens, known on the last stage (loss(); NaN on the
// others: broadcast it over the pipeline where every stage wants it).
//
// Tensor parallelism inside the stages (tp × pp): given the tensor group, each stage is a
// tensor-parallel Gpt (gpt.hpp), and `pipe` is this rank's pipeline axis — the ranks of equal
// tensor (and data) coordinate — so each rank sends its stage's whole (B, T, C) activations to the
// rank of the same tensor coordinate on the next stage, and the tied pair and the norm's sum over
// the stages run per tensor coordinate too (the norm is already summed over the tensor axis).
//
//   const auto grid = ProcessGrid::create(world, {.pp = 2});
//   const int m = 8;
//   GptPipeline<> pipe(cfg, micro_batch, seq, make_schedule(OneFOneB{}, 2, m), m, grid.comm(Axis::pipeline));
//   // tp × pp: ProcessGrid::create(world, {.tp = 2, .pp = 2}), and &grid.comm(Axis::tensor) last
//   pipe.model().init_random(1337);               // the whole model's values for this stage's tensors
//   pipe.forward_backward(tokens, targets);       // (m · micro_batch, T) int32 each, on the device
//   pipe.update(lr, step, adam, 1.0);

#include "dpml/comm/mpi.hpp"
#include "dpml/comm/nccl.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/cuda_space.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/models/cuda/gpt.hpp"
#include "dpml/parallel/cuda/pipeline_transport.hpp"
#include "dpml/parallel/pipeline/executor.hpp"
#include "dpml/parallel/pipeline/partition.hpp"
#include "dpml/parallel/pipeline/peer_batches.hpp"
#include "dpml/parallel/pipeline/schedule.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace dpml::models::cuda {

template <class Precision = Bf16, class Comm = comm::Nccl>
class GptPipeline {
 public:
  using Model = Gpt<Precision, Comm>;
  using Act = typename Model::Act;

  // Collective over `pipe`, the pipeline axis (this rank is stage pipe.rank()), and over
  // `tensor_group` when given (each stage tensor-parallel over it). `schedule`: a table for
  // pipe.size() stages and `micro_batches` micro-batches of `micro_batch` sequences of `seq`.
  GptPipeline(const GptCudaConfig& cfg, std::int64_t micro_batch, std::int64_t seq, const parallel::pipeline::Schedule& schedule,
              int micro_batches, const comm::Mpi& pipe, const comm::Mpi* tensor_group = nullptr)
      : m_(micro_batches), actions_(row_of(schedule, micro_batches, pipe)), buffers_(plan(actions_, micro_batches)),
        model_(cfg, micro_batch, seq,
               GptStagePlan{.stage = pipe.rank(), .stages = pipe.size(), .activation_sets = buffers_.sets.count,
                            .input_sets = buffers_.inputs.count, .weight_grad_sets = buffers_.weight_grads.count},
               tensor_group),
        comm_(Comm::from(pipe)), transport_(parallel::cuda::StreamLauncher<Act, Comm>(comm_, model_.stream()),
                   parallel::pipeline::peer_batches(schedule, pipe.rank())),
        stage_(*this) {
    if (pipe.size() > 1) {  // the tied pair (first and last stage), and the norm's sum over the stages
      const bool member = model_.is_first_stage() || model_.is_last_stage();
      const comm::Mpi pair = pipe.split(member ? 0 : MPI_UNDEFINED, pipe.rank());
      if (member) tied_.emplace(Comm::from(pair, model_.stream()));
      model_.link_stages(tied_ ? &*tied_ : nullptr, [this](double* norm_sq) { sum_over_stages(norm_sq); });
    }
    if (model_.is_last_stage())
      DPML_CHECK_CUDA(cudaMallocHost(&host_losses_, static_cast<std::size_t>(m_ * tokens_per_micro_batch()) * sizeof(float)));
    DPML_CHECK_CUDA(cudaEventCreateWithFlags(&norm_ready_, cudaEventDisableTiming));
    DPML_CHECK_CUDA(cudaEventCreateWithFlags(&norm_summed_, cudaEventDisableTiming));
  }
  GptPipeline(const GptPipeline&) = delete;
  GptPipeline& operator=(const GptPipeline&) = delete;
  ~GptPipeline() {
    cudaEventDestroy(norm_ready_);
    cudaEventDestroy(norm_summed_);
    if (host_losses_) cudaFreeHost(host_losses_);
  }

  // This stage's model: parameters (copy_from, init_random, gradient, read_state…), the data-parallel
  // GradientSync (set_gradient_sync), the profiler.
  Model& model() noexcept { return model_; }
  const Model& model() const noexcept { return model_; }
  // The sets the model was built with (activation sets: the schedule's peak in flight on this stage).
  const GptStagePlan& stage_plan() const noexcept { return model_.plan(); }

  // One step: tokens and targets (m · micro_batch, T) int32 on the device, micro-batch i in rows
  // [i · micro_batch, (i + 1) · micro_batch). Stage 0 reads the tokens, the last stage the targets
  // (the others may pass nullptr). Afterwards the gradients are the step's on every stage.
  void forward_backward(const std::int32_t* tokens, const std::int32_t* targets) {
    DPML_REQUIRE(tokens || !model_.is_first_stage(), "GptPipeline: pipeline stage 0 needs the tokens");
    DPML_REQUIRE(targets || !model_.is_last_stage(), "GptPipeline: the last pipeline stage needs the targets");
    tokens_ = tokens;
    targets_ = targets;
    model_.begin_step(m_);
    parallel::pipeline::run_stage(actions_, stage_, transport_);  // its host times are launch times: not kept
    model_.finish_tied_gradients();
  }
  // Global norm over the pipeline → clip → AdamW (step ≥ 1): Gpt::update, whose norm the stages
  // sum (link_stages); under ZeRO-1 the distributed optimizer's update, the same way.
  void update(double lr, std::int64_t step, const optim::AdamWOptions& opt, double clip) { model_.update(lr, step, opt, clip); }
  // Mean loss per token of the last step (last stage; NaN on the others); synchronises.
  double loss() const {
    if (!model_.is_last_stage()) return std::numeric_limits<double>::quiet_NaN();
    DPML_CHECK_CUDA(cudaStreamSynchronize(model_.stream()));
    const std::int64_t n = m_ * tokens_per_micro_batch();
    double s = 0;
    for (std::int64_t i = 0; i < n; ++i) s += host_losses_[i];
    return s / static_cast<double>(n);
  }
  double grad_norm() const { return model_.grad_norm(); }  // of the whole model, on every stage
  double finish_step() { return model_.finish_step(); }

 private:
  // What the schedule says this stage keeps (see the header comment).
  struct Buffers {
    parallel::pipeline::BufferPlan sets, inputs, weight_grads;  // weight_grads.count 0: W inside B
  };

  // pipeline::Stage over the model: micro-batch mb in its sets, reading its rows of the batch.
  class Stage {
   public:
    using value_type = Act;
    using View = TensorView<Act, CudaSpace>;
    using ConstView = TensorView<const Act, CudaSpace>;
    explicit Stage(GptPipeline& p) : p_(p) {}

    void forward(int mb) {
      p_.model_.forward_micro_batch(mb, p_.slots(mb), p_.rows(p_.tokens_, mb), p_.rows(p_.targets_, mb));
      if (p_.model_.is_last_stage())
        DPML_CHECK_CUDA(cudaMemcpyAsync(p_.host_losses_ + mb * p_.tokens_per_micro_batch(), p_.model_.token_losses(),
                                        static_cast<std::size_t>(p_.tokens_per_micro_batch()) * sizeof(float),
                                        cudaMemcpyDeviceToHost, p_.model_.stream()));
    }
    void backward_input(int mb) { p_.model_.backward_input_micro_batch(mb, p_.slots(mb), p_.rows(p_.tokens_, mb)); }
    void backward_weight(int mb) { p_.model_.backward_weight_micro_batch(mb, p_.slots(mb), p_.rows(p_.tokens_, mb)); }
    View recv_forward_buffer(int mb) { return view(p_.model_.stage_input(index(p_.buffers_.inputs, mb))); }
    ConstView send_forward_buffer(int mb) { return view(p_.model_.stage_output(index(p_.buffers_.sets, mb))); }
    View recv_backward_buffer(int mb) { return view(p_.model_.output_gradient(index(p_.buffers_.sets, mb))); }
    ConstView send_backward_buffer(int mb) { return view(p_.model_.input_gradient(index(p_.buffers_.sets, mb))); }

   private:
    template <class T>
    TensorView<T, CudaSpace> view(T* data) const {  // (B·T·C) message
      return {data, Shape{p_.model_.message_elements()}};
    }
    GptPipeline& p_;
  };
  static_assert(parallel::pipeline::Stage<Stage>);

  static std::vector<parallel::pipeline::Action> row_of(const parallel::pipeline::Schedule& schedule, int m, const comm::Mpi& pipe) {
    DPML_REQUIRE(m >= 1, "GptPipeline: " << m << " micro-batches; a step needs at least 1");
    const Status ok = parallel::pipeline::check_schedule(schedule, pipe.size(), m);
    DPML_REQUIRE(ok.ok(), "GptPipeline: the schedule is not a step of " << pipe.size() << " stages (--pp) and " << m
                                                                        << " micro-batches: " << ok.message());
    return schedule[static_cast<std::size_t>(pipe.rank())];
  }
  static Buffers plan(const std::vector<parallel::pipeline::Action>& row, int m) {
    using parallel::pipeline::Op;
    using parallel::pipeline::plan_buffers;
    Buffers b;
    b.sets = plan_buffers(row, m, {Op::Forward, Op::RecvBackward, Op::BackwardInput, Op::BackwardWeight});
    b.inputs = plan_buffers(row, m, {Op::RecvForward, Op::Forward, Op::BackwardInput, Op::BackwardWeight});
    if (!parallel::pipeline::weight_follows_input(row)) b.weight_grads = plan_buffers(row, m, {Op::BackwardInput, Op::BackwardWeight});
    return b;
  }
  static int index(const parallel::pipeline::BufferPlan& p, int mb) { return p.index[static_cast<std::size_t>(mb)]; }
  // Σ of a device double over the stages, on the communication stream between the model stream's events.
  void sum_over_stages(double* value) {
    DPML_CHECK_CUDA(cudaEventRecord(norm_ready_, model_.stream()));
    DPML_CHECK_CUDA(cudaStreamWaitEvent(comm_.stream(), norm_ready_, 0));
    comm_.allreduce(value, 1, comm::ReduceOp::sum);
    DPML_CHECK_CUDA(cudaEventRecord(norm_summed_, comm_.stream()));
    DPML_CHECK_CUDA(cudaStreamWaitEvent(model_.stream(), norm_summed_, 0));
  }
  typename Model::Slots slots(int mb) const {
    return {.set = index(buffers_.sets, mb), .input = index(buffers_.inputs, mb),
            .weight_grads = buffers_.weight_grads.count > 0 ? index(buffers_.weight_grads, mb) : -1};
  }
  std::int64_t tokens_per_micro_batch() const noexcept { return model_.message_elements() / model_.config().dim; }
  // Micro-batch mb's rows of a (m · micro_batch, T) batch (null stays null).
  const std::int32_t* rows(const std::int32_t* batch, int mb) const { return batch ? batch + mb * tokens_per_micro_batch() : nullptr; }

  int m_;
  std::vector<parallel::pipeline::Action> actions_;  // this stage's row of the table
  Buffers buffers_;
  Model model_;
  Comm comm_;                 // the pipeline axis, on the communication stream
  std::optional<Comm> tied_;  // first and last stage (pp > 1), on the model's stream
  parallel::cuda::StreamTransport<Act, Comm> transport_;
  Stage stage_;
  const std::int32_t *tokens_ = nullptr, *targets_ = nullptr;  // of the running step
  float* host_losses_ = nullptr;                                 // (m · B · T) pinned, last stage
  cudaEvent_t norm_ready_ = nullptr, norm_summed_ = nullptr;
};

}  // namespace dpml::models::cuda
