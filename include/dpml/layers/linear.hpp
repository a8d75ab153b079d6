#pragma once
// Linear: y = x · Wᵀ + b, with W (out, in) and b (out), as PyTorch's nn.Linear. The input is
// (..., in) with any leading dimensions, flattened to rows; the output is (..., out).
//
//   forward          y  (rows, out) = x (rows, in) · Wᵀ       (one GEMM) + b on every row
//   backward_input   dx (rows, in)  = dy (rows, out) · W
//   backward_weight  dW (out, in)  += dyᵀ · x,   db (out) += Σ_rows dy
//
// Parameters are declared with PyTorch's default init U(−1/√fan_in, 1/√fan_in) and filled by
// layers::initialize_all. fan_in defaults to `in`; a tensor-parallel row-split linear passes the
// global one. Shardings are passed through for tensor-parallel layers (parallel_linear.hpp).
//
// Any space: the three products are kernels::Ops<Space>'s linear family (OpenBLAS on the host;
// on a GPU cuBLASLt with the bias in the GEMM's epilogue and the weight gradient accumulated by
// the GEMM itself). T is float or double on the host, bf16, fp16 or float on a GPU.
//
// The *_into forms write into the caller's buffers instead of the layer's own, and forward_into can
// leave out the bias or add onto what y holds (a residual: y = residual + x · Wᵀ + b in one GEMM
// with beta = 1), so that a fused block keeps no buffer twice; forward_gelu_into is the MLP's first
// product with its GELU (pre-activation kept). The plain forms are these with buffers of the layer's
// own per micro-batch slot.

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace dpml::layers {

struct LinearOptions {
  bool bias = true;
  std::string name = "linear";
  Sharding weight_sharding = {};
  Sharding bias_sharding = {};
  std::int64_t fan_in = 0;  // 0: in
};

// What Linear::forward_into adds to x · Wᵀ in the caller's buffer y.
struct LinearEpilogue {
  bool bias = true;         // the layer's bias, when it has one (a row-parallel rank other than 0: no)
  bool accumulate = false;  // y's own contents (a residual the caller copied there): GEMM beta = 1
};

template <class T = float, class Space = HostSpace>
class Linear {
  using Ops = kernels::Ops<Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (..., in)
  using Output = TensorView<const T, Space>;  // (..., out)

  Linear(std::int64_t in, std::int64_t out, LinearOptions opts = {})
      : in_(in), out_(out), has_bias_(opts.bias),
        weight_(opts.name + ".weight", Shape{out, in}, uniform_init(opts.fan_in > 0 ? opts.fan_in : in),
                opts.weight_sharding) {
    DPML_REQUIRE(in > 0 && out > 0, "Linear " << opts.name << ": sizes in=" << in << ", out=" << out << " must be positive");
    if (has_bias_)
      bias_ = Param<T, Space>(opts.name + ".bias", Shape{out}, uniform_init(opts.fan_in > 0 ? opts.fan_in : in),
                              opts.bias_sharding);
  }

  Output forward(Context<Space>& ctx, Input x) {
    auto y = ensure(slots_.slot(ctx).y, output_shape(x));
    forward_into(ctx, x, y);
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    auto dx = ensure(slots_.slot(ctx).dx, slots_.slot(ctx).x.shape());
    backward_input_into(ctx, dy, dx);
    return dx;
  }

  void backward_weight(Context<Space>& ctx, Output dy) { backward_weight(ctx, dy, slots_.slot(ctx).x); }

  // ---- forms with the caller's buffers (a fused block's shared scratch, a residual stream) -----

  // y (..., out) = x · Wᵀ [+ b unless !e.bias] [+ y's own contents when e.accumulate: a residual
  // the caller put there]. Saves x, as forward does.
  void forward_into(Context<Space>& ctx, Input x, TensorView<T, Space> y, LinearEpilogue e = {}) {
    check_io(x, y, out_, "output");
    slots_.slot(ctx).x = x;
    Ops::linear_forward(ctx.dev(), x.data(), weight_.value().data(), e.bias ? bias() : nullptr, y.data(),
                        x.numel() / in_, in_, out_, e.accumulate);
  }
  // pre (..., out) = x · Wᵀ + b and act = gelu(pre), one pass (the GEMM's epilogue on a GPU).
  void forward_gelu_into(Context<Space>& ctx, Input x, TensorView<T, Space> pre, TensorView<T, Space> act) {
    check_io(x, pre, out_, "pre-activation");
    check_io(x, act, out_, "activation");
    slots_.slot(ctx).x = x;
    Ops::linear_gelu_forward(ctx.dev(), x.data(), weight_.value().data(), bias(), pre.data(), act.data(),
                             x.numel() / in_, in_, out_);
  }
  // dx (..., in) = dy · W.
  void backward_input_into(Context<Space>& ctx, Output dy, TensorView<T, Space> dx) {
    const Saved& s = slots_.slot(ctx);
    check_dy(ctx, s, dy);
    check_io(s.x, dx, in_, "input gradient");
    Ops::linear_backward_input(ctx.dev(), dy.data(), weight_.value().data(), dx.data(), rows(s), in_, out_);
  }
  // dW += dyᵀ · x, db += Σ_rows dy, with x the forward's input or a recomputation of it (the same
  // values, possibly in another buffer: an MLP's GELU output recomputed into shared scratch).
  void backward_weight(Context<Space>& ctx, Output dy, Input x) {
    const Saved& s = slots_.slot(ctx);
    check_dy(ctx, s, dy);
    DPML_REQUIRE(x.shape() == s.x.shape() && x.is_contiguous(),
                 "Linear " << weight_.name() << ": input " << x.shape().str()
                           << " for the weight gradient differs from the forward's " << s.x.shape().str());
    Ops::linear_backward_weight(ctx.dev(), dy.data(), x.data(), weight_.grad().data(),
                                has_bias_ ? bias_.grad().data() : nullptr, rows(s), in_, out_, weight_.take_grad_zero());
  }

  // weight (out, in), then bias (out) when there is one.
  std::vector<Param<T, Space>*> parameters() {
    if (has_bias_) return {&weight_, &bias_};
    return {&weight_};
  }

  std::int64_t in_features() const noexcept { return in_; }
  std::int64_t out_features() const noexcept { return out_; }

 private:
  struct Saved {
    Input x;                 // (..., in), the caller's buffer
    Tensor<T, Space> y, dx;  // (..., out), (..., in)
  };
  static Init uniform_init(std::int64_t fan_in) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    return Init::uniform(-bound, bound);
  }
  std::int64_t rows(const Saved& s) const noexcept { return s.x.numel() / in_; }
  Shape output_shape(const Input& x) const {
    check_input(x);
    Shape ys = x.shape();
    ys[ys.rank() - 1] = out_;
    return ys;
  }
  void check_input(const Input& x) const {
    DPML_REQUIRE(x.rank() >= 1 && x.size(x.rank() - 1) == in_ && x.is_contiguous(),
                 "Linear " << weight_.name() << ": input " << x.shape().str() << " does not end in in=" << in_);
  }
  // `v` (a caller's buffer) holds x's rows of `cols` elements, contiguously.
  void check_io(const Input& x, const TensorView<T, Space>& v, std::int64_t cols, const char* what) const {
    check_input(x);
    DPML_REQUIRE(v.is_contiguous() && v.rank() >= 1 && v.size(v.rank() - 1) == cols && v.numel() == x.numel() / in_ * cols,
                 "Linear " << weight_.name() << ": " << what << " buffer " << v.shape().str() << " does not hold the "
                           << x.numel() / in_ << " rows of " << cols << " of input " << x.shape().str());
  }
  const T* bias() const noexcept { return has_bias_ ? bias_.value().data() : nullptr; }
  void check_dy(const Context<Space>& ctx, const Saved& s, const Output& dy) const {
    DPML_REQUIRE(s.x.rank() > 0, "Linear " << weight_.name() << ": backward before forward for micro-batch "
                                           << ctx.micro_batch);
    DPML_REQUIRE(dy.is_contiguous() && dy.rank() >= 1 && dy.numel() == rows(s) * out_ && dy.size(dy.rank() - 1) == out_,
                 "Linear " << weight_.name() << ": dy " << dy.shape().str() << " does not match the output of input "
                           << s.x.shape().str() << " (micro-batch " << ctx.micro_batch << ")");
  }

  std::int64_t in_, out_;
  bool has_bias_;
  Param<T, Space> weight_, bias_;
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
