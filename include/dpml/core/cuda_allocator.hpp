#pragma once
// CudaAllocator: a caching, stream-ordered device allocator for the training step.
//
// It sits on a private CUDA memory pool (cudaMemPoolCreate) whose release threshold is
// UINT64_MAX: memory freed with cudaFreeAsync stays reserved in the pool instead of going back to
// the driver, and later cudaMallocAsync calls reuse it. Allocation and free are stream-ordered: a
// block freed on stream s may be handed out again to work queued after the free on s (or, through
// the pool's event tracking, on another stream once the free's stream has passed it), so no host
// synchronisation is ever needed. The pool keeps its own size classes and free lists, which is
// what a hand-written cache keyed by stream would do; once the first step has grown the pool to
// its working set, later steps never reach cudaMalloc/cudaFree.
//
// Counters, for tests and for the benchmark's peak-memory figure:
//   in_use       bytes handed out and not yet freed (as requested, not rounded)
//   peak         the highest in_use seen (reset_peak() starts a new window)
//   reserved     bytes the pool holds from the driver
//   grows        how many allocations made the pool reserve more memory (i.e. reached the
//                driver: the equivalent of a cudaMalloc call); 0 per step after warm-up
//
// Not thread-safe: one allocator per host thread driving a device (dpml's model).

#include "dpml/core/cuda_error.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace dpml {

struct CudaAllocatorStats {
  std::size_t in_use = 0;
  std::size_t peak = 0;
  std::size_t reserved = 0;
  std::size_t grows = 0;
};

class CudaAllocator {
 public:
  // A pool on `device` (the current device by default).
  explicit CudaAllocator(int device = -1) {
    if (device < 0) DPML_CHECK_CUDA(cudaGetDevice(&device));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    DPML_CHECK_CUDA(cudaMemPoolCreate(&pool_, &props));
    std::uint64_t keep_all = UINT64_MAX;
    DPML_CHECK_CUDA(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_all));
  }
  CudaAllocator(const CudaAllocator&) = delete;
  CudaAllocator& operator=(const CudaAllocator&) = delete;
  ~CudaAllocator() {
    if (pool_) cudaMemPoolDestroy(pool_);  // frees what the pool reserved; blocks still out are the owner's bug
  }

  // `bytes` of device memory, usable by work queued on `stream` after this call.
  void* allocate(std::size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaError_t rc = cudaMallocAsync(&p, bytes, pool_, stream);
    DPML_REQUIRE(rc == cudaSuccess, "CudaAllocator: cannot allocate " << bytes << " bytes (in use " << stats_.in_use
                                                                      << ", reserved " << reserved()
                                                                      << "): " << cudaGetErrorString(rc));
    const std::size_t r = reserved();
    if (r > stats_.reserved) ++stats_.grows;
    stats_.reserved = r;
    stats_.in_use += bytes;
    if (stats_.in_use > stats_.peak) stats_.peak = stats_.in_use;
    return p;
  }
  // Returns a block once the work queued on `stream` so far is done with it. noexcept (it runs in
  // destructors): a failing cudaFreeAsync means a broken context, which the next checked call reports.
  void deallocate(void* p, std::size_t bytes, cudaStream_t stream) noexcept {
    if (!p) return;
    (void)cudaFreeAsync(p, stream);
    stats_.in_use -= bytes;
  }

  CudaAllocatorStats stats() const { return stats_; }
  void reset_peak() { stats_.peak = stats_.in_use; }
  cudaMemPool_t pool() const { return pool_; }

 private:
  std::size_t reserved() const {
    std::uint64_t r = 0;
    DPML_CHECK_CUDA(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &r));
    return static_cast<std::size_t>(r);
  }

  cudaMemPool_t pool_ = nullptr;
  CudaAllocatorStats stats_;
};

// An owning, stream-ordered block of n elements of T from a CudaAllocator; freed on the stream it
// was allocated on (or the one given to reset()).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(CudaAllocator& alloc, std::size_t n, cudaStream_t stream)
      : alloc_(&alloc), data_(static_cast<T*>(alloc.allocate(n * sizeof(T), stream))), n_(n), stream_(stream) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : alloc_(std::exchange(o.alloc_, nullptr)), data_(std::exchange(o.data_, nullptr)), n_(std::exchange(o.n_, 0)),
        stream_(o.stream_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      alloc_ = std::exchange(o.alloc_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      n_ = std::exchange(o.n_, 0);
      stream_ = o.stream_;
    }
    return *this;
  }
  ~DeviceBuffer() { reset(); }

  void reset() noexcept {
    if (alloc_) alloc_->deallocate(data_, n_ * sizeof(T), stream_);
    data_ = nullptr;
    n_ = 0;
  }
  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return n_; }

 private:
  CudaAllocator* alloc_ = nullptr;
  T* data_ = nullptr;
  std::size_t n_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace dpml
