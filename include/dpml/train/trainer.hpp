#pragma once
// train::Trainer<Model, Loss, Strategy, Rule, Space>: one training step of any model under any
// (dp, tp, pp) layout — the one trainer of dpml.
//
//   Model     any Layer (a Sequential, a Stack, a layer of one's own: the library cuts a
//             Sequential/Stack into pp stages, LayerStage in train/layer_stage.hpp), a model
//             with pipeline-stage members of its own (StagedModel: models::Gpt), or v such
//             stages per rank for the interleaved schedule (ChunkedModel: models::GptChunks)
//   Loss      a loss layer (LossLayer: forward(ctx, logits, targets) adds to a running sum,
//             backward(ctx) gives dlogits, take_loss()), or ModelLoss where the model's last
//             stage computes its loss itself
//   Strategy  parallel::Parallel<TensorParallel, PipelineParallel<Schedule>, DataParallel<…>>
//   Rule      the update rule (optim::Sgd, optim::AdamW, …)
//   Space     the memory space (the model's)
//   Comm, DataComm  the device communicators (parallel::DeviceGrid<Comm, DataComm>) on a GPU;
//             comm::Mpi, the grid's own, on the host. DataComm follows the Strategy:
//             comm::Hierarchical<Comm> under DataParallel<…, Hierarchical> (the grid's data nodes)
//
// One step on this data rank's batch (any TrainBatch: train/batch.hpp):
//   m micro-batches, rows [n·i/m, n·(i+1)/m) of the batch (TrainOptions::micro_batches), each in
//   an activation slot (Context::micro_batch) reused once its micro-batch's W is done —
//   pipeline::plan_buffers: the schedule's peak in flight (GPipe m, 1F1B p − s, ZB-H1 p), so the
//   layers keep that many micro-batches' activations, not m
//   the schedule's actions for this stage (GPipe | 1F1B | ZB-H1 | interleaved 1F1B, whose v chunks
//   per rank — TrainOptions::virtual_stages — are a LayerStage each or the ChunkedModel's chunks,
//   virtual stage c·pp + rank, every action naming its chunk) through the pipeline executor:
//     F  forward of micro-batch i (first stage: the batch's inputs; others: the activation
//        received); the last stage adds the loss
//     B  backward_input (last stage: from the loss; others: the gradient received)
//     W  backward_weight → ctx.grad_ready → gradient buckets reduce over the data axis
//   tied parameters (a model's tied_parameter(), finish_tied_gradients(): GPT's embedding on its
//   first and last stage) held back from their bucket until summed
//   non-finite check (TrainOptions::on_nonfinite), DistributedOptimizer: global norm, clip,
//   update, ZeRO-1 all-gather (DataParallel<Zero1>)
// The loss divides by the target elements of the whole step (Context::global_batch; a batch whose
// BatchTraits has loss_elements says how many count: a masked LM's masked positions), so the
// summed gradients are the sequential run's on the same global batch whatever the layout; the
// step's loss is reported on every rank. ctx.deferred_weight_gradients is set from the schedule:
// true iff on this stage some W does not follow its B (ZB-H1 on stages > 0).
//
// Message shapes: what crosses a stage boundary is a tensor whose first dimension counts the
// micro-batch's samples; the rest of its shape is learnt once per input shape by a forward of
// micro-batch 0 in eval mode through the stages, each sending the next one the shape before the
// data (a probe: no weight, no statistic changes). A boundary whose first dimension is not the
// samples is refused, naming the stage.
//
// Non-finite steps: after the data-parallel reduction and before the update, one all-reduce asks
// whether the loss or any gradient this rank updates is NaN/inf. `skip` drops the step (no
// update, the optimizer's step count unchanged; rank 0 prints a line naming the step), `stop`
// raises an Error on every rank naming the step and the first non-finite gradient in model order
// (pipeline stage, then registration order), `ignore` updates anyway (no check).
//
// Loss scaling (TrainOptions::loss_scaling, optim/loss_scale.hpp; fp16 needs it): the step's scale
// S goes to the loss layers as ctx.loss_scale (their gradient seed is S times the true one, the
// loss they report is not) and to the DistributedOptimizer, which reports the unscaled norm and
// divides S out in the update. A fixed S changes nothing else: a non-finite step is handled as
// above. With dynamic scaling a step whose loss is finite and whose scaled gradients are not is an
// overflow, an expected event whatever on_nonfinite says: no update (StepResult::overflow), S
// halved, rank 0 prints one line naming the step and the new S; after `window` clean steps S
// doubles. Checkpoints save and restore the scaler (dynamic_loss_scale()).
//
// The trainer names the grid's communicators for the collective watchdog (comm/watchdog.hpp) and
// tells it the step. Checkpoints (train/checkpointing.hpp) read and restore its state through
// model(), grid(), options(), optimizer(), step() / set_step().
//
// Messages: what a stage sends lives in the trainer's per-micro-batch buffers until the transport
// has sent it (an activation slot may be reused meanwhile): a stage that can write its input
// gradient into a buffer of the caller's (backward_input(ctx, received, into): models::Gpt) does so,
// otherwise what it returns is copied there. An evaluation (no B, no W) runs every micro-batch in
// slot 0 and copies what it sends.
//
// Space. HostSpace: the grid's MPI groups carry everything (MpiTransport between stages). CudaSpace
// (CUDA translation units): the trainer is built on a parallel::DeviceGrid<Comm, DataComm> and the
// kernels::Device the model's layers run on, and three things change —
//   batch      uploaded once per step, each tensor one asynchronous copy on the compute stream
//              from pinned staging (kernels::Ops::upload)
//   pipeline   parallel::pipeline::StreamTransport over the device grid's pipeline communicator, its
//              groups matched on both sides (pipeline::peer_batches; under the interleaved
//              schedule single messages in one global order, pipeline::message_order); the
//              message shapes still travel over MPI during the probe
//   step end   the DistributedOptimizer's device form (data axis on DataComm, norm over the world):
//              norm, clip and update are queued before the host waits for anything; the host then
//              reads the norm and the loss once (the step's synchronisation). A non-finite norm
//              makes the update skip itself on the device, on every rank alike, whatever
//              on_nonfinite says; `stop` then raises the Error, `skip` reports it (a non-finite
//              loss with finite gradients is found after the update: stop raises, skip reports)

#include "dpml/comm/hierarchical.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/comm/watchdog.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/device.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/optim/loss_scale.hpp"
#include "dpml/optim/optimizer.hpp"
#include "dpml/parallel/distributed_optimizer.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/parallel/pipeline/executor.hpp"
#include "dpml/parallel/pipeline/partition.hpp"
#include "dpml/parallel/pipeline/peer_batches.hpp"
#include "dpml/parallel/pipeline/schedule.hpp"
#include "dpml/parallel/strategy.hpp"
#include "dpml/train/batch.hpp"
#include "dpml/train/layer_stage.hpp"
#if defined(__CUDACC__)
#include "dpml/core/cuda_space.hpp"
#include "dpml/parallel/pipeline/stream_transport.hpp"
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpml::train {

// What a step with a non-finite loss or gradient does (--on-nonfinite).
enum class NonFinite { stop, skip, ignore };

inline NonFinite parse_nonfinite(const std::string& s) {
  DPML_REQUIRE_EVERYWHERE(s == "stop" || s == "skip" || s == "ignore", "--on-nonfinite " << s << " is not one of stop, skip, ignore");
  return s == "stop" ? NonFinite::stop : s == "skip" ? NonFinite::skip : NonFinite::ignore;
}

// The Loss of a model whose last stage computes its loss itself (read with model.take_loss()).
struct ModelLoss {};

// A model that is its own pipeline stage (models::Gpt, LayerStage): this rank's share of the
// model, one micro-batch per call.
//   forward(ctx, x, received, targets)  x: the first stage's input; received: what the previous
//                                       stage sent; targets: the last stage's. Returns what to
//                                       send on (empty on the last stage, which adds its loss)
//   backward_input(ctx, received)       from the loss (last stage) or the gradient received;
//                                       returns the gradient to send back (empty on the first)
//   backward_weight(ctx)                weight gradients += this micro-batch's (may run later)
//   take_loss()                         the losses added since the last take (last stage)
// Optional: tied_parameter() and finish_tied_gradients() (see the top of the file), and
// backward_input(ctx, received, into) writing the gradient to send back into the trainer's buffer.
template <class M>
concept StagedModel = requires(M& m, const M& cm, layers::Context<typename M::space>& ctx, const typename M::Input& x,
                               const typename M::Target& t, TensorView<const typename M::value_type, typename M::space> v) {
  { cm.is_first_stage() } -> std::convertible_to<bool>;
  { cm.is_last_stage() } -> std::convertible_to<bool>;
  { m.forward(ctx, x, v, t) } -> std::convertible_to<decltype(v)>;
  { m.backward_input(ctx, v) } -> std::convertible_to<decltype(v)>;
  m.backward_weight(ctx);
  { m.take_loss() } -> std::convertible_to<double>;
  m.parameters();
};

struct TrainOptions {
  int micro_batches = 1;               // per step: gradient accumulation and the pipeline's micro-batches
  std::int64_t global_batch = 0;       // samples per step over all data ranks; 0: the batch carries it
  std::uint64_t seed = 0;              // dropout and other in-model randomness
  NonFinite on_nonfinite = NonFinite::stop;
  parallel::pipeline::Partition partition = {};  // where a Sequential/Stack is cut (pp > 1): balanced by default
  // Model chunks per pipeline rank under the interleaved schedule (--num-virtual-stages-per-
  // pipeline-rank v): a Sequential/Stack is cut into v·pp virtual stages, chunk c of rank r being
  // virtual stage c·pp + r (LayerStage); 1 for every other schedule.
  int virtual_stages = 1;
  optim::LossScaling loss_scaling = {};          // off | fixed S | dynamic (fp16): see the top of the file
};

// Megatron's --micro-batch (sequences per micro-batch) and --global-batch (sequences per step over
// all data ranks) as TrainOptions::micro_batches = global / (micro · dp), refused on every rank
// when that does not divide.
inline int micro_batches_of(std::int64_t micro_batch, std::int64_t global_batch, int dp) {
  const std::int64_t per_rank = micro_batch * dp;
  DPML_REQUIRE_EVERYWHERE(micro_batch >= 1 && global_batch >= 1, "--micro-batch " << micro_batch << " and --global-batch "
                                                                                   << global_batch << " must be positive");
  DPML_REQUIRE_EVERYWHERE(global_batch % per_rank == 0,
                          "--global-batch " << global_batch << " is not a multiple of --micro-batch " << micro_batch
                                            << " × dp " << dp << ": the micro-batches do not divide the batch");
  return static_cast<int>(global_batch / per_rank);
}

struct StepResult {
  double loss = 0.0;                 // mean over the global batch (per target element)
  double grad_norm = 0.0;            // NaN when the step was skipped
  bool skipped = false;              // no update: non-finite (NonFinite::skip) or an overflow
  bool overflow = false;             // dynamic loss scaling: the scaled gradients overflowed (skipped)
  double loss_scale = 1.0;           // S the step's gradients carried (1: no loss scaling)
  double seconds = 0.0;
  double exposed_comm_seconds = 0.0; // waiting for data-parallel reductions after backward
  std::int64_t wire_bytes = 0;       // gradient bytes this rank sent over the data axis (compressed or not)
  std::int64_t dense_bytes = 0;      // … and would have sent uncompressed (parallel/compression/policy.hpp)
  std::int64_t tensor_bytes = 0;     // activation bytes this rank sent over the tensor axis (parallel/tensor.hpp)
  parallel::pipeline::StepTimings pipeline;  // this stage: busy per op kind, waits, total, bytes sent to its neighbours
};

// A model cut into v StagedModel chunks per pipeline rank, chunk c being virtual stage c·pp + rank
// of the interleaved schedule (models::GptChunks): chunks() (v, the TrainOptions::virtual_stages it
// is trained with), chunk(c), parameters() (every chunk's).
template <class M>
concept ChunkedModel = requires(M& m, const M& cm) {
  { cm.chunks() } -> std::convertible_to<int>;
  requires StagedModel<std::remove_reference_t<decltype(m.chunk(0))>>;
  m.parameters();
};

namespace detail {

template <class Model, class Loss, int = StagedModel<Model> ? 0 : ChunkedModel<Model> ? 1 : 2>
struct StageFor {
  using type = Model;
  static_assert(std::is_same_v<Loss, ModelLoss>, "dpml Trainer: this model computes its loss itself: Loss = train::ModelLoss");
};
template <class Model, class Loss>
struct StageFor<Model, Loss, 1> {
  using type = std::remove_reference_t<decltype(std::declval<Model&>().chunk(0))>;
  static_assert(std::is_same_v<Loss, ModelLoss>, "dpml Trainer: this model computes its loss itself: Loss = train::ModelLoss");
};
template <class Model, class Loss>
struct StageFor<Model, Loss, 2> {
  static_assert(layers::check_layer<Model>(), "dpml Trainer: the model is neither a Layer nor a StagedModel nor a ChunkedModel");
  using type = LayerStage<Model, Loss>;
};

// Element types of a stage's inputs and targets (a GPU's copy of the batch).
template <class Stage>
struct BatchElement {
  using input = std::remove_const_t<typename Stage::Input::value_type>;
  using target = std::remove_const_t<typename Stage::Target::value_type>;
};

// How a space's stages exchange their messages (the executor's transport, pipeline/transport.hpp):
// MPI on the host, the stream transport over the device grid's pipeline communicator on a GPU.
template <class Space, class T, class Comm>
struct TransportFor {
  static_assert(dependent_false<Space>, "dpml Trainer: no pipeline transport for this memory space and communicator");
};
template <class T>
struct TransportFor<HostSpace, T, comm::Mpi> {
  using type = parallel::pipeline::MpiTransport<T>;
  template <class Comms>
  static type make(const parallel::ProcessGrid& grid, const Comms*, kernels::Device<HostSpace>&, const parallel::pipeline::Schedule& schedule) {
    return type(grid.comm(Axis::pipeline), parallel::pipeline::chunks_in(schedule));
  }
};
#if defined(__CUDACC__)
template <class T, class Comm>
struct TransportFor<CudaSpace, T, Comm> {
  using type = parallel::pipeline::StreamTransport<T, Comm>;
  template <class Comms>
  static type make(const parallel::ProcessGrid& grid, const Comms* comms, kernels::Device<CudaSpace>& dev,
                   const parallel::pipeline::Schedule& schedule) {
    // Interleaved: no rounds exist; the trainer has the transport follow each table's global
    // message order (pipeline::message_order) instead.
    const int chunks = parallel::pipeline::chunks_in(schedule);
    return type(parallel::pipeline::StreamLauncher<T, Comm>(comms->pipeline(), dev.stream()),
                chunks > 1 ? parallel::pipeline::PeerBatches{} : parallel::pipeline::peer_batches(schedule, grid.coord(Axis::pipeline)),
                chunks);
  }
};
#endif

// pipeline::ChunkedStage over one step of a StagedModel's chunks (one, or v under the interleaved
// schedule: chunk c is virtual stage c·p + rank): the micro-batches' views, each chunk's
// activation slots, message buffers and message shapes (learnt by the probe; see the top of the
// file).
template <class Stage>
class PipelineStep {
 public:
  using value_type = typename Stage::value_type;
  using Space = typename Stage::space;
  using Input = typename Stage::Input;
  using Target = typename Stage::Target;
  using Message = TensorView<const value_type, Space>;
  using Buffer = TensorView<value_type, Space>;

  // `chunks`: this rank's stages, chunk order; `slots`: the activation slot of each micro-batch in
  // training, per chunk (pipeline::plan_buffers over the chunk's actions).
  PipelineStep(std::vector<Stage*> chunks, layers::Context<Space>& ctx, const comm::Mpi& pipe,
               std::vector<parallel::pipeline::BufferPlan> slots)
      : ctx_(ctx), pipe_(pipe) {
    for (std::size_t c = 0; c < chunks.size(); ++c) chunks_.push_back({chunks[c], std::move(slots[c])});
  }

  // inputs (n, …), targets (n, …) of this data rank; `first_sample`: the global index of row 0.
  void set_batch(const Input& inputs, const Target& targets, int m, std::int64_t first_sample) {
    const std::int64_t n = inputs.size(0);
    inputs_.clear(), targets_.clear(), offsets_.clear();
    for (int i = 0; i < m; ++i) {
      const std::int64_t lo = n * i / m, hi = n * (i + 1) / m;
      inputs_.push_back(inputs.slice(0, lo, hi));
      targets_.push_back(targets.slice(0, lo, hi));
      offsets_.push_back(first_sample + lo);
    }
    const auto count = static_cast<std::size_t>(m);
    for (Chunk& ch : chunks_) {
      if (ch.recv_fwd.size() < count) ch.recv_fwd.resize(count), ch.recv_bwd.resize(count), ch.kept_fwd.resize(count), ch.kept_bwd.resize(count);
      ch.sent_fwd.assign(count, Message());
      ch.sent_bwd.assign(count, Message());
    }
  }

  // Whether the message shapes for inputs shaped like this step's are known (pp = 1: none needed).
  bool knows_shapes() const { return pipe_.size() == 1 || (probed_ && key_ == key(inputs_.at(0))); }
  // The probe runs while this is set: the schedule's forward of micro-batch 0 only.
  void set_probing(bool on) {
    probing_ = on;
    if (!on) probed_ = true, key_ = key(inputs_.at(0));
  }

  void forward(int c, int mb) {
    Chunk& ch = chunk(c);
    const auto i = at(ch, mb);
    if (probing_ && ch.stage->is_last_stage()) return;  // nothing to learn: it sends nothing
    const Message out = ch.stage->forward(ctx_, inputs_[i], ch.recv_fwd[i].cview(), targets_[i]);
    if (ch.stage->is_last_stage()) return;
    if (probing_) ch.out_shape = out.shape();
    check(out, ch.out_shape, mb, "sends on");
    ch.sent_fwd[i] = ctx_.training() ? out : kept(ch.kept_fwd[i], out);  // evaluation: all in slot 0
  }
  void backward_input(int c, int mb) {
    Chunk& ch = chunk(c);
    Stage& stage = *ch.stage;
    const auto i = at(ch, mb);
    const Message received = ch.recv_bwd[i].cview();
    if (stage.is_first_stage()) {
      stage.backward_input(ctx_, received);
      return;
    }
    const Shape shape = with_rows(ch.in_shape, inputs_[i].size(0));
    if constexpr (requires(Buffer into) { stage.backward_input(ctx_, received, into); }) {
      ch.sent_bwd[i] = stage.backward_input(ctx_, received, layers::ensure(ch.kept_bwd[i], shape));
      check(ch.sent_bwd[i], ch.in_shape, mb, "sends back");
    } else {  // the stage's own buffer belongs to the slot, which a later micro-batch may reuse before the send ends
      const Message dx = stage.backward_input(ctx_, received);
      check(dx, ch.in_shape, mb, "sends back");
      ch.sent_bwd[i] = kept(ch.kept_bwd[i], dx);
    }
  }
  void backward_weight(int c, int mb) {
    Chunk& ch = chunk(c);
    at(ch, mb);
    ch.stage->backward_weight(ctx_);
  }
  Buffer recv_forward_buffer(int c, int mb) {
    Chunk& ch = chunk(c);
    const auto i = static_cast<std::size_t>(mb);
    if (probing_) ch.in_shape = receive_shape();
    return layers::ensure(ch.recv_fwd[i], with_rows(ch.in_shape, inputs_[i].size(0)));
  }
  Buffer recv_backward_buffer(int c, int mb) {
    Chunk& ch = chunk(c);
    const auto i = static_cast<std::size_t>(mb);
    return layers::ensure(ch.recv_bwd[i], with_rows(ch.out_shape, inputs_[i].size(0)));
  }
  Message send_forward_buffer(int c, int mb) {
    Chunk& ch = chunk(c);
    if (probing_) send_shape(ch.out_shape);
    return ch.sent_fwd[static_cast<std::size_t>(mb)];
  }
  Message send_backward_buffer(int c, int mb) { return chunk(c).sent_bwd[static_cast<std::size_t>(mb)]; }

 private:
  static constexpr int kShapeTag = 32767;  // MPI's least tag bound; the transport's tags are 2·(mb·v + chunk) + flow

  struct Chunk {
    Stage* stage;
    parallel::pipeline::BufferPlan slots;
    std::vector<Tensor<value_type, Space>> recv_fwd, recv_bwd;  // (micro-batches): what arrives
    std::vector<Tensor<value_type, Space>> kept_fwd, kept_bwd;  // (micro-batches): what is sent from buffers of ours
    std::vector<Message> sent_fwd = {}, sent_bwd = {};
    Shape in_shape = {}, out_shape = {};  // dimension 0 is set per micro-batch
  };
  Chunk& chunk(int c) { return chunks_.at(static_cast<std::size_t>(c)); }

  // Selects micro-batch mb of a chunk: its slot (training) or slot 0 (evaluation, the probe), its first sample.
  std::size_t at(const Chunk& ch, int mb) {
    const auto i = static_cast<std::size_t>(mb);
    ctx_.micro_batch = ctx_.training() ? ch.slots.index.at(i) : 0;
    ctx_.sample_offset = offsets_[i];
    return i;
  }
  // A copy of `m` in `buffer` (the space's copy, on its stream), as a message.
  Message kept(Tensor<value_type, Space>& buffer, Message m) {
    auto out = layers::ensure(buffer, m.shape());
    kernels::Ops<Space>::copy(ctx_.dev(), m.data(), out.data(), m.numel());
    return out;
  }
  static Shape key(const Input& x) {
    Shape k = x.shape();
    k[0] = 0;
    return k;
  }
  static Shape with_rows(Shape s, std::int64_t rows) {
    s[0] = rows;
    return s;
  }
  // The probe's header, (rank, dims…): to the next virtual stage, from the previous one (ranks
  // ± 1 mod p: under interleaving the last rank sends to the first).
  using Header = std::array<std::int64_t, kMaxRank + 1>;
  void send_shape(const Shape& shape) const {
    Header header{shape.rank()};
    std::copy(shape.begin(), shape.end(), header.begin() + 1);
    pipe_.send(header.data(), header.size(), (pipe_.rank() + 1) % pipe_.size(), kShapeTag);
  }
  Shape receive_shape() const {
    Header header{};
    pipe_.recv(header.data(), header.size(), (pipe_.rank() + pipe_.size() - 1) % pipe_.size(), kShapeTag);
    return Shape::from_range(header.begin() + 1, header.begin() + 1 + header[0]);
  }
  // What crosses the boundary must be `learnt` with the micro-batch's samples first, contiguous.
  void check(Message m, const Shape& learnt, int mb, const char* what) const {
    const Shape expected = with_rows(learnt, inputs_[static_cast<std::size_t>(mb)].size(0));
    DPML_REQUIRE(m.is_contiguous() && m.shape() == expected,
                 "pipeline stage " << pipe_.rank() << " " << what << " " << m.shape().str() << (m.is_contiguous() ? "" : " (strided)")
                                   << " for micro-batch " << mb << ", expected " << expected.str()
                                   << ": a tensor crossing stages must be contiguous, with the samples as its first dimension");
  }

  layers::Context<Space>& ctx_;
  const comm::Mpi& pipe_;
  std::vector<Chunk> chunks_;
  std::vector<Input> inputs_;
  std::vector<Target> targets_;
  std::vector<std::int64_t> offsets_;
  Shape key_;
  bool probing_ = false, probed_ = false;
};

}  // namespace detail

template <class Model, class Loss, class Strategy, optim::UpdateRule Rule, class Space = typename Model::space,
          class Comm = parallel::default_comm_t<Space>, class DataComm = parallel::data_comm_t<Strategy, Comm>>
class Trainer {
  static_assert(std::is_same_v<Space, typename Model::space>, "dpml Trainer: Space must be the model's space");
  static_assert(Strategy::data::hierarchical == comm::is_hierarchical<DataComm>,
                "dpml Trainer: DataParallel<…, Hierarchical> all-reduces over a comm::Hierarchical data communicator, "
                "DataParallel<…, Flat> over any other (parallel::data_comm_t<Strategy, Comm>)");
  static constexpr bool on_host = std::is_same_v<Space, HostSpace>;

 public:
  using value_type = typename Model::value_type;
  using Stage = typename detail::StageFor<Model, Loss>::type;  // LayerStage<Model, Loss>, or the model itself
  using Optimizer = parallel::DistributedOptimizer<Rule, value_type, Space, DataComm, typename Strategy::data::compression>;
  using ParamT = Param<value_type, Space>;
  using Schedule = typename Strategy::schedule;
  using Comms = parallel::DeviceGrid<Comm, DataComm>;  // a GPU's communicators
  static constexpr bool zero = Strategy::zero;

  // Host: the grid's MPI communicators. `dist.zero` comes from the Strategy (DataParallel<Zero1>);
  // `loss`: the last stage's loss layer.
  Trainer(Model& model, const parallel::ProcessGrid& grid, typename Rule::Options rule,
          parallel::DistributedOptimizerOptions dist, TrainOptions options, Loss loss = Loss())
    requires on_host
      : Trainer(model, grid, nullptr, nullptr, rule, dist, options, std::move(loss)) {}
  // A GPU: the device communicators of `comms` and the Device whose stream the model's layers run
  // on (the one `comms` was built with); both outlive the trainer.
  Trainer(Model& model, const Comms& comms, kernels::Device<Space>& dev, typename Rule::Options rule,
          parallel::DistributedOptimizerOptions dist, TrainOptions options, Loss loss = Loss())
      : Trainer(model, comms.grid(), &comms, &dev, rule, dist, options, std::move(loss)) {}

  // One optimizer step on this data rank's batch; lr from the caller's schedule.
  template <TrainBatch Batch>
  StepResult train_step(const Batch& batch, double lr) {
    const auto t0 = std::chrono::steady_clock::now();
    ctx_.mode = layers::Mode::train;
    comm::watchdog::set_step(ctx_.step + 1);
    prepare(batch);
    optimizer_.begin_step(options_.micro_batches, static_cast<std::int64_t>(ctx_.step) + 1);
    StepResult r;
    r.loss_scale = ctx_.loss_scale = loss_scale();
    const std::int64_t tensor_sent = tensor_bytes();
    r.pipeline = run(schedule_, order(&TableOrders::step), std::exchange(trace_next_, false));
    if constexpr (requires { stage().finish_tied_gradients(); })
      for (int c = 0; c < chunks(); ++c) chunk(c).finish_tied_gradients();  // the chunks that hold a tied end
    r.tensor_bytes = tensor_bytes() - tensor_sent;
    optimizer_.buckets().finish();  // reduced gradients, checked before the update
    ++ctx_.step;
    const bool checked = options_.on_nonfinite != NonFinite::ignore;
    if constexpr (on_host) {
      r.loss = sum_over_last_stage(take_chunk_losses());
      const bool bad = (checked || scaler_) && !finite_step(r.loss);  // r.loss: the same on every rank
      r.overflow = bad && scaler_ && std::isfinite(r.loss);
      if (r.overflow || (bad && checked)) {
        if (!r.overflow) handle_nonfinite(r.loss);  // throws with `stop`
        r.skipped = true;
        r.grad_norm = std::numeric_limits<double>::quiet_NaN();
      } else {
        update(r, lr);
      }
    } else {  // queued before the host waits: see the top of the file
      update(r, lr);
      r.loss = sum_over_last_stage(take_chunk_losses());
      // r.skipped (a global norm) and r.loss (summed over the world) agree on every rank
      r.overflow = r.skipped && scaler_ && std::isfinite(r.loss);
      if (checked && !r.overflow && (r.skipped || !std::isfinite(r.loss)))
        handle_nonfinite(r.loss);  // throws with `stop`
      if (r.skipped) r.grad_norm = std::numeric_limits<double>::quiet_NaN();
    }
    if (scaler_ && (r.overflow || !r.skipped)) {  // a skip for a non-finite loss says nothing of S
      scaler_->update(r.overflow);
      if (r.overflow && grid_.world().rank() == 0)
        std::printf("dpml: step %llu: gradients overflowed at loss scale %g — skipping the step, loss scale now %g\n",
                    static_cast<unsigned long long>(ctx_.step), r.loss_scale, scaler_->scale());
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  // The loss on a batch without training (eval mode; the schedule's forward actions only).
  template <TrainBatch Batch>
  double evaluate(const Batch& batch) {
    ctx_.mode = layers::Mode::eval;
    prepare(batch);
    (void)run(eval_tables_, order(&TableOrders::eval));
    ctx_.mode = layers::Mode::train;
    return sum_over_last_stage(take_chunk_losses());
  }

  // The next train_step records each F/B/W and wait of this stage as Spans in its
  // StepResult::pipeline.spans (host times: on a GPU the launches; pipeline/executor.hpp).
  void trace_next_step() noexcept { trace_next_ = true; }

  // A value the last pipeline stage computed (a loss, a count), summed over the data axis (tensor
  // rank 0 counts, the other tensor ranks hold copies): the same on every rank. Collective.
  double sum_over_last_stage(double value) const {
    const bool counts = stage().is_last_stage() && grid_.coord(Axis::tensor) == 0;
    return grid_.world().allreduce(counts ? value : 0.0, comm::ReduceOp::sum);
  }

  Model& model() noexcept { return model_; }
  // This rank's pipeline stage: a LayerStage of the model, or the model itself. Under the
  // interleaved schedule its last chunk (the one that holds the loss on the last rank).
  Stage& stage() noexcept { return chunk(chunks() - 1); }
  const Stage& stage() const noexcept { return chunk(chunks() - 1); }
  // This rank's model chunks: v under the interleaved schedule (chunk c: virtual stage c·pp + rank), else 1.
  int chunks() const noexcept { return options_.virtual_stages; }
  // Bytes this rank's chunks have sent over the tensor axis (a stage that counts: tensor_bytes()), else 0.
  std::int64_t tensor_bytes() const {
    std::int64_t n = 0;
    if constexpr (requires(const Stage& s) { s.tensor_bytes(); })
      for (int c = 0; c < chunks(); ++c) n += chunk(c).tensor_bytes();
    return n;
  }
  Stage& chunk(int c) noexcept {
    if constexpr (kOwnStages) return own_stage(model_, c);
    else return stage_[static_cast<std::size_t>(c)];
  }
  const Stage& chunk(int c) const noexcept {
    if constexpr (kOwnStages) return own_stage(model_, c);
    else return stage_[static_cast<std::size_t>(c)];
  }
  // The parameters this rank trains (its stage's).
  const std::vector<ParamT*>& parameters() noexcept { return optimizer_.flat().params(); }
  const parallel::ProcessGrid& grid() const noexcept { return grid_; }
  const TrainOptions& options() const noexcept { return options_; }
  Optimizer& optimizer() noexcept { return optimizer_; }
  layers::Context<Space>& context() noexcept { return ctx_; }
  kernels::Device<Space>& device() noexcept { return *dev_; }
  int micro_batches() const noexcept { return options_.micro_batches; }
  const parallel::pipeline::Schedule& schedule() const noexcept { return schedule_; }
  // The loss scale S of the next step (1 without loss scaling).
  double loss_scale() const noexcept {
    if (scaler_) return scaler_->scale();
    return options_.loss_scaling.mode == optim::LossScaling::Mode::fixed ? options_.loss_scaling.scale : 1.0;
  }
  // The dynamic scaler (checkpoints save and restore it); null unless the scaling is dynamic.
  optim::DynamicLossScale* dynamic_loss_scale() noexcept { return scaler_ ? &*scaler_ : nullptr; }
  // Steps run so far (skipped ones included); a checkpoint restores it with set_step, together
  // with the optimizer's own count of updates.
  std::int64_t step() const noexcept { return ctx_.step; }
  void set_step(std::int64_t step) {
    DPML_REQUIRE(step >= 0, "trainer step " << step << " is negative");
    ctx_.step = static_cast<std::uint64_t>(step);
  }

 private:
  // LayerStages of the model (one per chunk; a deque: they stay put), or nothing (the model is its
  // own stage); stage() and chunk() either way.
  struct NoStage {};
  static constexpr bool kOwnStages = StagedModel<Model> || ChunkedModel<Model>;  // the model cuts its stages itself
  using StageStorage = std::conditional_t<kOwnStages, NoStage, std::deque<Stage>>;
  // Chunk c of a model that cuts its own stages: a StagedModel is its one chunk.
  template <class M>
  static auto& own_stage(M& model, [[maybe_unused]] int c) {
    if constexpr (StagedModel<std::remove_const_t<M>>) return model;
    else return model.chunk(c);
  }
  using Transport = detail::TransportFor<Space, value_type, Comm>;

  // comms, dev: null on the host (the grid's MPI groups, a Device of the trainer's own).
  Trainer(Model& model, const parallel::ProcessGrid& grid, const Comms* comms, kernels::Device<Space>* dev,
          typename Rule::Options rule, parallel::DistributedOptimizerOptions dist, TrainOptions options, Loss loss)
      : model_(model), grid_(grid), options_(checked(options, dist)),
        own_device_(dev ? nullptr : std::make_unique<kernels::Device<Space>>()), dev_(dev ? dev : own_device_.get()),
        stage_(make_stage(model, std::move(loss), grid, options_)),
        optimizer_(make_optimizer(chunk_parameters(), grid, comms, *dev_, rule, dist)),
        schedule_(parallel::pipeline::make_schedule(schedule_tag(options_), grid.pp(), options.micro_batches)),
        eval_tables_(parallel::pipeline::forward_only(schedule_)),
        probe_tables_(parallel::pipeline::first_forward(grid.pp(), parallel::pipeline::chunks_in(schedule_))),
        step_(chunk_list(), ctx_, grid.comm(Axis::pipeline), chunk_slots()),
        transport_(Transport::make(grid, comms, *dev_, schedule_)) {
    if constexpr (requires { transport_.follow(nullptr); })
      if (parallel::pipeline::chunks_in(schedule_) > 1) {
        const int s = grid.coord(Axis::pipeline);
        orders_.emplace(TableOrders{parallel::pipeline::message_order(schedule_, s), parallel::pipeline::message_order(eval_tables_, s),
                                    parallel::pipeline::message_order(probe_tables_, s)});
      }
    if (options_.loss_scaling.mode == optim::LossScaling::Mode::dynamic) scaler_.emplace(options_.loss_scaling.dynamic);
    ctx_.grid = &grid;
    ctx_.seed = options.seed;
    ctx_.device = dev_;
    ctx_.deferred_weight_gradients = !parallel::pipeline::weight_follows_input(actions());
    ctx_.on_grad_ready = [this](std::span<ParamBase* const> ps) { optimizer_.on_grad_ready(ps); };
    for (Axis a : parallel::kAxes) {
      comm::watchdog::name_group(grid.comm(a).native(), parallel::axis_name(a));
      for (Axis b : parallel::kAxes)
        if (static_cast<int>(a) < static_cast<int>(b))
          comm::watchdog::name_group(grid.comm(a, b).native(), std::string(parallel::axis_name(a)) + "+" + parallel::axis_name(b));
    }
    if constexpr (requires { stage().tied_parameter(); })
      for (int c = 0; c < chunks(); ++c)
        if (const auto* tied = chunk(c).tied_parameter()) optimizer_.buckets().hold(tied);
  }

  static TrainOptions checked(const TrainOptions& o, const parallel::DistributedOptimizerOptions& dist) {
    DPML_REQUIRE_EVERYWHERE(o.micro_batches >= 1, "--micro-batches must be at least 1, got " << o.micro_batches);
    DPML_REQUIRE_EVERYWHERE(o.global_batch >= 0, "the global batch " << o.global_batch << " is negative");
    DPML_REQUIRE_EVERYWHERE(o.loss_scaling.mode != optim::LossScaling::Mode::fixed ||
                                (o.loss_scaling.scale > 0.0 && std::isfinite(o.loss_scaling.scale)),
                            "--loss-scale " << o.loss_scaling.scale << " must be finite and positive");
    DPML_REQUIRE_EVERYWHERE(!dist.zero || Strategy::zero,
                            "ZeRO-1 is chosen by the Strategy type (DataParallel<Zero1>), not by DistributedOptimizerOptions::zero");
    DPML_REQUIRE_EVERYWHERE(!dist.shard_gradients || Strategy::zero,
                            "ZeRO-2 (DistributedOptimizerOptions::shard_gradients) needs a ZeRO strategy: DataParallel<Zero1> "
                            "or DataParallel<Zero2>");
    DPML_REQUIRE_EVERYWHERE(!dist.shard_values || Strategy::zero,
                            "ZeRO-3 (DistributedOptimizerOptions::shard_values) needs a ZeRO strategy: DataParallel<Zero1> "
                            "or DataParallel<Zero3>");
    DPML_REQUIRE_EVERYWHERE(o.virtual_stages >= 1, "--num-virtual-stages-per-pipeline-rank " << o.virtual_stages << " must be at least 1");
    // Each condition reads the run-time v, so that no check is a constant (nvcc warns on those).
    const bool one = o.virtual_stages == 1;
    DPML_REQUIRE_EVERYWHERE((one || std::is_same_v<Schedule, parallel::pipeline::Interleaved1F1B>),
                            "--num-virtual-stages-per-pipeline-rank " << o.virtual_stages << " needs --schedule interleaved");
    DPML_REQUIRE_EVERYWHERE(one || !StagedModel<Model>, "--num-virtual-stages-per-pipeline-rank "
                                                            << o.virtual_stages
                                                            << ": this model's pipeline stages are its own (models::Gpt); the "
                                                               "library interleaves the chunks it cuts out of a Sequential or a Stack, "
                                                               "or those of a chunked model (models::GptChunks)");
    return o;
  }
  // The schedule's tag: the interleaved one carries its chunks.
  static Schedule schedule_tag(const TrainOptions& o) {
    if constexpr (std::is_same_v<Schedule, parallel::pipeline::Interleaved1F1B>) return Schedule{o.virtual_stages};
    else return Schedule{};
  }
  static parallel::DistributedOptimizerOptions with_zero(parallel::DistributedOptimizerOptions d) {
    d.zero = Strategy::zero;
    d.shard_values = d.shard_values || Strategy::shard_values;
    d.shard_gradients = d.shard_gradients || Strategy::shard_gradients || d.shard_values;
    return d;
  }
  static StageStorage make_stage(Model& model, Loss loss, const parallel::ProcessGrid& grid, const TrainOptions& options) {
    if constexpr (kOwnStages) {
      const int r = grid.coord(Axis::pipeline), p = grid.pp(), v = options.virtual_stages;  // a StagedModel: v = 1 (checked)
      if constexpr (ChunkedModel<Model>)
        DPML_REQUIRE_EVERYWHERE(model.chunks() == v, "dpml Trainer: the model has " << model.chunks() << " chunks per pipeline rank, "
                                                                                     << "--num-virtual-stages-per-pipeline-rank is " << v);
      bool laid_out = true;  // chunk c is virtual stage c·p + r of v·p
      for (int c = 0; c < v; ++c)
        laid_out = laid_out && own_stage(model, c).is_first_stage() == (c * p + r == 0) &&
                   own_stage(model, c).is_last_stage() == (c * p + r == v * p - 1);
      DPML_REQUIRE_EVERYWHERE(laid_out, "dpml Trainer: the model was built for another pipeline layout than this grid's");
      return {};
    } else {
      StageStorage chunks;
      const int v = options.virtual_stages;
      for (int c = 0; c < v; ++c)  // only the last chunk can hold the last virtual stage: the loss is its
        chunks.emplace_back(model, c + 1 == v ? std::move(loss) : Loss(), grid, options.partition, c, v);
      return chunks;
    }
  }
  // The losses the chunks added since the last take (only the last virtual stage computes one;
  // a model's first stage may report a bad token here).
  double take_chunk_losses() {
    double loss = 0.0;
    for (int c = 0; c < chunks(); ++c) loss += chunk(c).take_loss();
    return loss;
  }
  // Every chunk's parameters, chunk order (what the optimizer updates and the buckets reduce).
  std::vector<ParamT*> chunk_parameters() {
    std::vector<ParamT*> out;
    for (int c = 0; c < chunks(); ++c)
      for (auto* p : chunk(c).parameters()) out.push_back(p);
    return out;
  }
  std::vector<Stage*> chunk_list() {
    std::vector<Stage*> out;
    for (int c = 0; c < chunks(); ++c) out.push_back(&chunk(c));
    return out;
  }
  // Each chunk's activation slots over its own actions (a chunk's layers hold only its micro-batches).
  std::vector<parallel::pipeline::BufferPlan> chunk_slots() const {
    using parallel::pipeline::Op;
    std::vector<parallel::pipeline::BufferPlan> out;
    for (int c = 0; c < chunks(); ++c)
      out.push_back(parallel::pipeline::plan_buffers(parallel::pipeline::of_chunk(actions(), c), options_.micro_batches,
                                                     {Op::Forward, Op::BackwardInput, Op::BackwardWeight}));
    return out;
  }
  // The host form over the grid's MPI groups, or the device form over `comms` (returned as a
  // prvalue: the optimizer is neither copied nor moved).
  template <class Params>
  static Optimizer make_optimizer(Params&& params, const parallel::ProcessGrid& grid, const Comms* comms,
                                  kernels::Device<Space>& dev, typename Rule::Options rule,
                                  parallel::DistributedOptimizerOptions dist) {
    if constexpr (on_host) return Optimizer(std::forward<Params>(params), &grid, rule, with_zero(dist));
    else return Optimizer(std::forward<Params>(params), &grid, rule, with_zero(dist), *comms, dev);
  }

  const std::vector<parallel::pipeline::Action>& actions() const {
    return schedule_[static_cast<std::size_t>(grid_.coord(Axis::pipeline))];
  }
  // This rank's row of `tables` (every rank's), the transport following `order` where it has one.
  parallel::pipeline::StepTimings run(const parallel::pipeline::Schedule& tables, const parallel::pipeline::MessageOrder* order,
                                      bool trace = false) {
    if constexpr (requires { transport_.follow(order); })
      if (orders_) transport_.follow(order);
    return parallel::pipeline::run_stage(tables[static_cast<std::size_t>(grid_.coord(Axis::pipeline))], step_, transport_, trace);
  }
  struct TableOrders;
  const parallel::pipeline::MessageOrder* order(parallel::pipeline::MessageOrder TableOrders::*table) const {
    return orders_ ? &((*orders_).*table) : nullptr;
  }
  // Norm, clip, update (DistributedOptimizer::finish_step) into r.
  void update(StepResult& r, double lr) {
    const auto report = optimizer_.finish_step(lr, r.loss_scale);
    r.grad_norm = report.grad_norm;
    r.skipped = report.skipped;
    r.exposed_comm_seconds = report.exposed_comm_seconds;
    r.wire_bytes = report.wire_bytes;
    r.dense_bytes = report.dense_bytes;
  }

  // A view already in this space (a ResidentBatch's on a GPU): itself.
  template <class E, class Buffer>
    requires(!on_host)
  TensorView<const E, Space> in_space(TensorView<const E, Space> resident, Buffer&) {
    static_assert(std::is_same_v<Buffer, Tensor<E, Space>>, "dpml Trainer: the batch's element type is not the stage input's");
    DPML_REQUIRE(resident.is_contiguous(), "dpml Trainer: a batch tensor " << resident.shape().str() << " is not contiguous");
    return resident;
  }
  // A host view in this space: itself on the host; on a GPU uploaded into `buffer` (on the stream).
  template <class E, class Buffer>
  auto in_space(TensorView<const E> host, Buffer& buffer) {
    if constexpr (on_host) {
      return host;
    } else {
      DPML_REQUIRE(host.is_contiguous(), "dpml Trainer: a batch tensor " << host.shape().str() << " is not contiguous");
      static_assert(std::is_same_v<Buffer, Tensor<E, Space>>, "dpml Trainer: the batch's element type is not the stage input's");
      auto out = layers::ensure(buffer, host.shape());
      kernels::Ops<Space>::upload(*dev_, host.data(), out.data(), host.numel());
      return TensorView<const E, Space>(out);
    }
  }

  // Checks this rank's share of the batch, cuts it into micro-batches, and learns the message
  // shapes if this input shape is new.
  template <TrainBatch Batch>
  void prepare(const Batch& batch) {
    using Traits = BatchTraits<Batch>;
    const auto inputs = Traits::inputs(batch);
    const auto targets = Traits::targets(batch);
    const std::int64_t n = inputs.size(0), carried = Traits::global_rows(batch);
    const std::int64_t global = carried > 0 ? carried : options_.global_batch;
    DPML_REQUIRE(global > 0, "the trainer needs TrainOptions::global_batch: this batch type does not carry the step's global size");
    const int ranks = grid_.dp(), r = grid_.coord(Axis::data);
    const std::int64_t first = global * r / ranks, expected = global * (r + 1) / ranks - first;
    DPML_REQUIRE(n == expected && targets.size(0) == n,
                 "rank " << grid_.world_rank() << " holds " << n << " samples (targets " << targets.size(0) << "), expected "
                         << expected << ": its share of the global batch " << global << " over dp " << ranks);
    DPML_REQUIRE(n >= options_.micro_batches || n == 0, "rank " << grid_.world_rank() << " holds " << n
                                                                << " samples, fewer than the " << options_.micro_batches
                                                                << " micro-batches");
    ctx_.global_batch = n > 0 ? global * (targets.numel() / n) : global;  // target elements of the step
    if constexpr (requires { Traits::loss_elements(batch); })  // only these count (at least 1: a divisor)
      ctx_.global_batch = std::max<std::int64_t>(Traits::loss_elements(batch), 1);
    step_.set_batch(in_space(inputs, inputs_), in_space(targets, targets_), options_.micro_batches, first);
    if (!step_.knows_shapes()) probe_shapes();
  }

  // See "Message shapes" at the top of the file.
  void probe_shapes() {
    const auto mode = ctx_.mode;
    ctx_.mode = layers::Mode::eval;
    step_.set_probing(true);
    (void)run(probe_tables_, order(&TableOrders::probe));
    step_.set_probing(false);
    ctx_.mode = mode;
  }

  static constexpr int kNoParam = std::numeric_limits<int>::max();
  // Collective: the loss and every reduced gradient this rank updates are finite on all ranks.
  bool finite_step(double loss) {
    int bad = std::isfinite(loss) ? 0 : 1;
    if (!bad) bad = first_nonfinite_local() != kNoParam;
    return grid_.world().allreduce(bad, comm::ReduceOp::max) == 0;
  }
  // Index (registration order) of this rank's first parameter with a non-finite reduced gradient
  // among the ranges it updates, or kNoParam. (A GPU's gradients are copied to the host first.)
  int first_nonfinite_local() {
    auto& buckets = optimizer_.buckets();
    const auto& offsets = optimizer_.flat().offsets();
    const auto grads = buckets.shard_grads();
    Tensor<value_type> host;
    const value_type* shard = grads.data();
    if constexpr (!on_host) {
      host = Tensor<value_type>(grads.shape());
      copy(host.view(), TensorView<const value_type, Space>(grads));
      shard = host.data();
    }
    int first = kNoParam;
    for (const auto& s : buckets.own_segments())
      for (std::int64_t i = 0; i < s.count; ++i)
        if (!std::isfinite(static_cast<double>(static_cast<float>(shard[s.shard_offset + i])))) {
          const auto at = std::upper_bound(offsets.begin(), offsets.end(), s.flat_offset + i) - offsets.begin() - 1;
          first = std::min(first, static_cast<int>(at));
          break;  // later elements of the segment belong to the same or later parameters
        }
    return first;
  }
  // After a step found non-finite on some rank (collective): names the first non-finite gradient
  // in model order, then stops (Error on every rank) or reports the skip (rank 0).
  void handle_nonfinite(double loss) {
    const auto& world = grid_.world();
    const int local = first_nonfinite_local();
    // Model order: pipeline stage first, then registration order within the stage.
    constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
    const std::int64_t key = local == kNoParam ? none : std::int64_t{grid_.coord(Axis::pipeline)} * kNoParam + local;
    const std::int64_t best = world.allreduce(key, comm::ReduceOp::min);
    const int holder = world.allreduce(key == best && best != none ? world.rank() : kNoParam, comm::ReduceOp::min);
    std::string name;
    if (holder != kNoParam) {
      if (world.rank() == holder) name = optimizer_.flat().params()[static_cast<std::size_t>(local)]->name();
      world.broadcast(name, holder);
    }
    std::string what = "step " + std::to_string(ctx_.step) + ": non-finite ";
    what += std::isfinite(loss) ? "gradient" : "loss (" + std::to_string(loss) + ")";
    what += name.empty() ? "; every gradient is finite" : "; first non-finite gradient: '" + name + "'";
    DPML_REQUIRE_EVERYWHERE(options_.on_nonfinite != NonFinite::stop, what << " — stopping (--on-nonfinite stop)");
    if (world.rank() == 0) std::printf("dpml: %s — skipping the step, no update (--on-nonfinite skip)\n", what.c_str());
  }

  Model& model_;
  const parallel::ProcessGrid& grid_;
  TrainOptions options_;
  std::unique_ptr<kernels::Device<Space>> own_device_;  // the host's, when none is given
  kernels::Device<Space>* dev_;
  layers::Context<Space> ctx_;
  [[no_unique_address]] StageStorage stage_;
  Optimizer optimizer_;
  parallel::pipeline::Schedule schedule_;
  // Every rank's evaluation table (forward actions) and probe table (see "Message shapes" at the top).
  parallel::pipeline::Schedule eval_tables_, probe_tables_;
  detail::PipelineStep<Stage> step_;
  typename Transport::type transport_;
  // A rendezvous transport under the interleaved schedule: each table's global message order.
  struct TableOrders {
    parallel::pipeline::MessageOrder step, eval, probe;
  };
  std::optional<TableOrders> orders_;
  bool trace_next_ = false;  // trace_next_step()
  std::optional<optim::DynamicLossScale> scaler_;  // LossScaling::Mode::dynamic
  Tensor<typename detail::BatchElement<Stage>::input, Space> inputs_;    // a GPU's copy of the step's batch
  Tensor<typename detail::BatchElement<Stage>::target, Space> targets_;
};

}  // namespace dpml::train
