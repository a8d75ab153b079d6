#pragma once
// SGD with momentum, Nesterov momentum and L2 weight decay — torch.optim.SGD with dampening 0:
//
//   g  = grad + weight_decay · p
//   b  = momentum · b + g                     (b starts at 0, so step 1 gives b = g, as in PyTorch)
//   d  = nesterov ? g + momentum · b : b      (momentum 0: d = g)
//   p -= lr · d
//
// Sgd is an update rule (a tag with Options, state_names and update()); Optimizer<Sgd, T>
// (optim/optimizer.hpp) runs it over a list of contiguous ranges, and ZeRO-1 runs it on a shard.
// With dampening fixed at 0, PyTorch's "first step copies g into the buffer" equals the
// zero-initialised recurrence above, so update() needs no special first step.

#include "dpml/core/error.hpp"

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

namespace dpml::optim {

struct SgdOptions {
  double momentum = 0.0;
  double weight_decay = 0.0;  // L2: added to the gradient (not decoupled; AdamW decouples)
  bool nesterov = false;
};

namespace detail {
// Arithmetic type of an update: double for double parameters, float otherwise (PyTorch's fp32).
template <class T>
using update_t = std::conditional_t<std::is_same_v<T, double>, double, float>;
}  // namespace detail

struct Sgd {
  using Options = SgdOptions;
  static constexpr std::array<const char*, 1> state_names{"momentum"};

  static void validate(const Options& o) {
    DPML_REQUIRE(o.momentum >= 0.0 && o.momentum < 1.0, "SGD momentum " << o.momentum << " is outside [0, 1)");
    DPML_REQUIRE(o.weight_decay >= 0.0, "SGD weight decay " << o.weight_decay << " is negative");
    DPML_REQUIRE(!o.nesterov || o.momentum > 0.0, "SGD Nesterov momentum needs momentum > 0");
  }

  // One step on a contiguous range; `momentum` has value.size() elements (unused when momentum is 0).
  // `step` (1 on the first update) is unused: SGD has no bias correction.
  template <class T>
  static void update(std::span<T> value, std::span<const T> grad, std::span<T> momentum, const Options& o, double lr,
                     std::int64_t /*step*/) {
    using A = detail::update_t<T>;
    const A mu = static_cast<A>(o.momentum), wd = static_cast<A>(o.weight_decay), eta = static_cast<A>(lr);
    const std::size_t n = value.size();
    if (o.momentum == 0.0) {
      for (std::size_t i = 0; i < n; ++i) {
        const A p = static_cast<A>(value[i]);
        value[i] = static_cast<T>(p - eta * (static_cast<A>(grad[i]) + wd * p));
      }
      return;
    }
    for (std::size_t i = 0; i < n; ++i) {
      const A p = static_cast<A>(value[i]);
      const A g = static_cast<A>(grad[i]) + wd * p;
      const A b = mu * static_cast<A>(momentum[i]) + g;
      momentum[i] = static_cast<T>(b);
      value[i] = static_cast<T>(p - eta * (o.nesterov ? g + mu * b : b));
    }
  }
};

}  // namespace dpml::optim
