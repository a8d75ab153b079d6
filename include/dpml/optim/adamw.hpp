#pragma once
// AdamW (Loshchilov & Hutter) with bias correction and decoupled weight decay — torch.optim.AdamW:
//
//   p  = p · (1 − lr · weight_decay)                  (decoupled: not part of the gradient)
//   m  = β1 · m + (1 − β1) · g
//   v  = β2 · v + (1 − β2) · g²
//   p -= (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε)       t = 1 on the first update
//
// AdamW is an update rule (a tag with Options, state_names and update()); Optimizer<AdamW, T>
// (optim/optimizer.hpp) runs it over a list of contiguous ranges, and ZeRO-1 runs it on a shard.

#include "dpml/core/error.hpp"
#include "dpml/optim/sgd.hpp"  // detail::update_t

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

namespace dpml::optim {

struct AdamWOptions {  // PyTorch's defaults
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
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

  // One step on a contiguous range; exp_avg and exp_avg_sq have value.size() elements each.
  template <class T>
  static void update(std::span<T> value, std::span<const T> grad, std::span<T> exp_avg, std::span<T> exp_avg_sq,
                     const Options& o, double lr, std::int64_t step) {
    DPML_REQUIRE(step >= 1, "AdamW step " << step << " must be >= 1 (bias correction divides by 1 - beta^step)");
    using A = detail::update_t<T>;
    const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(step));
    // 1 − β in double, then rounded (as PyTorch does): 1 − 0.999f would be off by 1e-5 relative.
    const A b1 = static_cast<A>(o.beta1), b2 = static_cast<A>(o.beta2), eps = static_cast<A>(o.eps);
    const A c1 = static_cast<A>(1.0 - o.beta1), c2 = static_cast<A>(1.0 - o.beta2);
    const A decay = static_cast<A>(1.0 - lr * o.weight_decay);
    const A step_size = static_cast<A>(lr / bc1), inv_sqrt_bc2 = static_cast<A>(1.0 / std::sqrt(bc2));
    for (std::size_t i = 0, n = value.size(); i < n; ++i) {
      const A g = static_cast<A>(grad[i]);
      const A m = b1 * static_cast<A>(exp_avg[i]) + c1 * g;
      const A v = b2 * static_cast<A>(exp_avg_sq[i]) + c2 * g * g;
      exp_avg[i] = static_cast<T>(m);
      exp_avg_sq[i] = static_cast<T>(v);
      value[i] = static_cast<T>(static_cast<A>(value[i]) * decay - step_size * m / (std::sqrt(v) * inv_sqrt_bc2 + eps));
    }
  }
};

}  // namespace dpml::optim
