#pragma once
// Memory spaces: where a tensor's bytes live. A space is a tag type with static allocate /
// deallocate / fill-free copy hooks; kernels and layers are chosen by it (kernels/host for
// HostSpace, kernels/cuda for CudaSpace). CudaSpace lives in core/cuda_space.hpp and exists only in
// CUDA builds, so that the host build never sees a CUDA header.
//
// Copies between spaces go through SpaceCopy<Dst, Src>, declared here once; each pair of spaces
// specialises it (host↔host here, the CUDA pairs in core/cuda_space.hpp). A pair with no
// specialisation fails to compile with a message that names it.

#include "dpml/core/error.hpp"

#include <concepts>
#include <cstddef>
#include <cstring>
#include <new>
#include <string_view>
#include <type_traits>

namespace dpml {

template <class S>
concept MemorySpace = requires(std::size_t bytes, void* p) {
  { S::name } -> std::convertible_to<std::string_view>;
  { S::host_accessible } -> std::convertible_to<bool>;
  { S::allocate(bytes) } -> std::same_as<void*>;
  S::deallocate(p, bytes);
};

struct HostSpace {
  static constexpr std::string_view name = "host";
  static constexpr bool host_accessible = true;
  static constexpr std::size_t alignment = 64;  // one cache line; AVX-512 friendly

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    return ::operator new(bytes, std::align_val_t{alignment});
  }
  static void deallocate(void* p, std::size_t) noexcept {
    if (p) ::operator delete(p, std::align_val_t{alignment});
  }
};

// The host memory a space's buffers are mirrored in when their copies cross to the host each step
// (ZeRO-Offload's gradients and weights): plain host memory here; core/cuda_space.hpp makes
// CudaSpace's page-locked, so that those copies run at the link's DMA speed.
template <class Space>
struct HostMirror {
  using type = HostSpace;
};
template <class Space>
using host_mirror_space_t = typename HostMirror<Space>::type;

template <class>
inline constexpr bool dependent_false = false;

// Copies `bytes` from a buffer in Src to one in Dst. Specialised per pair of spaces.
template <class Dst, class Src>
struct SpaceCopy {
  static_assert(dependent_false<Dst>, "dpml: no copy between these two memory spaces (is this a CUDA build?)");
};

template <>
struct SpaceCopy<HostSpace, HostSpace> {
  static void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
};

}  // namespace dpml
