#pragma once
// LayerNorm over the last dimension: y = (x − μ) / √(σ² + eps) · weight + bias, with weight
// initialised to 1 and bias to 0 (GPT-2). Input (..., C), any leading dimensions.
//
// Forward saves per slot only the row statistics (mean, rstd: (rows)) beside the input view;
// backward_input gives dx, backward_weight adds dweight and dbias. The parameters are replicated
// over the tensor axis: a LayerNorm sits where activations are whole on every tensor rank, so
// every rank computes the same gradients.

#include "dpml/core/tensor.hpp"
#include "dpml/kernels/host/layer_norm.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/parameter.hpp"

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace dpml::layers {

template <class T = float, class Space = HostSpace>
class LayerNorm {
  static_assert(std::is_same_v<Space, HostSpace>, "dpml LayerNorm: only the host path (kernels/host) exists so far");

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
    kernels::host::layer_norm_forward(x.data(), weight_.value().data(), bias_.value().data(), y.data(),
                                      ensure(s.mean, Shape{rows}).data(), ensure(s.rstd, Shape{rows}).data(), rows,
                                      C_, eps_);
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    check_dy(s, dy);
    auto dx = ensure(s.dx, s.x.shape());
    kernels::host::layer_norm_backward_input(dy.data(), s.x.data(), weight_.value().data(), s.mean.data(),
                                             s.rstd.data(), dx.data(), s.x.numel() / C_, C_);
    return dx;
  }

  void backward_weight(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    check_dy(s, dy);
    kernels::host::layer_norm_backward_weight(dy.data(), s.x.data(), s.mean.data(), s.rstd.data(),
                                              weight_.grad().data(), bias_.grad().data(), s.x.numel() / C_, C_);
  }

  std::vector<Param<T, Space>*> parameters() { return {&weight_, &bias_}; }

 private:
  struct Saved {
    Input x;                           // (..., C), the caller's buffer
    Tensor<T, Space> y, mean, rstd;    // (..., C), (rows), (rows)
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
