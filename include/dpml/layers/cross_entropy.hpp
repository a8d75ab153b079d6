#pragma once
// Softmax cross-entropy loss over (N, C) logits and int32 labels (N). Not a Layer: it ends the
// chain. forward returns this micro-batch's share of the mean over the *global* batch,
// Σ_n −log softmax(z_n)[label_n] / ctx.global_batch (N when global_batch is 0), so that summing
// over micro-batches and data-parallel ranks gives the mean loss, and gradients are summed, never
// averaged. backward returns dlogits = (softmax − onehot) / global_batch, a view into a buffer kept
// per micro-batch slot. forward also adds its share to a running sum that take_loss() returns
// (and zeroes): the loss API the trainer reads once per step.

#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/host/cross_entropy.hpp"
#include "dpml/layers/layer.hpp"

#include <cstdint>
#include <type_traits>
#include <utility>

namespace dpml::layers {

template <class T = float, class Space = HostSpace>
class SoftmaxCrossEntropy {
  static_assert(std::is_same_v<Space, HostSpace>, "dpml SoftmaxCrossEntropy: only the host path exists so far");

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;              // logits (N, C), and dlogits
  using Target = TensorView<const std::int32_t, Space>;  // labels (N)

  // logits (N, C), labels (N) in [0, C).
  float forward(Context<Space>& ctx, TensorView<const T, Space> logits, TensorView<const std::int32_t, Space> labels) {
    DPML_REQUIRE(logits.rank() == 2 && logits.is_contiguous() && labels.rank() == 1 && labels.is_contiguous() &&
                     labels.size(0) == logits.size(0),
                 "SoftmaxCrossEntropy: logits " << logits.shape().str() << " and labels " << labels.shape().str()
                                                << " are not (N, C) and (N)");
    const std::int64_t N = logits.size(0), C = logits.size(1);
    for (std::int64_t n = 0; n < N; ++n)
      DPML_REQUIRE(labels[n] >= 0 && labels[n] < C,
                   "SoftmaxCrossEntropy: label " << labels[n] << " of sample " << n << " is not in [0, " << C << ")");
    Saved& s = slots_.slot(ctx);
    s.labels = labels;
    s.divisor = ctx.global_batch > 0 ? static_cast<double>(ctx.global_batch) : static_cast<double>(N);
    auto probs = ensure(s.probs, logits.shape());
    const double sum = kernels::host::softmax_cross_entropy_forward(logits.data(), labels.data(), N, C, probs.data());
    const float loss = static_cast<float>(N > 0 ? sum / s.divisor : 0.0);
    running_ += loss;
    return loss;
  }

  // dlogits (N, C) of the same micro-batch's forward.
  TensorView<const T, Space> backward(Context<Space>& ctx) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.probs.rank() == 2, "SoftmaxCrossEntropy: backward before forward for micro-batch " << ctx.micro_batch);
    auto d = ensure(s.dlogits, s.probs.shape());
    kernels::host::softmax_cross_entropy_backward(s.probs.data(), s.labels.data(), s.probs.size(0), s.probs.size(1),
                                                  static_cast<T>(1.0 / s.divisor), d.data());
    return d;
  }

  // The losses forward returned since the last take, summed; then zero.
  double take_loss() { return std::exchange(running_, 0.0); }

 private:
  struct Saved {
    TensorView<const std::int32_t, Space> labels;  // (N), the caller's buffer
    double divisor = 1;
    Tensor<T, Space> probs, dlogits;               // (N, C)
  };
  Slots<Saved> slots_;
  double running_ = 0.0;
};

}  // namespace dpml::layers
