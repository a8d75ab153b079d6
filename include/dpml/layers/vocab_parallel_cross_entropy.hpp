#pragma once
// Softmax cross-entropy over a vocabulary split across the tensor axis, with the LM head tied to
// the token embedding (Megatron-LM's vocab-parallel cross-entropy). The full logits never exist
// on one rank.
//
//   logits_k = h · W_kᵀ           h (N, C) whole on every rank; W_k (V_pad/tp, C) this rank's
//                                 rows of wte → (N, V_pad/tp) local logits, own buffer per slot
//   per row, this shard's (max m_k, Σ exp(z − m_k), z_target if the shard holds it): written in
//   slot k of a zeroed (tp, 3, N) buffer, which ONE all_reduce (sum) over the tensor axis fills
//   with every shard's triple — exactly, since the other slots add zeros (no MPI/NCCL here: the
//   region's conjugate operation)
//   M = max_k m_k,  S = Σ_k s_k · exp(m_k − M),  loss = Σ_n (M + log S − z_target) / global_batch
//   (kernels/{host,cuda}/cross_entropy.hpp; with tp = 1 one fused pass over each row instead)
//
// Padding columns (rows of wte at or past V) are masked: the GEMM computes them (whole, aligned
// shards), but they are left out of the max and the sum, as −inf logits would be, and get zero
// gradient, so the loss is the unpadded one for any tp and padding rows of wte never get a
// gradient.
//
// ctx.global_batch counts TOKENS here: the number of target tokens in the whole step (all data
// ranks, all micro-batches), so that summed micro-batch losses give the mean per-token loss and
// gradients add up unscaled. With global_batch = 0 the divisor is this call's N.
//
// The loss API of layers/cross_entropy.hpp (forward adds to a running sum in the space's memory,
// take_loss() reads it), with the head's own parameter gradient split off:
//   forward(ctx, h, targets)  the logits, the loss and — in training — dlogits = (softmax −
//                             onehot(target)) · ctx.loss_scale / global_batch written over the
//                             logits in place (the loss scale S of fp16; the loss stays unscaled)
//                             (the loss is the root of the graph; the logits' producer is this
//                             layer, which does not need them again)
//   backward(ctx)             dh = dlogits · W_k, summed over the tensor axis (copy_to's backward,
//                             because h entered every rank whole); backward_into(ctx, dh): into
//                             the caller's buffer (e.g. scratch that dies right after)
//   backward_weight(ctx)      W_k.grad += dlogitsᵀ · h   — the tied embedding's gradient
//   take_loss()               the running sum; the same on every tensor rank (count it once)
// Memory per slot: the (N, V_pad/tp) logits (then dlogits) and, with backward(), dh (N, C).
//
// Masked LM (VocabHeadOptions, models/bert.hpp): with ignore_negative a target < 0 marks a
// position that counts nothing — zero loss, zero dlogits — so only the masked positions train
// (ctx.global_batch then counts the step's masked tokens: train/batch.hpp); with count_hits an
// evaluation forward also adds to take_hits() the rows whose target has the row's largest logit
// over the whole vocabulary (the masked-token accuracy's numerator), from the same all-reduced
// stats as the loss (with tp = 1 too: the stats path instead of the fused pass, in evaluation only).
//
// next_token_logits(ctx, h_row) gives one row's logits over the whole vocabulary on the host, for
// sampling; logits(ctx) the slot's shard of logits (evaluation) or dlogits (training). Any space, through kernels::Ops<Space>; Comm is the tensor axis' communicator.

#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/cross_entropy.hpp"
#include "dpml/layers/embedding.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/parallel/tensor.hpp"

#include <cstdint>
#include <vector>

namespace dpml::layers {

struct VocabHeadOptions {
  bool ignore_negative = false;  // targets < 0 are ignored rows (a masked LM's unmasked positions)
  bool count_hits = false;       // evaluation forwards count the targets predicted right (take_hits)
};

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>>
class VocabParallelCrossEntropy {
  using Ops = kernels::Ops<Space>;
  using Stat = kernels::accum_t<T>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;              // h (..., C)
  using Target = TensorView<const std::int32_t, Space>;  // targets (...) in [0, V)

  // weight: this rank's (V_pad/tp, C) rows of the tied token table, described by `part`.
  VocabParallelCrossEntropy(Param<T, Space>& weight, VocabPartition part,
                            const parallel::TensorRegion<Comm>& region = {}, VocabHeadOptions opts = {})
      : weight_(&weight), part_(part), region_(region), opts_(opts),
        check_(kernels::IdRange{"VocabParallelCrossEntropy", "target", "the vocabulary", opts.ignore_negative}) {
    DPML_REQUIRE(weight.shape().rank() == 2 && weight.shape()[0] == part.local(),
                 "VocabParallelCrossEntropy: weight " << weight.name() << " " << weight.shape().str()
                                                      << " does not hold the shard's " << part.local() << " rows");
  }
  explicit VocabParallelCrossEntropy(Embedding<T, Space, Comm>& tied, VocabHeadOptions opts = {})
      : VocabParallelCrossEntropy(tied.token_weight(), tied.partition(), tied.region(), opts) {}

  // h (..., C), targets (...): the loss summed over tokens / ctx.global_batch, added to the running sum.
  void forward(Context<Space>& ctx, Input h, Target targets) {
    const std::int64_t C = weight_->shape()[1];
    DPML_REQUIRE(h.is_contiguous() && targets.is_contiguous() && h.rank() >= 1 && h.size(h.rank() - 1) == C &&
                     h.numel() / C == targets.numel(),
                 "VocabParallelCrossEntropy: h " << h.shape().str() << " is not (targets " << targets.shape().str()
                                                 << ", C=" << C << ")");
    const std::int64_t N = targets.numel(), Vl = part_.local();
    check_.scan(ctx.dev(), targets.data(), N, part_.vocab);
    Saved& s = slots_.slot(ctx);
    s.h = h;
    s.trained = ctx.training();
    auto z = ensure(s.logits, Shape{N, Vl});  // (N, Vl): logits, then dlogits
    Ops::linear_forward(ctx.dev(), h.data(), weight_->value().data(), static_cast<const T*>(nullptr), z.data(), N, C,
                        Vl);
    T* d = s.trained ? z.data() : nullptr;
    const double divisor = ctx.global_batch > 0 ? static_cast<double>(ctx.global_batch) : static_cast<double>(N);
    double* sum = sum_.running(ctx);
    const bool count = opts_.count_hits && !s.trained;
    if (region_.size() == 1 && !count) {
      Ops::softmax_xent(ctx.dev(), z.data(), targets.data(), d, sum, N, Vl, part_.valid(), 1.0 / divisor, ctx.loss_scale);
      return;
    }
    auto stats = ensure(stats_, Shape{region_.size(), 3, N});  // (tp, 3, N)
    Ops::vocab_xent_partials(ctx.dev(), z.data(), targets.data(), stats.data(), N, Vl, part_.begin, part_.vocab,
                             region_.size(), region_.rank());
    if (region_.size() > 1) region_.all_reduce(stats);
    if (count) Ops::vocab_xent_count_hits(ctx.dev(), targets.data(), stats.data(), hits_.running(ctx), N, part_.vocab, region_.size());
    Ops::vocab_xent_finish(ctx.dev(), z.data(), targets.data(), stats.data(), d, sum, N, Vl, part_.begin, part_.vocab,
                           region_.size(), 1.0 / divisor, ctx.loss_scale);
  }

  // dh (..., C) of the slot's training forward, summed over the tensor axis.
  Input backward(Context<Space>& ctx) {
    Saved& s = trained_slot(ctx);
    return backward_into(ctx, ensure(s.dh, s.h.shape()));
  }
  // The same into `dh` (..., C), the caller's.
  Input backward_into(Context<Space>& ctx, TensorView<T, Space> dh) {
    Saved& s = trained_slot(ctx);
    const std::int64_t C = weight_->shape()[1];
    DPML_REQUIRE(dh.shape() == s.h.shape() && dh.is_contiguous(),
                 "VocabParallelCrossEntropy: dh buffer " << dh.shape().str() << " is not a contiguous " << s.h.shape().str());
    Ops::linear_backward_input(ctx.dev(), s.logits.data(), weight_->value().data(), dh.data(), s.logits.size(0), C,
                               part_.local());
    region_.copy_to_backward(dh);
    return dh;
  }

  // weight.grad (V_pad/tp, C) += dlogitsᵀ · h (zero on the padding rows).
  void backward_weight(Context<Space>& ctx) {
    Saved& s = trained_slot(ctx);
    Ops::linear_backward_weight(ctx.dev(), s.logits.data(), s.h.data(), weight_->grad().data(), static_cast<T*>(nullptr),
                                s.logits.size(0), weight_->shape()[1], part_.local(), weight_->take_grad_zero());
  }

  double take_loss() {
    const double loss = sum_.take();
    check_.raise_if_bad();
    return loss;
  }
  // The rows predicted right by the evaluation forwards since the last take (count_hits), then
  // zeroed; the same on every tensor rank (count it once).
  double take_hits() { return hits_.take(); }

  // Logits (V) of one row h_row (C) over the whole vocabulary, on the host (for sampling): this
  // rank's shard in a zeroed row of V_pad, summed over the tensor axis (a gather: the other ranks
  // add zeros there).
  std::vector<float> next_token_logits(const Context<Space>& ctx, Input h_row) {
    const std::int64_t C = weight_->shape()[1];
    DPML_REQUIRE(h_row.numel() == C && h_row.is_contiguous(),
                 "VocabParallelCrossEntropy: next_token_logits takes one row of C=" << C << ", got "
                                                                                  << h_row.shape().str());
    auto row = ensure(row_, Shape{part_.padded});  // (V_pad)
    Ops::zero(ctx.dev(), row.data(), part_.padded);
    Ops::linear_forward(ctx.dev(), h_row.data(), weight_->value().data(), static_cast<const T*>(nullptr),
                        row.data() + part_.begin, 1, C, part_.local());
    region_.all_reduce(row);
    Tensor<T> host(Shape{part_.padded});
    copy(host.view(), TensorView<const T, Space>(row));
    std::vector<float> logits(static_cast<std::size_t>(part_.vocab));
    for (std::int64_t v = 0; v < part_.vocab; ++v) logits[static_cast<std::size_t>(v)] = static_cast<float>(host[v]);
    return logits;
  }

  // The slot's (N, V_pad/tp) buffer: this shard's logits after an evaluation forward, its dlogits
  // after a training one.
  Input logits(const Context<Space>& ctx) { return slots_.slot(ctx).logits.cview(); }

  const VocabPartition& partition() const noexcept { return part_; }

 private:
  struct Saved {
    Input h;                   // (..., C), the caller's buffer
    bool trained = false;      // the last forward formed dlogits
    Tensor<T, Space> logits;   // (N, V_pad/tp): logits, then dlogits in training
    Tensor<T, Space> dh;       // (..., C)
  };

  Saved& trained_slot(Context<Space>& ctx) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.trained, "VocabParallelCrossEntropy: backward without a training forward for micro-batch "
                                << ctx.micro_batch);
    return s;
  }

  Param<T, Space>* weight_;
  VocabPartition part_;
  parallel::TensorRegion<Comm> region_;
  VocabHeadOptions opts_;
  typename Ops::IdCheck check_;
  LossSum<Space> sum_, hits_;  // hits_: count_hits
  Tensor<Stat, Space> stats_;  // (tp, 3, N), between the two passes only
  Tensor<T, Space> row_;       // (V_pad): next_token_logits
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
