#pragma once
// Multi-head self-attention with its heads split across the tensor axis (Megatron-LM), causal or
// bidirectional by a mask policy (kernels/attention_mask.hpp): SelfAttention<T, Space, Comm, Mask>,
// CausalSelfAttention (GPT) and BidirectionalSelfAttention (ViT) name the two.
//
//   qkv = x · W_attnᵀ + b_attn      column-parallel, C → 3C; rank k gets its heads' q, k, v
//   att = attention per head under Mask (kernels::Ops<Space>'s attention family), (B, T, C/tp)
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
// Key padding (bidirectional only): forward(…, KeyPadding) names per sample the valid keys — a
// count (keys [0, n) valid) or a bool mask (B, T) — and padded keys get no probability. The
// backward needs nothing more: the kept probabilities are 0 there. On CudaSpace a forward given
// key padding is refused (the flash kernels take no key mask yet).
//
// heads must be divisible by tp and C by heads; otherwise every rank raises the same Error. A
// space whose attention kernels lack the mask policy refuses at construction, on every rank:
// "no kernel for this space: bidirectional attention …".
// Memory per slot: c_attn's qkv (B, T, 3C/tp), the attention output (B, T, C/tp), the state, and
// c_proj's output (B, T, C); with the plain backward also dqkv and dx.

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/attention_mask.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/parallel_linear.hpp"
#include "dpml/parallel/tensor.hpp"

#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
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
// dim, once the space's attention kernels are known to take Mask: refused on every rank before any
// buffer is made. (An if constexpr, not DPML_REQUIRE: nvcc warns on a check that always fails.)
template <class Ops, class Mask>
std::int64_t dim_for_mask(std::int64_t dim, const std::string& name) {
  if constexpr (!Ops::attention_mask_supported(Mask{})) {
    std::ostringstream os;
    os << "no kernel for this space: " << Mask::name << " attention " << name << " (this space's attention kernels are "
       << Ops::attention_masks << " only)";
    throw Error(os.str(), Scope::everywhere);
  }
  return dim;
}
}  // namespace detail

// Which keys of each sample are valid under bidirectional attention: (B, T) bytes, 1 = valid.
// Empty (default): every key. Each sample keeps at least one valid key.
class KeyPadding {
 public:
  KeyPadding() = default;
  // Sample b's keys [0, valid[b]) are valid; 1 ≤ valid[b] ≤ T.
  static KeyPadding lengths(std::span<const std::int64_t> valid, std::int64_t T) {
    KeyPadding k(static_cast<std::int64_t>(valid.size()), T);
    for (std::int64_t b = 0; b < k.B_; ++b) {
      const std::int64_t n = valid[static_cast<std::size_t>(b)];
      DPML_REQUIRE(n >= 1 && n <= T, "key padding: sample " << b << " has " << n << " valid keys, not in [1, " << T << "]");
      for (std::int64_t j = 0; j < n; ++j) k.keys_[static_cast<std::size_t>(b * T + j)] = 1;
    }
    return k;
  }
  // mask (B, T): true = a valid key; every sample has one.
  static KeyPadding mask(std::span<const bool> valid, std::int64_t B, std::int64_t T) {
    DPML_REQUIRE(B >= 0 && T >= 1 && static_cast<std::int64_t>(valid.size()) == B * T,
                 "key padding: a mask of " << valid.size() << " entries is not (B=" << B << ", T=" << T << ")");
    KeyPadding k(B, T);
    for (std::int64_t b = 0; b < B; ++b) {
      std::int64_t n = 0;
      for (std::int64_t j = 0; j < T; ++j) {
        const auto i = static_cast<std::size_t>(b * T + j);
        k.keys_[i] = valid[i] ? 1 : 0;
        n += k.keys_[i];
      }
      DPML_REQUIRE(n > 0, "key padding: sample " << b << " has no valid key");
    }
    return k;
  }

  bool empty() const noexcept { return keys_.empty(); }
  std::int64_t batch() const noexcept { return B_; }
  std::int64_t tokens() const noexcept { return T_; }
  const std::uint8_t* data() const noexcept { return keys_.empty() ? nullptr : keys_.data(); }  // (B, T) or null

 private:
  KeyPadding(std::int64_t B, std::int64_t T) : B_(B), T_(T), keys_(static_cast<std::size_t>(B * T), 0) {}
  std::int64_t B_ = 0, T_ = 0;
  std::vector<std::uint8_t> keys_;  // (B, T)
};

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>,
          class Mask = attention::Causal>
class SelfAttention {
  using Ops = kernels::Ops<Space>;
  using State = typename Ops::template AttentionState<T>;
  static constexpr bool kCausal = std::is_same_v<Mask, attention::Causal>;
  static_assert(kCausal || std::is_same_v<Mask, attention::Bidirectional>,
                "SelfAttention: Mask is attention::Causal or attention::Bidirectional");

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (B, T, C), whole on every tensor rank
  using Output = TensorView<const T, Space>;  // (B, T, C), whole on every tensor rank

  SelfAttention(std::int64_t dim, std::int64_t heads, std::string name = "attn",
                const parallel::TensorRegion<Comm>& region = {})
      : C_(detail::dim_for_mask<Ops, Mask>(dim, name)), H_(detail::heads_per_rank(dim, heads, region.size(), name)),
        D_(dim / heads),
        c_attn_(dim, 3 * dim, {.bias = true, .name = name + ".c_attn"}, region),
        c_proj_(dim, dim, {.bias = true, .name = name + ".c_proj"}, region) {
    DPML_REQUIRE_EVERYWHERE(Ops::attention_head_dim_supported(D_),
                            "attention " << name << ": head dimension " << D_ << " (" << dim << " / " << heads
                                         << " heads) is not one this space's attention kernels take ("
                                         << Ops::attention_head_dims << ")");
  }

  Output forward(Context<Space>& ctx, Input x) { return run_forward(ctx, x, Input(), {}, nullptr); }
  // Bidirectional: with the valid keys of each sample (B, T).
  Output forward(Context<Space>& ctx, Input x, const KeyPadding& keys)
    requires(!kCausal)
  {
    return run_forward(ctx, x, Input(), {}, &keys);
  }

  // residual (B, T, C; a null view: none) + attention(x), into y (a null view: c_proj's own buffer).
  Output forward(Context<Space>& ctx, Input x, Input residual, TensorView<T, Space> y = {}) {
    return run_forward(ctx, x, residual, y, nullptr);
  }
  Output forward(Context<Space>& ctx, Input x, Input residual, TensorView<T, Space> y, const KeyPadding& keys)
    requires(!kCausal)
  {
    return run_forward(ctx, x, residual, y, &keys);
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
    if constexpr (kCausal)
      Ops::attention_backward(ctx.dev(), datt.data(), s.qkv.data(), s.att.data(), s.state, dqkv.data(), s.att.size(0),
                              s.att.size(1), H_, D_);
    else if constexpr (Ops::attention_mask_supported(Mask{}))  // else refused at construction
      Ops::attention_backward(ctx.dev(), datt.data(), s.qkv.data(), s.att.data(), s.state, dqkv.data(), s.att.size(0),
                              s.att.size(1), H_, D_, Mask{});
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
  // keys: the valid keys (bidirectional; null: all).
  Output run_forward(Context<Space>& ctx, Input x, Input residual, TensorView<T, Space> y, const KeyPadding* keys) {
    DPML_REQUIRE(x.rank() == 3 && x.size(2) == C_, "attention: input " << x.shape().str() << " is not (B, T, C="
                                                                       << C_ << ")");
    const std::int64_t B = x.size(0), Tn = x.size(1);
    const bool padded = keys != nullptr && !keys->empty();
    DPML_REQUIRE(!padded || (keys->batch() == B && keys->tokens() == Tn),
                 "attention: key padding (" << keys->batch() << ", " << keys->tokens() << ") is not the input's (B="
                                            << B << ", T=" << Tn << ")");
    Saved& s = slots_.slot(ctx);
    s.qkv = c_attn_.forward(ctx, x);  // (B, T, H/tp, 3, D)
    auto att = ensure(s.att, Shape{B, Tn, H_ * D_});
    if constexpr (kCausal)
      Ops::attention_forward(ctx.dev(), s.qkv.data(), att.data(), s.state, B, Tn, H_, D_);
    else if constexpr (Ops::attention_mask_supported(Mask{}))  // else refused at construction
      Ops::attention_forward(ctx.dev(), s.qkv.data(), att.data(), s.state, B, Tn, H_, D_,
                             Mask{.keys = padded ? keys->data() : nullptr});
    return c_proj_.forward(ctx, att, residual, y);
  }

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

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>>
using CausalSelfAttention = SelfAttention<T, Space, Comm, attention::Causal>;
template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>>
using BidirectionalSelfAttention = SelfAttention<T, Space, Comm, attention::Bidirectional>;

}  // namespace dpml::layers
