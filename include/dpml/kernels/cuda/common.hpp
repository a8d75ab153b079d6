#pragma once
// Pieces shared by the CUDA kernels: 16-bit floats ↔ float in registers, warp and group
// reductions, and launch arithmetic. CUDA translation units only.
//
// Storage types are dpml::bf16 (the host struct, bit-identical to __nv_bfloat16), f16 (CUDA's
// __half, IEEE binary16: the fp16 precision policy) and float; kernels load any of them as float
// with load_f() and store with from_f<T>(), so one kernel template serves all three. bf16 → float
// is a 16-bit shift (exact); float → bf16 and float → f16 are the hardware round-to-nearest-even
// conversions (bf16: the same bits as dpml::bf16(float)).

#include "dpml/core/bf16.hpp"
#include "dpml/core/cuda_error.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace dpml::kernels::cuda {

// IEEE binary16, the storage type of the fp16 precision policy (host and device).
using f16 = __half;

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over n elements, capped so that huge n do not make huge grids.
inline unsigned grid_for(std::int64_t n, int threads, std::int64_t cap = 65536) {
  const std::int64_t b = ceil_div(n, threads);
  return static_cast<unsigned>(b < 1 ? 1 : (b > cap ? cap : b));
}

namespace detail {

// Whether p may be read as 16-byte vectors. Host and device: launchers pick vector paths with it
// (a __device__-only helper called from a host launcher compiles, and then ends the process).
__host__ __device__ inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Whether rows of `cols` elements split into whole packs of `per_pack` and every given tensor (null
// ones aside) is 16-byte aligned: the condition of the vector paths (Pack, Pack8, load_v below).
inline bool whole_packs(std::int64_t cols, int per_pack, std::initializer_list<const void*> tensors) {
  if (cols % per_pack != 0) return false;
  for (const void* p : tensors)
    if (p != nullptr && !aligned16(p)) return false;
  return true;
}

template <class T>
inline constexpr bool is_storage_v = std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

__device__ __forceinline__ float load_f(float v) { return v; }
__device__ __forceinline__ float load_f(bf16 v) { return __uint_as_float(static_cast<unsigned>(v.bits) << 16); }
__device__ __forceinline__ float load_f(f16 v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ T from_f(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, f16>) {
    return __float2half_rn(v);
  } else {
    return bf16::from_bits(__bfloat16_as_ushort(__float2bfloat16_rn(v)));
  }
}

// Two floats → one 32-bit word of two 16-bit floats of type T (low half first), as mma.sync and
// paired stores want.
template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>);
  if constexpr (std::is_same_v<T, f16>) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
}

// E consecutive elements of T moved as one access (E = 16 / sizeof(T): 16 bytes), and Pack8: 8
// elements 16-byte aligned (one access of bf16, two of float) — the vector unit of the
// element-wise, LayerNorm, BatchNorm and column-sum kernels.
template <class T, int E, int Align = static_cast<int>(sizeof(T)) * E>
struct alignas(Align) Pack {
  T v[E];
};
template <class T>
using Pack8 = Pack<T, 8, 16>;

// V consecutive elements as floats: one Pack8 (V = 8, p 16-byte aligned) or one element.
template <int V, class T>
__device__ __forceinline__ void load_v(const T* p, float (&v)[V]) {
  if constexpr (V == 8) {
    const Pack8<T> pk = *reinterpret_cast<const Pack8<T>*>(p);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = load_f(pk.v[e]);
  } else {
    static_assert(V == 1);
    v[0] = load_f(*p);
  }
}
template <int V, class T>
__device__ __forceinline__ void store_v(T* p, const float (&v)[V]) {
  if constexpr (V == 8) {
    Pack8<T> pk;
#pragma unroll
    for (int e = 0; e < 8; ++e) pk.v[e] = from_f<T>(v[e]);
    *reinterpret_cast<Pack8<T>*>(p) = pk;
  } else {
    static_assert(V == 1);
    *p = from_f<T>(v[0]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over aligned groups of G lanes (G a power of two ≤ 32); every lane of a group gets it.
template <int G>
__device__ __forceinline__ float group_sum(float v) {
  for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// tanh-approximation GELU (GPT-2) and its derivative, as kernels/host/activation.hpp.
inline constexpr float kGeluC = 0.7978845608028654f;  // √(2/π)
inline constexpr float kGeluA = 0.044715f;
__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.f + tanhf(kGeluC * (x + kGeluA * x * x * x)));
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float t = tanhf(kGeluC * (x + kGeluA * x * x * x));
  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kGeluC * (1.f + 3.f * kGeluA * x * x);
}

}  // namespace detail
}  // namespace dpml::kernels::cuda
