// Compiled (never run: the CI machine has no GPU) by both consumer projects when dpml has CUDA:
// proves that a consumer's .cu files see dpml::cuda as C++20 (the shim of cmake/dpmlCuda.cmake).
#include <dpml/core/bf16.hpp>

#include <concepts>

static_assert(__cplusplus >= 202002L, "dpml::cuda consumers must compile .cu files as C++20");
static_assert(DPML_WITH_CUDA && DPML_WITH_NCCL, "dpml::cuda defines DPML_WITH_CUDA and DPML_WITH_NCCL");

template <std::floating_point T>
__global__ void to_bf16(const T* in, dpml::bf16* out, int n) {  // in, out: (n)
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = dpml::bf16(static_cast<float>(in[i]));
}
template __global__ void to_bf16<float>(const float*, dpml::bf16*, int);
