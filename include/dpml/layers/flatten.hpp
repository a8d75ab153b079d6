#pragma once
// Flatten: (N, d1, d2, …) → (N, d1·d2·…), a view of the same elements (no copy); backward
// reshapes dy back to the input's shape. Any space: a reshape runs no kernel. It flattens in the
// input's memory order, whatever layout that is (NCHW on the host): the order of the features the
// next layer sees is the producer's.

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/layers/layer.hpp"

#include <vector>

namespace dpml::layers {

template <class T = float, class Space = HostSpace>
class Flatten {
 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (N, ...)
  using Output = TensorView<const T, Space>;  // (N, rest)

  Output forward(Context<Space>& ctx, Input x) {
    DPML_REQUIRE(x.rank() >= 1 && x.is_contiguous(), "Flatten: input " << x.shape().str() << " needs a batch dimension");
    shapes_.slot(ctx) = x.shape();
    return x.reshape(Shape{x.size(0), x.size(0) > 0 ? x.numel() / x.size(0) : 0});
  }
  Input backward_input(Context<Space>& ctx, Output dy) {
    const Shape& in = shapes_.slot(ctx);
    DPML_REQUIRE(in.rank() > 0 && dy.numel() == in.numel(),
                 "Flatten: dy " << dy.shape().str() << " does not match the input " << in.str() << " of micro-batch "
                                << ctx.micro_batch);
    return dy.reshape(in);
  }
  void backward_weight(Context<Space>&, Output) {}
  std::vector<Param<T, Space>*> parameters() { return {}; }

 private:
  Slots<Shape> shapes_;
};

}  // namespace dpml::layers
