#pragma once
// Residual<Body, Shortcut>: y = shortcut(x) + body(x), itself a Layer. With the default
// Shortcut = Identity, y = x + body(x); a projection (e.g. Sequential<Conv2d, BatchNorm2d> with
// stride 2, as in ResNet's down-sampling blocks) is any Layer with the same Input and Output.
//
//   backward_input   dx = body.backward_input(dy) + shortcut.backward_input(dy)   (or + dy)
//   backward_weight  body's, then the shortcut's, each followed by report_grad_ready
//   parameters()     body's, prefixed "body.", then the shortcut's, prefixed "shortcut."
//
// residual_add(ctx, out, a, b) is the add itself (kernels::Ops<Space>::add on ctx's device), for
// other layers (transformer blocks) to use. Any space: the children's and the add's.

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpml::layers {

// out = a + b (same shapes), resizing `out`; returns a view of it.
template <class T, class Space>
TensorView<const T, Space> residual_add(const Context<Space>& ctx, Tensor<T, Space>& out,
                                        std::type_identity_t<TensorView<const T, Space>> a,
                                        std::type_identity_t<TensorView<const T, Space>> b) {
  DPML_REQUIRE(a.shape() == b.shape() && a.is_contiguous() && b.is_contiguous(),
               "residual add of shapes " << a.shape().str() << " and " << b.shape().str());
  auto y = ensure(out, a.shape());
  kernels::Ops<Space>::add(ctx.dev(), a.data(), b.data(), y.data(), y.numel());
  return y;
}

// The default shortcut of Residual: x itself.
struct Identity {};

template <class Body, class Shortcut = Identity>
class Residual {
  static_assert(check_layer<Body>());
  static constexpr bool has_shortcut = !std::is_same_v<Shortcut, Identity>;

 public:
  using value_type = typename Body::value_type;
  using space = typename Body::space;
  using Input = typename Body::Input;
  using Output = typename Body::Output;
  using ParamT = Param<value_type, space>;
  static constexpr bool reports_grad_ready = true;
  static_assert(std::is_same_v<Input, TensorView<const value_type, space>> && std::is_same_v<Input, Output>,
                "dpml Residual: the body maps a tensor view to one of the same shape");

  explicit Residual(Body body, Shortcut shortcut = {}) : body_(std::move(body)), shortcut_(std::move(shortcut)) {
    for (ParamT* p : body_.parameters()) p->prefix_name("body");
    if constexpr (has_shortcut) {
      static_assert(check_layer<Shortcut>());
      static_assert(std::is_same_v<typename Shortcut::Input, Input> && std::is_same_v<typename Shortcut::Output, Output>,
                    "dpml Residual: the shortcut must take and give the body's views");
      for (ParamT* p : shortcut_.parameters()) p->prefix_name("shortcut");
    }
  }

  Body& body() noexcept { return body_; }
  Shortcut& shortcut() noexcept { return shortcut_; }

  Output forward(Context<space>& ctx, Input x) {
    Output fx = body_.forward(ctx, x);
    Output sx = x;
    if constexpr (has_shortcut) sx = shortcut_.forward(ctx, x);
    DPML_REQUIRE(fx.shape() == sx.shape(), "Residual: the body gives " << fx.shape().str() << " but the shortcut "
                                                                        << sx.shape().str());
    return residual_add(ctx, slots_.slot(ctx).y, sx, fx);
  }

  Input backward_input(Context<space>& ctx, Output dy) {
    Input dbody = body_.backward_input(ctx, dy);
    Input dshort = dy;
    if constexpr (has_shortcut) dshort = shortcut_.backward_input(ctx, dy);
    return residual_add(ctx, slots_.slot(ctx).dx, dshort, dbody);
  }

  void backward_weight(Context<space>& ctx, Output dy) {
    body_.backward_weight(ctx, dy);
    report_grad_ready(ctx, body_);
    if constexpr (has_shortcut) {
      shortcut_.backward_weight(ctx, dy);
      report_grad_ready(ctx, shortcut_);
    }
  }

  std::vector<ParamT*> parameters() {
    std::vector<ParamT*> all;
    for (ParamT* p : body_.parameters()) all.push_back(p);
    if constexpr (has_shortcut)
      for (ParamT* p : shortcut_.parameters()) all.push_back(p);
    return all;
  }

 private:
  struct Saved {
    Tensor<value_type, space> y, dx;  // shaped as the output / the input
  };
  Body body_;
  [[no_unique_address]] Shortcut shortcut_;
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
