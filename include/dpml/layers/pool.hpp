#pragma once
// Pooling layers over NCHW images (kernels/host/pool.hpp):
//   MaxPool2d(kernel, stride = kernel, padding = 0)   keeps the argmax per output for backward
//   AvgPool2d(kernel, stride = kernel, padding = 0)   padding counted as zeros (PyTorch default)
//   GlobalAvgPool                                     (N, C, H, W) → (N, C)
// MaxPool2d and AvgPool2d are one class, Pool2d<Kind>, read by a tag type.
// None has parameters; backward_weight is empty.

#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/host/pool.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/core/parameter.hpp"

#include <cstdint>
#include <type_traits>
#include <vector>

namespace dpml::layers {

struct MaxPoolKind {
  static constexpr const char* name = "MaxPool2d";
};
struct AvgPoolKind {
  static constexpr const char* name = "AvgPool2d";
};

template <class Kind, class T = float, class Space = HostSpace>
class Pool2d {
  static_assert(std::is_same_v<Space, HostSpace>, "dpml pooling layers: only the host path exists so far");
  static constexpr bool is_max = std::is_same_v<Kind, MaxPoolKind>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (N, C, H, W)
  using Output = TensorView<const T, Space>;  // (N, C, Ho, Wo)

  explicit Pool2d(std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0)
      : k_(kernel), stride_(stride > 0 ? stride : kernel), pad_(padding) {
    DPML_REQUIRE(k_ > 0 && pad_ >= 0 && 2 * pad_ <= k_,
                 Kind::name << ": kernel " << k_ << " and padding " << pad_ << " (at most half the kernel) are invalid");
  }

  Output forward(Context<Space>& ctx, Input x) {
    DPML_REQUIRE(x.rank() == 4 && x.is_contiguous() && x.size(2) + 2 * pad_ >= k_ && x.size(3) + 2 * pad_ >= k_,
                 Kind::name << ": input " << x.shape().str() << " is not (N, C, H, W) with H, W ≥ kernel " << k_);
    Saved& s = slots_.slot(ctx);
    s.in = x.shape();
    const auto g = geometry(s.in);
    const std::int64_t P = x.size(0) * x.size(1);
    auto y = ensure(s.y, Shape{x.size(0), x.size(1), g.out_h(), g.out_w()});
    if constexpr (is_max)
      kernels::host::max_pool_forward(x.data(), g, P, y.data(), ensure(s.argmax, y.shape()).data());
    else
      kernels::host::avg_pool_forward(x.data(), g, P, y.data());
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.in.rank() == 4 && dy.shape() == s.y.shape(),
                 Kind::name << ": dy " << dy.shape().str() << " differs from the output " << s.y.shape().str()
                            << " of micro-batch " << ctx.micro_batch);
    const auto g = geometry(s.in);
    auto dx = ensure(s.dx, s.in);
    if constexpr (is_max)
      kernels::host::max_pool_backward(dy.data(), s.argmax.data(), g, s.in[0] * s.in[1], dx.data());
    else
      kernels::host::avg_pool_backward(dy.data(), g, s.in[0] * s.in[1], dx.data());
    return dx;
  }

  void backward_weight(Context<Space>&, Output) {}
  std::vector<Param<T, Space>*> parameters() { return {}; }

 private:
  struct Empty {};
  struct Saved {
    Shape in;                                                           // (N, C, H, W)
    Tensor<T, Space> y, dx;                                             // (N, C, Ho, Wo), (N, C, H, W)
    std::conditional_t<is_max, Tensor<std::int32_t, Space>, Empty> argmax;  // (N, C, Ho, Wo), max only
  };
  kernels::host::PoolGeometry geometry(const Shape& in) const { return {in[2], in[3], k_, k_, stride_, pad_}; }

  std::int64_t k_, stride_, pad_;
  Slots<Saved> slots_;
};

template <class T = float, class Space = HostSpace>
using MaxPool2d = Pool2d<MaxPoolKind, T, Space>;
template <class T = float, class Space = HostSpace>
using AvgPool2d = Pool2d<AvgPoolKind, T, Space>;

template <class T = float, class Space = HostSpace>
class GlobalAvgPool {
  static_assert(std::is_same_v<Space, HostSpace>, "dpml GlobalAvgPool: only the host path exists so far");

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (N, C, H, W)
  using Output = TensorView<const T, Space>;  // (N, C)

  Output forward(Context<Space>& ctx, Input x) {
    DPML_REQUIRE(x.rank() == 4 && x.is_contiguous() && x.size(2) * x.size(3) > 0,
                 "GlobalAvgPool: input " << x.shape().str() << " is not (N, C, H, W) with H·W > 0");
    Saved& s = slots_.slot(ctx);
    s.in = x.shape();
    auto y = ensure(s.y, Shape{x.size(0), x.size(1)});
    kernels::host::global_avg_pool_forward(x.data(), y.numel(), x.size(2) * x.size(3), y.data());
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.in.rank() == 4 && dy.shape() == s.y.shape(),
                 "GlobalAvgPool: dy " << dy.shape().str() << " differs from the output " << s.y.shape().str()
                                      << " of micro-batch " << ctx.micro_batch);
    auto dx = ensure(s.dx, s.in);
    kernels::host::global_avg_pool_backward(dy.data(), dy.numel(), s.in[2] * s.in[3], dx.data());
    return dx;
  }

  void backward_weight(Context<Space>&, Output) {}
  std::vector<Param<T, Space>*> parameters() { return {}; }

 private:
  struct Saved {
    Shape in;                // (N, C, H, W)
    Tensor<T, Space> y, dx;  // (N, C), (N, C, H, W)
  };
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
