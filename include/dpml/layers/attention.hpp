#pragma once
// Causal multi-head self-attention with its heads split across the tensor axis (Megatron-LM).
//
//   qkv = x · W_attnᵀ + b_attn      column-parallel, C → 3C; rank k gets its heads' q, k, v
//   att = causal attention per head (kernels::Ops<Space>'s attention family), (B, T, C/tp)
//   y   = att · W_projᵀ + b_proj    row-parallel, C → C (reduce_from over the tensor axis)
//
// Weight layout of c_attn: the global weight (3C, C) has its output rows ordered (head, {q, k, v},
// head_dim) — head after head, each head's query, key and value rows side by side (Megatron's
// layout, not GPT-2's [all q | all k | all v]). A contiguous row shard, which is what a
// column-parallel split takes, is then whole heads of q, k and v: rank k holds heads
// [k · H/tp, (k + 1) · H/tp), and its (B, T, 3C/tp) output is exactly the attention kernel's
// (B, T, H/tp, 3, D) input. Loading a GPT-2 checkpoint would permute those rows.
//
// What the attention kernel keeps for its backward differs per space — the host keeps the
// probabilities (B, H/tp, T, T), a GPU the flash kernels' row log-sum-exp (B, H/tp, T) — so the
// layer keeps the Ops family's AttentionState per slot without looking inside. Head dims on a GPU:
// 32, 64 or 128 (kernels/cuda/attention.hpp).
//
// Residual join: forward(ctx, x, residual[, y]) returns residual + attention(x), the residual added
// inside c_proj's GEMM (RowParallelLinear). For a block that keeps its backward buffers in shared
// scratch, backward_input_into(ctx, dy, dx, datt, dqkv) writes into the caller's buffers and
// backward_weight_from(ctx, dy, dqkv) forms the weight gradients from them; the plain
// backward_input / backward_weight are these with buffers of the layer's own per slot.
//
// heads must be divisible by tp and C by heads; otherwise every rank raises the same Error.
// Memory per slot: c_attn's qkv (B, T, 3C/tp), the attention output (B, T, C/tp), the state, and
// c_proj's output (B, T, C); with the plain backward also dqkv and dx.

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/parallel_linear.hpp"
#include "dpml/parallel/tensor.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dpml::layers {

namespace detail {
// Checks the head split before any layer is built, on every rank alike.
inline std::int64_t heads_per_rank(std::int64_t dim, std::int64_t heads, int tp, const std::string& name) {
  DPML_REQUIRE_EVERYWHERE(heads > 0 && dim % heads == 0,
                          "attention " << name << ": model dimension " << dim << " is not divisible by " << heads
                                       << " heads");
  DPML_REQUIRE_EVERYWHERE(heads % tp == 0, "attention " << name << ": " << heads
                                                        << " heads are not divisible by the tensor-parallel degree --tp "
                                                        << tp);
  return heads / tp;
}
}  // namespace detail

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>>
class CausalSelfAttention {
  using Ops = kernels::Ops<Space>;
  using State = typename Ops::template AttentionState<T>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (B, T, C), whole on every tensor rank
  using Output = TensorView<const T, Space>;  // (B, T, C), whole on every tensor rank

  CausalSelfAttention(std::int64_t dim, std::int64_t heads, std::string name = "attn",
                      const parallel::TensorRegion<Comm>& region = {})
      : C_(dim), H_(detail::heads_per_rank(dim, heads, region.size(), name)), D_(dim / heads),
        c_attn_(dim, 3 * dim, {.bias = true, .name = name + ".c_attn"}, region),
        c_proj_(dim, dim, {.bias = true, .name = name + ".c_proj"}, region) {
    DPML_REQUIRE_EVERYWHERE(Ops::attention_head_dim_supported(D_),
                            "attention " << name << ": head dimension " << D_ << " (" << dim << " / " << heads
                                         << " heads) is not one this space's attention kernels take ("
                                         << Ops::attention_head_dims << ")");
  }

  Output forward(Context<Space>& ctx, Input x) { return forward(ctx, x, Input()); }

  // residual (B, T, C; a null view: none) + attention(x), into y (a null view: c_proj's own buffer).
  Output forward(Context<Space>& ctx, Input x, Input residual, TensorView<T, Space> y = {}) {
    DPML_REQUIRE(x.rank() == 3 && x.size(2) == C_, "attention: input " << x.shape().str() << " is not (B, T, C="
                                                                       << C_ << ")");
    const std::int64_t B = x.size(0), Tn = x.size(1);
    Saved& s = slots_.slot(ctx);
    s.qkv = c_attn_.forward(ctx, x);  // (B, T, H/tp, 3, D)
    auto att = ensure(s.att, Shape{B, Tn, H_ * D_});
    Ops::attention_forward(ctx.dev(), s.qkv.data(), att.data(), s.state, B, Tn, H_, D_);
    return c_proj_.forward(ctx, att, residual, y);
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    auto dx = ensure(s.dx, dy.shape());
    backward_input_into(ctx, dy, dx, TensorView<T, Space>(dx.data(), s.att.shape()), ensure(s.dqkv, s.qkv.shape()));
    return dx;
  }
  // dx (B, T, C) = dL/dx into the caller's buffers: datt (B, T, C/tp) is scratch and may share
  // dx's memory (it is read before dx is written); dqkv (B, T, 3C/tp) is kept for
  // backward_weight_from. One all-reduce over the tensor axis (c_attn's input gradient).
  void backward_input_into(Context<Space>& ctx, Output dy, TensorView<T, Space> dx, TensorView<T, Space> datt,
                           TensorView<T, Space> dqkv) {
    const Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.att.rank() == 3 && datt.shape() == s.att.shape() && dqkv.shape() == s.qkv.shape(),
                 "attention: backward buffers " << datt.shape().str() << ", " << dqkv.shape().str()
                                                << " do not match the forward of micro-batch " << ctx.micro_batch);
    c_proj_.backward_input_into(ctx, dy, datt);
    Ops::attention_backward(ctx.dev(), datt.data(), s.qkv.data(), s.att.data(), s.state, dqkv.data(), s.att.size(0),
                            s.att.size(1), H_, D_);
    c_attn_.backward_input_into(ctx, dqkv, dx);
  }

  void backward_weight(Context<Space>& ctx, Output dy) { backward_weight_from(ctx, dy, slots_.slot(ctx).dqkv.cview()); }
  // dW, db += … from the block output gradient dy and the dqkv of backward_input_into.
  void backward_weight_from(Context<Space>& ctx, Output dy, Output dqkv) {
    c_proj_.backward_weight(ctx, dy);
    c_attn_.backward_weight(ctx, dqkv);
  }

  // c_attn weight, bias, then c_proj weight, bias.
  std::vector<Param<T, Space>*> parameters() {
    auto p = c_attn_.parameters();
    for (auto* q : c_proj_.parameters()) p.push_back(q);
    return p;
  }

 private:
  struct Saved {
    TensorView<const T, Space> qkv;  // (B, T, H/tp, 3, D), c_attn's buffer
    Tensor<T, Space> att;            // (B, T, C/tp)
    State state;                     // what the attention kernel keeps (probabilities / log-sum-exp)
    Tensor<T, Space> dqkv;           // (B, T, H/tp, 3, D)   plain backward only
    Tensor<T, Space> dx;             // (B, T, C)            plain backward only (datt in front)
  };

  std::int64_t C_, H_, D_;  // model dim, heads on this rank, head dim
  ColumnParallelLinear<T, Space, Comm> c_attn_;
  RowParallelLinear<T, Space, Comm> c_proj_;
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
