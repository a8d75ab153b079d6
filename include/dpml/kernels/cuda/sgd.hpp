#pragma once
// sgd_update: optim::Sgd's step on one contiguous range of fp32 master weights, through the one
// generic update kernel (kernels/cuda/update.hpp) — the call the fused ResNet makes on its flat
// buffers (models/cuda/resnet.hpp). It goes with it: the parallel runtime runs SGD through
// optim::Optimizer instead. (This header still includes optim/: the kernels → optim arrow that the
// fused models' removal takes away.)
//
// With momentum 0 the momentum buffer is neither read nor written (it may be null). `grad_scale`
// follows kernels/cuda/update.hpp: a device pointer (nullable) to one float that multiplies every
// gradient; a non-finite *grad_scale skips the update, leaving every buffer untouched.

#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/update.hpp"
#include "dpml/optim/sgd.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace dpml::kernels::cuda {

// One SGD step on n parameters: master (n) fp32 in/out; grad (n) fp32, bf16 or fp16; momentum (n)
// fp32 in/out (nullable iff o.momentum == 0; ignored then); param (n) bf16 or fp16 out (nullable:
// no working copy); grad_scale: see above.
template <class P, class G>
void sgd_update(float* master, P* param, const G* grad, float* momentum, std::int64_t n, const optim::SgdOptions& o,
                double lr, const float* grad_scale, cudaStream_t stream) {
  static_assert(detail::is_storage_v<G>, "SGD's gradient is fp32, bf16 or fp16");
  static_assert(std::is_same_v<P, bf16> || std::is_same_v<P, f16>, "SGD's working copy is bf16 or fp16");
  optim::Sgd::validate(o);
  DPML_REQUIRE(n >= 0, "SGD parameter count " << n << " is negative");
  DPML_REQUIRE(o.momentum == 0.0 || momentum != nullptr,
               "SGD momentum " << o.momentum << " needs a momentum buffer of " << n << " floats, got null");
  UpdateState<float, 1> state;
  state.master = master;
  state.slot[0] = o.momentum == 0.0 ? nullptr : momentum;
  update_contiguous(optim::Sgd::step<float>(o, lr, 0), param, grad, n, state, grad_scale, stream);
}

}  // namespace dpml::kernels::cuda
