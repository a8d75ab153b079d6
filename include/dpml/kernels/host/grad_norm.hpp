#pragma once
// Ops<HostSpace>'s gradient-norm family: the sum of squares of some ranges of a buffer (the
// elements a rank adds to the global norm), in double and in order, and the clipping scale of
// torch.nn.utils.clip_grad_norm_ from the summed squares. The device family
// (kernels/cuda/grad_norm.hpp) computes the same on the GPU, so that the optimizer reads the scale
// there without a host synchronisation.

#include "dpml/kernels/device.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace dpml::kernels::host {

struct GradNormOps {
  using Dev = Device<HostSpace>;

  // *out = Σ data[i]² over the `count` ranges [begin[r], begin[r] + before[r + 1] − before[r]);
  // begin (count), before (count + 1: running lengths, before[0] = 0, before[count] = total).
  template <class T>
  static void sum_squares(Dev&, const T* data, const std::int64_t* begin, const std::int64_t* before, int count,
                          std::int64_t /*total*/, double* out) {
    double sum = 0.0;
    for (int r = 0; r < count; ++r)
      for (std::int64_t i = begin[r], end = begin[r] + before[r + 1] - before[r]; i < end; ++i) {
        const double g = static_cast<double>(data[i]);
        sum += g * g;
      }
    *out = sum;
  }

  // *scale = inv_scale · min(1, max_norm / (norm + 1e-6)) with norm = √*squared · inv_scale
  // (max_norm = ∞: inv_scale), NaN when the norm is not finite (the update then skips the step).
  // Gradients carrying a loss scale S (optim/loss_scale.hpp): inv_scale = 1/S, so the norm compared
  // with max_norm is the unscaled one and *scale also divides S out — the device kernel's rule.
  template <class S>
  static void clip_scale(Dev&, const double* squared, S* scale, double max_norm, double inv_scale = 1.0) {
    const double norm = std::sqrt(*squared) * inv_scale;
    *scale = std::isfinite(norm) ? static_cast<S>(inv_scale * std::min(1.0, max_norm / (norm + 1e-6)))
                                 : std::numeric_limits<S>::quiet_NaN();
  }
};

}  // namespace dpml::kernels::host
