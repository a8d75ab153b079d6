#pragma once
// LayerNorm over the last dimension: y = (x − μ) / √(σ² + eps) · weight + bias, with weight
// initialised to 1 and bias to 0 (GPT-2). Input (..., C), any leading dimensions.
//
// Forward saves per slot only the row statistics (mean, rstd: (rows)) beside the input view;
// backward_input gives dx, backward_weight adds dweight and dbias. The parameters are replicated
// over the tensor axis: a LayerNorm sits where activations are whole on every tensor rank, so
// every rank computes the same gradients.
//
// Residual joined in the backward (the fused GPT's trick, open to any model): backward_input(ctx,
// dy, dres) returns dres + dL/dx in the same pass over the rows, so a pre-LN block's residual
// gradient costs no separate add; backward_input_into writes it into the caller's buffer (a block's
// shared scratch), in place over dres if asked. Any space (kernels::Ops<Space>'s LayerNorm family);
// statistics in kernels::accum_t<T> (float, or double for double tensors).

#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace dpml::layers {

template <class T = float, class Space = HostSpace>
class LayerNorm {
  using Ops = kernels::Ops<Space>;
  using Stat = kernels::accum_t<T>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (..., C)
  using Output = TensorView<const T, Space>;  // (..., C)

  explicit LayerNorm(std::int64_t C, std::string name = "ln", double eps = 1e-5)
      : C_(C), eps_(eps), weight_(name + ".weight", Shape{C}, Init::constant(1.0)),
        bias_(name + ".bias", Shape{C}, Init::constant(0.0)) {}

  Output forward(Context<Space>& ctx, Input x) {
    DPML_REQUIRE(x.rank() >= 1 && x.size(x.rank() - 1) == C_ && x.is_contiguous(),
                 "LayerNorm " << weight_.name() << ": input " << x.shape().str() << " does not end in C=" << C_);
    Saved& s = slots_.slot(ctx);
    const std::int64_t rows = x.numel() / C_;
    s.x = x;
    auto y = ensure(s.y, x.shape());
    Ops::layer_norm_forward(ctx.dev(), x.data(), weight_.value().data(), bias_.value().data(), y.data(),
                            ensure(s.mean, Shape{rows}).data(), ensure(s.rstd, Shape{rows}).data(), rows, C_, eps_);
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) { return backward_input(ctx, dy, Output()); }

  // dres (the shape of x; a null view: none) + dL/dx, in one pass.
  Input backward_input(Context<Space>& ctx, Output dy, Output dres) {
    Saved& s = slots_.slot(ctx);
    auto dx = ensure(s.dx, s.x.shape());
    backward_input_into(ctx, dy, dres, dx);
    return dx;
  }
  // The same into the caller's buffer dx (the shape of x), which may be dres's (in place).
  void backward_input_into(Context<Space>& ctx, Output dy, Output dres, TensorView<T, Space> dx) {
    const Saved& s = slots_.slot(ctx);
    check_dy(s, dy);
    const bool joined = dres.data() != nullptr;
    DPML_REQUIRE(!joined || dres.shape() == s.x.shape(),
                 "LayerNorm " << weight_.name() << ": residual gradient " << dres.shape().str() << " differs from the input "
                              << s.x.shape().str());
    DPML_REQUIRE(dx.shape() == s.x.shape() && dx.is_contiguous(),
                 "LayerNorm " << weight_.name() << ": input gradient buffer " << dx.shape().str()
                              << " differs from the input " << s.x.shape().str());
    Ops::layer_norm_backward_input(ctx.dev(), dy.data(), s.x.data(), weight_.value().data(), s.mean.data(),
                                   s.rstd.data(), dx.data(), s.x.numel() / C_, C_, joined ? dres.data() : nullptr);
  }

  void backward_weight(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    check_dy(s, dy);
    Ops::layer_norm_backward_weight(ctx.dev(), dy.data(), s.x.data(), s.mean.data(), s.rstd.data(),
                                    weight_.grad().data(), bias_.grad().data(), s.x.numel() / C_, C_);
  }

  std::vector<Param<T, Space>*> parameters() { return {&weight_, &bias_}; }

 private:
  struct Saved {
    Input x;                           // (..., C), the caller's buffer
    Tensor<T, Space> y;                // (..., C)
    Tensor<Stat, Space> mean, rstd;    // (rows), (rows)
    Tensor<T, Space> dx;               // (..., C)
  };
  void check_dy(const Saved& s, const Output& dy) const {
    DPML_REQUIRE(dy.shape() == s.x.shape(), "LayerNorm " << weight_.name() << ": dy " << dy.shape().str()
                                                         << " differs from the input " << s.x.shape().str());
  }

  std::int64_t C_;
  double eps_;
  Param<T, Space> weight_, bias_;
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
