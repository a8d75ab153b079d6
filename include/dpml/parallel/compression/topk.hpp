#pragma once
// TopK: each rank sends the k largest-magnitude entries of its bucket (gradient + residual) as
// (index, value) pairs and keeps the rest as the next step's residual — sparsification with error
// feedback (Stich, Cordonnier and Jaggi, "Sparsified SGD with Memory", NeurIPS 2018; Lin et al.,
// "Deep Gradient Compression", ICLR 2018). On either memory space: the selection and the sum are
// kernels::Ops<Space>' compression family (kernels/{host,cuda}/compression.hpp), the all-gathers
// the buckets' CommLink.
//
//   M ← G + E                            (n) the bucket plus what earlier steps kept back
//   S = the k entries of largest |M|      k = ⌈ratio · n⌉ (1 ≤ k ≤ n); ties go to the lower index,
//                                         a NaN counts as largest (kernels::magnitude_key)
//   E ← M with S's entries zeroed         exactly: every entry is either sent or kept, never split
//   all-gather S's indices (k int32) and values (k of T) from every rank: fixed k, no counts
//   G[i] = Σ_w S_w[i], added in rank order (w = 0 … p − 1) onto zeros
//
// So Σ_w (S_w + E_w) = Σ_w M_w entry by entry, and with ratio 1 every entry is sent: G is the sum
// of all ranks' gradients in rank order (equal to an all-reduce wherever that sum is exact). On
// the wire per bucket: (p−1)·k·(4 + sizeof(T)) bytes per rank against 2(p−1)/p·n·sizeof(T) for the
// all-reduce: a saving once k/n < 2/(p(1 + 4/sizeof(T))), 1 % at any p ≤ 100 for fp32. The
// selection is nth_element on the host (O(n)), a radix sort of the keys on a GPU (O(n), about
// 8 bytes moved per element and pass). The residual is not saved in checkpoints.

#include "dpml/core/error.hpp"
#include "dpml/core/flat_parameters.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/parallel/comm_link.hpp"
#include "dpml/parallel/compression/policy.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace dpml::parallel {

template <class T, class Space, class Comm>
class BucketCompressor<TopK, T, Space, Comm> {
  using Ops = kernels::Ops<Space>;

 public:
  BucketCompressor(const FlatParameters<T, Space>& flat, kernels::Device<Space>& dev, CommLink<Comm, Space>& link,
                   bool sharded, const CompressionOptions& o)
      : flat_(flat), dev_(dev), link_(link), ratio_(o.topk_ratio), residual_(Shape{flat.numel()}) {
    DPML_REQUIRE_EVERYWHERE(!sharded, "top-k compresses whole buckets on every rank: it cannot feed ZeRO-1's reduce-scatter "
                                      "(--grad-compression topk with --zero)");
    DPML_REQUIRE_EVERYWHERE(ratio_ > 0.0 && ratio_ <= 1.0, "--topk-ratio " << ratio_ << " is outside (0, 1]");
    Ops::zero(dev_, residual_.data(), residual_.numel());
    std::int64_t most = 1;
    for (const FlatBucket& b : flat.buckets()) {
      DPML_REQUIRE(b.count <= std::numeric_limits<std::int32_t>::max(),
                   "top-k: a bucket of " << b.count << " elements has indices beyond int32");
      most = std::max(most, k_of(b.count));
    }
    const std::int64_t p = link.comm().size();
    idx_ = Tensor<std::int32_t, Space>(Shape{p * most});  // (p, k): rank w's indices at row w
    val_ = Tensor<T, Space>(Shape{p * most});             // (p, k)
  }

  // k of a bucket of n elements.
  std::int64_t k_of(std::int64_t n) const {
    return std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(ratio_ * static_cast<double>(n))), 1, n);
  }

  std::int64_t reduce(std::size_t b, T* grads, T*) {
    const int p = link_.comm().size(), me = link_.comm().rank();
    const std::int64_t n = flat_.buckets()[b].count, k = k_of(n);
    T* E = residual_.data() + flat_.buckets()[b].offset;  // (n)
    Ops::add(dev_, E, grads, E, n);                       // E now holds M
    std::int32_t* idx = idx_.data();
    T* val = val_.data();
    Ops::take_top_magnitude(dev_, E, n, k, idx + me * k, val + me * k);  // in place for the all-gathers
    link_.allgather(idx + me * k, idx, static_cast<std::size_t>(k)).wait();
    link_.allgather(val + me * k, val, static_cast<std::size_t>(k)).wait();
    link_.join();
    Ops::zero(dev_, grads, n);
    for (int w = 0; w < p; ++w) Ops::scatter_add(dev_, idx + w * k, val + w * k, k, grads);  // rank order
    return wire_bytes::allgather(k, 4, p) + wire_bytes::allgather(k, static_cast<std::int64_t>(sizeof(T)), p);
  }

  // What this rank kept back: (flat numel).
  TensorView<const T, Space> residual() const noexcept { return residual_.cview(); }

 private:
  const FlatParameters<T, Space>& flat_;
  kernels::Device<Space>& dev_;
  CommLink<Comm, Space>& link_;
  double ratio_;
  Tensor<T, Space> residual_;          // (flat numel)
  Tensor<std::int32_t, Space> idx_;    // (p, k) of the largest bucket's k
  Tensor<T, Space> val_;               // (p, k)
};

}  // namespace dpml::parallel
