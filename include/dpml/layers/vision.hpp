#pragma once
// The three layers that turn an image classifier's input into a transformer's tokens and back
// (models/vit.hpp; Dosovitskiy et al. 2021):
//
//   PatchTokens     images (N, Cin, H, W) → (N, T, Cin·P·P): non-overlapping P × P patches,
//                   row-major; a Linear after it (Cin·P·P → C) is the ViT's patch embedding, the
//                   same map as a Conv2d of kernel and stride P, without a layout transpose after it
//   ClassToken      (N, T, C) → (N, 1 + T, C): a learned class token in front, a learned position
//                   embedding added to every token; parameters <name>.cls (C), <name>.pos (1 + T, C)
//   TakeClassToken  (N, 1 + T, C) → (N, C): the class token's row, what the classifier head reads
//
// PatchTokens and ClassToken run kernels::Ops<Space>'s vision family (kernels/host/vision.hpp,
// kernels/cuda/vision.hpp; images in the space's layout); TakeClassToken is strided copies.

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dpml::layers {

template <class T = float, class Space = HostSpace>
class PatchTokens {
  using Ops = kernels::Ops<Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (N, Cin, H, W) in the space's image layout
  using Output = TensorView<const T, Space>;  // (N, (H/P)·(W/P), Cin·P·P)

  explicit PatchTokens(std::int64_t patch) : P_(patch) {
    DPML_REQUIRE_EVERYWHERE(patch >= 1, "PatchTokens: patch size " << patch << " must be ≥ 1");
  }

  Output forward(Context<Space>& ctx, Input x) {
    DPML_REQUIRE(x.rank() == 4 && x.is_contiguous(), "PatchTokens: input " << x.shape().str() << " is not an image batch");
    const kernels::ImageDims d = Ops::image_dims(x.shape());
    DPML_REQUIRE(d.H % P_ == 0 && d.W % P_ == 0,
                 "PatchTokens: image " << d.H << "×" << d.W << " is not a whole number of " << P_ << "×" << P_ << " patches");
    Saved& s = slots_.slot(ctx);
    s.x = x.shape();
    auto y = ensure(s.y, Shape{d.N, (d.H / P_) * (d.W / P_), d.C * P_ * P_});
    Ops::patchify(ctx.dev(), x.data(), y.data(), d.N, d.C, d.H, d.W, P_);
    return y;
  }
  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(dy.shape() == s.y.shape(), "PatchTokens: dy " << dy.shape().str() << " does not match the output "
                                                               << s.y.shape().str() << " of micro-batch " << ctx.micro_batch);
    const kernels::ImageDims d = Ops::image_dims(s.x);
    auto dx = ensure(s.dx, s.x);
    Ops::unpatchify(ctx.dev(), dy.data(), dx.data(), d.N, d.C, d.H, d.W, P_);
    return dx;
  }
  void backward_weight(Context<Space>&, Output) {}
  std::vector<Param<T, Space>*> parameters() { return {}; }

 private:
  struct Saved {
    Shape x;                 // the input's shape
    Tensor<T, Space> y, dx;  // (N, T, Cin·P·P), (N, Cin, H, W)
  };
  std::int64_t P_;
  Slots<Saved> slots_;
};

template <class T = float, class Space = HostSpace>
class ClassToken {
  using Ops = kernels::Ops<Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (N, T, C)
  using Output = TensorView<const T, Space>;  // (N, 1 + T, C)

  // tokens: T, the patches per image; both parameters drawn from N(0, 0.02²) (ViT's init).
  ClassToken(std::int64_t tokens, std::int64_t dim, const std::string& name)
      : T_(tokens), C_(dim), cls_(name + ".cls", Shape{dim}, Init::normal(0.0, 0.02)),
        pos_(name + ".pos", Shape{1 + tokens, dim}, Init::normal(0.0, 0.02)) {
    DPML_REQUIRE_EVERYWHERE(tokens >= 1 && dim >= 1, "ClassToken " << name << ": " << tokens << " tokens of width " << dim
                                                                   << " must both be ≥ 1");
  }

  Output forward(Context<Space>& ctx, Input x) {
    DPML_REQUIRE(x.rank() == 3 && x.size(1) == T_ && x.size(2) == C_ && x.is_contiguous(),
                 "ClassToken: input " << x.shape().str() << " is not (N, T=" << T_ << ", C=" << C_ << ")");
    Saved& s = slots_.slot(ctx);
    s.n = x.size(0);
    auto y = ensure(s.y, Shape{s.n, 1 + T_, C_});
    Ops::class_token_forward(ctx.dev(), x.data(), cls_.value().data(), pos_.value().data(), y.data(), s.n, T_, C_);
    return y;
  }
  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = check_dy(ctx, dy);
    auto dx = ensure(s.dx, Shape{s.n, T_, C_});
    Ops::class_token_backward_input(ctx.dev(), dy.data(), dx.data(), s.n, T_, C_);
    return dx;
  }
  void backward_weight(Context<Space>& ctx, Output dy) {
    const Saved& s = check_dy(ctx, dy);
    Ops::class_token_backward_weight(ctx.dev(), dy.data(), cls_.grad().data(), pos_.grad().data(), s.n, T_, C_);
  }
  std::vector<Param<T, Space>*> parameters() { return {&cls_, &pos_}; }

 private:
  struct Saved {
    std::int64_t n = 0;      // images
    Tensor<T, Space> y, dx;  // (N, 1 + T, C), (N, T, C)
  };
  Saved& check_dy(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(dy.shape() == Shape({s.n, 1 + T_, C_}) && dy.is_contiguous(),
                 "ClassToken: dy " << dy.shape().str() << " does not match the output of micro-batch " << ctx.micro_batch);
    return s;
  }
  std::int64_t T_, C_;
  Param<T, Space> cls_, pos_;  // (C), (1 + T, C)
  Slots<Saved> slots_;
};

template <class T = float, class Space = HostSpace>
class TakeClassToken {
  using Ops = kernels::Ops<Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (N, 1 + T, C)
  using Output = TensorView<const T, Space>;  // (N, C)

  Output forward(Context<Space>& ctx, Input x) {
    DPML_REQUIRE(x.rank() == 3 && x.size(1) >= 1 && x.is_contiguous(),
                 "TakeClassToken: input " << x.shape().str() << " is not (N, 1 + T, C)");
    Saved& s = slots_.slot(ctx);
    s.x = x.shape();
    const std::int64_t N = x.size(0), L = x.size(1), C = x.size(2);
    auto y = ensure(s.y, Shape{N, C});
    Ops::copy_columns(ctx.dev(), x.data(), L * C, y.data(), C, N, C);
    return y;
  }
  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(dy.shape() == s.y.shape(), "TakeClassToken: dy " << dy.shape().str() << " does not match the output "
                                                                  << s.y.shape().str() << " of micro-batch " << ctx.micro_batch);
    const std::int64_t N = s.x[0], L = s.x[1], C = s.x[2];
    auto dx = ensure(s.dx, s.x);
    Ops::zero(ctx.dev(), dx.data(), dx.numel());
    Ops::copy_columns(ctx.dev(), dy.data(), C, dx.data(), L * C, N, C);
    return dx;
  }
  void backward_weight(Context<Space>&, Output) {}
  std::vector<Param<T, Space>*> parameters() { return {}; }

 private:
  struct Saved {
    Shape x;                 // (N, 1 + T, C)
    Tensor<T, Space> y, dx;  // (N, C), (N, 1 + T, C)
  };
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
