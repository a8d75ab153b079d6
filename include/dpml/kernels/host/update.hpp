#pragma once
// Ops<HostSpace>'s optimizer-update family: the element of kernels/update.hpp in a plain loop over
// the spans, in order. The device family (kernels/cuda/update.hpp) runs the same element in a
// kernel, one block per span; an update rule's functor is the same on both. A large update (an
// offloaded GPU optimizer's: billions of elements) is cut into contiguous ranges of the spans run
// by this rank's share of the cores (parallel_ranges); each element's result does not depend on
// the cut.

#include "dpml/kernels/device.hpp"
#include "dpml/kernels/host/parallel_ranges.hpp"
#include "dpml/kernels/update.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

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
    parallel_ranges(total, std::int64_t{1} << 22, run);
  }
};

}  // namespace dpml::kernels::host
