#pragma once
// Learning-rate schedules: small value types called with t, the number of the update about to be
// made (1 for the first), returning its learning rate. Optimizer::step(schedule) asks for
// schedule(step_count() + 1).
//
//   ConstantLR      lr
//   StepLR          lr · gamma^⌊(t − 1) / step_size⌋    (torch StepLR: the first step_size updates use lr)
//   WarmupCosineLR  Megatron-LM's OptimizerParamScheduler, cosine style, init_lr 0:
//                     t ≤ warmup:        max_lr · t / warmup
//                     t > decay_steps:   min_lr
//                     otherwise:         min_lr + (max_lr − min_lr) · ½(1 + cos(π · (t − warmup) / (decay_steps − warmup)))

#include "dpml/core/error.hpp"

#include <cmath>
#include <cstdint>
#include <numbers>

namespace dpml::optim {

namespace detail {
inline void require_step(std::int64_t t) { DPML_REQUIRE(t >= 1, "learning-rate schedule asked for step " << t << " (steps count from 1)"); }
}  // namespace detail

struct ConstantLR {
  double lr = 1e-3;
  double operator()(std::int64_t t) const {
    detail::require_step(t);
    return lr;
  }
};

struct StepLR {
  double lr = 1e-3;
  std::int64_t step_size = 1;  // updates between decays
  double gamma = 0.1;
  double operator()(std::int64_t t) const {
    detail::require_step(t);
    DPML_REQUIRE(step_size >= 1, "StepLR step_size " << step_size << " must be >= 1");
    return lr * std::pow(gamma, static_cast<double>((t - 1) / step_size));
  }
};

struct WarmupCosineLR {
  double max_lr = 1e-3;
  double min_lr = 0.0;
  std::int64_t warmup_steps = 0;
  std::int64_t decay_steps = 1;  // the update at which min_lr is reached (warm-up included)
  double operator()(std::int64_t t) const {
    detail::require_step(t);
    DPML_REQUIRE(warmup_steps >= 0 && decay_steps > warmup_steps,
                 "WarmupCosineLR needs 0 <= warmup_steps < decay_steps, got warmup_steps " << warmup_steps
                                                                                          << ", decay_steps " << decay_steps);
    DPML_REQUIRE(min_lr <= max_lr, "WarmupCosineLR min_lr " << min_lr << " exceeds max_lr " << max_lr);
    if (warmup_steps > 0 && t <= warmup_steps) return max_lr * static_cast<double>(t) / static_cast<double>(warmup_steps);
    if (t > decay_steps) return min_lr;
    const double ratio = static_cast<double>(t - warmup_steps) / static_cast<double>(decay_steps - warmup_steps);
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  }
};

}  // namespace dpml::optim
