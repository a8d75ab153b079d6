#pragma once
// Element-wise activation layers: ReLU and GELU (tanh approximation, as GPT-2), any shape, any space.
//
// Both are one class, Activation<Fn, T, Space>, read by a tag type that names the pair of
// kernels::Ops<Space> members it runs (the activation family: kernels/host/activation.hpp and
// kernels/cuda/elementwise.hpp). Forward keeps a view of its input (the previous layer's slot
// buffer) since both backward kernels take x; there are no parameters, so backward_weight is empty.

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"

#include <cstdint>
#include <vector>

namespace dpml::layers {

// Tags: Fn::forward<Ops>(dev, x, y, n) and Fn::backward<Ops>(dev, x, dy, dx, n) call Ops's members.
struct ReluFn {
  static constexpr const char* name = "ReLU";
  template <class Ops, class Dev, class T>
  static void forward(Dev& dev, const T* x, T* y, std::int64_t n) {
    Ops::relu_forward(dev, x, y, n);
  }
  template <class Ops, class Dev, class T>
  static void backward(Dev& dev, const T* x, const T* dy, T* dx, std::int64_t n) {
    Ops::relu_backward(dev, x, dy, dx, n);
  }
};

struct GeluFn {
  static constexpr const char* name = "GELU";
  template <class Ops, class Dev, class T>
  static void forward(Dev& dev, const T* x, T* y, std::int64_t n) {
    Ops::gelu_forward(dev, x, y, n);
  }
  template <class Ops, class Dev, class T>
  static void backward(Dev& dev, const T* x, const T* dy, T* dx, std::int64_t n) {
    Ops::gelu_backward(dev, x, dy, dx, n);
  }
};

template <class Fn, class T = float, class Space = HostSpace>
class Activation {
  using Ops = kernels::Ops<Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // any shape
  using Output = TensorView<const T, Space>;  // same shape

  Output forward(Context<Space>& ctx, Input x) {
    DPML_REQUIRE(x.is_contiguous(), Fn::name << ": input " << x.shape().str() << " is not contiguous");
    Saved& s = slots_.slot(ctx);
    s.x = x;
    auto y = ensure(s.y, x.shape());
    Fn::template forward<Ops>(ctx.dev(), x.data(), y.data(), x.numel());
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.x.rank() > 0 && dy.shape() == s.x.shape() && dy.is_contiguous(), Fn::name << ": dy " << dy.shape().str()
                                                                       << " differs from the input " << s.x.shape().str()
                                                                       << " of micro-batch " << ctx.micro_batch);
    auto dx = ensure(s.dx, s.x.shape());
    Fn::template backward<Ops>(ctx.dev(), s.x.data(), dy.data(), dx.data(), dx.numel());
    return dx;
  }

  void backward_weight(Context<Space>&, Output) {}
  std::vector<Param<T, Space>*> parameters() { return {}; }

 private:
  struct Saved {
    Input x;                 // the caller's buffer
    Tensor<T, Space> y, dx;  // shaped as x
  };
  Slots<Saved> slots_;
};

template <class T = float, class Space = HostSpace>
using ReLU = Activation<ReluFn, T, Space>;
template <class T = float, class Space = HostSpace>
using GELU = Activation<GeluFn, T, Space>;

}  // namespace dpml::layers
