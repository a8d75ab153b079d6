#pragma once
// adamw_update: optim::AdamW's step on one contiguous range of fp32 master weights, through the one
// generic update kernel (kernels/cuda/update.hpp) — the call the fused GPU models make on their
// flat buffers (models/cuda/gpt.hpp, parallel/cuda/distributed_optimizer.hpp). It goes with them:
// the parallel runtime runs AdamW through optim::Optimizer instead. (This header still includes
// optim/: the kernels → optim arrow that the fused models' removal takes away.)
//
// Clipping and loss scaling enter as `grad_scale`, a device pointer (nullable) to one float that
// multiplies every gradient; a non-finite *grad_scale skips the update (see update.hpp).

#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/update.hpp"
#include "dpml/optim/adamw.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace dpml::kernels::cuda {

// One AdamW step (step ≥ 1) on n parameters: master, m, v (n) fp32 in/out; grad (n) fp32, bf16 or
// fp16; param (n) bf16 or fp16 out (nullable: no working copy); grad_scale: see above.
template <class P, class G>
void adamw_update(float* master, P* param, const G* grad, float* m, float* v, std::int64_t n,
                  const optim::AdamWOptions& o, double lr, std::int64_t step, const float* grad_scale,
                  cudaStream_t stream) {
  static_assert(detail::is_storage_v<G>);
  static_assert(std::is_same_v<P, bf16> || std::is_same_v<P, f16>, "AdamW's working copy is bf16 or fp16");
  optim::AdamW::validate(o);
  UpdateState<float, 2> state;
  state.master = master;
  state.slot[0] = m;
  state.slot[1] = v;
  update_contiguous(optim::AdamW::step<float>(o, lr, step), param, grad, n, state, grad_scale, stream);
}

}  // namespace dpml::kernels::cuda
