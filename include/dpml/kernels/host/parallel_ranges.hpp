#pragma once
// parallel_ranges(n, per_thread, f): f(lo, hi) over [0, n) cut into contiguous ranges, one per
// thread of this rank's share of the host's cores (blas_threads(), which dpml::run sizes from the
// node's ranks), each at least per_thread elements; below that, one range on the calling thread.
// What f computes for an element must not depend on the cut (the callers draw initial values by
// global index, update optimizer elements): the results are then the same on any thread count.

#include "dpml/kernels/host/blas_threads.hpp"

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace dpml::kernels::host {

template <class F>
void parallel_ranges(std::int64_t n, std::int64_t per_thread, const F& f) {
  const auto threads = std::clamp<std::int64_t>(n / per_thread, 1, std::max(1, blas_threads()));
  if (threads == 1) {
    f(std::int64_t{0}, n);
    return;
  }
  const std::int64_t share = (n + threads - 1) / threads;
  std::vector<std::jthread> pool;
  for (std::int64_t t = 1; t < threads; ++t) pool.emplace_back(f, t * share, std::min(n, (t + 1) * share));
  f(std::int64_t{0}, std::min(n, share));
}  // the pool joins here

}  // namespace dpml::kernels::host
