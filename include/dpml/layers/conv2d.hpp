#pragma once
// Conv2d: weight (Cout, Cin, kh, kw), bias (Cout), stride and zero padding, as PyTorch's
// nn.Conv2d (cross-correlation; default init U(−1/√fan_in, 1/√fan_in), fan_in = Cin·kh·kw).
//
//   forward          y  (N, Cout, Ho, Wo) = conv(x (N, Cin, H, W), W) + b
//   backward_input   dx (N, Cin, H, W)    = the transposed convolution of dy with W
//   backward_weight  dW += Σ_pixels dy ⊗ im2col(x),  db += Σ dy
//
// Any space, one code path: the three passes are kernels::Ops<Space>'s convolution family.
// Layouts belong to the space's kernels (kernels/image.hpp): images are NCHW on the host and NHWC
// on a GPU, so on CudaSpace x is (N, H, W, Cin) and y (N, Ho, Wo, Cout) — no activation is ever
// transposed. The weight keeps ONE logical shape and name, (Cout, Cin, kh, kw), on every space
// (initialisation by global index and checkpoints speak of it) and is stored in the order the
// space's kernels read, Ops::conv_weight_order: as it is on the host, (Cout, kh, kw, Cin) on a GPU
// (core/parameter.hpp's StorageOrder; layers::initialize and checkpoints convert on the host).
//
// Policy picks the convolution kernels: on the host kernels::host::Im2colGemm (im2col and one
// OpenBLAS GEMM per image); on CudaSpace kernels::cuda::CudnnConv where DPML_HAS_CUDNN (the
// default) or kernels::cuda::ImplicitGemmConv<> (our implicit GEMM on tensor cores). Element
// types: float or double on the host, bf16 only on a GPU (both GPU policies are bf16 kernels:
// Conv2d<float, CudaSpace> does not compile). input_gradient = false makes backward_input compute
// nothing and return an empty view (a network's first convolution: its input needs no gradient).
// backward_input_into writes the input gradient into the caller's buffer (a fused block's shared
// scratch) instead of the layer's own.

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace dpml::layers {

struct Conv2dOptions {
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  bool bias = true;
  bool input_gradient = true;  // false: backward_input returns an empty view, computing nothing
  std::string name = "conv";
};

template <class T = float, class Space = HostSpace, class Policy = typename kernels::Ops<Space>::DefaultConvPolicy>
class Conv2d {
  using Ops = kernels::Ops<Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (N, Cin, H, W) in the space's image layout
  using Output = TensorView<const T, Space>;  // (N, Cout, Ho, Wo) in the space's image layout

  Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel, Conv2dOptions opts = {})
      : cin_(in_channels), cout_(out_channels), k_(kernel), stride_(opts.stride), pad_(opts.padding),
        has_bias_(opts.bias), input_gradient_(opts.input_gradient),
        weight_(opts.name + ".weight", Shape{out_channels, in_channels, kernel, kernel}, uniform_init()) {
    DPML_REQUIRE(cin_ > 0 && cout_ > 0 && k_ > 0 && stride_ > 0 && pad_ >= 0,
                 "Conv2d " << opts.name << ": channels " << cin_ << "→" << cout_ << ", kernel " << k_ << ", stride "
                           << stride_ << ", padding " << pad_ << " must be positive (padding ≥ 0)");
    weight_.set_storage_order(StorageOrder(Ops::conv_weight_order));
    if (has_bias_) bias_ = Param<T, Space>(opts.name + ".bias", Shape{out_channels}, uniform_init());
  }

  Output forward(Context<Space>& ctx, Input x) {
    const kernels::ImageDims d = dims_of(x);
    const kernels::host::ConvGeometry g = geometry(d);
    Saved& s = slots_.slot(ctx);
    s.x = x;
    auto y = ensure(s.y, Ops::image_shape({d.N, cout_, g.out_h(), g.out_w()}));
    Ops::template conv2d_forward<Policy>(ctx.dev(), x.data(), weight_.value().data(),
                                         has_bias_ ? bias_.value().data() : nullptr, y.data(), d.N, cout_, g);
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    return backward_input_into(ctx, dy, input_gradient_ ? ensure(s.dx, s.x.shape()) : TensorView<T, Space>());
  }

  // The same into the caller's buffer dx (N, Cin, H, W; apart from dy) — a fused block's gradient
  // scratch shared by all blocks — instead of the layer's own; with input_gradient = false, nothing.
  Input backward_input_into(Context<Space>& ctx, Output dy, TensorView<T, Space> dx) {
    Saved& s = slots_.slot(ctx);
    const kernels::ImageDims d = checked(ctx, s, dy);
    if (!input_gradient_) return Input();
    DPML_REQUIRE(dx.shape() == s.x.shape() && dx.is_contiguous() && dx.data() != dy.data(),
                 "Conv2d " << weight_.name() << ": input gradient buffer " << dx.shape().str()
                           << " is not a contiguous " << s.x.shape().str() << " apart from dy");
    Ops::template conv2d_backward_input<Policy>(ctx.dev(), dy.data(), weight_.value().data(), dx.data(), d.N, cout_,
                                                geometry(d));
    return dx;
  }

  void backward_weight(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    const kernels::ImageDims d = checked(ctx, s, dy);
    Ops::template conv2d_backward_weight<Policy>(ctx.dev(), dy.data(), s.x.data(), weight_.grad().data(),
                                                 has_bias_ ? bias_.grad().data() : nullptr, d.N, cout_, geometry(d));
  }

  // weight (Cout, Cin, k, k) (stored in Ops::conv_weight_order), then bias (Cout) when there is one.
  std::vector<Param<T, Space>*> parameters() {
    if (has_bias_) return {&weight_, &bias_};
    return {&weight_};
  }

 private:
  struct Saved {
    Input x;                 // (N, Cin, H, W), the caller's buffer
    Tensor<T, Space> y, dx;  // (N, Cout, Ho, Wo), (N, Cin, H, W)
  };
  Init uniform_init() const {
    const double bound = 1.0 / std::sqrt(static_cast<double>(cin_ * k_ * k_));
    return Init::uniform(-bound, bound);
  }
  kernels::ImageDims dims_of(const Input& x) const {
    DPML_REQUIRE(x.rank() == 4 && x.is_contiguous() && Ops::image_dims(x.shape()).C == cin_,
                 "Conv2d " << weight_.name() << ": input " << x.shape().str() << " is not " << image_of(cin_));
    const kernels::ImageDims d = Ops::image_dims(x.shape());
    DPML_REQUIRE(d.H + 2 * pad_ >= k_ && d.W + 2 * pad_ >= k_,
                 "Conv2d " << weight_.name() << ": input " << x.shape().str() << " is smaller than the kernel " << k_
                           << " (padding " << pad_ << ")");
    return d;
  }
  kernels::host::ConvGeometry geometry(const kernels::ImageDims& d) const {
    return {cin_, d.H, d.W, k_, k_, stride_, pad_};
  }
  kernels::ImageDims checked(const Context<Space>& ctx, const Saved& s, const Output& dy) const {
    DPML_REQUIRE(s.x.rank() == 4, "Conv2d " << weight_.name() << ": backward before forward for micro-batch "
                                            << ctx.micro_batch);
    DPML_REQUIRE(dy.shape() == s.y.shape() && dy.is_contiguous(),
                 "Conv2d " << weight_.name() << ": dy " << dy.shape().str() << " differs from the output "
                           << s.y.shape().str() << " of micro-batch " << ctx.micro_batch);
    return Ops::image_dims(s.x.shape());
  }
  // "(N, C, H, W)" with C spelled out, in the space's image layout.
  static std::string image_of(std::int64_t C) {
    const std::string c = std::to_string(C);
    return Ops::image_layout == kernels::ImageLayout::nchw ? "(N, " + c + ", H, W)" : "(N, H, W, " + c + ")";
  }

  std::int64_t cin_, cout_, k_, stride_, pad_;
  bool has_bias_, input_gradient_;
  Param<T, Space> weight_, bias_;
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
