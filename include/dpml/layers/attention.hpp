#pragma once
// Causal multi-head self-attention with its heads split across the tensor axis (Megatron-LM).
//
//   qkv = x · W_attnᵀ + b_attn      column-parallel, C → 3C; rank k gets its heads' q, k, v
//   att = causal attention per head kernels/host/attention.hpp, (B, T, C/tp)
//   y   = att · W_projᵀ + b_proj    row-parallel, C → C (reduce_from over the tensor axis)
//
// Weight layout of c_attn: the global weight (3C, C) has its output rows ordered (head, {q, k, v},
// head_dim) — head after head, each head's query, key and value rows side by side (Megatron's
// layout, not GPT-2's [all q | all k | all v]). A contiguous row shard, which is what a
// column-parallel split takes, is then whole heads of q, k and v: rank k holds heads
// [k · H/tp, (k + 1) · H/tp), and its (B, T, 3C/tp) output is exactly the attention kernel's
// (B, T, H/tp, 3, D) input. Loading a GPT-2 checkpoint would permute those rows.
//
// heads must be divisible by tp and C by heads; otherwise every rank raises the same Error.
// Memory per slot (host path): the (B, H/tp, T, T) probabilities, the (B, T, C/tp) attention
// output and its gradients; the linears keep their own.

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/host/attention.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/parallel_linear.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/parallel/tensor.hpp"

#include <cstdint>
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
}  // namespace detail

template <class T = float, class Space = HostSpace>
class CausalSelfAttention {
  static_assert(std::is_same_v<Space, HostSpace>, "dpml CausalSelfAttention: only the host path exists so far");

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (B, T, C), whole on every tensor rank
  using Output = TensorView<const T, Space>;  // (B, T, C), whole on every tensor rank

  CausalSelfAttention(std::int64_t dim, std::int64_t heads, std::string name = "attn",
                      const parallel::TensorRegion<comm::Mpi>& region = {})
      : C_(dim), H_(detail::heads_per_rank(dim, heads, region.size(), name)), D_(dim / heads),
        c_attn_(dim, 3 * dim, {.bias = true, .name = name + ".c_attn"}, region),
        c_proj_(dim, dim, {.bias = true, .name = name + ".c_proj"}, region) {}

  Output forward(Context<Space>& ctx, Input x) {
    DPML_REQUIRE(x.rank() == 3 && x.size(2) == C_, "attention: input " << x.shape().str() << " is not (B, T, C="
                                                                       << C_ << ")");
    const std::int64_t B = x.size(0), Tn = x.size(1);
    Saved& s = slots_.slot(ctx);
    s.qkv = c_attn_.forward(ctx, x);  // (B, T, H/tp, 3, D)
    auto att = ensure(s.att, Shape{B, Tn, H_ * D_});
    kernels::host::attention_forward(s.qkv.data(), att.data(), ensure(s.probs, Shape{B, H_, Tn, Tn}).data(), B, Tn,
                                     H_, D_);
    return c_proj_.forward(ctx, att);
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    const std::int64_t B = s.att.size(0), Tn = s.att.size(1);
    auto datt = c_proj_.backward_input(ctx, dy);  // (B, T, C/tp)
    auto dqkv = ensure(s.dqkv, s.qkv.shape());
    kernels::host::attention_backward(datt.data(), s.qkv.data(), s.probs.data(), dqkv.data(), B, Tn, H_, D_);
    return c_attn_.backward_input(ctx, dqkv);
  }

  void backward_weight(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    c_proj_.backward_weight(ctx, dy);
    c_attn_.backward_weight(ctx, s.dqkv.cview());
  }

  std::vector<Param<T, Space>*> parameters() {
    auto p = c_attn_.parameters();
    for (auto* q : c_proj_.parameters()) p.push_back(q);
    return p;
  }

 private:
  struct Saved {
    TensorView<const T, Space> qkv;  // (B, T, H/tp, 3, D), c_attn's buffer
    Tensor<T, Space> att;            // (B, T, C/tp)
    Tensor<T, Space> probs;          // (B, H/tp, T, T)
    Tensor<T, Space> dqkv;           // (B, T, H/tp, 3, D)
  };

  std::int64_t C_, H_, D_;  // model dim, heads on this rank, head dim
  ColumnParallelLinear<T, Space> c_attn_;
  RowParallelLinear<T, Space> c_proj_;
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
