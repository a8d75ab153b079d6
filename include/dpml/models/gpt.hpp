#pragma once
// GPT-2 (Radford et al. 2019) as one pipeline stage's share, tensor-parallel inside — one
// definition for both memory spaces, composed from the layers:
//
//   tokens (B, T) → wte + wpe → h.0 … h.{L−1} → ln_f → logits = h · wteᵀ → cross-entropy
//
// Pipeline parallelism cuts the L blocks into pp contiguous stages (the first stages take one
// more block when pp does not divide L): the first stage also holds the embedding, the last one
// ln_f and the LM head. Under the interleaved schedule a rank holds v such stages of v·pp
// (GptChunks, at the end: a Gpt per VirtualStage). The head is tied to the token embedding:
// with pp = 1 it reads the embedding's own wte; with pp > 1 the last stage holds a copy of wte
// (same name, so the same initial values; marked duplicate: counted once in the gradient norm,
// saved once), and
// finish_tied_gradients() sums the two gradients over the first and last stage before the data
// axis reduces them (their bucket is held until then).
//
// Names follow GPT-2's checkpoints: wte.weight, wpe.weight, h.<i>.ln_1.weight, h.<i>.attn.c_attn
// .weight, …, ln_f.weight — with global block numbers on every stage, so initial weights and
// checkpoints are the same in every layout.
//
// One micro-batch on a stage: forward(ctx, tokens or received activation, targets) returns the
// activation to send on (empty on the last stage, which computes the loss instead);
// backward_input(ctx, received[, into]) returns the gradient to send back (empty on the first
// stage; written into the caller's buffer `into` when given: the blocks' ring scratch is not a
// place a message may wait in); backward_weight(ctx) forms the weight gradients — separately, for
// zero-bubble schedules.
//
// What the hand-fused GPU model (removed in Step 8) did for speed and memory, this one does through
// its layers, on either space:
//   head at once   in a training forward the last stage runs the head's whole backward right
//                  after the loss — dlogits in place over the logits, dh, wte's gradient, ln_f's
//                  backward — so the (B, T, V/tp) logits live only inside that call (the head and
//                  ln_f use one buffer slot for every micro-batch) and a micro-batch keeps only
//                  d(final hidden) (B, T, C) until its B; ln_f and the tied copy of wte are
//                  reported to the gradient buckets there
//   blocks         TransformerBlock's fused backward (shared scratch, residuals joined in
//                  LayerNorm's backward, each weight gradient right after its input gradient)
//                  and, with GptConfig::recompute_gelu, one GELU output shared by all blocks
//   parameters     the trainer's DistributedOptimizer lays them out in one flat buffer (bf16
//                  values and gradients, fp32 master and state on a GPU)
//
// The attention's mask policy is the last template argument (kernels/attention_mask.hpp):
// attention::Causal, GPT's, by default; with attention::Bidirectional the same stages — token and
// position embeddings, pre-LN blocks, ln_f, the tied vocabulary-parallel head, over any (dp, tp, pp)
// — are a BERT-style encoder trained as a masked LM (models/bert.hpp: GptConfig::masked_targets
// ignores the targets < 0, count_hits counts the masked tokens predicted right in evaluation).
//
// Communicators: the tensor axis' (TensorRegion<Comm>: the layers' conjugate operations) and, with
// pp > 1, the pair of the first and last stage (the tied gradient's sum). On the host both come
// from the ProcessGrid's MPI groups; on a GPU from a parallel::DeviceGrid (tensor() and
// pipeline_ends(), on the compute stream).
//
//   models::Gpt<float> cpu(config, grid);                            // HostSpace, comm::Mpi
//   parallel::DeviceGrid<comm::Nccl> comms(grid, dev);
//   models::Gpt<bf16, CudaSpace> gpu(config, comms);                  // CUDA translation units

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/attention_mask.hpp"
#include "dpml/layers/embedding.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/layer_norm.hpp"
#include "dpml/layers/stack.hpp"
#include "dpml/layers/transformer_block.hpp"
#include "dpml/layers/vocab_parallel_cross_entropy.hpp"
#include "dpml/parallel/device_grid.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/parallel/pipeline/partition.hpp"
#include "dpml/parallel/tensor.hpp"

#include <cmath>
#include <concepts>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dpml::models {

struct GptConfig {
  std::int64_t vocab = 256;        // V (bytes by default)
  std::int64_t max_seq = 64;       // T_max: rows of the position table
  std::int64_t layers = 2;         // L
  std::int64_t heads = 2;          // H
  std::int64_t dim = 32;           // C
  std::int64_t pad_multiple = 1;   // V is padded to a multiple of tp · pad_multiple (GPU: 128, GEMM tiles)
  bool recompute = false;          // activation recomputation per block
  bool recompute_gelu = false;     // the MLP's GELU output shared by all blocks, recomputed in the
                                   // backward (GPU: −1.2 GiB at GPT-2 124M, B=16, T=1024)
  bool masked_targets = false;     // targets < 0 count nothing (a masked LM's unmasked positions)
  bool count_hits = false;         // evaluation forwards count the targets predicted right (take_hits)
  // Blocks of the first and the last pipeline stage (0: an even cut; Megatron's
  // --decoder-first/last-pipeline-num-layers), for stages the embedding or the head make heavier
  // (on 2 H200s GPT-2 124M still ran fastest cut evenly: bench/RESULTS.md).
  std::int64_t first_stage_layers = 0, last_stage_layers = 0;

  // Parameters of the whole (unsharded, unpadded) model.
  std::int64_t parameter_count() const {
    const std::int64_t per_block = 12 * dim * dim + 13 * dim;
    return vocab * dim + max_seq * dim + layers * per_block + 2 * dim;
  }
};

// Named sizes (--model-size): GPT-2's 124M and 350M (T = 1024) and GPT-3's 1.3B, 2.7B and 6.7B
// (Brown et al. 2020, table 2.1; T = 2048). Layers, width, heads and sequence only: the
// vocabulary is the data's. Heads are chosen so that the head dimension is one the GPU's attention
// kernels take (32, 64, 128): 1.3B has 16 heads of 128 (GPT-3's table says 24 heads of 128, which
// does not multiply to 2048; 16 keeps its head dimension), 2.7B 20 heads of 128 (GPT-3: 32 heads
// of 80, a head dimension those kernels do not take; --num-attention-heads 32 still asks for it on
// CPU ranks).
struct GptPreset {
  const char* name;
  std::int64_t layers, dim, heads, seq;
};
inline constexpr GptPreset kGptPresets[] = {
    {"124m", 12, 768, 12, 1024},  {"350m", 24, 1024, 16, 1024}, {"1.3b", 24, 2048, 16, 2048},
    {"2.7b", 32, 2560, 20, 2048}, {"6.7b", 32, 4096, 32, 2048},
};
// The preset called `name`, refused on every rank with the list when there is none.
inline const GptPreset& gpt_preset(const std::string& name) {
  for (const GptPreset& p : kGptPresets)
    if (name == p.name) return p;
  DPML_REQUIRE_EVERYWHERE(false, "--model-size " << name << " is not one of 124m, 350m, 1.3b, 2.7b, 6.7b");
  return kGptPresets[0];
}

// A program's shape flags filled from preset `name` ("": none) where the command line did not
// name them: given(i) for i = 0 layers, 1 width, 2 heads, 3 sequence length (train::Args::given
// of the program's own flag names), so that explicit flags override the preset.
template <class Given>
void apply_gpt_preset(const std::string& name, Given&& given, std::int64_t& layers, std::int64_t& dim, std::int64_t& heads,
                      std::int64_t& seq) {
  if (name.empty()) return;
  const GptPreset& p = gpt_preset(name);
  std::int64_t* fields[] = {&layers, &dim, &heads, &seq};
  const std::int64_t values[] = {p.layers, p.dim, p.heads, p.seq};
  for (int i = 0; i < 4; ++i)
    if (!given(i)) *fields[i] = values[i];
}

// --recompute-granularity (Megatron's flag) into `c`: none | selective (the MLP's GELU output
// recomputed in the backward; the GPU's flash attention keeps no (T, T) scores anyway) | full
// (each block keeps only its input and runs its forward again in the backward; its MLPs share one
// GELU buffer too). Anything else is refused on every rank.
inline void apply_recompute_granularity(const std::string& granularity, GptConfig& c) {
  DPML_REQUIRE_EVERYWHERE(granularity == "none" || granularity == "selective" || granularity == "full",
                          "--recompute-granularity " << granularity << " is not one of none, selective, full");
  c.recompute = granularity == "full";
  c.recompute_gelu = granularity != "none";
}

// Blocks [first, first + count) of a pipeline stage (shared with the GPU model).
using parallel::pipeline::StageBlocks;

// The blocks of (virtual) pipeline stage `stage` of `stages`: the configured ends, the rest even.
inline StageBlocks stage_blocks(const GptConfig& c, int stages, int stage) {
  return StageBlocks::of(c.layers, stages, stage, c.first_stage_layers, c.last_stage_layers);
}
// Refused on every rank, naming the flags: an uneven cut that leaves a stage without a block, one
// on a single stage, or one under the interleaved schedule (`chunks` per rank; its cut is even).
inline void check_stage_cut(const GptConfig& c, int pp, int chunks) {
  const std::int64_t first = c.first_stage_layers, last = c.last_stage_layers;
  if (first == 0 && last == 0) return;
  DPML_REQUIRE_EVERYWHERE(first >= 0 && last >= 0, "--decoder-first/last-pipeline-num-layers " << first << " / " << last
                                                                                                << " must not be negative");
  DPML_REQUIRE_EVERYWHERE(pp > 1, "--decoder-first/last-pipeline-num-layers need --pp 2 or more (one stage holds every block)");
  DPML_REQUIRE_EVERYWHERE(chunks == 1, "--decoder-first/last-pipeline-num-layers and --schedule interleaved: the "
                                       "interleaved schedule cuts its virtual stages evenly");
  const int others = pp - (first > 0 ? 1 : 0) - (last > 0 ? 1 : 0);
  const std::int64_t rest = c.layers - first - last;
  DPML_REQUIRE_EVERYWHERE(others == 0 ? rest == 0 : rest >= others,
                          "--decoder-first-pipeline-num-layers " << first << " and --decoder-last-pipeline-num-layers " << last
                              << " leave " << rest << " of the model's " << c.layers << " layers for the " << others
                              << " other stages of --pp " << pp << (others == 0 ? " (they must use all of them)" : " (one each at least)"));
}

// Which of this pipeline rank's model chunks a Gpt is, under the interleaved schedule
// (GptChunks below): chunk `index` of `count` is virtual stage index·pp + rank of count·pp.
struct VirtualStage {
  int index = 0;
  int count = 1;
};

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>,
          class Mask = attention::Causal>
class Gpt {
 public:
  using value_type = T;
  using space = Space;
  using comm_type = Comm;
  using ParamT = Param<T, Space>;
  using View = TensorView<const T, Space>;
  using Tokens = TensorView<const std::int32_t, Space>;
  using Input = Tokens;   // a pipeline stage's micro-batch (train::StagedModel)
  using Target = Tokens;
  using Block = layers::TransformerBlock<T, Space, Comm, Mask>;

  // Host: the grid's MPI groups (collective over the pipeline axis when pp > 1).
  Gpt(const GptConfig& c, const parallel::ProcessGrid& grid)
    requires std::same_as<Comm, comm::Mpi>
      : Gpt(c, grid, &grid.comm(Axis::tensor), {}) {
    own_pair_ = tied_pair_of(grid);
    if (grid.pp() > 1 && (first_ || last_)) tied_pair_ = &own_pair_;
  }
  // Host, one chunk of GptChunks: `pair` is the tied pair's group (tied_pair_of), shared by the
  // rank's chunks; only the chunk holding the embedding or the head uses it.
  Gpt(const GptConfig& c, const parallel::ProcessGrid& grid, VirtualStage chunk, const comm::Mpi* pair)
    requires std::same_as<Comm, comm::Mpi>
      : Gpt(c, grid, &grid.comm(Axis::tensor), chunk) {
    if (grid.pp() > 1 && (first_ || last_)) tied_pair_ = pair;
  }
  // First and last pipeline rank of each (tp, dp) pipeline, the tied embedding's pair (null
  // elsewhere and with pp = 1). Collective over the pipeline axis.
  static comm::Mpi tied_pair_of(const parallel::ProcessGrid& grid)
    requires std::same_as<Comm, comm::Mpi>
  {
    if (grid.pp() == 1) return comm::Mpi(MPI_COMM_NULL);
    const bool end = grid.is_first_stage() || grid.is_last_stage();
    return grid.comm(Axis::pipeline).split(end ? 0 : MPI_UNDEFINED, grid.coord(Axis::pipeline));
  }
  // Any space: the device communicators of `comms` (tensor(), pipeline_ends()), which must outlive
  // the model.
  template <class DataComm>
  explicit Gpt(const GptConfig& c, const parallel::DeviceGrid<Comm, DataComm>& comms) : Gpt(c, comms.grid(), &comms.tensor(), {}) {
    tied_pair_ = comms.pipeline_ends();
  }
  // Any space, one chunk of GptChunks: the chunk holding the embedding or the head takes the
  // device grid's pipeline_ends() as the tied pair.
  template <class DataComm>
  Gpt(const GptConfig& c, const parallel::DeviceGrid<Comm, DataComm>& comms, VirtualStage chunk)
      : Gpt(c, comms.grid(), &comms.tensor(), chunk) {
    if (comms.grid().pp() > 1 && (first_ || last_)) tied_pair_ = comms.pipeline_ends();
  }
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  bool is_first_stage() const noexcept { return first_; }
  bool is_last_stage() const noexcept { return last_; }
  const GptConfig& config() const noexcept { return cfg_; }
  const StageBlocks& blocks_range() const noexcept { return range_; }
  // Bytes this stage's layers have sent over the tensor axis (TensorRegion::sent_bytes; 0 when tp = 1).
  std::int64_t tensor_bytes() const noexcept { return region_.sent_bytes(); }

  // One micro-batch forward. First stage: `tokens` (B, T); other stages: `received` (B, T, C).
  // Last stage: `targets` (B, T) add to the loss (see take_loss()) and, in training, the head's
  // backward runs at once (top of the file); returns the activation to send (B, T, C). With empty
  // targets (inference) the last stage stops at ln_f; see next_token_logits().
  View forward(layers::Context<Space>& ctx, Tokens tokens, View received, Tokens targets) {
    View h = first_ ? embedding_->forward(ctx, tokens) : received;
    h = blocks_.forward(ctx, h);
    if (!last_) return h;
    Saved& s = saved_.slot(ctx);
    layers::Context<Space> once = head_context(ctx);
    s.final_h = ln_f_->forward(once, h);
    s.trained = false;
    if (targets.data() == nullptr) return View();
    head_->forward(once, s.final_h, targets);
    if (!ctx.training()) return View();
    // (B, T, C) = dlogits · wte, in the blocks' backward scratch: it dies in this call
    const View dh = head_->backward_into(once, TensorView<T, Space>(ctx.dev().template shared<T>("blk.small", h.numel()), h.shape()));
    head_->backward_weight(once);           // wte (or its tied copy) += dlogitsᵀ · h
    ln_f_->backward_input_into(once, dh, View(), layers::ensure(s.d_final, h.shape()));
    ln_f_->backward_weight(once, dh);
    layers::report_grad_ready(ctx, *ln_f_);
    if (tied_copy_) report(ctx, *tied_copy_);  // pp = 1: wte is reported with the embedding, after its share
    s.trained = true;
    return View();
  }

  // Last stage, after forward: logits (V) of the token after sequence `b`'s last position, over
  // the whole vocabulary (the vocabulary-parallel shards gathered over the tensor axis), on the host.
  std::vector<float> next_token_logits(const layers::Context<Space>& ctx, std::int64_t b) {
    const View h = saved_[ctx.micro_batch].final_h;  // (B, T, C)
    const std::int64_t len = h.size(1), C = h.size(2);
    return head_->next_token_logits(head_context(ctx), View(h.data() + (b * len + len - 1) * C, Shape{C}));
  }
  // Last stage, after an evaluation forward with targets: this tensor rank's (B·T, V_pad/tp) logits
  // (ln_f and the head keep one slot; after a training forward the slot holds the dlogits).
  View head_logits(const layers::Context<Space>& ctx) { return head_->logits(head_context(ctx)); }
  // The losses of the last stage's forwards since the last take (summed over their tokens /
  // ctx.global_batch), then zeroed; 0 on other stages. The first stage's token check surfaces here
  // too. On a GPU it waits for the work queued so far.
  double take_loss() {
    if (first_) embedding_->check_tokens();
    return last_ ? head_->take_loss() : 0.0;
  }
  // With GptConfig::count_hits: the targets the last stage's evaluation forwards since the last
  // take predicted right (their logit the row's largest), then zeroed; 0 on other stages.
  double take_hits() { return last_ ? head_->take_hits() : 0.0; }

  // One micro-batch backward_input. Last stage: from the head's gradient its forward kept; others:
  // `received` (B, T, C). Returns the gradient to send to the previous stage (empty on the first
  // stage), in `into` (B, T, C) when given, else in a buffer of the slot's own.
  View backward_input(layers::Context<Space>& ctx, View received) { return backward_input(ctx, received, {}); }
  View backward_input(layers::Context<Space>& ctx, View received, TensorView<T, Space> into) {
    Saved& s = saved_.slot(ctx);
    if (last_) {
      DPML_REQUIRE(s.trained, "GPT: backward_input of micro-batch slot " << ctx.micro_batch
                                                                        << " without a training forward with targets");
      received = s.d_final.cview();
    }
    s.blocks_dy = received;
    if (last_ && !ctx.deferred_weight_gradients) {  // d_final is ours to give up: the blocks run in place
      const TensorView<T, Space> d = s.d_final.view();
      if (first_) {
        s.embedding_dy = blocks_.backward_input_in_place(ctx, d);
        return View();
      }
      if (into.data() == nullptr) into = layers::ensure(s.sent, received.shape());
      return blocks_.backward_input_in_place(ctx, d, into);
    }
    if (first_) {
      s.embedding_dy = blocks_.backward_input(ctx, received);
      return View();
    }
    if (into.data() == nullptr) into = layers::ensure(s.sent, received.shape());
    return blocks_.backward_input_into(ctx, received, into);
  }

  // The blocks' weight gradients (nothing left to do where they formed them inside B) and, on the
  // first stage, the embedding's.
  void backward_weight(layers::Context<Space>& ctx) {
    Saved& s = saved_.slot(ctx);
    blocks_.backward_weight(ctx, s.blocks_dy);
    if (first_) {
      embedding_->backward_weight(ctx, s.embedding_dy);
      layers::report_grad_ready(ctx, *embedding_);
    }
  }

  // pp > 1: the tied token-embedding gradient, summed over the first and last stage. Call after
  // the step's last backward_weight (and, with a stream-ordered pipeline, after the step's sends
  // are launched) and before the data-parallel reduction finishes.
  void finish_tied_gradients() {
    if (!tied_pair_) return;
    const ParamT& w = first_ ? embedding_->token_weight() : *tied_copy_;
    tied_pair_->allreduce(w.grad().data(), static_cast<std::size_t>(w.numel()), comm::ReduceOp::sum);
  }
  // The parameter whose data-parallel bucket must wait for finish_tied_gradients (or null).
  const ParamT* tied_parameter() {
    if (grid_.pp() == 1) return nullptr;
    return first_ ? &embedding_->token_weight() : tied_copy_.get();
  }

  std::vector<ParamT*> parameters() {
    std::vector<ParamT*> all;
    if (first_)
      for (ParamT* p : embedding_->parameters()) all.push_back(p);
    for (ParamT* p : blocks_.parameters()) all.push_back(p);
    if (last_) {
      for (ParamT* p : ln_f_->parameters()) all.push_back(p);
      if (tied_copy_) all.push_back(tied_copy_.get());
    }
    return all;
  }

 private:
  struct Saved {
    View final_h;                  // (B, T, C) ln_f's output (the head's slot: valid until the next forward)
    Tensor<T, Space> d_final;      // (B, T, C) d(last block's output), from the head at forward time
    bool trained = false;          // d_final holds this slot's training forward's
    View blocks_dy, embedding_dy;  // (B, T, C)
    Tensor<T, Space> sent;         // (B, T, C) the gradient sent back, when the caller gives no buffer
  };

  Gpt(const GptConfig& c, const parallel::ProcessGrid& grid, const Comm* tensor, VirtualStage chunk)
      : cfg_(validated(c, grid, chunk)), grid_(grid), region_(tensor), first_(grid.is_first_stage() && chunk.index == 0),
        last_(grid.is_last_stage() && chunk.index == chunk.count - 1),
        range_(stage_blocks(c, grid.pp() * chunk.count, chunk.index * grid.pp() + grid.coord(Axis::pipeline))) {
    if (first_)
      embedding_.emplace(layers::EmbeddingOptions{.vocab = c.vocab, .max_seq = c.max_seq, .dim = c.dim,
                                                  .pad_multiple = c.pad_multiple},
                         region_);
    std::vector<Block> blocks;
    for (std::int64_t i = 0; i < range_.count; ++i)
      blocks.emplace_back(layers::BlockOptions{.dim = c.dim, .heads = c.heads, .recompute = c.recompute,
                                               .recompute_gelu = c.recompute_gelu,
                                               .name = "h." + std::to_string(range_.first + i)},
                          region_);
    blocks_ = layers::Stack<Block>(std::move(blocks), "");
    if (last_) {
      ln_f_.emplace(c.dim, "ln_f");
      if (first_) {
        head_.emplace(*embedding_, head_options(c));
      } else {
        const auto part = layers::VocabPartition::make(c.vocab, region_.size(), region_.rank(), c.pad_multiple);
        tied_copy_ = std::make_unique<ParamT>("wte.weight", Shape{part.local(), c.dim}, Init::normal(0.0, 0.02),
                                              Sharding::split(0));
        tied_copy_->mark_duplicate();
        head_.emplace(*tied_copy_, part, region_, head_options(c));
      }
    }
  }

  static const GptConfig& validated(const GptConfig& c, const parallel::ProcessGrid& grid, VirtualStage chunk) {
    DPML_REQUIRE_EVERYWHERE(c.layers >= grid.pp(), "the model has " << c.layers << " layers, fewer than the " << grid.pp()
                                                                     << " pipeline stages of --pp " << grid.pp());
    DPML_REQUIRE_EVERYWHERE(c.layers >= grid.pp() * chunk.count,
                            "the model has " << c.layers << " layers, fewer than the " << grid.pp() * chunk.count
                                             << " virtual pipeline stages of --pp " << grid.pp()
                                             << " × --num-virtual-stages-per-pipeline-rank " << chunk.count);
    check_stage_cut(c, grid.pp(), chunk.count);
    DPML_REQUIRE_EVERYWHERE(c.heads % grid.tp() == 0, "--num-attention-heads " << c.heads << " is not divisible by --tp " << grid.tp());
    DPML_REQUIRE_EVERYWHERE(c.dim % grid.tp() == 0, "--hidden-size " << c.dim << " is not divisible by --tp " << grid.tp());
    DPML_REQUIRE_EVERYWHERE(c.dim % c.heads == 0, "--hidden-size " << c.dim << " is not divisible by --num-attention-heads " << c.heads);
    using Attention = kernels::Ops<Space>;
    DPML_REQUIRE_EVERYWHERE(Attention::attention_head_dim_supported(c.dim / c.heads),
                            "--hidden-size " << c.dim << " / --num-attention-heads " << c.heads << " = head dimension "
                                             << c.dim / c.heads << ": the attention kernels of this device take "
                                             << Attention::attention_head_dims);
    return c;
  }
  static layers::VocabHeadOptions head_options(const GptConfig& c) {
    return {.ignore_negative = c.masked_targets, .count_hits = c.count_hits};
  }
  // ln_f and the head consume what they compute within one forward: one buffer slot for all
  // micro-batches.
  static layers::Context<Space> head_context(const layers::Context<Space>& ctx) {
    layers::Context<Space> once = ctx;
    once.micro_batch = 0;
    return once;
  }
  static void report(layers::Context<Space>& ctx, ParamT& p) {
    ParamBase* one[] = {&p};
    ctx.grad_ready(std::span<ParamBase* const>(one, 1));
  }

  GptConfig cfg_;
  const parallel::ProcessGrid& grid_;
  parallel::TensorRegion<Comm> region_;
  bool first_, last_;
  StageBlocks range_;
  std::optional<layers::Embedding<T, Space, Comm>> embedding_;
  layers::Stack<Block> blocks_;
  std::optional<layers::LayerNorm<T, Space>> ln_f_;
  std::unique_ptr<ParamT> tied_copy_;
  std::optional<layers::VocabParallelCrossEntropy<T, Space, Comm>> head_;
  comm::Mpi own_pair_{MPI_COMM_NULL};  // host: the tied pair's group, split from the grid
  const Comm* tied_pair_ = nullptr;    // first and last stage when pp > 1, else null
  layers::Slots<Saved> saved_;
};

// models::Gpt cut into v chunks per pipeline rank for the interleaved 1F1B schedule (Narayanan et
// al. 2021; parallel::pipeline::Interleaved1F1B, TrainOptions::virtual_stages = v): the L blocks
// are cut into v·pp contiguous virtual stages, and chunk c of pipeline rank r is virtual stage
// c·pp + r — a Gpt of its own (VirtualStage), so the embedding is chunk 0 of rank 0 and ln_f with
// the tied head chunk v−1 of rank pp−1. Those two share one tied-embedding pair, as Gpt's stages
// do. The trainer runs the chunks (train::Trainer: chunks(), chunk(c)); parameters() lists every
// chunk's, chunk order. v = 1 is models::Gpt's own layout.
//
//   models::GptChunks<float> gpt(config, grid, 2);   // pp ≥ 2, L ≥ 2·pp
//   train::Trainer<models::GptChunks<float>, train::ModelLoss, Strategy, optim::AdamW> trainer(
//       gpt, grid, adamw, dist, {.micro_batches = m, .global_batch = B, .virtual_stages = 2});
//
//   models::GptChunks<bf16, CudaSpace, comm::Nccl> gpu(config, comms, 2);   // a parallel::DeviceGrid
template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>,
          class Mask = attention::Causal>
class GptChunks {
 public:
  using Chunk = Gpt<T, Space, Comm, Mask>;
  using value_type = T;
  using space = Space;
  using ParamT = typename Chunk::ParamT;

  // Collective over the pipeline axis.
  GptChunks(const GptConfig& c, const parallel::ProcessGrid& grid, int chunks)
    requires std::same_as<Comm, comm::Mpi>
      : pair_(Chunk::tied_pair_of(grid)) {
    check_chunks(chunks, grid);
    for (int i = 0; i < chunks; ++i) chunks_.emplace_back(c, grid, VirtualStage{i, chunks}, grid.pp() > 1 ? &pair_ : nullptr);
  }
  // Any space: the device communicators of `comms`, which must outlive the model.
  template <class DataComm>
  GptChunks(const GptConfig& c, const parallel::DeviceGrid<Comm, DataComm>& comms, int chunks) {
    check_chunks(chunks, comms.grid());
    for (int i = 0; i < chunks; ++i) chunks_.emplace_back(c, comms, VirtualStage{i, chunks});
  }
  GptChunks(const GptChunks&) = delete;
  GptChunks& operator=(const GptChunks&) = delete;

  int chunks() const noexcept { return static_cast<int>(chunks_.size()); }
  Chunk& chunk(int c) { return chunks_.at(static_cast<std::size_t>(c)); }
  const Chunk& chunk(int c) const { return chunks_.at(static_cast<std::size_t>(c)); }
  const GptConfig& config() const noexcept { return chunks_.front().config(); }

  std::vector<ParamT*> parameters() {
    std::vector<ParamT*> all;
    for (Chunk& ch : chunks_)
      for (ParamT* p : ch.parameters()) all.push_back(p);
    return all;
  }

 private:
  static void check_chunks(int chunks, const parallel::ProcessGrid& grid) {
    DPML_REQUIRE_EVERYWHERE(chunks >= 1, "--num-virtual-stages-per-pipeline-rank " << chunks << " must be at least 1");
    DPML_REQUIRE_EVERYWHERE(chunks == 1 || grid.pp() > 1, "--num-virtual-stages-per-pipeline-rank "
                                                              << chunks << " needs pipeline parallelism (--pp ≥ 2)");
  }

  comm::Mpi pair_{MPI_COMM_NULL};  // host: the tied pair's group (null where this rank is neither end)
  std::deque<Chunk> chunks_;  // a deque: the chunks are neither copied nor moved
};

}  // namespace dpml::models
