#pragma once
// The one extension point between layers and kernels: kernels::Ops<Space> maps every operation a
// layer performs (GEMM, LayerNorm, attention, softmax + cross-entropy, …) to its kernel in that
// memory space, and kernels::Device<Space> holds what those kernels need to run there (nothing
// on the host; on a GPU the stream, the cuBLASLt handle and a workspace). A layer is written once
// against Ops<Space>; the space picks the kernels (DESIGN.md: "One framework, two memory
// spaces"; CUTLASS's *_decl.hpp habit: one declaration, failing loudly, then one specialisation
// per policy).
//
//   Ops<HostSpace>   kernels/host/ops.hpp  — OpenBLAS and plain loops (any T: float, double)
//   Ops<CudaSpace>   kernels/cuda/ops.hpp  — the device kernels (T: bf16, fp16 or float);
//                    visible in CUDA translation units only, so the host build never sees CUDA
//
// Every op takes the Device first, then raw pointers and sizes (shapes in comments), exactly as
// the kernels below it do; the layer owns the tensors and checks their shapes. A space without a
// specialisation fails to compile with "no kernel for this space".
//
// Ops<Space> is composed of one struct per kernel family (LinearOps, LayerNormOps, …), each
// defined beside its kernels (they include only kernels/device.hpp), so a family is added without
// touching the others.

#include "dpml/kernels/device.hpp"

namespace dpml::kernels {

// The operations a layer may call, per space: specialised per space.
template <class Space>
struct Ops {
  static_assert(dependent_false<Space>, "dpml: no kernel for this space (kernels::Ops<Space> has no "
                                        "specialisation; CudaSpace needs a CUDA translation unit)");
};

}  // namespace dpml::kernels

#include "dpml/kernels/host/ops.hpp"
#if defined(__CUDACC__)
#include "dpml/kernels/cuda/ops.hpp"
#endif
