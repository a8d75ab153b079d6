#pragma once
// CudaSpace: device memory of the current CUDA device, and the copies between it and the host.
// CUDA builds only. Allocation here is plain cudaMalloc; the caching, stream-ordered allocator
// used inside training steps sits on top of it (kernels/cuda). The process counts the bytes it
// holds through CudaSpace, now and at most (cuda_space_bytes(): two relaxed atomics, beside a
// cudaMalloc's cost nothing), for train::memory_now<CudaSpace> (train/memory.hpp).

#include "dpml/core/cuda_error.hpp"
#include "dpml/core/memory_space.hpp"

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <string_view>

namespace dpml {

// Bytes of device memory held through CudaSpace::allocate by this process (every device), and
// the most held at once since the process started.
struct CudaSpaceBytes {
  std::atomic<std::size_t> in_use{0}, peak{0};
};
inline CudaSpaceBytes& cuda_space_bytes() noexcept {
  static CudaSpaceBytes bytes;
  return bytes;
}

struct CudaSpace {
  static constexpr std::string_view name = "cuda";
  static constexpr bool host_accessible = false;

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    DPML_CHECK_CUDA(cudaMalloc(&p, bytes));
    CudaSpaceBytes& b = cuda_space_bytes();
    const std::size_t now = b.in_use.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    for (std::size_t top = b.peak.load(std::memory_order_relaxed);
         now > top && !b.peak.compare_exchange_weak(top, now, std::memory_order_relaxed);) {
    }
    return p;
  }
  static void deallocate(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    cudaFree(p);
    cuda_space_bytes().in_use.fetch_sub(bytes, std::memory_order_relaxed);
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

// Page-locked host memory (cudaMallocHost): host-accessible, and copied to and from the GPU by
// DMA at the link's speed (a copy from pageable memory goes through the driver's bounce buffer at
// a fraction of it). CudaSpace's HostMirror: offloaded optimizers keep their mirrors here.
struct PinnedHostSpace {
  static constexpr std::string_view name = "pinned host";
  static constexpr bool host_accessible = true;

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    DPML_CHECK_CUDA(cudaMallocHost(&p, bytes));
    return p;
  }
  static void deallocate(void* p, std::size_t) noexcept {
    if (p) cudaFreeHost(p);
  }
};
template <>
struct HostMirror<CudaSpace> {
  using type = PinnedHostSpace;
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
