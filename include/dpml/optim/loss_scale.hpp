#pragma once
// Loss scaling for 16-bit gradients, on either space (the trainer's and the fused GPU model's).
//
// IEEE fp16 has 11 significant bits and the range ±65504, smallest normal 6e-5: small gradients
// would flush to zero. So the loss gradient (the loss layers' seed, Context::loss_scale) is
// multiplied by a scale S, every gradient of the backward is S times the true one, and the update
// divides S out again (the clipping scale carries 1/S: kernels' GradNormOps::clip_scale). A power
// of two S changes no bit of the result where nothing overflows or flushes.
//
//   LossScaling          off | fixed (a static S, Megatron's --loss-scale) | dynamic
//   DynamicLossScale     the scale between steps: a step whose scaled gradients overflow (a
//                        non-finite global norm) is skipped and S halved (never below min);
//                        after `window` clean steps in a row S doubles — torch.cuda.amp's
//                        GradScaler and Megatron's --fp16 with dynamic scaling (no hysteresis)

#include "dpml/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace dpml::optim {

struct LossScaleOptions {
  double initial = 65536.0;   // 2^16, as torch.cuda.amp.GradScaler (Megatron: --initial-loss-scale)
  std::int64_t window = 1000; // clean steps before the scale doubles (--loss-scale-window)
  double min = 1.0;           // the scale never drops below this (--min-loss-scale)
};

// The loss scale between steps: update() once per step with whether its gradients overflowed.
class DynamicLossScale {
 public:
  explicit DynamicLossScale(LossScaleOptions o = {}) : options_(o), scale_(o.initial) {
    DPML_REQUIRE(o.initial >= o.min && o.min > 0.0 && std::isfinite(o.initial),
                 "loss scale: initial " << o.initial << " must be finite and at least min " << o.min << " > 0");
    DPML_REQUIRE(o.window >= 1, "loss scale: window " << o.window << " must be at least 1");
  }
  double scale() const noexcept { return scale_; }
  std::int64_t clean_steps() const noexcept { return clean_; }
  // Restores the state a checkpoint saved.
  void set(double scale, std::int64_t clean_steps) {
    DPML_REQUIRE(std::isfinite(scale) && scale >= options_.min && clean_steps >= 0 && clean_steps < options_.window,
                 "loss scale " << scale << " with " << clean_steps << " clean steps does not fit min " << options_.min
                               << ", window " << options_.window);
    scale_ = scale;
    clean_ = clean_steps;
  }
  void update(bool overflow) {
    if (overflow) {
      scale_ = std::max(options_.min, scale_ / 2.0);
      clean_ = 0;
    } else if (++clean_ == options_.window) {
      scale_ *= 2.0;
      clean_ = 0;
    }
  }

 private:
  LossScaleOptions options_;
  double scale_;
  std::int64_t clean_ = 0;
};

// How a trainer scales the loss gradient (train::TrainOptions::loss_scaling).
struct LossScaling {
  enum class Mode { off, fixed, dynamic };
  Mode mode = Mode::off;
  double scale = 1.0;           // Mode::fixed: S (finite, > 0; a power of two keeps fp32 gradients exact)
  LossScaleOptions dynamic{};   // Mode::dynamic: the scaler's options

  static LossScaling fixed_at(double s) { return {.mode = Mode::fixed, .scale = s}; }
  static LossScaling dynamic_from(LossScaleOptions o = {}) { return {.mode = Mode::dynamic, .dynamic = o}; }
};

}  // namespace dpml::optim
