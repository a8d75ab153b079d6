#pragma once
// CudaSpace: device memory of the current CUDA device, and the copies between it and the host.
// CUDA builds only. Allocation here is plain cudaMalloc; the caching, stream-ordered allocator
// used inside training steps sits on top of it (kernels/cuda).

#include "dpml/core/cuda_error.hpp"
#include "dpml/core/memory_space.hpp"

#include <cuda_runtime.h>

#include <string_view>

namespace dpml {

struct CudaSpace {
  static constexpr std::string_view name = "cuda";
  static constexpr bool host_accessible = false;

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    DPML_CHECK_CUDA(cudaMalloc(&p, bytes));
    return p;
  }
  static void deallocate(void* p, std::size_t) noexcept {
    if (p) cudaFree(p);
  }
};

namespace detail {
// Set-up and test copies (Param::bind, to_space): the device is synchronised before and after,
// because the library's work runs on non-blocking streams, which a plain cudaMemcpy does not wait
// for, and a copy from pageable host memory may return before its DMA has landed. Copies inside a
// step go through kernels::Ops<CudaSpace>::copy, on the step's stream.
inline void cuda_copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (!bytes) return;
  DPML_CHECK_CUDA(cudaDeviceSynchronize());
  DPML_CHECK_CUDA(cudaMemcpy(dst, src, bytes, kind));
  DPML_CHECK_CUDA(cudaDeviceSynchronize());
}
}  // namespace detail

template <>
struct SpaceCopy<CudaSpace, HostSpace> {
  static void copy(void* d, const void* s, std::size_t n) { detail::cuda_copy(d, s, n, cudaMemcpyHostToDevice); }
};
template <>
struct SpaceCopy<HostSpace, CudaSpace> {
  static void copy(void* d, const void* s, std::size_t n) { detail::cuda_copy(d, s, n, cudaMemcpyDeviceToHost); }
};
template <>
struct SpaceCopy<CudaSpace, CudaSpace> {
  static void copy(void* d, const void* s, std::size_t n) { detail::cuda_copy(d, s, n, cudaMemcpyDeviceToDevice); }
};

// Number of usable CUDA devices; 0 where the driver or a device is missing (any error means none).
inline int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace dpml
