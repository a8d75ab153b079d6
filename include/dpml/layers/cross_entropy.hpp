#pragma once
// Softmax cross-entropy over (N, C) logits and int32 labels (N): the classifier's loss, and the
// pattern of the loss API every loss layer offers on both spaces (the trainer is generic over it).
// Leading dimensions are rows: (B, T, C) logits with (B, T) labels are a language model's
// next-token loss over B·T rows (examples/train_lstm), each target token one row.
//
//   using value_type, space, Input (the logits view), Target (the labels view)
//   void   forward(ctx, Input logits, Target labels)
//            adds this micro-batch's Σ_n −log softmax(z_n)[label_n] / ctx.global_batch (N when
//            global_batch is 0) to a running sum kept in the loss — one double in the space's
//            memory, so nothing is read back in the step — and, when ctx.training(), forms
//            dlogits = (softmax − onehot) · ctx.loss_scale / global_batch for the slot
//            ctx.micro_batch (the loss scale S of fp16 training: the loss itself stays unscaled)
//   Input  backward(ctx)     dlogits (N, C) of that slot
//   double take_loss()       the running sum since the last take, then zeroed; on a GPU the one
//                            place that waits for the device (one small copy)
//
// Summing micro-batches and data-parallel ranks of loss / global_batch gives the mean loss, and
// gradients are summed, never averaged.
//
// in_place: dlogits are written over the logits (the producer's buffer: only when the producer
// does not read its output in backward — a Linear does not), saving a logits-sized buffer per slot;
// after a training forward the logits are gone. Padded classes (valid < C: columns [valid, C) pad the
// row, e.g. to a multiple of 8 for the GEMM) are left out of the softmax and get zero gradient.
// Labels must lie in [0, valid): Ops::IdCheck (kernels/host/id_check.hpp) throws at once on the
// host, and by take_loss() at the latest on a GPU.
//
// Any space, through kernels::Ops<Space>'s cross-entropy family: one pass over each row writes the
// loss and dlogits (kernels/{host,cuda}/cross_entropy.hpp).

#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"

#include <cstdint>

namespace dpml::layers {

// The running loss of a loss layer: one double in the space's memory, which every forward adds to
// (the Ops cross-entropy family's *loss_sum) and take() reads and zeroes.
template <class Space>
class LossSum {
  using Ops = kernels::Ops<Space>;

 public:
  // The sum for this forward to add to; made and zeroed, on the context's device, at first use.
  double* running(Context<Space>& ctx) {
    if (!dev_) {
      dev_ = &ctx.dev();
      value_ = Tensor<double, Space>(Shape{1});
      Ops::zero(*dev_, value_.data(), 1);
    }
    return value_.data();
  }
  // The sum since the last take (0 before any forward), then zeroed.
  double take() { return dev_ ? Ops::take_loss(*dev_, value_.data()) : 0.0; }

 private:
  kernels::Device<Space>* dev_ = nullptr;
  Tensor<double, Space> value_;  // (1)
};

struct CrossEntropyOptions {
  bool in_place = false;     // dlogits over the logits
  std::int64_t valid = 0;    // real classes: columns [valid, C) are padding; 0: all C
};

template <class T = float, class Space = HostSpace>
class SoftmaxCrossEntropy {
  using Ops = kernels::Ops<Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;              // logits (N, C), or (…, C): N rows
  using Target = TensorView<const std::int32_t, Space>;  // labels (N) or (…) in [0, valid)

  explicit SoftmaxCrossEntropy(CrossEntropyOptions o = {})
      : opts_(o), check_(kernels::IdRange{"SoftmaxCrossEntropy", "label", "the classes"}) {}

  void forward(Context<Space>& ctx, Input logits, Target labels) {
    bool rows_match = logits.rank() >= 2 && logits.rank() == labels.rank() + 1;
    for (int d = 0; rows_match && d < labels.rank(); ++d) rows_match = labels.size(d) == logits.size(d);
    DPML_REQUIRE(rows_match && logits.is_contiguous() && labels.is_contiguous(),
                 "SoftmaxCrossEntropy: logits " << logits.shape().str() << " and labels " << labels.shape().str()
                                                << " are not (…, C) and (…)");
    const std::int64_t N = labels.numel(), C = logits.size(logits.rank() - 1), valid = opts_.valid > 0 ? opts_.valid : C;
    DPML_REQUIRE(valid <= C && C > 0, "SoftmaxCrossEntropy: " << valid << " real classes in rows of " << C);
    check_.scan(ctx.dev(), labels.data(), N, valid);
    Saved& s = slots_.slot(ctx);
    T* d = nullptr;  // (N, C): dlogits, or none when evaluating
    if (ctx.training()) d = opts_.in_place ? const_cast<T*>(logits.data()) : ensure(s.own, logits.shape()).data();
    s.dlogits = Input(d, d ? logits.shape() : Shape{0});
    const double divisor = ctx.global_batch > 0 ? static_cast<double>(ctx.global_batch) : static_cast<double>(N);
    Ops::softmax_xent(ctx.dev(), logits.data(), labels.data(), d, sum_.running(ctx), N, C, valid, 1.0 / divisor,
                      ctx.loss_scale);
  }

  // dlogits, shaped as the logits, of the same micro-batch's training forward.
  Input backward(Context<Space>& ctx) {
    const Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.dlogits.data() != nullptr, "SoftmaxCrossEntropy: backward without a training forward for micro-batch "
                                                  << ctx.micro_batch);
    return s.dlogits;
  }

  double take_loss() {
    const double loss = sum_.take();
    check_.raise_if_bad();
    return loss;
  }

 private:
  struct Saved {
    Tensor<T, Space> own;  // (…, C) as the logits: dlogits unless in place
    Input dlogits;         // (…, C): `own` or the caller's logits; empty after an evaluation forward
  };

  CrossEntropyOptions opts_;
  typename Ops::IdCheck check_;
  LossSum<Space> sum_;
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
