#pragma once
// Precision policies of the device models (a template argument: models::cuda::Gpt<Fp16>) and the
// dynamic loss scale that the fp16 policy needs.
//
//   Bf16   weights, activations and gradients in bf16; fp32 master weights and AdamW moments.
//          bf16 has fp32's exponent range: gradients neither overflow nor flush, no scaling.
//   Fp16   the same in IEEE fp16 (11 significant bits, range ±65504, smallest normal 6e-5):
//          small gradients would flush to zero, so the loss gradient is multiplied by a scale S
//          and the update divides it out (AdamW's grad_scale = clip coefficient / S). A step
//          whose scaled gradients overflow (a non-finite global norm) is skipped on the device
//          and S is halved; after `window` clean steps S doubles again — torch.cuda.amp's
//          GradScaler and Megatron's --fp16 with dynamic scaling.
//
// CUDA translation units only (the storage types are CUDA's).

#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/common.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace dpml::models::cuda {

struct Bf16 {
  using type = bf16;
  static constexpr bool loss_scaling = false;
  static constexpr std::string_view name = "bf16";
};
struct Fp16 {
  using type = kernels::cuda::f16;
  static constexpr bool loss_scaling = true;
  static constexpr std::string_view name = "fp16";
};

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

}  // namespace dpml::models::cuda
