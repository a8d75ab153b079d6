#pragma once
// Element-wise activation layers: ReLU and GELU (tanh approximation, as GPT-2), any shape.
//
// Both are one class, Activation<Fn, T, Space>, read by a tag type that names the kernel pair
// (kernels/host/activation.hpp). Forward keeps a view of its input (the previous layer's slot
// buffer) since both backward kernels need x; there are no parameters, so backward_weight is empty.

#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/host/activation.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/core/parameter.hpp"

#include <cstdint>
#include <type_traits>
#include <vector>

namespace dpml::layers {

struct ReluFn {
  static constexpr const char* name = "ReLU";
  template <class T>
  static void forward(const T* x, T* y, std::int64_t n) { kernels::host::relu_forward(x, y, n); }
  template <class T>
  static void backward(const T* x, const T* dy, T* dx, std::int64_t n) { kernels::host::relu_backward(x, dy, dx, n); }
};

struct GeluFn {
  static constexpr const char* name = "GELU";
  template <class T>
  static void forward(const T* x, T* y, std::int64_t n) { kernels::host::gelu_forward(x, y, n); }
  template <class T>
  static void backward(const T* x, const T* dy, T* dx, std::int64_t n) { kernels::host::gelu_backward(x, dy, dx, n); }
};

template <class Fn, class T = float, class Space = HostSpace>
class Activation {
  static_assert(std::is_same_v<Space, HostSpace>, "dpml activation layers: only the host path exists so far");

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
    Fn::forward(x.data(), y.data(), x.numel());
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.x.rank() > 0 && dy.shape() == s.x.shape(), Fn::name << ": dy " << dy.shape().str()
                                                                       << " differs from the input " << s.x.shape().str()
                                                                       << " of micro-batch " << ctx.micro_batch);
    auto dx = ensure(s.dx, s.x.shape());
    Fn::backward(s.x.data(), dy.data(), dx.data(), dx.numel());
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
