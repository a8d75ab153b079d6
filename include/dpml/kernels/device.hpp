#pragma once
// kernels::Device<Space>: what the kernels of a memory space need to run, handed to every op of
// kernels::Ops<Space> (kernels/ops.hpp) through layers::Context. Declared here, below the kernel
// families, so that each family can name it without seeing the others.
//
//   Device<HostSpace>   host kernels are plain calls; it holds only the scratch and shared
//                       buffers below, in host memory
//   Device<CudaSpace>   kernels/cuda/device.hpp: the stream every op is queued on, the GEMM
//                       context (cuBLASLt handle, workspace, algorithm cache) and a scratch
//                       buffer for one op at a time (CUDA builds only)
//
// Both spaces answer scratch<T>(n) (n elements for ONE op or one exchange; the next one may reuse
// the bytes) and shared<T>(key, n) (a buffer every caller naming `key` gets alike: gradients and
// activations that live only inside one layer's call, or between a forward and its recomputation,
// shared by all the blocks of a model instead of one per block). Buffers grow on first need and
// are kept; growing one invalidates what it handed out before.
//
// accum_t<T> is the type row statistics, softmax sums and other reductions are kept in on every
// space: double for double tensors (the finite-difference tests), float for float, bf16 and fp16.

#include "dpml/core/memory_space.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>

namespace dpml::kernels {

template <class Space>
struct Device {
  static_assert(dependent_false<Space>, "dpml: no kernels::Device for this memory space (a CUDA build, and a "
                                        "translation unit compiled by nvcc, are needed for CudaSpace)");
};

template <>
struct Device<HostSpace> {
 public:
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  template <class T>
  T* scratch(std::int64_t n) {
    return static_cast<T*>(scratch_.ensure(static_cast<std::size_t>(n) * sizeof(T)));
  }
  template <class T>
  T* shared(std::string_view key, std::int64_t n) {
    auto it = shared_.find(key);
    if (it == shared_.end()) it = shared_.emplace(std::string(key), Buffer{}).first;
    return static_cast<T*>(it->second.ensure(static_cast<std::size_t>(n) * sizeof(T)));
  }

 private:
  struct Buffer {
    void* data = nullptr;
    std::size_t bytes = 0;
    Buffer() = default;
    Buffer(Buffer&& o) noexcept : data(o.data), bytes(o.bytes) { o.data = nullptr, o.bytes = 0; }
    Buffer& operator=(Buffer&&) = delete;
    ~Buffer() { HostSpace::deallocate(data, bytes); }
    void* ensure(std::size_t need) {  // contents are not kept when it grows
      if (need > bytes) {
        HostSpace::deallocate(data, bytes);
        data = nullptr;  // the allocation below may throw
        bytes = 0;
        data = HostSpace::allocate(need);
        bytes = need;
      }
      return data;
    }
  };
  Buffer scratch_;
  std::map<std::string, Buffer, std::less<>> shared_;
};

// The one Device<HostSpace> that host code without a Context of its own (optimizers, gradient
// buckets) hands to the ops: it holds nothing.
inline Device<HostSpace>& host_device() {
  static Device<HostSpace> host;
  return host;
}

template <class T>
using accum_t = std::conditional_t<std::is_same_v<std::remove_const_t<T>, double>, double, float>;

}  // namespace dpml::kernels
