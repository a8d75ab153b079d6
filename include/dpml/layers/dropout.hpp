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

#include "dpml/core/error.hpp"
#include "dpml/core/philox.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/host/activation.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/core/parameter.hpp"

#include <cstdint>
#include <type_traits>
#include <vector>

namespace dpml::layers {

template <class T = float, class Space = HostSpace>
class Dropout {
  static_assert(std::is_same_v<Space, HostSpace>, "dpml Dropout: only the host path exists so far");

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
    const PhiloxStream rng(ctx.seed, stream_id_ * 0x9E3779B97F4A7C15ull + ctx.step);
    auto mask = ensure(s.mask, x.shape());
    const T keep = static_cast<T>(1.0 / (1.0 - p_));
    const float p = static_cast<float>(p_);
    for (std::int64_t n = 0; n < samples; ++n) {
      const std::uint64_t base = static_cast<std::uint64_t>(ctx.sample_offset + n) << 32;
      T* row = mask.data() + n * per_sample;
      for (std::int64_t e = 0; e < per_sample; ++e) row[e] = rng.uniform(base + static_cast<std::uint64_t>(e)) >= p ? keep : T(0);
    }
    auto y = ensure(s.y, x.shape());
    kernels::host::dropout_apply(x.data(), mask.data(), y.data(), y.numel());
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.shape.rank() > 0 && dy.shape() == s.shape && dy.is_contiguous(),
                 "Dropout " << stream_id_ << ": dy " << dy.shape().str() << " differs from the input " << s.shape.str()
                            << " of micro-batch " << ctx.micro_batch);
    if (!s.active) return dy;
    auto dx = ensure(s.dx, s.shape);
    kernels::host::dropout_apply(dy.data(), s.mask.data(), dx.data(), dx.numel());
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
