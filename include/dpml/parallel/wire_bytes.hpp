#pragma once
// Bytes one rank puts on the wire for a collective of n elements of `elem` bytes over p ranks, as
// the bandwidth-optimal ring algorithms send them (what NCCL's bus bandwidth counts): an all-reduce
// 2(p−1)/p · n, a reduce-scatter or all-to-all (p−1)/p · n, an all-gather of k per rank (p−1) · k.
// The library's traffic counters use these: the data axis' gradient buckets (parallel/data.hpp:
// wire_bytes, dense_bytes, and the compressors' own), and the tensor axis' conjugate operations
// (parallel/tensor.hpp: TensorRegion::sent_bytes).

#include <cstdint>

namespace dpml::parallel::wire_bytes {

inline std::int64_t allreduce(std::int64_t n, std::int64_t elem, int p) { return 2 * (p - 1) * n * elem / p; }
inline std::int64_t reduce_scatter(std::int64_t n, std::int64_t elem, int p) { return (p - 1) * n * elem / p; }
inline std::int64_t alltoall(std::int64_t n, std::int64_t elem, int p) { return (p - 1) * n * elem / p; }
inline std::int64_t allgather(std::int64_t k, std::int64_t elem, int p) { return (p - 1) * k * elem; }

}  // namespace dpml::parallel::wire_bytes
