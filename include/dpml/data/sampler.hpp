#pragma once
// DistributedSampler: which samples each data-parallel rank reads, step by step.
//
// Each epoch has one global order of the N samples: a Fisher–Yates shuffle driven by Philox
// keyed by (seed, epoch) — the same permutation on every rank, for any number of ranks — or the
// identity when shuffle is off. Global batch b of the epoch is order[b·G, b·G + G); data-parallel
// rank r of K takes its contiguous slice of it, [⌊r·n/K⌋, ⌊(r+1)·n/K⌋) of the n samples of that
// batch. So the union over ranks of one step is exactly the batch one process would take, which
// is what makes data parallelism equal to the sequential run. G need not divide by K: slices then
// differ by one sample (the loss divides by the global count, Batch::global_size).
//
// drop_last = true: ⌊N / G⌋ batches, the last N mod G samples of the order are skipped (they
// differ every epoch). drop_last = false: ⌈N / G⌉ batches, the last one smaller (n = N mod G;
// ranks past the samples get an empty slice when n < K).

#include "dpml/core/error.hpp"
#include "dpml/core/philox.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

namespace dpml::data {

struct SamplerOptions {
  std::int64_t global_batch = 1;  // samples per step over all data-parallel ranks
  std::uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = true;
};

namespace detail {
inline constexpr std::uint64_t shuffle_stream(std::int64_t epoch) {
  return 0x5348'5546'0000'0000ull ^ static_cast<std::uint64_t>(epoch);
}
}  // namespace detail

class DistributedSampler {
 public:
  DistributedSampler(std::int64_t dataset_size, SamplerOptions options, int rank = 0, int ranks = 1)
      : n_(dataset_size), o_(options), rank_(rank), ranks_(ranks) {
    DPML_REQUIRE_EVERYWHERE(ranks >= 1 && rank >= 0 && rank < ranks, "sampler rank " << rank << " of " << ranks);
    DPML_REQUIRE_EVERYWHERE(o_.global_batch >= 1, "global batch " << o_.global_batch << " must be at least 1");
    DPML_REQUIRE_EVERYWHERE(dataset_size >= (o_.drop_last ? o_.global_batch : 1),
                            "a dataset of " << dataset_size << " samples holds no global batch of " << o_.global_batch
                                            << (o_.drop_last ? " (drop_last)" : ""));
    set_epoch(0);
  }

  // Makes `epoch`'s order the current one.
  void set_epoch(std::int64_t epoch) {
    epoch_ = epoch;
    order_.resize(static_cast<std::size_t>(n_));
    std::iota(order_.begin(), order_.end(), std::int64_t{0});
    if (!o_.shuffle) return;
    const PhiloxStream rng(o_.seed, detail::shuffle_stream(epoch));
    for (std::int64_t i = n_ - 1; i > 0; --i) {  // Fisher–Yates: swap i with j uniform in [0, i]
      const auto b = rng.block(static_cast<std::uint64_t>(i));
      const std::uint64_t word = std::uint64_t{b[0]} << 32 | b[1];  // 64 bits: modulo bias < 2^-40
      std::swap(order_[static_cast<std::size_t>(i)], order_[static_cast<std::size_t>(word % static_cast<std::uint64_t>(i + 1))]);
    }
  }

  std::int64_t epoch() const noexcept { return epoch_; }
  std::int64_t dataset_size() const noexcept { return n_; }
  const SamplerOptions& options() const noexcept { return o_; }
  int rank() const noexcept { return rank_; }
  int ranks() const noexcept { return ranks_; }
  std::int64_t batches_per_epoch() const noexcept {
    return o_.drop_last ? n_ / o_.global_batch : (n_ + o_.global_batch - 1) / o_.global_batch;
  }

  // The epoch's global order (N samples).
  std::span<const std::int64_t> order() const noexcept { return order_; }
  // Global batch b: all ranks' samples of step b.
  std::span<const std::int64_t> global_batch(std::int64_t b) const {
    DPML_REQUIRE(b >= 0 && b < batches_per_epoch(), "batch " << b << " of an epoch of " << batches_per_epoch());
    const std::int64_t begin = b * o_.global_batch, end = std::min(n_, begin + o_.global_batch);
    return std::span<const std::int64_t>(order_).subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(end - begin));
  }
  // This rank's slice of global batch b.
  std::span<const std::int64_t> local_batch(std::int64_t b) const {
    const auto g = global_batch(b);
    const auto n = static_cast<std::int64_t>(g.size());
    const std::int64_t begin = rank_ * n / ranks_, end = (rank_ + 1) * n / ranks_;
    return g.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(end - begin));
  }

 private:
  std::int64_t n_;
  SamplerOptions o_;
  int rank_, ranks_;
  std::int64_t epoch_ = 0;
  std::vector<std::int64_t> order_;  // (N)
};

}  // namespace dpml::data
