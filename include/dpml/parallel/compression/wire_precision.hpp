#pragma once
// WirePrecision<W>: fp32 gradient buckets reduced with 16-bit values on the wire (W = bf16 or
// Fp16), on host buckets over comm::Mpi.
//
// MPI has no bf16 (or fp16) sum, and a user-defined MPI_Op would add in an order the MPI library
// picks (a tree, a ring, recursive halving — it depends on the size and the implementation), so
// the result would have no exact description. Instead the reduction is a reduce-scatter made of
// an all-to-all, which only moves bits, and a sum done here:
//
//   encode      w = W(g)                                   (n) 16-bit codes of this rank's bucket
//   all-to-all  block j of w (block_count(n, p, j) codes) to rank j; this rank receives its block
//               from every rank                                             (p, m) codes, m = my block
//   sum         s[i] = Σ_r decode(w_r[i]), in fp32, r = 0, 1, …, p − 1 (rank order, left to right)
//   ZeRO-1      the shard is s (fp32): done
//   all-reduce  the block W(s) all-gathered into w, decoded into the bucket
//
// So every rank ends with, bitwise,
//   all-reduce:      g[i] = decode(W(fl32(Σ_r decode(W(g_r[i])))))      (the sum rounded once more)
//   reduce-scatter:  shard[i] = fl32(Σ_r decode(W(g_r[i])))
// whatever MPI does inside; tests/parallel/test_grad_compression.cpp checks exactly that. On the
// wire: 2(p−1)/p·n·2 bytes per rank for the all-reduce (half of fp32's), (p−1)/p·n·2 for ZeRO-1's
// reduce-scatter. Not overlapped: the bucket's reduction runs to completion when the bucket is
// ready (during backward), as the other compressors do.
//
// Fp16's range ends at 65504: larger gradients (or sums) become infinite and the step is skipped
// as any non-finite gradient is (train::Trainer's --on-nonfinite); bf16 has fp32's range.

#include "dpml/comm/communicator.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/flat_parameters.hpp"
#include "dpml/core/memory_space.hpp"
#include "dpml/kernels/device.hpp"
#include "dpml/parallel/comm_link.hpp"
#include "dpml/parallel/compression/policy.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dpml::parallel {

template <class W>
class BucketCompressor<WirePrecision<W>, float, HostSpace, comm::Mpi> {
  using Codec = WireCodec<W>;

 public:
  BucketCompressor(const FlatParameters<float>& flat, kernels::Device<HostSpace>&, CommLink<comm::Mpi, HostSpace>& link,
                   bool sharded, const CompressionOptions&)
      : flat_(flat), comm_(link.comm()), sharded_(sharded) {}

  std::int64_t reduce(std::size_t b, float* grads, float* shard) {
    const int p = comm_.size(), me = comm_.rank();
    const auto n = static_cast<std::size_t>(flat_.buckets()[b].count);
    counts_.resize(static_cast<std::size_t>(p));
    for (int j = 0; j < p; ++j) counts_[static_cast<std::size_t>(j)] = static_cast<int>(comm::block_count(n, p, j));
    const std::size_t m = comm::block_count(n, p, me), at = comm::block_offset(n, p, me);
    mine_.assign(static_cast<std::size_t>(p), static_cast<int>(m));

    codes_.resize(n);  // (n)
    for (std::size_t i = 0; i < n; ++i) codes_[i] = Codec::encode(grads[i]);
    arrived_.resize(m * static_cast<std::size_t>(p));  // (p, m): my block of every rank
    comm_.alltoallv(codes_.data(), counts_, arrived_.data(), mine_);

    float* sum = sharded_ ? shard : grads + at;  // (m): fp32, rank order
    for (std::size_t i = 0; i < m; ++i) {
      float s = 0.0f;
      for (int r = 0; r < p; ++r) s += Codec::decode(arrived_[static_cast<std::size_t>(r) * m + i]);
      sum[i] = s;
    }
    if (sharded_) return wire_bytes::reduce_scatter(static_cast<std::int64_t>(n), 2, p);  // as the all-to-all moves

    for (std::size_t i = 0; i < m; ++i) codes_[at + i] = Codec::encode(sum[i]);
    comm_.allgatherv(codes_.data() + at, codes_.data(), counts_);  // in place
    for (std::size_t i = 0; i < n; ++i) grads[i] = Codec::decode(codes_[i]);
    return wire_bytes::allreduce(static_cast<std::int64_t>(n), 2, p);  // all-to-all and all-gather: a ring all-reduce's bytes
  }

 private:
  const FlatParameters<float>& flat_;
  const comm::Mpi& comm_;
  bool sharded_;
  std::vector<int> counts_, mine_;      // (p): block sizes; my block's size, from every rank
  std::vector<std::uint16_t> codes_;    // (n): the bucket on the wire
  std::vector<std::uint16_t> arrived_;  // (p, m): my block from every rank
};

}  // namespace dpml::parallel
