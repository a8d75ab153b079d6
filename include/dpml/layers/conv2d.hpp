#pragma once
// Conv2d over NCHW images: weight (Cout, Cin, kh, kw), bias (Cout), stride and zero padding, as
// PyTorch's nn.Conv2d (cross-correlation; default init U(−1/√fan_in, 1/√fan_in), fan_in =
// Cin·kh·kw).
//
// Each image is unrolled by im2col into col (Cin·kh·kw, Ho·Wo), and then
//   forward          y[n] (Cout, Ho·Wo)    = W (Cout, K) · col
//   backward_input   dcol (K, Ho·Wo)       = Wᵀ · dy[n],   dx[n] = col2im(dcol)
//   backward_weight  dW (Cout, K)         += dy[n] · colᵀ,  db += Σ dy[n]
// One GEMM per image and phase, through OpenBLAS. col is one image's worth, shared by the slots
// and recomputed in backward_weight rather than kept for the batch (memory stays at one image).

#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/host/conv.hpp"
#include "dpml/kernels/host/elementwise.hpp"
#include "dpml/kernels/host/gemm.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/core/parameter.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace dpml::layers {

struct Conv2dOptions {
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  bool bias = true;
  std::string name = "conv";
};

template <class T = float, class Space = HostSpace>
class Conv2d {
  static_assert(std::is_same_v<Space, HostSpace>, "dpml Conv2d: only the host path (kernels/host) exists so far");

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (N, Cin, H, W)
  using Output = TensorView<const T, Space>;  // (N, Cout, Ho, Wo)

  Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel, Conv2dOptions opts = {})
      : cin_(in_channels), cout_(out_channels), k_(kernel), stride_(opts.stride), pad_(opts.padding),
        has_bias_(opts.bias),
        weight_(opts.name + ".weight", Shape{out_channels, in_channels, kernel, kernel}, uniform_init()) {
    DPML_REQUIRE(cin_ > 0 && cout_ > 0 && k_ > 0 && stride_ > 0 && pad_ >= 0,
                 "Conv2d " << opts.name << ": channels " << cin_ << "→" << cout_ << ", kernel " << k_ << ", stride "
                           << stride_ << ", padding " << pad_ << " must be positive (padding ≥ 0)");
    if (has_bias_) bias_ = Param<T, Space>(opts.name + ".bias", Shape{out_channels}, uniform_init());
  }

  Output forward(Context<Space>& ctx, Input x) {
    const kernels::host::ConvGeometry g = geometry(x);
    Saved& s = slots_.slot(ctx);
    s.x = x;
    const std::int64_t N = x.size(0), K = g.col_rows(), P = g.col_cols();
    auto y = ensure(s.y, Shape{N, cout_, g.out_h(), g.out_w()});
    auto col = ensure(col_, Shape{K, P});
    for (std::int64_t n = 0; n < N; ++n) {
      kernels::host::im2col(x.data() + n * cin_ * g.H * g.W, g, col.data());
      kernels::host::gemm(kernels::host::Trans::no, kernels::host::Trans::no, cout_, P, K, T(1), weight_.value().data(),
                          col.data(), T(0), y.data() + n * cout_ * P);
    }
    if (has_bias_) kernels::host::bias_add_channels(y.data(), bias_.value().data(), N, cout_, P);
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    const kernels::host::ConvGeometry g = checked(ctx, s, dy);
    const std::int64_t N = s.x.size(0), K = g.col_rows(), P = g.col_cols(), HW = g.H * g.W;
    auto dx = ensure(s.dx, s.x.shape());
    std::fill(dx.begin(), dx.end(), T(0));
    auto dcol = ensure(col_, Shape{K, P});
    for (std::int64_t n = 0; n < N; ++n) {
      kernels::host::gemm(kernels::host::Trans::yes, kernels::host::Trans::no, K, P, cout_, T(1), weight_.value().data(),
                          dy.data() + n * cout_ * P, T(0), dcol.data());
      kernels::host::col2im(dcol.data(), g, dx.data() + n * cin_ * HW);
    }
    return dx;
  }

  void backward_weight(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    const kernels::host::ConvGeometry g = checked(ctx, s, dy);
    const std::int64_t N = s.x.size(0), K = g.col_rows(), P = g.col_cols();
    auto col = ensure(col_, Shape{K, P});
    for (std::int64_t n = 0; n < N; ++n) {
      kernels::host::im2col(s.x.data() + n * cin_ * g.H * g.W, g, col.data());
      kernels::host::gemm(kernels::host::Trans::no, kernels::host::Trans::yes, cout_, K, P, T(1),
                          dy.data() + n * cout_ * P, col.data(), T(1), weight_.grad().data());
    }
    if (has_bias_) kernels::host::bias_grad_channels(dy.data(), bias_.grad().data(), N, cout_, P);
  }

  // weight (Cout, Cin, k, k), then bias (Cout) when there is one.
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
  kernels::host::ConvGeometry geometry(const Input& x) const {
    DPML_REQUIRE(x.rank() == 4 && x.size(1) == cin_ && x.is_contiguous(),
                 "Conv2d " << weight_.name() << ": input " << x.shape().str() << " is not (N, " << cin_ << ", H, W)");
    DPML_REQUIRE(x.size(2) + 2 * pad_ >= k_ && x.size(3) + 2 * pad_ >= k_,
                 "Conv2d " << weight_.name() << ": input " << x.shape().str() << " is smaller than the kernel " << k_
                           << " (padding " << pad_ << ")");
    return {cin_, x.size(2), x.size(3), k_, k_, stride_, pad_};
  }
  kernels::host::ConvGeometry checked(const Context<Space>& ctx, const Saved& s, const Output& dy) const {
    DPML_REQUIRE(s.x.rank() == 4, "Conv2d " << weight_.name() << ": backward before forward for micro-batch "
                                            << ctx.micro_batch);
    DPML_REQUIRE(dy.shape() == s.y.shape() && dy.is_contiguous(),
                 "Conv2d " << weight_.name() << ": dy " << dy.shape().str() << " differs from the output "
                           << s.y.shape().str() << " of micro-batch " << ctx.micro_batch);
    return geometry(s.x);
  }

  std::int64_t cin_, cout_, k_, stride_, pad_;
  bool has_bias_;
  Param<T, Space> weight_, bias_;
  Slots<Saved> slots_;
  Tensor<T, Space> col_;  // (Cin·k·k, Ho·Wo): one image's columns, scratch shared by all slots
};

}  // namespace dpml::layers
