#pragma once
// GPT-2 (Radford et al. 2019) as one pipeline stage's share, tensor-parallel inside.
//
//   tokens (B, T) → wte + wpe → h.0 … h.{L−1} → ln_f → logits = h · wteᵀ → cross-entropy
//
// Pipeline parallelism cuts the L blocks into pp contiguous stages (the first stages take one
// more block when pp does not divide L): the first stage also holds the embedding, the last one
// ln_f and the LM head. The head is tied to the token embedding: with pp = 1 it reads the
// embedding's own wte; with pp > 1 the last stage holds a copy of wte (same name, so the same
// initial values; marked duplicate: counted once in the gradient norm, saved once), and
// finish_tied_gradients() sums the two gradients over the first and last stage before the data
// axis reduces them (their bucket is held until then).
//
// Names follow GPT-2's checkpoints: wte.weight, wpe.weight, h.<i>.ln_1.weight, h.<i>.attn.c_attn
// .weight, …, ln_f.weight — with global block numbers on every stage, so initial weights and
// checkpoints are the same in every layout.
//
// One micro-batch on a stage: forward(ctx, tokens or received activation, targets) returns the
// activation to send on (empty on the last stage, which computes the loss instead);
// backward_input(ctx, received gradient) returns the gradient to send back (empty on the first
// stage); backward_weight(ctx) forms the weight gradients — separately, for zero-bubble schedules.

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/layers/embedding.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/layer_norm.hpp"
#include "dpml/layers/stack.hpp"
#include "dpml/layers/transformer_block.hpp"
#include "dpml/layers/vocab_parallel_cross_entropy.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/parallel/pipeline/partition.hpp"
#include "dpml/parallel/tensor.hpp"

#include <cstdint>
#include <memory>
#include <optional>
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
  std::int64_t pad_multiple = 1;   // V is padded to a multiple of tp · pad_multiple
  bool recompute = false;          // activation recomputation per block

  // Parameters of the whole (unsharded, unpadded) model.
  std::int64_t parameter_count() const {
    const std::int64_t per_block = 12 * dim * dim + 13 * dim;
    return vocab * dim + max_seq * dim + layers * per_block + 2 * dim;
  }
};

// Blocks [first, first + count) of a pipeline stage (shared with the GPU model).
using parallel::pipeline::StageBlocks;

template <class T = float>
class Gpt {
 public:
  using value_type = T;
  using space = HostSpace;
  using ParamT = Param<T, HostSpace>;
  using View = TensorView<const T>;
  using Tokens = TensorView<const std::int32_t>;
  using Input = Tokens;   // a pipeline stage's micro-batch (train::StagedModel)
  using Target = Tokens;

  Gpt(const GptConfig& c, const parallel::ProcessGrid& grid)
      : cfg_(validated(c, grid)), grid_(grid), region_(&grid.comm(Axis::tensor)),
        first_(grid.is_first_stage()), last_(grid.is_last_stage()),
        range_(StageBlocks::of(c.layers, grid.pp(), grid.coord(Axis::pipeline))) {
    if (first_)
      embedding_.emplace(layers::EmbeddingOptions{.vocab = c.vocab, .max_seq = c.max_seq, .dim = c.dim,
                                                  .pad_multiple = c.pad_multiple},
                         region_);
    std::vector<layers::TransformerBlock<T>> blocks;
    for (std::int64_t i = 0; i < range_.count; ++i)
      blocks.emplace_back(layers::BlockOptions{.dim = c.dim, .heads = c.heads, .recompute = c.recompute,
                                               .name = "h." + std::to_string(range_.first + i)},
                          region_);
    blocks_ = layers::Stack<layers::TransformerBlock<T>>(std::move(blocks), "");
    if (last_) {
      ln_f_.emplace(c.dim, "ln_f");
      if (first_) {
        head_.emplace(*embedding_);
      } else {
        const auto part = layers::VocabPartition::make(c.vocab, grid.tp(), grid.coord(Axis::tensor), c.pad_multiple);
        tied_copy_ = std::make_unique<ParamT>("wte.weight", Shape{part.local(), c.dim},
                                              Init::normal(0.0, 0.02), Sharding::split(0));
        tied_copy_->mark_duplicate();
        head_.emplace(*tied_copy_, part, region_);
      }
    }
    if (grid.pp() > 1) {  // first and last stage of each (tp, dp) pipeline: the tied-embedding group
      const bool member = first_ || last_;
      tied_group_ = grid.comm(Axis::pipeline).split(member ? 0 : MPI_UNDEFINED, grid.coord(Axis::pipeline));
    }
  }

  bool is_first_stage() const noexcept { return first_; }
  bool is_last_stage() const noexcept { return last_; }
  const GptConfig& config() const noexcept { return cfg_; }
  const StageBlocks& blocks_range() const noexcept { return range_; }

  // One micro-batch forward. First stage: `tokens` (B, T); other stages: `received` (B, T, C).
  // Last stage: `targets` (B, T) add to the loss (see take_loss()); returns the activation to send (B, T, C).
  // With empty targets (inference) the last stage stops at ln_f; see next_token_logits().
  View forward(layers::Context<HostSpace>& ctx, Tokens tokens, View received, Tokens targets) {
    View h = first_ ? embedding_->forward(ctx, tokens) : received;
    h = blocks_.forward(ctx, h);
    if (!last_) return h;
    Saved& s = saved_.slot(ctx);
    s.final_h = ln_f_->forward(ctx, h);
    if (targets.data() != nullptr) head_->forward(ctx, s.final_h, targets);
    return View();
  }

  // Last stage, after forward: logits (V) of the token after sequence `b`'s last position, over
  // the whole vocabulary (the vocabulary-parallel shards gathered over the tensor axis).
  std::vector<float> next_token_logits(const layers::Context<HostSpace>& ctx, std::int64_t b) {
    const View h = saved_[ctx.micro_batch].final_h;  // (B, T, C)
    const std::int64_t len = h.size(1), C = h.size(2);
    return head_->next_token_logits(ctx, View(h.data() + (b * len + len - 1) * C, Shape{C}));
  }
  // The losses of the last stage's forwards since the last take (summed over their tokens /
  // ctx.global_batch), then zeroed; 0 on other stages. The first stage's token check surfaces here too.
  double take_loss() {
    if (first_) embedding_->check_tokens();
    return last_ ? head_->take_loss() : 0.0;
  }

  // One micro-batch backward_input. Last stage: from its own loss; others: `received` (B, T, C).
  // Returns the gradient to send to the previous stage (empty on the first stage).
  View backward_input(layers::Context<HostSpace>& ctx, View received) {
    Saved& s = saved_.slot(ctx);
    if (last_) {
      s.head_dh = head_->backward(ctx);
      received = ln_f_->backward_input(ctx, s.head_dh);
    }
    s.blocks_dy = received;
    View dx = blocks_.backward_input(ctx, received);
    if (first_) {
      s.embedding_dy = dx;
      return View();
    }
    // The blocks' input gradient may lie in scratch they share (TransformerBlock); the message to
    // the previous stage must stay until its send completes: a copy of this slot's own.
    auto sent = layers::ensure(s.sent, dx.shape());
    copy(sent, dx);
    return sent;
  }

  void backward_weight(layers::Context<HostSpace>& ctx) {
    Saved& s = saved_.slot(ctx);
    if (last_) {
      head_->backward_weight(ctx);
      ln_f_->backward_weight(ctx, s.head_dh);
      layers::report_grad_ready(ctx, *ln_f_);
      if (tied_copy_) report(ctx, *tied_copy_);
    }
    blocks_.backward_weight(ctx, s.blocks_dy);
    if (first_) {
      embedding_->backward_weight(ctx, s.embedding_dy);
      layers::report_grad_ready(ctx, *embedding_);
    }
  }

  // pp > 1: the tied token-embedding gradient, summed over the first and last stage. Call after
  // the step's last backward_weight and before the data-parallel reduction finishes.
  void finish_tied_gradients() {
    if (tied_group_.native() == MPI_COMM_NULL) return;
    const ParamT& w = first_ ? embedding_->token_weight() : *tied_copy_;
    tied_group_.allreduce(w.grad().data(), static_cast<std::size_t>(w.numel()), comm::ReduceOp::sum);
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
    View final_h, head_dh, blocks_dy, embedding_dy;
    Tensor<T> sent;  // (B, T, C) the gradient sent to the previous stage
  };

  static const GptConfig& validated(const GptConfig& c, const parallel::ProcessGrid& grid) {
    DPML_REQUIRE_EVERYWHERE(c.layers >= grid.pp(), "the model has " << c.layers << " layers, fewer than the " << grid.pp()
                                                                     << " pipeline stages of --pp " << grid.pp());
    DPML_REQUIRE_EVERYWHERE(c.heads % grid.tp() == 0, "--num-attention-heads " << c.heads << " is not divisible by --tp " << grid.tp());
    DPML_REQUIRE_EVERYWHERE(c.dim % grid.tp() == 0, "--hidden-size " << c.dim << " is not divisible by --tp " << grid.tp());
    DPML_REQUIRE_EVERYWHERE(c.dim % c.heads == 0, "--hidden-size " << c.dim << " is not divisible by --num-attention-heads " << c.heads);
    return c;
  }
  static void report(layers::Context<HostSpace>& ctx, ParamT& p) {
    ParamBase* one[] = {&p};
    ctx.grad_ready(std::span<ParamBase* const>(one, 1));
  }

  GptConfig cfg_;
  const parallel::ProcessGrid& grid_;
  parallel::TensorRegion<comm::Mpi> region_;
  bool first_, last_;
  StageBlocks range_;
  std::optional<layers::Embedding<T>> embedding_;
  layers::Stack<layers::TransformerBlock<T>> blocks_;
  std::optional<layers::LayerNorm<T>> ln_f_;
  std::unique_ptr<ParamT> tied_copy_;
  std::optional<layers::VocabParallelCrossEntropy<T>> head_;
  comm::Mpi tied_group_{MPI_COMM_NULL};
  layers::Slots<Saved> saved_;
};

}  // namespace dpml::models
