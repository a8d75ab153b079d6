#pragma once
// Precision policies of the device models (a template argument: models::cuda::Gpt<Fp16>); the
// dynamic loss scale that the fp16 policy needs is optim::DynamicLossScale (optim/loss_scale.hpp).
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

#include "dpml/kernels/cuda/common.hpp"
#include "dpml/optim/loss_scale.hpp"

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

// The dynamic loss scale is the library's (optim/loss_scale.hpp), shared with train::Trainer.
using optim::DynamicLossScale;
using optim::LossScaleOptions;

}  // namespace dpml::models::cuda
