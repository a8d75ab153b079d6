#pragma once
// TopK: each rank sends the k largest-magnitude entries of its bucket (gradient + residual) as
// (index, value) pairs and keeps the rest as the next step's residual — sparsification with error
// feedback (Stich, Cordonnier and Jaggi, "Sparsified SGD with Memory", NeurIPS 2018; Lin et al.,
// "Deep Gradient Compression", ICLR 2018). Host buckets over comm::Mpi.
//
//   M ← G + E                            (n) the bucket plus what earlier steps kept back
//   S = the k entries of largest |M|      k = ⌈ratio · n⌉ (1 ≤ k ≤ n); ties go to the lower index
//   E ← M with S's entries zeroed         exactly: every entry is either sent or kept, never split
//   all-gather S's indices (k int32) and values (k of T) from every rank: fixed k, no counts
//   G[i] = Σ_w S_w[i], added in rank order (w = 0 … p − 1) onto zeros
//
// So Σ_w (S_w + E_w) = Σ_w M_w entry by entry, and with ratio 1 every entry is sent: G is the sum
// of all ranks' gradients in rank order (equal to an all-reduce wherever that sum is exact). On
// the wire per bucket: (p−1)·k·(4 + sizeof(T)) bytes per rank against 2(p−1)/p·n·sizeof(T) for the
// all-reduce: a saving once k/n < 2/(p(1 + 4/sizeof(T))), 1 % at any p ≤ 100 for fp32. The
// selection is nth_element, O(n) per bucket. The residual is not saved in checkpoints.

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/flat_parameters.hpp"
#include "dpml/core/memory_space.hpp"
#include "dpml/parallel/compression/policy.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace dpml::parallel {

template <class T>
class BucketCompressor<TopK, T, HostSpace, comm::Mpi> {
 public:
  BucketCompressor(const FlatParameters<T>& flat, const comm::Mpi& data, bool sharded, const CompressionOptions& o)
      : flat_(flat), comm_(data), ratio_(o.topk_ratio), residual_(static_cast<std::size_t>(flat.numel()), T(0)) {
    DPML_REQUIRE_EVERYWHERE(!sharded, "top-k compresses whole buckets on every rank: it cannot feed ZeRO-1's reduce-scatter "
                                      "(--grad-compression topk with --zero)");
    DPML_REQUIRE_EVERYWHERE(ratio_ > 0.0 && ratio_ <= 1.0, "--topk-ratio " << ratio_ << " is outside (0, 1]");
    for (const FlatBucket& b : flat.buckets())
      DPML_REQUIRE(b.count <= std::numeric_limits<std::int32_t>::max(),
                   "top-k: a bucket of " << b.count << " elements has indices beyond int32");
  }

  // k of a bucket of n elements.
  std::int64_t k_of(std::int64_t n) const {
    return std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(ratio_ * static_cast<double>(n))), 1, n);
  }

  std::int64_t reduce(std::size_t b, T* grads, T*) {
    const int p = comm_.size();
    const std::int64_t n = flat_.buckets()[b].count, k = k_of(n);
    T* E = residual_.data() + flat_.buckets()[b].offset;  // (n)
    for (std::int64_t i = 0; i < n; ++i) E[i] += grads[i];  // E now holds M

    order_.resize(static_cast<std::size_t>(n));
    std::iota(order_.begin(), order_.end(), std::int32_t{0});
    const auto larger = [E](std::int32_t a, std::int32_t c) {
      const T x = std::abs(E[a]), y = std::abs(E[c]);
      return x > y || (x == y && a < c);  // a strict total order: the same choice on every machine
    };
    if (k < n) std::nth_element(order_.begin(), order_.begin() + k, order_.end(), larger);
    idx_.assign(order_.begin(), order_.begin() + k);  // (k)
    val_.resize(static_cast<std::size_t>(k));         // (k)
    for (std::int64_t j = 0; j < k; ++j) {
      val_[static_cast<std::size_t>(j)] = E[idx_[static_cast<std::size_t>(j)]];
      E[idx_[static_cast<std::size_t>(j)]] = T(0);  // sent: nothing kept back
    }

    all_idx_.resize(static_cast<std::size_t>(k * p));  // (p, k)
    all_val_.resize(static_cast<std::size_t>(k * p));  // (p, k)
    comm_.allgather(idx_.data(), all_idx_.data(), static_cast<std::size_t>(k));
    comm_.allgather(val_.data(), all_val_.data(), static_cast<std::size_t>(k));
    std::fill(grads, grads + n, T(0));
    for (std::size_t j = 0; j < all_idx_.size(); ++j) grads[all_idx_[j]] += all_val_[j];  // rank order
    return wire_bytes::allgather(k, 4, p) + wire_bytes::allgather(k, static_cast<std::int64_t>(sizeof(T)), p);
  }

  // What this rank kept back: (flat numel).
  const std::vector<T>& residual() const noexcept { return residual_; }

 private:
  const FlatParameters<T>& flat_;
  const comm::Mpi& comm_;
  double ratio_;
  std::vector<T> residual_;  // (flat numel)
  std::vector<std::int32_t> order_, idx_, all_idx_;
  std::vector<T> val_, all_val_;
};

}  // namespace dpml::parallel
