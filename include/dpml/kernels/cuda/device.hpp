#pragma once
// kernels::Device<CudaSpace>: what the device kernels of a training step need, handed to every op
// of kernels::Ops<CudaSpace> through layers::Context (kernels/device.hpp declares it).
//
//   stream()        every op is queued here; nothing in an op synchronises the host
//   gemm()          the GEMM context: cuBLASLt handle, its workspace, cached algorithm choices
//   scratch<T>(n)   n elements of scratch for ONE op (column-sum partials, softmax statistics…):
//                   the next op may reuse the same bytes (stream order makes that safe)
//   shared<T>(key, n)  a buffer every layer asking for `key` gets alike — activations that live
//                   only between two neighbouring ops of one layer and are recomputed when needed
//                   again (the MLP's GELU output): one buffer for all blocks, not one per block
//   resource<R>()   the one R of this Device, made on first use: library state that every layer of
//                   a kind shares (a convolution policy's cuDNN handle, plans and workspace)
//
// Buffers grow on first need (the first step) and are kept: later steps allocate nothing. A Device
// owns its stream unless it was made over an existing one (a model's, a test's).

#include "dpml/core/cuda_space.hpp"
#include "dpml/core/cuda_stream.hpp"
#include "dpml/kernels/cuda/gemm/gemm.hpp"
#include "dpml/kernels/device.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <typeindex>
#include <typeinfo>

namespace dpml::kernels {

template <>
struct Device<CudaSpace> {
 public:
  Device() = default;                                               // a stream of its own
  explicit Device(cudaStream_t stream) : stream_(Stream::borrow(stream)) {}  // someone else's stream
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  cudaStream_t stream() const noexcept { return stream_.native(); }
  void synchronize() const { stream_.synchronize(); }
  cuda::GemmContext& gemm() { return *gemm_; }

  template <class T>
  T* scratch(std::int64_t n) {
    return static_cast<T*>(scratch_.ensure(static_cast<std::size_t>(n) * sizeof(T), stream()));
  }
  template <class T>
  T* shared(std::string_view key, std::int64_t n) {
    return static_cast<T*>(shared_[std::string(key)].ensure(static_cast<std::size_t>(n) * sizeof(T), stream()));
  }
  template <class R>
  R& resource() {
    std::shared_ptr<void>& r = resources_[std::type_index(typeid(R))];
    if (!r) r = std::make_shared<R>();
    return *static_cast<R*>(r.get());
  }
  // Device bytes held by the scratch and shared buffers (for memory reports).
  std::size_t buffer_bytes() const noexcept {
    std::size_t b = scratch_.bytes;
    for (const auto& [key, buf] : shared_) b += buf.bytes;
    return b;
  }

 private:
  struct Buffer {
    void* data = nullptr;
    std::size_t bytes = 0;
    Buffer() = default;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() { cudaFree(data); }
    // At least `need` bytes; a larger buffer replaces the old one once the stream has finished
    // with it (first step only).
    void* ensure(std::size_t need, cudaStream_t s) {
      if (need > bytes) {
        DPML_CHECK_CUDA(cudaStreamSynchronize(s));
        DPML_CHECK_CUDA(cudaFree(data));
        data = nullptr;
        DPML_CHECK_CUDA(cudaMalloc(&data, need));
        bytes = need;
      }
      return data;
    }
  };

  Stream stream_;
  std::unique_ptr<cuda::GemmContext> gemm_ = std::make_unique<cuda::GemmContext>();
  Buffer scratch_;
  std::map<std::string, Buffer, std::less<>> shared_;
  std::map<std::type_index, std::shared_ptr<void>> resources_;  // last: gone before the stream
};

}  // namespace dpml::kernels
