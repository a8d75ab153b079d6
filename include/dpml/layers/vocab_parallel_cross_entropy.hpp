#pragma once
// Softmax cross-entropy over a vocabulary split across the tensor axis, with the LM head tied to
// the token embedding (Megatron-LM's vocab-parallel cross-entropy). The full logits never exist
// on one rank.
//
//   logits_k = h · W_kᵀ           h (N, C) whole on every rank; W_k (V_pad/tp, C) this rank's
//                                 rows of wte → (N, V_pad/tp) local logits
//   m  = max over all ranks       each rank's row maxima, gathered (N, tp), then the max: the
//                                 same shift on every rank (gather is a conjugate op: no MPI here)
//   S  = Σ_k Σ_j exp(z − m)       and z_target (from the rank whose shard holds the target, 0
//                                 elsewhere): one all_reduce over the tensor axis, (N, 2)
//   loss = Σ_n (log S_n + m_n − z_target,n) / ctx.global_batch
//
// Padding columns (rows of wte at or past V) are masked: they are left out of the GEMM, the max
// and the sum, exactly as −inf logits would be, so the loss is the unpadded one for any tp.
//
// ctx.global_batch counts TOKENS here: the number of target tokens in the whole step (all data
// ranks, all micro-batches), so that summed micro-batch losses give the mean per-token loss and
// gradients add up unscaled. With global_batch = 0 the divisor is this call's N.
//
// Forward already forms dlogits = (softmax − onehot(target)) / global_batch (the loss is the
// root of the graph, its own gradient is 1), kept per slot. Then
//   backward_input:  dh = dlogits · W_k, summed over the tensor axis (copy_to's backward,
//                    because h entered every rank whole)
//   backward_weight: W_k.grad += dlogitsᵀ · h   — the tied embedding's gradient.
// Not a Layer (the loss is a scalar root), like SoftmaxCrossEntropy. forward returns the loss
// as double whatever T is: float64 gradient checks need it unrounded.

#include "dpml/comm/mpi.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/host/gemm.hpp"
#include "dpml/layers/embedding.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/parallel/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace dpml::layers {

template <class T = float, class Space = HostSpace>
class VocabParallelCrossEntropy {
  static_assert(std::is_same_v<Space, HostSpace>,
                "dpml VocabParallelCrossEntropy: only the host path (kernels/host) exists so far");

 public:
  using value_type = T;
  using space = Space;

  // weight: this rank's (V_pad/tp, C) rows of the tied token table, described by `part`.
  VocabParallelCrossEntropy(Param<T, Space>& weight, VocabPartition part,
                            const parallel::TensorRegion<comm::Mpi>& region = {})
      : weight_(&weight), part_(part), region_(region) {
    DPML_REQUIRE(weight.shape().rank() == 2 && weight.shape()[0] == part.local(),
                 "VocabParallelCrossEntropy: weight " << weight.name() << " " << weight.shape().str()
                                                      << " does not hold the shard's " << part.local() << " rows");
  }
  explicit VocabParallelCrossEntropy(Embedding<T, Space>& tied)
      : VocabParallelCrossEntropy(tied.token_weight(), tied.partition(), tied.region()) {}

  // h (..., C), targets (...) int32 in [0, V) → the loss summed over tokens / ctx.global_batch.
  double forward(Context<Space>& ctx, TensorView<const T, Space> h, TensorView<const std::int32_t, Space> targets) {
    const std::int64_t C = weight_->shape()[1];
    DPML_REQUIRE(h.is_contiguous() && h.rank() >= 1 && h.size(h.rank() - 1) == C && h.numel() / C == targets.numel(),
                 "VocabParallelCrossEntropy: h " << h.shape().str() << " is not (targets " << targets.shape().str()
                                                 << ", C=" << C << ")");
    const std::int64_t N = targets.numel(), Vl = part_.valid();
    for (std::int64_t n = 0; n < N; ++n)
      DPML_REQUIRE(targets[n] >= 0 && targets[n] < part_.vocab, "VocabParallelCrossEntropy: target "
                                                                    << targets[n] << " at position " << n
                                                                    << " is outside the vocabulary [0, "
                                                                    << part_.vocab << ")");
    Saved& s = slots_.slot(ctx);
    s.h = h;
    auto dz = ensure(s.dlogits, Shape{N, Vl});  // (N, Vl): logits, then probabilities, then dlogits
    if (Vl > 0)
      kernels::host::gemm(kernels::host::Trans::no, kernels::host::Trans::yes, N, Vl, C, T(1), h.data(), C,
                          weight_->value().data(), C, T(0), dz.data(), Vl);

    // Row maxima, made global by gathering one per rank.
    Tensor<T, Space> local_max(Shape{N, 1}), all_max(Shape{N, static_cast<std::int64_t>(region_.size())});
    for (std::int64_t n = 0; n < N; ++n) {
      T m = -std::numeric_limits<T>::infinity();
      for (std::int64_t j = 0; j < Vl; ++j) m = std::max(m, dz(n, j));
      local_max[n] = m;
    }
    region_.gather_last_dim(local_max.cview(), all_max.view());
    // (N, 2): Σ exp(z − m) over this shard, and the target's logit if this shard holds it.
    Tensor<T, Space> sums(Shape{N, 2}, T(0));
    for (std::int64_t n = 0; n < N; ++n) {
      const T m = *std::max_element(&all_max(n, 0), &all_max(n, 0) + all_max.size(1));
      all_max(n, 0) = m;
      const std::int64_t t = targets[n] - part_.begin;
      if (t >= 0 && t < Vl) sums(n, 1) = dz(n, t);
      double s_exp = 0;
      for (std::int64_t j = 0; j < Vl; ++j) {
        dz(n, j) = std::exp(dz(n, j) - m);
        s_exp += dz(n, j);
      }
      sums(n, 0) = static_cast<T>(s_exp);
    }
    region_.all_reduce(sums.view());

    const double divisor = ctx.global_batch > 0 ? static_cast<double>(ctx.global_batch) : static_cast<double>(N);
    const T scale = static_cast<T>(1.0 / divisor);
    double loss = 0;
    for (std::int64_t n = 0; n < N; ++n) {
      const T S = sums(n, 0), m = all_max(n, 0);
      loss += std::log(static_cast<double>(S)) + static_cast<double>(m) - static_cast<double>(sums(n, 1));
      const T inv = T(1) / S;
      for (std::int64_t j = 0; j < Vl; ++j) dz(n, j) *= inv * scale;
      const std::int64_t t = targets[n] - part_.begin;
      if (t >= 0 && t < Vl) dz(n, t) -= scale;
    }
    return loss / divisor;
  }

  // dh (..., C), summed over the tensor axis.
  TensorView<const T, Space> backward_input(Context<Space>& ctx) {
    Saved& s = slots_.slot(ctx);
    const std::int64_t C = weight_->shape()[1], N = s.dlogits.size(0), Vl = s.dlogits.size(1);
    auto dh = ensure(s.dh, s.h.shape());
    if (Vl > 0)
      kernels::host::gemm(kernels::host::Trans::no, kernels::host::Trans::no, N, C, Vl, T(1), s.dlogits.data(), Vl,
                          weight_->value().data(), C, T(0), dh.data(), C);
    else
      std::fill(dh.begin(), dh.end(), T(0));
    region_.copy_to_backward(dh);
    return dh;
  }

  // weight.grad (V_pad/tp, C) += dlogitsᵀ · h over the shard's real rows.
  void backward_weight(Context<Space>& ctx) {
    Saved& s = slots_.slot(ctx);
    const std::int64_t C = weight_->shape()[1], N = s.dlogits.size(0), Vl = s.dlogits.size(1);
    if (Vl > 0)
      kernels::host::gemm(kernels::host::Trans::yes, kernels::host::Trans::no, Vl, C, N, T(1), s.dlogits.data(), Vl,
                          s.h.data(), C, T(1), weight_->grad().data(), C);
  }

 private:
  struct Saved {
    TensorView<const T, Space> h;      // (..., C), the caller's buffer
    Tensor<T, Space> dlogits;          // (N, valid rows of the shard)
    Tensor<T, Space> dh;               // (..., C)
  };

  Param<T, Space>* weight_;
  VocabPartition part_;
  parallel::TensorRegion<comm::Mpi> region_;
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
