#pragma once
// PowerSgd: each gradient matrix of a bucket reduced as a rank-r product (Vogels, Karimireddy and
// Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization",
// NeurIPS 2019, Algorithms 1 and 2), on host buckets over comm::Mpi.
//
// A parameter of two or more dimensions is the matrix M (n, m): n = its first stored dimension,
// m = the rest (a convolution's (out, in·k·k) as the paper does); it is compressed when r(n + m)
// < n·m. Everything else (biases, norm weights, small matrices) is all-reduced as it is, packed
// with the P's of the bucket into one message. Per matrix and step, with this rank's M_w:
//
//   M_w ← G_w + E_w                error feedback: the residual E_w of the last step added
//   P_w = M_w Q                    (n, r), Q (m, r) from the last step (warm start), identical on all ranks
//   P = Σ_w P_w                    all-reduce (one message: every P of the bucket + the dense rest)
//   P̂ = orth(P)                    Gram–Schmidt on P's columns in double (a zero column stays zero)
//   Q_w = M_wᵀ P̂                   (m, r)
//   E_w ← M_w − P̂ Q_wᵀ             what this rank did not send: P̂ P̂ᵀ M_w went, (I − P̂ P̂ᵀ) M_w stays
//   Q = Σ_w Q_w                    all-reduce (one message: every Q of the bucket)
//   G ← P̂ Qᵀ = P̂ P̂ᵀ Σ_w M_w       the bucket's result on every rank; Q is kept for the next step
//
// Σ_w (sent_w + E_w) = Σ_w M_w within rounding, and when r ≥ rank(Σ_w M_w) the span of P is the
// column space of the sum, so G equals the exact all-reduce within rounding (both tested). Q starts
// as Philox normals of (seed, the parameter's index), the same on every rank; a column that comes
// back zero (a gradient without that direction) is drawn again from the next Philox numbers.
// Gradients are summed, not averaged (losses divide by the global batch), which PowerSGD's
// linearity allows. On the wire per bucket: 2(p−1)/p·(Σ(n + m)·r + dense)·4 bytes instead of
// 2(p−1)/p·numel·4. P, Q and the residual live on the host (no GPU compressor); they are not
// saved in checkpoints: a resumed run starts them afresh.

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/flat_parameters.hpp"
#include "dpml/core/memory_space.hpp"
#include "dpml/core/philox.hpp"
#include "dpml/parallel/compression/policy.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dpml::parallel {

template <class T>
class BucketCompressor<PowerSgd, T, HostSpace, comm::Mpi> {
 public:
  // One compressed parameter of a bucket.
  struct Matrix {
    std::size_t param = 0;    // index in the flat buffers' parameters
    std::int64_t at = 0;      // first element, relative to the bucket
    std::int64_t n = 0, m = 0;
    std::int64_t p_at = 0;    // its P (n, r) in the bucket's P message
    std::int64_t q_at = 0;    // its Q (m, r) in the bucket's Q message
    std::uint64_t redraws = 0;  // Philox numbers used for Q so far (a zero column draws again)
  };
  struct Dense {
    std::int64_t at = 0, count = 0;  // relative to the bucket
  };

  BucketCompressor(const FlatParameters<T>& flat, const comm::Mpi& data, bool sharded, const CompressionOptions& o)
      : flat_(flat), comm_(data), r_(o.powersgd_rank), seed_(o.seed), residual_(static_cast<std::size_t>(flat.numel()), T(0)) {
    DPML_REQUIRE_EVERYWHERE(!sharded, "PowerSGD compresses whole buckets on every rank: it cannot feed ZeRO-1's reduce-scatter "
                                      "(--grad-compression powersgd with --zero)");
    DPML_REQUIRE_EVERYWHERE(r_ >= 1, "--powersgd-rank " << r_ << " must be at least 1");
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
        plan.q_size += mat.m * r_;
      }
      plan.dense_at = plan.p_size;
      for (const auto& d : plan.dense) plan.p_size_with_dense += d.count;
      plan.p_size_with_dense += plan.p_size;
      plan.q.assign(static_cast<std::size_t>(plan.q_size), T(0));
      for (auto& mat : plan.matrices) draw_q(plan, mat, /*all columns*/ -1);
      plans_.push_back(std::move(plan));
    }
  }

  std::int64_t reduce(std::size_t b, T* grads, T*) {
    Plan& plan = plans_[b];
    const int p = comm_.size();
    const std::size_t r = static_cast<std::size_t>(r_);
    T* residual = residual_.data() + flat_.buckets()[b].offset;
    message_.assign(static_cast<std::size_t>(plan.p_size_with_dense), T(0));

    // M ← G + E; P_w = M Q; the dense rest after the P's.
    for (auto& mat : plan.matrices) {
      T* M = grads + mat.at;  // (n, m)
      const T* E = residual + mat.at;
      for (std::int64_t i = 0; i < mat.n * mat.m; ++i) M[i] += E[i];
      revive_zero_columns(plan, mat);
      const T* Q = plan.q.data() + mat.q_at;  // (m, r)
      T* P = message_.data() + mat.p_at;      // (n, r)
      acc_.assign(r, 0.0);
      for (std::int64_t i = 0; i < mat.n; ++i) {
        std::fill(acc_.begin(), acc_.end(), 0.0);
        for (std::int64_t j = 0; j < mat.m; ++j) {
          const double x = M[i * mat.m + j];
          for (std::size_t c = 0; c < r; ++c) acc_[c] += x * Q[static_cast<std::size_t>(j) * r + c];
        }
        for (std::size_t c = 0; c < r; ++c) P[static_cast<std::size_t>(i) * r + c] = static_cast<T>(acc_[c]);
      }
    }
    std::int64_t at = plan.dense_at;
    for (const auto& d : plan.dense)
      for (std::int64_t i = 0; i < d.count; ++i) message_[static_cast<std::size_t>(at++)] = grads[d.at + i];
    comm_.allreduce(message_.data(), message_.size(), comm::ReduceOp::sum);
    at = plan.dense_at;
    for (const auto& d : plan.dense)
      for (std::int64_t i = 0; i < d.count; ++i) grads[d.at + i] = message_[static_cast<std::size_t>(at++)];

    // P̂ = orth(P); Q_w = Mᵀ P̂; E ← M − P̂ Q_wᵀ.
    qmsg_.assign(static_cast<std::size_t>(plan.q_size), T(0));
    phat_.resize(static_cast<std::size_t>(plan.p_size));
    for (auto& mat : plan.matrices) {
      double* Ph = phat_.data() + mat.p_at;  // (n, r)
      for (std::int64_t i = 0; i < mat.n * r_; ++i) Ph[i] = message_[static_cast<std::size_t>(mat.p_at + i)];
      orthogonalise(Ph, mat.n);
      const T* M = grads + mat.at;
      T* Qw = qmsg_.data() + mat.q_at;  // (m, r)
      qw_.assign(static_cast<std::size_t>(mat.m) * r, 0.0);
      for (std::int64_t i = 0; i < mat.n; ++i)
        for (std::int64_t j = 0; j < mat.m; ++j) {
          const double x = M[i * mat.m + j];
          for (std::size_t c = 0; c < r; ++c) qw_[static_cast<std::size_t>(j) * r + c] += x * Ph[static_cast<std::size_t>(i) * r + c];
        }
      T* E = residual + mat.at;
      for (std::int64_t i = 0; i < mat.n; ++i)
        for (std::int64_t j = 0; j < mat.m; ++j) {
          double sent = 0.0;
          for (std::size_t c = 0; c < r; ++c) sent += Ph[static_cast<std::size_t>(i) * r + c] * qw_[static_cast<std::size_t>(j) * r + c];
          E[i * mat.m + j] = static_cast<T>(M[i * mat.m + j] - sent);
        }
      for (std::size_t k = 0; k < qw_.size(); ++k) Qw[k] = static_cast<T>(qw_[k]);
    }
    comm_.allreduce(qmsg_.data(), qmsg_.size(), comm::ReduceOp::sum);

    // G ← P̂ Qᵀ; Q kept for the next step.
    for (auto& mat : plan.matrices) {
      const double* Ph = phat_.data() + mat.p_at;
      const T* Q = qmsg_.data() + mat.q_at;
      T* G = grads + mat.at;
      for (std::int64_t i = 0; i < mat.n; ++i)
        for (std::int64_t j = 0; j < mat.m; ++j) {
          double g = 0.0;
          for (std::size_t c = 0; c < r; ++c) g += Ph[static_cast<std::size_t>(i) * r + c] * static_cast<double>(Q[static_cast<std::size_t>(j) * r + c]);
          G[i * mat.m + j] = static_cast<T>(g);
        }
    }
    std::copy(qmsg_.begin(), qmsg_.end(), plan.q.begin());
    const auto elem = static_cast<std::int64_t>(sizeof(T));
    return wire_bytes::allreduce(plan.p_size_with_dense, elem, p) + wire_bytes::allreduce(plan.q_size, elem, p);
  }

  // ---- inspection (tests) ------------------------------------------------------------------------
  // What this rank kept back: (flat numel), nonzero on compressed matrices only.
  const std::vector<T>& residual() const noexcept { return residual_; }
  // The compressed parameters of bucket b.
  const std::vector<Matrix>& matrices(std::size_t b) const { return plans_[b].matrices; }

 private:
  struct Plan {
    std::vector<Matrix> matrices;
    std::vector<Dense> dense;
    std::int64_t p_size = 0, q_size = 0, dense_at = 0, p_size_with_dense = 0;
    std::vector<T> q;  // (Σ m·r): every matrix's Q, warm from the last step
  };

  // Fills column `only` of mat's Q (all columns when -1) with the next Philox normals of
  // (seed, parameter index): the same numbers on every rank.
  void draw_q(Plan& plan, Matrix& mat, int only) {
    const PhiloxStream rng(seed_, 0x9057'5000'0000'0000ull + mat.param);
    const std::size_t r = static_cast<std::size_t>(r_);
    for (std::size_t c = 0; c < r; ++c) {
      if (only >= 0 && c != static_cast<std::size_t>(only)) continue;
      for (std::int64_t j = 0; j < mat.m; ++j)
        plan.q[static_cast<std::size_t>(mat.q_at) + static_cast<std::size_t>(j) * r + c] = static_cast<T>(rng.normal(mat.redraws++));
    }
  }
  void revive_zero_columns(Plan& plan, Matrix& mat) {
    const std::size_t r = static_cast<std::size_t>(r_);
    for (std::size_t c = 0; c < r; ++c) {
      bool zero = true;
      for (std::int64_t j = 0; j < mat.m && zero; ++j) zero = plan.q[static_cast<std::size_t>(mat.q_at) + static_cast<std::size_t>(j) * r + c] == T(0);
      if (zero) draw_q(plan, mat, static_cast<int>(c));
    }
  }

  // Modified Gram–Schmidt on the r columns of P (n, r) in place. A column with nothing left after
  // the projections (relative to its own norm: a dependent or zero column) becomes zero.
  void orthogonalise(double* P, std::int64_t n) const {
    const std::size_t r = static_cast<std::size_t>(r_);
    auto at = [&](std::int64_t i, std::size_t c) -> double& { return P[static_cast<std::size_t>(i) * r + c]; };
    for (std::size_t c = 0; c < r; ++c) {
      double before = 0.0;
      for (std::int64_t i = 0; i < n; ++i) before += at(i, c) * at(i, c);
      for (std::size_t k = 0; k < c; ++k) {
        double dot = 0.0;
        for (std::int64_t i = 0; i < n; ++i) dot += at(i, k) * at(i, c);
        for (std::int64_t i = 0; i < n; ++i) at(i, c) -= dot * at(i, k);
      }
      double norm = 0.0;
      for (std::int64_t i = 0; i < n; ++i) norm += at(i, c) * at(i, c);
      const bool keep = norm > 0.0 && norm > 1e-24 * before && std::isfinite(norm);
      const double inv = keep ? 1.0 / std::sqrt(norm) : 0.0;
      for (std::int64_t i = 0; i < n; ++i) at(i, c) *= inv;
    }
  }

  const FlatParameters<T>& flat_;
  const comm::Mpi& comm_;
  int r_;
  std::uint64_t seed_;
  std::vector<T> residual_;  // (flat numel): E of every compressed matrix
  std::vector<Plan> plans_;  // per bucket
  std::vector<T> message_;   // (P's + dense): the first all-reduce
  std::vector<T> qmsg_;      // (Q's): the second
  std::vector<double> phat_, qw_, acc_;
};

}  // namespace dpml::parallel
