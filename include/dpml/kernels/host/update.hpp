#pragma once
// Ops<HostSpace>'s optimizer-update family: the element of kernels/update.hpp in a plain loop over
// the spans, in order. The device family (kernels/cuda/update.hpp) runs the same element in a
// kernel, one block per span; an update rule's functor is the same on both. A large update (an
// offloaded GPU optimizer's: billions of elements) is cut into contiguous ranges of the spans run
// by this rank's share of the cores (blas_threads()); each element's result does not depend on the
// cut.

#include "dpml/kernels/device.hpp"
#include "dpml/kernels/host/blas_threads.hpp"
#include "dpml/kernels/update.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

namespace dpml::kernels::host {

struct UpdateOps {
  using Dev = Device<HostSpace>;
  // The longest span update() takes: any (the loop needs no cutting).
  static constexpr std::int64_t max_update_span = std::numeric_limits<std::int64_t>::max();

  // For every span s (n_spans) and i < s.count: update_element(step, s, state, i, *scale).
  // scale (1 element; nullptr: 1): a non-finite *scale (an overflowed or NaN gradient norm) skips
  // the update, leaving every value, master and state element as it was.
  template <class Step, class T, class G, class M, int K>
  static void update(Dev&, const Step& step, const UpdateSpan<T, G>* spans, std::int64_t n_spans,
                     const UpdateState<M, K>& state, const M* scale) {
    const M gs = scale ? *scale : M(1);
    if (!std::isfinite(static_cast<double>(gs))) return;
    std::int64_t total = 0;
    for (std::int64_t s = 0; s < n_spans; ++s) total += spans[s].count;
    // Elements [lo, hi) of the spans laid end to end.
    const auto run = [&](std::int64_t lo, std::int64_t hi) {
      std::int64_t before = 0;
      for (std::int64_t s = 0; s < n_spans && before < hi; before += spans[s].count, ++s)
        for (std::int64_t i = std::max(lo - before, std::int64_t{0}); i < std::min(hi - before, spans[s].count); ++i)
          update_element(step, spans[s], state, i, gs);
    };
    constexpr std::int64_t kPerThread = std::int64_t{1} << 22;  // below this, one thread
    const auto threads = std::clamp<std::int64_t>(total / kPerThread, 1, std::max(1, blas_threads()));
    if (threads == 1) {
      run(0, total);
      return;
    }
    const std::int64_t share = (total + threads - 1) / threads;
    std::vector<std::jthread> pool;
    for (std::int64_t t = 1; t < threads; ++t) pool.emplace_back(run, t * share, std::min(total, (t + 1) * share));
    run(0, share);
  }
};

}  // namespace dpml::kernels::host
