#pragma once
// The transformer's feed-forward block with its hidden layer split across the tensor axis:
//
//   h = GELU(x · W_fcᵀ + b_fc)      column-parallel, C → hidden (default 4C), (..., hidden/tp)
//   y = h · W_projᵀ + b_proj        row-parallel, hidden → C (reduce_from over the tensor axis)
//
// GELU is the tanh approximation (GPT-2), applied to each rank's slice: elementwise, so no
// communication, and fused into c_fc's product (kernels::Ops<Space>::linear_gelu_forward: the
// GEMM's epilogue on a GPU), which keeps the pre-activation for the backward. One all-reduce
// forward (in c_proj) and one backward (in c_fc). A hidden size that tp does not divide is
// refused on every rank alike.
//
// GELU recompute (MlpOptions::recompute_gelu, the fused GPT's option): h is needed again only by
// c_proj's weight gradient, so it lives in one buffer shared by every MLP on the Device
// (Device::shared, key "mlp.gelu") instead of one per layer and slot, and the weight gradient
// recomputes it from the pre-activation first: (B, T, hidden/tp) less per layer for one more
// element-wise pass in the backward.
//
// Residual join: forward(ctx, x, residual[, y]) returns residual + mlp(x), the residual added
// inside c_proj's GEMM. For a block that keeps its backward buffers in shared scratch,
// backward_input_into(ctx, dy, dx, dpre) and backward_weight_from(ctx, dy, dpre) take the caller's
// buffers; the plain backward_input / backward_weight are these with buffers of its own per slot.

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/parallel_linear.hpp"
#include "dpml/parallel/tensor.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dpml::layers {

struct MlpOptions {
  std::int64_t dim = 0;
  std::int64_t hidden = 0;      // 0: 4 · dim
  std::string name = "mlp";
  bool recompute_gelu = false;  // GELU output in shared scratch, recomputed for c_proj's weight gradient
};

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>>
class Mlp {
  using Ops = kernels::Ops<Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (..., C), whole on every tensor rank
  using Output = TensorView<const T, Space>;  // (..., C), whole on every tensor rank

  explicit Mlp(const MlpOptions& o, const parallel::TensorRegion<Comm>& region = {})
      : recompute_gelu_(o.recompute_gelu), hidden_local_(checked_hidden(o, region.size()) / region.size()),
        c_fc_(o.dim, hidden_local_ * region.size(), {.bias = true, .name = o.name + ".c_fc"}, region),
        c_proj_(hidden_local_ * region.size(), o.dim, {.bias = true, .name = o.name + ".c_proj"}, region) {}
  // hidden = 0: 4 · dim.
  Mlp(std::int64_t dim, std::int64_t hidden = 0, std::string name = "mlp", const parallel::TensorRegion<Comm>& region = {})
      : Mlp(MlpOptions{.dim = dim, .hidden = hidden, .name = std::move(name)}, region) {}

  Output forward(Context<Space>& ctx, Input x) { return forward(ctx, x, Input()); }

  // residual (..., C; a null view: none) + mlp(x), into y (a null view: c_proj's own buffer).
  Output forward(Context<Space>& ctx, Input x, Input residual, TensorView<T, Space> y = {}) {
    Saved& s = slots_.slot(ctx);
    const Shape hs = detail::with_last(x.shape(), hidden_local_);
    const auto h = activation(ctx, s, hs);
    c_fc_.forward_gelu_into(ctx, x, ensure(s.pre, hs), h);
    return c_proj_.forward(ctx, h, residual, y);
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    auto dx = ensure(s.dx, dy.shape());
    backward_input_into(ctx, dy, dx, ensure(s.dpre, s.pre.shape()));
    return dx;
  }
  // dx (..., C) = dL/dx into the caller's buffers; dpre (..., hidden/tp), the gradient at c_fc's
  // output, is kept for backward_weight_from. One all-reduce over the tensor axis (in c_fc).
  void backward_input_into(Context<Space>& ctx, Output dy, TensorView<T, Space> dx, TensorView<T, Space> dpre) {
    const Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.pre.rank() > 0 && dpre.shape() == s.pre.shape(),
                 "MLP: pre-activation gradient buffer " << dpre.shape().str() << " does not match the forward of "
                                                        << "micro-batch " << ctx.micro_batch);
    c_proj_.backward_input_into(ctx, dy, dpre);  // d h
    Ops::gelu_backward(ctx.dev(), s.pre.data(), dpre.data(), dpre.data(), dpre.numel());  // d pre, in place
    c_fc_.backward_input_into(ctx, dpre, dx);
  }

  void backward_weight(Context<Space>& ctx, Output dy) { backward_weight_from(ctx, dy, slots_.slot(ctx).dpre.cview()); }
  // dW, db += … from the output gradient dy and the dpre of backward_input_into; with
  // recompute_gelu, the GELU output is recomputed into the shared buffer first.
  void backward_weight_from(Context<Space>& ctx, Output dy, Output dpre) {
    Saved& s = slots_.slot(ctx);
    Output h = s.h.cview();
    if (recompute_gelu_) {
      const auto shared = activation(ctx, s, s.pre.shape());
      Ops::gelu_forward(ctx.dev(), s.pre.data(), shared.data(), shared.numel());
      h = shared;
    }
    c_proj_.backward_weight(ctx, dy, h);
    c_fc_.backward_weight(ctx, dpre);
  }

  // c_fc weight, bias, then c_proj weight, bias.
  std::vector<Param<T, Space>*> parameters() {
    auto p = c_fc_.parameters();
    for (auto* q : c_proj_.parameters()) p.push_back(q);
    return p;
  }

  bool recompute_gelu() const noexcept { return recompute_gelu_; }

 private:
  static std::int64_t checked_hidden(const MlpOptions& o, int tp) {
    const std::int64_t n = o.hidden > 0 ? o.hidden : 4 * o.dim;
    DPML_REQUIRE_EVERYWHERE(n % tp == 0, "MLP " << o.name << ": hidden size " << n
                                                << " is not divisible by the tensor-parallel degree --tp " << tp);
    return n;
  }
  struct Saved {
    Tensor<T, Space> pre;       // (..., hidden/tp) GELU input
    Tensor<T, Space> h;         // (..., hidden/tp) GELU output, without recompute_gelu
    Tensor<T, Space> dpre, dx;  // (..., hidden/tp), (..., C): plain backward only
  };
  // The GELU output's buffer: shared by every MLP on the Device with recompute_gelu, else the slot's.
  TensorView<T, Space> activation(Context<Space>& ctx, Saved& s, const Shape& shape) {
    if (!recompute_gelu_) return ensure(s.h, shape);
    return TensorView<T, Space>(ctx.dev().template shared<T>("mlp.gelu", shape.numel()), shape);
  }

  bool recompute_gelu_;
  std::int64_t hidden_local_;  // hidden/tp
  ColumnParallelLinear<T, Space, Comm> c_fc_;
  RowParallelLinear<T, Space, Comm> c_proj_;
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
