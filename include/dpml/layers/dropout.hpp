#pragma once
// Dropout with probability p (inverted: kept values are scaled by 1/(1 − p)), identity in eval.
//
// The mask is a pure function of (ctx.seed, this layer's stream id, ctx.step, the global index of
// the sample, the element within the sample), drawn from Philox — never of the data rank or the
// micro-batch. So a step draws the same masks whatever ran before and however the global batch is
// split over data ranks and micro-batches: K ranks equal one process, dropout included. The input's
// first dimension is the sample; row i of the input is global sample ctx.sample_offset + i (the
// trainer sets it). Element e of global sample g at step t reads Philox stream
// (stream_id · φ + t) at offset g · 2³² + e, so masks never overlap for fewer than 2³² elements
// per sample and 2³² samples per step. The backward halves reuse the mask kept per slot.
// Tensor-parallel ranks of one data rank draw the same mask (their activations are replicated).
//
// Any space: the rule above is kernels/dropout_rule.hpp's DropoutRule, which the host loop and the
// device kernel both call (kernels::Ops<Space>'s dropout family), so a CudaSpace Dropout keeps
// exactly the elements the host one keeps. The mask is kept per slot as T values (0 or 1/(1 − p)
// rounded to T), read by both backward halves and by mask().

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/dropout_rule.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"

#include <cstdint>
#include <vector>

namespace dpml::layers {

template <class T = float, class Space = HostSpace>
class Dropout {
  using Ops = kernels::Ops<Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // any shape
  using Output = TensorView<const T, Space>;  // same shape

  // `stream_id` tells this layer's masks from other dropout layers' (e.g. its index in the model).
  Dropout(double p, std::uint64_t stream_id) : p_(p), stream_id_(stream_id) {
    DPML_REQUIRE(p >= 0 && p < 1, "Dropout " << stream_id << ": probability " << p << " is not in [0, 1)");
  }

  Output forward(Context<Space>& ctx, Input x) {
    DPML_REQUIRE(x.is_contiguous(), "Dropout " << stream_id_ << ": input " << x.shape().str() << " is not contiguous");
    Saved& s = slots_.slot(ctx);
    s.shape = x.shape();
    s.active = ctx.training() && p_ > 0;
    if (!s.active) return x;
    const std::int64_t samples = x.shape().rank() > 0 ? x.size(0) : 1;
    const std::int64_t per_sample = samples > 0 ? x.numel() / samples : 0;  // elements of one sample
    DPML_REQUIRE(per_sample < (std::int64_t{1} << 32) && ctx.sample_offset >= 0 &&
                     ctx.sample_offset + samples <= (std::int64_t{1} << 32),
                 "Dropout " << stream_id_ << ": " << per_sample << " elements per sample or samples ["
                            << ctx.sample_offset << ", " << ctx.sample_offset + samples
                            << ") beyond the mask's counter range");
    auto mask = ensure(s.mask, x.shape());  // (samples, per_sample)
    Ops::dropout_mask(ctx.dev(), mask.data(), samples, per_sample, ctx.sample_offset,
                      kernels::DropoutRule(ctx.seed, stream_id_, ctx.step, static_cast<float>(p_)), 1.0 / (1.0 - p_));
    auto y = ensure(s.y, x.shape());
    Ops::dropout_apply(ctx.dev(), x.data(), mask.data(), y.data(), y.numel());
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.shape.rank() > 0 && dy.shape() == s.shape && dy.is_contiguous(),
                 "Dropout " << stream_id_ << ": dy " << dy.shape().str() << " differs from the input " << s.shape.str()
                            << " of micro-batch " << ctx.micro_batch);
    if (!s.active) return dy;
    auto dx = ensure(s.dx, s.shape);
    Ops::dropout_apply(ctx.dev(), dy.data(), s.mask.data(), dx.data(), dx.numel());
    return dx;
  }

  void backward_weight(Context<Space>&, Output) {}
  std::vector<Param<T, Space>*> parameters() { return {}; }

  // The mask of the last training forward of `micro_batch`: 0 or 1/(1 − p) per element.
  TensorView<const T, Space> mask(int micro_batch) { return slots_[micro_batch].mask.cview(); }

 private:
  struct Saved {
    Shape shape;
    bool active = false;            // a training forward with p > 0 (else the identity)
    Tensor<T, Space> mask, y, dx;   // shaped as the input
  };
  double p_;
  std::uint64_t stream_id_;
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
