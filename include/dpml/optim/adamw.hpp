#pragma once
// AdamW (Loshchilov & Hutter) with bias correction and decoupled weight decay — torch.optim.AdamW:
//
//   p  = p · (1 − lr · weight_decay)                  (decoupled: not part of the gradient)
//   m  = β1 · m + (1 − β1) · g
//   v  = β2 · v + (1 − β2) · g²
//   p -= (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε)       t = 1 on the first update
//
// AdamW is an update rule (optim/rule.hpp): Optimizer<AdamW, T, Space> runs its step functor over
// contiguous ranges on the host or the GPU, and ZeRO-1 runs it on a shard. The coefficients are
// computed once per step in double and rounded to the update's type (as PyTorch does: 1 − 0.999f
// would be off by 1e-5 relative).

#include "dpml/core/config.hpp"
#include "dpml/core/error.hpp"
#include "dpml/optim/rule.hpp"

#include <array>
#include <cmath>
#include <cstdint>
#include <span>

namespace dpml::optim {

struct AdamWOptions {  // PyTorch's defaults
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// One element of an AdamW step in A (s[0]: exp_avg, s[1]: exp_avg_sq).
template <class A>
struct AdamWStep {
  A b1, b2, c1, c2, eps, decay, step_size, inv_sqrt_bc2;
  DPML_HD void operator()(A& p, A g, A* s) const {
    using std::sqrt;
    const A m = b1 * s[0] + c1 * g;
    const A v = b2 * s[1] + c2 * g * g;
    s[0] = m;
    s[1] = v;
    p = p * decay - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps);
  }
};

struct AdamW {
  using Options = AdamWOptions;
  static constexpr std::array<const char*, 2> state_names{"exp_avg", "exp_avg_sq"};

  static void validate(const Options& o) {
    DPML_REQUIRE(o.beta1 >= 0.0 && o.beta1 < 1.0, "AdamW beta1 " << o.beta1 << " is outside [0, 1)");
    DPML_REQUIRE(o.beta2 >= 0.0 && o.beta2 < 1.0, "AdamW beta2 " << o.beta2 << " is outside [0, 1)");
    DPML_REQUIRE(o.eps > 0.0, "AdamW eps " << o.eps << " must be positive");
    DPML_REQUIRE(o.weight_decay >= 0.0, "AdamW weight decay " << o.weight_decay << " is negative");
  }

  // The t-th step (t ≥ 1) with learning rate lr.
  template <class A>
  static AdamWStep<A> step(const Options& o, double lr, std::int64_t t) {
    DPML_REQUIRE(t >= 1, "AdamW step " << t << " must be >= 1 (bias correction divides by 1 - beta^step)");
    const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
    return {static_cast<A>(o.beta1),          static_cast<A>(o.beta2),          static_cast<A>(1.0 - o.beta1),
            static_cast<A>(1.0 - o.beta2),    static_cast<A>(o.eps),            static_cast<A>(1.0 - lr * o.weight_decay),
            static_cast<A>(lr / bc1),         static_cast<A>(1.0 / std::sqrt(bc2))};
  }

  // One step on contiguous host arrays; exp_avg and exp_avg_sq have value.size() elements each.
  template <class T>
  static void update(std::span<T> value, std::span<const T> grad, std::span<master_t<T>> exp_avg,
                     std::span<master_t<T>> exp_avg_sq, const Options& o, double lr, std::int64_t step) {
    detail::update_host<AdamW, T, 2>(value, grad, {exp_avg, exp_avg_sq}, o, lr, step);
  }
};

}  // namespace dpml::optim
