#pragma once
// PowerSgd: each gradient matrix of a bucket reduced as a rank-r product (Vogels, Karimireddy and
// Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization",
// NeurIPS 2019, Algorithms 1 and 2), on either memory space: the products are kernels::Ops<Space>'
// Linear GEMMs, the rest its compression family (kernels/{host,cuda}/compression.hpp), the
// all-reduces the buckets' CommLink (on a GPU: NCCL on the communication stream, ordered by events;
// no host synchronisation).
//
// A parameter of two or more dimensions is the matrix M (n, m): n = its first stored dimension,
// m = the rest (a convolution's (out, in·k·k) as the paper does); it is compressed when r(n + m)
// < n·m. Everything else (biases, norm weights, small matrices) is all-reduced as it is, packed
// with the P's of the bucket into one message. Per matrix and step, with this rank's M_w and Q kept
// transposed, Qt (r, m):
//
//   M_w ← G_w + E_w                error feedback: the residual E_w of the last step added
//   P_w = M_w Qtᵀ                  (n, r); Qt from the last step (warm start), identical on all ranks
//   P = Σ_w P_w                    all-reduce (one message: every P of the bucket + the dense rest)
//   P̂ = orth(P)                    Gram–Schmidt on P's columns in double (a vanished column is zero)
//   Qt_w = P̂ᵀ M_w                  (r, m)
//   E_w ← M_w − P̂ Qt_w             what this rank did not send: P̂ P̂ᵀ M_w went, (I − P̂ P̂ᵀ) M_w stays
//   Qt = Σ_w Qt_w                  all-reduce (one message: every Qt of the bucket)
//   G ← P̂ Qt = P̂ P̂ᵀ Σ_w M_w       the bucket's result on every rank; Qt is kept for the next step
//
// Σ_w (sent_w + E_w) = Σ_w M_w within rounding, and when r ≥ rank(Σ_w M_w) the span of P is the
// column space of the sum, so G equals the exact all-reduce within rounding (both tested). Before
// each step a row of Qt that is all zero (the first step's, or one whose direction vanished: a
// gradient without it) gets Philox normals of (seed, the parameter's index) at counters that
// advance with the step: the same on every rank. Gradients are summed, not averaged (losses
// divide by the global batch), which PowerSGD's linearity allows. On the wire per bucket:
// 2(p−1)/p·(Σ(n + m)·r + dense)·sizeof(T) bytes instead of 2(p−1)/p·numel·sizeof(T). P, Q and the
// residual are not saved in checkpoints: a resumed run starts them afresh.

#include "dpml/core/error.hpp"
#include "dpml/core/flat_parameters.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/parallel/comm_link.hpp"
#include "dpml/parallel/compression/policy.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dpml::parallel {

template <class T, class Space, class Comm>
class BucketCompressor<PowerSgd, T, Space, Comm> {
  using Ops = kernels::Ops<Space>;

 public:
  // One compressed parameter of a bucket.
  struct Matrix {
    std::size_t param = 0;     // index in the flat buffers' parameters
    std::int64_t at = 0;       // first element, relative to the bucket
    std::int64_t n = 0, m = 0;
    std::int64_t p_at = 0;     // its P (n, r) in the bucket's P message
    std::int64_t q_at = 0;     // its Qt (r, m) in the bucket's Q message
  };
  struct Dense {
    std::int64_t at = 0, count = 0;  // relative to the bucket
  };

  BucketCompressor(const FlatParameters<T, Space>& flat, kernels::Device<Space>& dev, CommLink<Comm, Space>& link,
                   bool sharded, const CompressionOptions& o)
      : flat_(flat), dev_(dev), link_(link), r_(o.powersgd_rank), seed_(o.seed), residual_(Shape{flat.numel()}) {
    DPML_REQUIRE_EVERYWHERE(!sharded, "PowerSGD compresses whole buckets on every rank: it cannot feed ZeRO-1's reduce-scatter "
                                      "(--grad-compression powersgd with --zero)");
    DPML_REQUIRE_EVERYWHERE(r_ >= 1, "--powersgd-rank " << r_ << " must be at least 1");
    Ops::zero(dev_, residual_.data(), residual_.numel());
    std::int64_t most = 0;  // the largest P and Q messages of a bucket
    for (const FlatBucket& b : flat.buckets()) {
      Plan plan;
      std::int64_t end = b.offset;  // the dense stretch (padding included) runs up to each matrix
      for (std::size_t i = b.first_param; i < b.last_param; ++i) {
        const ParamBase& p = *flat.params()[i];
        const std::int64_t at = flat.offsets()[i];
        const std::int64_t n = p.shape().rank() >= 2 ? p.shape()[p.storage_order()[0]] : p.numel();
        const std::int64_t m = p.numel() / n;
        if (p.shape().rank() < 2 || r_ * (n + m) >= n * m) continue;  // dense: left in the stretches
        if (at > end) plan.dense.push_back({end - b.offset, at - end});
        plan.matrices.push_back({i, at - b.offset, n, m, 0, 0});
        end = at + p.numel();
      }
      if (b.offset + b.count > end) plan.dense.push_back({end - b.offset, b.offset + b.count - end});
      for (auto& mat : plan.matrices) {
        mat.p_at = plan.p_size;
        plan.p_size += mat.n * r_;
        mat.q_at = plan.q_size;
        plan.q_size += r_ * mat.m;
      }
      plan.p_size_with_dense = plan.p_size;
      for (const auto& d : plan.dense) plan.p_size_with_dense += d.count;
      plan.qt = Tensor<T, Space>(Shape{plan.q_size});
      Ops::zero(dev_, plan.qt.data(), plan.q_size);  // all rows zero: the first reduce draws them
      most = std::max({most, plan.p_size_with_dense, plan.q_size});
      plans_.push_back(std::move(plan));
    }
    message_ = Tensor<T, Space>(Shape{std::max<std::int64_t>(most, 1)});
  }

  std::int64_t reduce(std::size_t b, T* grads, T*) {
    Plan& plan = plans_[b];
    T* residual = residual_.data() + flat_.buckets()[b].offset;
    T* message = message_.data();  // (p_size_with_dense): the P's, then the dense rest
    const int r = r_;

    // M ← G + E; P_w = M Qtᵀ; the dense rest after the P's.
    for (auto& mat : plan.matrices) {
      T* M = grads + mat.at;  // (n, m)
      Ops::add(dev_, M, residual + mat.at, M, mat.n * mat.m);
      T* Qt = plan.qt.data() + mat.q_at;  // (r, m)
      Ops::redraw_zero_rows(dev_, Qt, r, mat.m, seed_, kQStream + mat.param, plan.steps * static_cast<std::uint64_t>(r * mat.m));
      Ops::linear_forward(dev_, M, Qt, static_cast<const T*>(nullptr), message + mat.p_at, mat.n, mat.m, r);
    }
    ++plan.steps;
    std::int64_t at = plan.p_size;
    for (const auto& d : plan.dense) Ops::copy(dev_, grads + d.at, message + at, d.count), at += d.count;
    exchange(message, plan.p_size_with_dense);
    at = plan.p_size;
    for (const auto& d : plan.dense) Ops::copy(dev_, message + at, grads + d.at, d.count), at += d.count;

    // P̂ = orth(P); Qt_w = P̂ᵀ M; E ← M − P̂ Qt_w. P̂ stays in the message, Qt_w goes to the bucket's Qt.
    for (auto& mat : plan.matrices) {
      T* Ph = message + mat.p_at;  // (n, r)
      Ops::orthonormalise_columns(dev_, Ph, mat.n, r);
      const T* M = grads + mat.at;
      T* Qt = plan.qt.data() + mat.q_at;  // (r, m)
      Ops::linear_backward_weight(dev_, Ph, M, Qt, static_cast<T*>(nullptr), mat.n, mat.m, r, /*overwrite*/ true);
      T* E = residual + mat.at;
      Ops::linear_backward_input(dev_, Ph, Qt, E, mat.n, mat.m, r);  // what went: P̂ Qt_w
      Ops::subtract(dev_, M, E, E, mat.n * mat.m);
    }
    exchange(plan.qt.data(), plan.q_size);

    // G ← P̂ Qt; Qt kept for the next step.
    for (auto& mat : plan.matrices)
      Ops::linear_backward_input(dev_, message + mat.p_at, plan.qt.data() + mat.q_at, grads + mat.at, mat.n, mat.m, r);
    const auto elem = static_cast<std::int64_t>(sizeof(T));
    const int p = link_.comm().size();
    return wire_bytes::allreduce(plan.p_size_with_dense, elem, p) + wire_bytes::allreduce(plan.q_size, elem, p);
  }

  // ---- inspection (tests) ------------------------------------------------------------------------
  // What this rank kept back: (flat numel), nonzero on compressed matrices only.
  TensorView<const T, Space> residual() const noexcept { return residual_.cview(); }
  // The compressed parameters of bucket b.
  const std::vector<Matrix>& matrices(std::size_t b) const { return plans_[b].matrices; }

 private:
  static constexpr std::uint64_t kQStream = 0x9057'5000'0000'0000ull;  // + the parameter's index

  struct Plan {
    std::vector<Matrix> matrices;
    std::vector<Dense> dense;
    std::int64_t p_size = 0, q_size = 0, p_size_with_dense = 0;
    Tensor<T, Space> qt;         // (q_size): every matrix's Qt (r, m), warm from the last step
    std::uint64_t steps = 0;     // reductions so far (the Philox counters of a redraw advance with it)
  };

  // data (n) ← its sum over the data ranks, visible to what the device runs next.
  void exchange(T* data, std::int64_t n) {
    if (n == 0) return;
    link_.allreduce(data, static_cast<std::size_t>(n)).wait();
    link_.join();
  }

  const FlatParameters<T, Space>& flat_;
  kernels::Device<Space>& dev_;
  CommLink<Comm, Space>& link_;
  int r_;
  std::uint64_t seed_;
  Tensor<T, Space> residual_;  // (flat numel): E of every compressed matrix
  std::vector<Plan> plans_;    // per bucket
  Tensor<T, Space> message_;   // the largest bucket's P message (the P's and the dense rest)
};

}  // namespace dpml::parallel
