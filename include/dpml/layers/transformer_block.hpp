#pragma once
// One pre-LayerNorm GPT-2 block, tensor-parallel inside attention and MLP:
//
//   r = x + attn(ln_1(x));   y = r + mlp(ln_2(r))          x, r, y (B, T, C)
//
// Activation recomputation (recompute = true). Without it every child keeps its activations per
// micro-batch slot until that slot's backward. With it the block keeps per slot only a view of
// its input x and its output y (which the next block holds as *its* input): the children run in
// one shared scratch slot, and backward_input first reruns the forward from x there. The rerun
// is deterministic (no dropout in this block), so gradients are bit-identical to the stored
// path. Because the scratch slot is overwritten by the next micro-batch's forward, the weight
// gradients are formed inside backward_input while the recomputed activations are live, and
// backward_weight has nothing left to do: a zero-bubble schedule then finds no W work to delay
// in recomputed blocks (correct, with a bubble like 1F1B's).
//
// The block is a container (reports_grad_ready): backward_weight reports each child's
// parameters through report_grad_ready as soon as that child's gradients are final, so data
// parallel buckets can start inside the block.
//
// Parameter names (GPT-2's): ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, each
// .weight / .bias, under the prefix `name` when one is given; Stack<TransformerBlock>(blocks,
// "h") then names them h.0.ln_1.weight, … as GPT-2 does.

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/host/elementwise.hpp"
#include "dpml/layers/attention.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/layer_norm.hpp"
#include "dpml/layers/mlp.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/parallel/tensor.hpp"

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace dpml::layers {

struct BlockOptions {
  std::int64_t dim = 0;
  std::int64_t heads = 0;
  std::int64_t mlp_hidden = 0;  // 0: 4 · dim
  bool recompute = false;
  std::string name = "";  // prefix of the parameter names; empty: none
};

template <class T = float, class Space = HostSpace>
class TransformerBlock {
  static_assert(std::is_same_v<Space, HostSpace>, "dpml TransformerBlock: only the host path exists so far");

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (B, T, C)
  using Output = TensorView<const T, Space>;  // (B, T, C)
  static constexpr bool reports_grad_ready = true;

  explicit TransformerBlock(const BlockOptions& o, const parallel::TensorRegion<comm::Mpi>& region = {})
      : recompute_(o.recompute), ln_1_(o.dim, named(o, "ln_1")), attn_(o.dim, o.heads, named(o, "attn"), region),
        ln_2_(o.dim, named(o, "ln_2")), mlp_(o.dim, o.mlp_hidden, named(o, "mlp"), region) {}

  Output forward(Context<Space>& ctx, Input x) {
    Saved& s = saved_.slot(ctx);
    s.x = x;
    auto y = ensure(s.y, x.shape());
    Context<Space> inner = children_context(ctx);
    run_forward(inner, x, y);
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = saved_.slot(ctx);
    DPML_REQUIRE(dy.shape() == s.x.shape(), "TransformerBlock: dy " << dy.shape().str() << " differs from the input "
                                                                    << s.x.shape().str());
    Context<Space> inner = children_context(ctx);
    Work& w = work_.slot(inner);
    if (recompute_) run_forward(inner, s.x, ensure(w.y, s.x.shape()));
    w.d_ln_2 = mlp_.backward_input(inner, dy);
    w.d_r = add(w.dr_buf, dy, ln_2_.backward_input(inner, w.d_ln_2));  // dr = dy + d(mlp branch)/dr
    w.d_ln_1 = attn_.backward_input(inner, w.d_r);
    auto dx = add(s.dx, w.d_r, ln_1_.backward_input(inner, w.d_ln_1));
    if (recompute_)  // while the recomputed activations are live
      for_each_child_backward(w, dy, [&](auto& child, Output child_dy) { child.backward_weight(inner, child_dy); });
    return dx;
  }

  void backward_weight(Context<Space>& ctx, Output dy) {
    Context<Space> inner = children_context(ctx);
    for_each_child_backward(work_.slot(inner), dy, [&](auto& child, Output child_dy) {
      if (!recompute_) child.backward_weight(inner, child_dy);  // recompute: done in backward_input
      report_grad_ready(ctx, child);
    });
  }

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
  struct Saved {           // per micro-batch slot
    Input x;               // (B, T, C), the caller's buffer
    Tensor<T, Space> y;    // (B, T, C)
    Tensor<T, Space> dx;   // (B, T, C)
  };
  struct Work {            // per children slot (one shared slot with recompute)
    Tensor<T, Space> r;      // (B, T, C) x + attn(ln_1(x))
    Tensor<T, Space> y;      // (B, T, C) recomputed output (never the slot's y: the next block reads that)
    Tensor<T, Space> dr_buf; // (B, T, C)
    Output d_ln_2, d_r, d_ln_1;  // the dy each child's backward_weight needs again
  };

  // With recompute all children share slot 0: only one micro-batch's activations exist at a time.
  Context<Space> children_context(const Context<Space>& ctx) const {
    Context<Space> inner = ctx;
    if (recompute_) inner.micro_batch = 0;
    return inner;
  }

  void run_forward(Context<Space>& inner, Input x, TensorView<T, Space> y) {
    Work& w = work_.slot(inner);
    auto r = add(w.r, x, attn_.forward(inner, ln_1_.forward(inner, x)));
    add(y, r, mlp_.forward(inner, ln_2_.forward(inner, r)));
  }

  // f(child, the dy its backward_weight takes), children in backward order.
  template <class F>
  void for_each_child_backward(const Work& w, Output dy, F&& f) {
    f(mlp_, dy);
    f(ln_2_, w.d_ln_2);
    f(attn_, w.d_r);
    f(ln_1_, w.d_ln_1);
  }

  static std::string named(const BlockOptions& o, const char* child) {
    return o.name.empty() ? std::string(child) : o.name + "." + child;
  }

  // out = a + b (the residual connection), elementwise.
  static Output add(TensorView<T, Space> out, Output a, Output b) {
    DPML_REQUIRE(a.shape() == b.shape() && out.shape() == a.shape(), "TransformerBlock: residual add of "
                                                                          << a.shape().str() << " and "
                                                                          << b.shape().str());
    kernels::host::add(a.data(), b.data(), out.data(), out.numel());
    return out;
  }
  static Output add(Tensor<T, Space>& out, Output a, Output b) { return add(ensure(out, a.shape()), a, b); }

  bool recompute_;
  LayerNorm<T, Space> ln_1_;
  CausalSelfAttention<T, Space> attn_;
  LayerNorm<T, Space> ln_2_;
  Mlp<T, Space> mlp_;
  Slots<Saved> saved_;
  Slots<Work> work_;
};

}  // namespace dpml::layers
