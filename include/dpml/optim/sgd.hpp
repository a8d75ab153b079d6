#pragma once
// SGD with momentum, Nesterov momentum and L2 weight decay — torch.optim.SGD with dampening 0:
//
//   g  = grad + weight_decay · p
//   b  = momentum · b + g                     (b starts at 0, so step 1 gives b = g, as in PyTorch)
//   d  = nesterov ? g + momentum · b : b      (momentum 0: d = g, and b is neither read nor written)
//   p -= lr · d
//
// Sgd is an update rule (optim/rule.hpp): Optimizer<Sgd, T, Space> runs its step functor over
// contiguous ranges on the host or the GPU, and ZeRO-1 runs it on a shard. With dampening fixed
// at 0, PyTorch's "first step copies g into the buffer" equals the zero-initialised recurrence
// above, so the step needs no special first step.

#include "dpml/core/config.hpp"
#include "dpml/core/error.hpp"
#include "dpml/optim/rule.hpp"

#include <array>
#include <cstdint>
#include <span>

namespace dpml::optim {

struct SgdOptions {
  double momentum = 0.0;
  double weight_decay = 0.0;  // L2: added to the gradient (not decoupled; AdamW decouples)
  bool nesterov = false;
};

// One element of an SGD step in A (s[0]: the momentum buffer).
template <class A>
struct SgdStep {
  A momentum, weight_decay, lr;
  bool nesterov;
  DPML_HD void operator()(A& p, A g, A* s) const {
    g += weight_decay * p;
    if (momentum != A(0)) {
      s[0] = momentum * s[0] + g;
      g = nesterov ? g + momentum * s[0] : s[0];
    }
    p -= lr * g;
  }
};

struct Sgd {
  using Options = SgdOptions;
  static constexpr std::array<const char*, 1> state_names{"momentum"};

  static void validate(const Options& o) {
    DPML_REQUIRE(o.momentum >= 0.0 && o.momentum < 1.0, "SGD momentum " << o.momentum << " is outside [0, 1)");
    DPML_REQUIRE(o.weight_decay >= 0.0, "SGD weight decay " << o.weight_decay << " is negative");
    DPML_REQUIRE(!o.nesterov || o.momentum > 0.0, "SGD Nesterov momentum needs momentum > 0");
  }

  // The step with learning rate lr (SGD has no bias correction: the step number is unused).
  template <class A>
  static SgdStep<A> step(const Options& o, double lr, std::int64_t /*t*/) {
    return {static_cast<A>(o.momentum), static_cast<A>(o.weight_decay), static_cast<A>(lr), o.nesterov};
  }

  // One step on contiguous host arrays; `momentum` has value.size() elements.
  template <class T>
  static void update(std::span<T> value, std::span<const T> grad, std::span<master_t<T>> momentum, const Options& o,
                     double lr, std::int64_t step) {
    detail::update_host<Sgd, T, 1>(value, grad, {momentum}, o, lr, step);
  }
};

}  // namespace dpml::optim
