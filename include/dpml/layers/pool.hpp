#pragma once
// Pooling layers over images:
//   MaxPool2d(kernel, stride = kernel, padding = 0)   keeps the argmax per output for backward
//   AvgPool2d(kernel, stride = kernel, padding = 0)   padding counted as zeros (PyTorch default)
//   GlobalAvgPool                                     (N, C, H, W) → (N, C)
// MaxPool2d and AvgPool2d are one class, Pool2d<Kind>, read by a tag type; its
// backward_input_into writes the input gradient into the caller's buffer (a block's shared
// scratch). None has parameters; backward_weight is empty.
//
// Any space, one code path: kernels::Ops<Space>'s pooling family (kernels/host/pool.hpp,
// kernels/cuda/conv/pool.hpp), over the space's image layout (NCHW on the host, NHWC on a GPU:
// kernels/image.hpp); GlobalAvgPool's (N, C) is the same on both. Element types: float or double
// on the host; bf16, fp16 or float on a GPU.

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"

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
  using Ops = kernels::Ops<Space>;
  static constexpr bool is_max = std::is_same_v<Kind, MaxPoolKind>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (N, C, H, W) in the space's image layout
  using Output = TensorView<const T, Space>;  // (N, C, Ho, Wo) in the space's image layout

  explicit Pool2d(std::int64_t kernel, std::int64_t stride = 0, std::int64_t padding = 0)
      : k_(kernel), stride_(stride > 0 ? stride : kernel), pad_(padding) {
    DPML_REQUIRE(k_ > 0 && pad_ >= 0 && 2 * pad_ <= k_,
                 Kind::name << ": kernel " << k_ << " and padding " << pad_ << " (at most half the kernel) are invalid");
  }

  Output forward(Context<Space>& ctx, Input x) {
    DPML_REQUIRE(x.rank() == 4 && x.is_contiguous(), Kind::name << ": input " << x.shape().str() << " is not an image");
    const kernels::ImageDims d = Ops::image_dims(x.shape());
    DPML_REQUIRE(d.H + 2 * pad_ >= k_ && d.W + 2 * pad_ >= k_,
                 Kind::name << ": input " << x.shape().str() << " has H, W below the kernel " << k_ << " (padding "
                            << pad_ << ")");
    Saved& s = slots_.slot(ctx);
    s.in = x.shape();
    const auto g = geometry(d);
    auto y = ensure(s.y, Ops::image_shape({d.N, d.C, g.out_h(), g.out_w()}));
    if constexpr (is_max)
      Ops::max_pool_forward(ctx.dev(), x.data(), y.data(), ensure(s.argmax, y.shape()).data(), d.N, d.C, g);
    else
      Ops::avg_pool_forward(ctx.dev(), x.data(), y.data(), d.N, d.C, g);
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    return backward_input_into(ctx, dy, ensure(s.dx, s.in));
  }

  // The same into the caller's buffer dx (N, C, H, W; apart from dy; overwritten) — a block's
  // gradient scratch shared by all blocks — instead of the layer's own.
  Input backward_input_into(Context<Space>& ctx, Output dy, TensorView<T, Space> dx) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.in.rank() == 4 && dy.shape() == s.y.shape() && dy.is_contiguous(),
                 Kind::name << ": dy " << dy.shape().str() << " differs from the output " << s.y.shape().str()
                            << " of micro-batch " << ctx.micro_batch);
    DPML_REQUIRE(dx.shape() == s.in && dx.is_contiguous() && dx.data() != dy.data(),
                 Kind::name << ": input gradient buffer " << dx.shape().str() << " is not a contiguous " << s.in.str()
                            << " apart from dy");
    const kernels::ImageDims d = Ops::image_dims(s.in);
    const auto g = geometry(d);
    if constexpr (is_max)
      Ops::max_pool_backward(ctx.dev(), dy.data(), s.argmax.data(), dx.data(), d.N, d.C, g);
    else
      Ops::avg_pool_backward(ctx.dev(), dy.data(), dx.data(), d.N, d.C, g);
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
  kernels::host::PoolGeometry geometry(const kernels::ImageDims& d) const { return {d.H, d.W, k_, k_, stride_, pad_}; }

  std::int64_t k_, stride_, pad_;
  Slots<Saved> slots_;
};

template <class T = float, class Space = HostSpace>
using MaxPool2d = Pool2d<MaxPoolKind, T, Space>;
template <class T = float, class Space = HostSpace>
using AvgPool2d = Pool2d<AvgPoolKind, T, Space>;

template <class T = float, class Space = HostSpace>
class GlobalAvgPool {
  using Ops = kernels::Ops<Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (N, C, H, W) in the space's image layout
  using Output = TensorView<const T, Space>;  // (N, C)

  Output forward(Context<Space>& ctx, Input x) {
    const kernels::ImageDims d = Ops::image_dims(x.shape());
    DPML_REQUIRE(x.rank() == 4 && x.is_contiguous() && d.H * d.W > 0,
                 "GlobalAvgPool: input " << x.shape().str() << " is not an image with H·W > 0");
    Saved& s = slots_.slot(ctx);
    s.in = x.shape();
    auto y = ensure(s.y, Shape{d.N, d.C});
    Ops::global_avg_pool_forward(ctx.dev(), x.data(), y.data(), d.N, d.H * d.W, d.C);
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.in.rank() == 4 && dy.shape() == s.y.shape() && dy.is_contiguous(),
                 "GlobalAvgPool: dy " << dy.shape().str() << " differs from the output " << s.y.shape().str()
                                      << " of micro-batch " << ctx.micro_batch);
    const kernels::ImageDims d = Ops::image_dims(s.in);
    auto dx = ensure(s.dx, s.in);
    Ops::global_avg_pool_backward(ctx.dev(), dy.data(), dx.data(), d.N, d.H * d.W, d.C);
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
