#pragma once
// One pre-LayerNorm GPT-2 block, tensor-parallel inside attention and MLP:
//
//   r = x + attn(ln_1(x));   y = r + mlp(ln_2(r))          x, r, y (B, T, C)
//
// The attention's mask policy is the last template argument (kernels/attention_mask.hpp):
// attention::Causal (GPT, the default) or attention::Bidirectional (an encoder: ViT), whose
// forward may take a KeyPadding (layers/attention.hpp), kept per slot for recomputation.
//
// It does what the hand-fused GPU GPT of before Step 8 did, through its children's options, on
// any space:
//   forward    each residual joins inside the row-parallel GEMM that ends its branch (copy, then
//              beta = 1: no add pass); the MLP's GELU is c_fc's epilogue. Kept per micro-batch
//              slot: ln_1 (C) and its row statistics, qkv (3C/tp), the attention output (C/tp) and
//              state (GPU: its log-sum-exp), r (C), ln_2 (C) and statistics, the pre-activation
//              (4C/tp), y (C: the next block's x), and the GELU output (4C/tp) unless
//              recompute_gelu puts it in one buffer shared by all blocks — 12·B·T·C elements at
//              tp = 1 with recompute_gelu, as the fused model
//   backward   the gradients inside the block live in scratch shared by all blocks on the Device
//              (Device::shared: "blk.small" (B, T, C), "blk.big" (B, T, max(4C, 3C)/tp), and
//              the 2-entry ring "blk.dx0"/"blk.dx1" (B, T, C) for the block's input gradient: block
//              i − 1 reads block i's while writing its own), each residual gradient joins inside
//              LayerNorm's backward (d r = dy + ln_2's; d x = d r + ln_1's, in place), and each
//              child's weight gradient follows its input gradient at once, so that the scratch is
//              free again — the fused model's order. The block's backward_input thus forms its
//              weight gradients and reports each child's parameters to ctx.grad_ready right after
//              them (data-parallel buckets start block by block); backward_weight has nothing left.
//              The returned input gradient is a ring entry: valid until the backward_input of the
//              block after the next one (a caller that keeps it longer copies it, or names its own
//              buffer: backward_input_into).
//   deferred   when ctx.deferred_weight_gradients (zero-bubble schedules: W long after B), the
//   W          block keeps per slot the gradients its children's weight gradients read — d pre
//              (4C/tp), d ln_2, d r, d qkv (3C/tp), d ln_1 and d x (C each): 11·B·T·C at tp = 1, as
//              the fused model's weight-gradient sets — and forms them in backward_weight, which
//              then reports the parameters.
//
// Activation recomputation (recompute = true). Without it every child keeps its activations per
// micro-batch slot until that slot's backward. With it the block keeps per slot only a view of
// its input x and its output y (which the next block holds as *its* input): the children run in
// one shared scratch slot, and backward_input first reruns the forward from x there. The rerun
// is deterministic (no dropout in this block), so gradients are bit-identical to the stored
// path. Because the scratch slot is overwritten by the next micro-batch's forward, the weight
// gradients are always formed inside backward_input then (deferred or not): a zero-bubble
// schedule finds no W work to delay in recomputed blocks (correct, with a bubble like 1F1B's).
//
// The block is a container (reports_grad_ready): it reports each child's parameters through
// report_grad_ready as soon as that child's gradients are final.
//
// Parameter names (GPT-2's): ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, each
// .weight / .bias, under the prefix `name` when one is given; Stack<TransformerBlock>(blocks,
// "h") then names them h.0.ln_1.weight, … as GPT-2 does.

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/attention.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/layer_norm.hpp"
#include "dpml/layers/mlp.hpp"
#include "dpml/parallel/tensor.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace dpml::layers {

struct BlockOptions {
  std::int64_t dim = 0;
  std::int64_t heads = 0;
  std::int64_t mlp_hidden = 0;  // 0: 4 · dim
  bool recompute = false;       // activation recomputation (above)
  bool recompute_gelu = false;  // the MLP's GELU output shared by all blocks, recomputed (MlpOptions)
  std::string name = "";        // prefix of the parameter names; empty: none
};

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>,
          class Mask = attention::Causal>
class TransformerBlock {
  using Attention = SelfAttention<T, Space, Comm, Mask>;
  static constexpr bool kCausal = std::is_same_v<Mask, attention::Causal>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (B, T, C)
  using Output = TensorView<const T, Space>;  // (B, T, C)
  static constexpr bool reports_grad_ready = true;

  explicit TransformerBlock(const BlockOptions& o, const parallel::TensorRegion<Comm>& region = {})
      : recompute_(o.recompute), C_(o.dim), Cp_(o.dim / region.size()),
        hidden_((o.mlp_hidden > 0 ? o.mlp_hidden : 4 * o.dim) / region.size()), ln_1_(o.dim, named(o, "ln_1")),
        attn_(o.dim, o.heads, named(o, "attn"), region), ln_2_(o.dim, named(o, "ln_2")),
        mlp_(MlpOptions{.dim = o.dim, .hidden = o.mlp_hidden, .name = named(o, "mlp"), .recompute_gelu = o.recompute_gelu},
             region) {}  // (the children refuse sizes tp does not divide, on every rank)

  Output forward(Context<Space>& ctx, Input x) { return forward_keeping(ctx, x, KeyPadding()); }
  // Bidirectional: with the valid keys of each sample (B, T).
  Output forward(Context<Space>& ctx, Input x, const KeyPadding& keys)
    requires(!kCausal)
  {
    return forward_keeping(ctx, x, keys);
  }

  Input backward_input(Context<Space>& ctx, Output dy) { return backward_input_into(ctx, dy, {}); }

  // The same into the caller's buffer dx (B, T, C; a null view: a ring entry, or the slot's own
  // when deferred) — e.g. a pipeline stage's first block writing the message it sends. dx may be
  // dy's own buffer, which the caller then gives up (not with deferred weight gradients): the
  // gradient runs in place, as in the fused GPT, and a chain of blocks needs no ring.
  Input backward_input_into(Context<Space>& ctx, Output dy, TensorView<T, Space> dx) {
    Saved& s = saved_.slot(ctx);
    DPML_REQUIRE(s.x.rank() == 3 && dy.shape() == s.x.shape(),
                 "TransformerBlock: dy " << dy.shape().str() << " differs from the input " << s.x.shape().str()
                                         << " (micro-batch " << ctx.micro_batch << ")");
    s.weights_pending = ctx.deferred_weight_gradients && !recompute_;
    Context<Space> inner = children_context(ctx);
    if (recompute_) run_forward(inner, s.x, shared(ctx, "blk.rerun", s.x.shape()), s.keys);  // output unused
    DPML_REQUIRE(dx.data() == nullptr || (dx.shape() == s.x.shape() && dx.is_contiguous()),
                 "TransformerBlock: input gradient buffer " << dx.shape().str() << " is not a contiguous " << s.x.shape().str());
    DPML_REQUIRE(dx.data() != dy.data() || !s.weights_pending,
                 "TransformerBlock: backward in place (dx over dy) with the weight gradients deferred, which read dy later");
    const Grads g = s.weights_pending ? kept_grads(s) : shared_grads(ctx, dy, dx);
    const bool now = !s.weights_pending;
    if (dx.data() == nullptr) dx = g.dx;
    mlp_.backward_input_into(inner, dy, g.d_ln2, g.d_pre);
    if (now) weight_gradients(Child::mlp, ctx, inner, dy, g);
    ln_2_.backward_input_into(inner, g.d_ln2, dy, g.d_r);  // d r = dy + d(mlp branch)/dr
    if (now) weight_gradients(Child::ln_2, ctx, inner, dy, g);
    attn_.backward_input_into(inner, g.d_r, g.d_ln1, g.d_att, g.d_qkv);
    if (now) weight_gradients(Child::attn, ctx, inner, dy, g);
    ln_1_.backward_input_into(inner, g.d_ln1, g.d_r, dx);  // d x = d r + d(attention branch)/dx
    if (now) weight_gradients(Child::ln_1, ctx, inner, dy, g);
    return dx;
  }

  // Deferred (zero-bubble) only: the weight gradients from what backward_input kept, and the
  // reports. Otherwise backward_input formed and reported them already.
  void backward_weight(Context<Space>& ctx, Output dy) {
    Saved& s = saved_.slot(ctx);
    if (!s.weights_pending) return;
    DPML_REQUIRE(dy.shape() == s.x.shape(), "TransformerBlock: dy " << dy.shape().str() << " differs from the input "
                                                                    << s.x.shape().str());
    Context<Space> inner = children_context(ctx);
    const Grads g = kept_grads(s);
    for (Child c : {Child::mlp, Child::ln_2, Child::attn, Child::ln_1}) weight_gradients(c, ctx, inner, dy, g);
    s.weights_pending = false;
  }

  // ln_1, attention, ln_2, MLP: each its weights then biases.
  std::vector<Param<T, Space>*> parameters() {
    std::vector<Param<T, Space>*> p;
    for (auto* q : ln_1_.parameters()) p.push_back(q);
    for (auto* q : attn_.parameters()) p.push_back(q);
    for (auto* q : ln_2_.parameters()) p.push_back(q);
    for (auto* q : mlp_.parameters()) p.push_back(q);
    return p;
  }

  bool recompute() const noexcept { return recompute_; }

 private:
  using View = TensorView<T, Space>;
  enum class Child { mlp, ln_2, attn, ln_1 };  // in backward order

  // The gradients inside one backward, (B, T, ·): scratch shared by all blocks, or per slot.
  struct Grads {
    View d_pre;  // (…, hidden/tp) at c_fc's output
    View d_ln2;  // (…, C)         at ln_2's output
    View d_r;    // (…, C)         at r = x + attention
    View d_att;  // (…, C/tp)      at the attention output (read before d_ln1 is written: may share it)
    View d_qkv;  // (…, 3C/tp)     at c_attn's output
    View d_ln1;  // (…, C)         at ln_1's output
    View dx;     // (…, C)         at x (shared: in place over d_r)
  };
  struct Saved {                  // per micro-batch slot
    Input x;                      // (B, T, C), the caller's buffer
    KeyPadding keys;              // (B, T) the forward's valid keys (bidirectional; empty: all)
    Tensor<T, Space> y;           // (B, T, C) with recompute: the output outlives the children's slot
    bool weights_pending = false; // backward_input left the weight gradients to backward_weight
    Tensor<T, Space> d_pre, d_ln2, d_r, d_qkv, d_ln1, dx;  // deferred weight gradients only (Grads)
  };

  // With recompute all children share slot 0: only one micro-batch's activations exist at a time.
  Context<Space> children_context(const Context<Space>& ctx) const {
    Context<Space> inner = ctx;
    if (recompute_) inner.micro_batch = 0;
    return inner;
  }

  Output forward_keeping(Context<Space>& ctx, Input x, const KeyPadding& keys) {
    DPML_REQUIRE(x.rank() == 3 && x.size(2) == C_ && x.is_contiguous(),
                 "TransformerBlock: input " << x.shape().str() << " is not (B, T, C=" << C_ << ")");
    Saved& s = saved_.slot(ctx);
    s.x = x;
    if constexpr (!kCausal) s.keys = keys;
    if (!recompute_) return run_forward(ctx, x, {}, keys);
    Context<Space> inner = children_context(ctx);
    return run_forward(inner, x, ensure(s.y, x.shape()), keys);  // y outlives the shared slot
  }

  // r = x + attn(ln_1 x), y = r + mlp(ln_2 r): the residuals join in the branches' last GEMMs.
  // y: where the output goes (a null view: the MLP's own buffer); keys: bidirectional only.
  Output run_forward(Context<Space>& c, Input x, View y, const KeyPadding& keys) {
    Output r;
    if constexpr (kCausal)
      r = attn_.forward(c, ln_1_.forward(c, x), x);
    else
      r = attn_.forward(c, ln_1_.forward(c, x), x, {}, keys);
    return mlp_.forward(c, ln_2_.forward(c, r), r, y);
  }

  static Shape with_last(const Shape& s, std::int64_t n) { return detail::with_last(s, n); }
  static View shared(Context<Space>& ctx, std::string_view key, const Shape& shape) {
    return View(ctx.dev().template shared<T>(key, shape.numel()), shape);
  }
  // Scratch shared by all blocks; d r and then the input gradient in the caller's dx when given
  // (d r is read only before dx is written over it; dx may be dy's buffer: d r = dy + … is formed
  // in place once the MLP has read dy), else in the ring entry that does not hold dy.
  Grads shared_grads(Context<Space>& ctx, Output dy, View dx) const {
    const Shape s = dy.shape();
    const View small = shared(ctx, "blk.small", s);
    const View big = shared(ctx, "blk.big", with_last(s, std::max(hidden_, 3 * Cp_)));
    View d = dx;
    if (d.data() == nullptr) {
      const View ring[2] = {shared(ctx, "blk.dx0", s), shared(ctx, "blk.dx1", s)};  // both: they grow together
      d = ring[0].data() == dy.data() ? ring[1] : ring[0];
    }
    return {.d_pre = View(big.data(), with_last(s, hidden_)), .d_ln2 = small, .d_r = d,
            .d_att = View(small.data(), with_last(s, Cp_)), .d_qkv = View(big.data(), with_last(s, 3 * Cp_)),
            .d_ln1 = small, .dx = d};
  }
  // Per slot, for weight gradients formed later (the same shapes every call: views are stable).
  Grads kept_grads(Saved& s) const {
    const Shape x = s.x.shape();
    const View d_ln1 = ensure(s.d_ln1, x);
    return {.d_pre = ensure(s.d_pre, with_last(x, hidden_)), .d_ln2 = ensure(s.d_ln2, x), .d_r = ensure(s.d_r, x),
            .d_att = View(d_ln1.data(), with_last(x, Cp_)), .d_qkv = ensure(s.d_qkv, with_last(x, 3 * Cp_)),
            .d_ln1 = d_ln1, .dx = ensure(s.dx, x)};
  }

  // Child c's weight gradients from the buffers of the input pass (dy: the block's), then its report.
  void weight_gradients(Child c, Context<Space>& ctx, Context<Space>& inner, Output dy, const Grads& g) {
    switch (c) {
      case Child::mlp:
        mlp_.backward_weight_from(inner, dy, g.d_pre);
        return report_grad_ready(ctx, mlp_);
      case Child::ln_2:
        ln_2_.backward_weight(inner, g.d_ln2);
        return report_grad_ready(ctx, ln_2_);
      case Child::attn:
        attn_.backward_weight_from(inner, g.d_r, g.d_qkv);
        return report_grad_ready(ctx, attn_);
      case Child::ln_1:
        ln_1_.backward_weight(inner, g.d_ln1);
        return report_grad_ready(ctx, ln_1_);
    }
  }

  static std::string named(const BlockOptions& o, const char* child) {
    return o.name.empty() ? std::string(child) : o.name + "." + child;
  }

  bool recompute_;
  std::int64_t C_, Cp_, hidden_;  // C, C/tp, hidden/tp
  LayerNorm<T, Space> ln_1_;
  Attention attn_;
  LayerNorm<T, Space> ln_2_;
  Mlp<T, Space, Comm> mlp_;
  Slots<Saved> saved_;
};

}  // namespace dpml::layers
