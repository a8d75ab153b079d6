#pragma once
// kernels::Device<Space>: what the kernels of a memory space need to run, handed to every op of
// kernels::Ops<Space> (kernels/ops.hpp) through layers::Context. Declared here, below the kernel
// families, so that each family can name it without seeing the others.
//
//   Device<HostSpace>   nothing: host kernels are plain calls
//   Device<CudaSpace>   kernels/cuda/device.hpp: the stream every op is queued on, the GEMM
//                       context (cuBLASLt handle, workspace, algorithm cache) and a scratch
//                       buffer for one op at a time (CUDA builds only)
//
// accum_t<T> is the type row statistics, softmax sums and other reductions are kept in on every
// space: double for double tensors (the finite-difference tests), float for float, bf16 and fp16.

#include "dpml/core/memory_space.hpp"

#include <type_traits>

namespace dpml::kernels {

template <class Space>
struct Device {
  static_assert(dependent_false<Space>, "dpml: no kernels::Device for this memory space (a CUDA build, and a "
                                        "translation unit compiled by nvcc, are needed for CudaSpace)");
};

template <>
struct Device<HostSpace> {};

// The one Device<HostSpace> that host code without a Context of its own (optimizers, gradient
// buckets) hands to the ops: it holds nothing.
inline Device<HostSpace>& host_device() {
  static Device<HostSpace> host;
  return host;
}

template <class T>
using accum_t = std::conditional_t<std::is_same_v<std::remove_const_t<T>, double>, double, float>;

}  // namespace dpml::kernels
