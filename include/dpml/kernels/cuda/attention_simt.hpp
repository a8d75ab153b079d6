#pragma once
// SIMT kernels of the flash attention (attention.hpp has the maths and the entry points): fp32
// FMAs, for fp32 tensors, head sizes the tensor-core kernels do not take (128), and misaligned
// tensors. A row is owned by a group of 8 lanes, each holding D/8 of its elements in registers,
// with dot products finished by 3 shuffles; the streamed rows are converted to fp32 once into
// shared memory and read as 16-byte vectors that the 4 groups of a warp share (broadcast).
// Exponentials are exp2 with log2(e) folded into the scale. The backward is two kernels that own
// their output rows (dq per query block, dk/dv per key block): no atomics. Causal (a template
// argument) stops each query at its own key; otherwise every query sees every key.

#include "dpml/kernels/cuda/common.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace dpml::kernels::cuda {

namespace detail::attn {

inline constexpr int kGroup = 8;                   // lanes per owned row
inline constexpr int kThreads = 128;               // per block
inline constexpr int kRows = kThreads / kGroup;    // owned rows per block
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

template <int D>
inline constexpr int kTile = 4096 / D;  // streamed rows per shared tile: 16 KiB of fp32 per operand

__device__ __forceinline__ void load4(const bf16* p, float (&v)[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  v[0] = __uint_as_float(raw.x << 16);
  v[1] = __uint_as_float(raw.x & 0xffff0000u);
  v[2] = __uint_as_float(raw.y << 16);
  v[3] = __uint_as_float(raw.y & 0xffff0000u);
}
__device__ __forceinline__ void load4(const float* p, float (&v)[4]) {
  const float4 raw = *reinterpret_cast<const float4*>(p);
  v[0] = raw.x;
  v[1] = raw.y;
  v[2] = raw.z;
  v[3] = raw.w;
}
__device__ __forceinline__ void load4(const f16* p, float (&v)[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
  v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
}
template <class T>  // bf16, f16
__device__ __forceinline__ void store4(T* p, const float (&v)[4]) {
  *reinterpret_cast<uint2*>(p) = make_uint2(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]));
}
__device__ __forceinline__ void store4(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}

// A row of D elements as held by one lane of its group: E = D/8 values, in D/32 runs of 4 at
// element (c·8 + lane_in_group)·4 — so the 8 lanes of a group read 128 contiguous bytes at once.
template <int D>
struct Frag {
  static constexpr int runs = D / (4 * kGroup);
  float v[runs][4];

  template <class T>
  __device__ void load(const T* row, int gl, float scale = 1.f) {
#pragma unroll
    for (int c = 0; c < runs; ++c) {
      load4(row + (c * kGroup + gl) * 4, v[c]);
#pragma unroll
      for (int e = 0; e < 4; ++e) v[c][e] *= scale;
    }
  }
  __device__ void zero() {
#pragma unroll
    for (int c = 0; c < runs; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) v[c][e] = 0.f;
  }
  template <class T>
  __device__ void store(T* row, int gl, float scale) const {
#pragma unroll
    for (int c = 0; c < runs; ++c) {
      float o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] = v[c][e] * scale;
      store4(row + (c * kGroup + gl) * 4, o);
    }
  }
  // Σ over the row of this · s (a shared fp32 row), finished across the group.
  __device__ float dot(const float* s, int gl) const {
    float acc = 0.f;
#pragma unroll
    for (int c = 0; c < runs; ++c) {
      const float4 t = *reinterpret_cast<const float4*>(s + (c * kGroup + gl) * 4);
      acc += v[c][0] * t.x + v[c][1] * t.y + v[c][2] * t.z + v[c][3] * t.w;
    }
    return group_sum<kGroup>(acc);
  }
  // this = this · a + b · s
  __device__ void axpy(float a, float b, const float* s, int gl) {
#pragma unroll
    for (int c = 0; c < runs; ++c) {
      const float4 t = *reinterpret_cast<const float4*>(s + (c * kGroup + gl) * 4);
      v[c][0] = v[c][0] * a + b * t.x;
      v[c][1] = v[c][1] * a + b * t.y;
      v[c][2] = v[c][2] * a + b * t.z;
      v[c][3] = v[c][3] * a + b * t.w;
    }
  }
};

// Copies rows [r0, r0 + kTile) (those < T) of one (T, D) operand with row stride ld into a shared
// fp32 tile (kTile, D); rows past T become zeros.
template <int D, class T>
__device__ __forceinline__ void load_tile(float* tile, const T* base, std::int64_t ld, std::int64_t r0, std::int64_t Tn) {
  constexpr int quads = kTile<D> * D / 4;
  for (int q = threadIdx.x; q < quads; q += kThreads) {
    const int r = q / (D / 4), c = (q % (D / 4)) * 4;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    if (r0 + r < Tn) load4(base + (r0 + r) * ld + c, v);
    *reinterpret_cast<float4*>(tile + r * D + c) = make_float4(v[0], v[1], v[2], v[3]);
  }
}

template <class T, int D, bool Causal>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ qkv, T* __restrict__ out, float* __restrict__ lse, std::int64_t Tn, int H,
                   float scale) {
  constexpr int KT = kTile<D>;
  __shared__ __align__(16) float ks[KT * D], vs[KT * D];  // (KT, D) each
  const int bh = blockIdx.y, b = bh / H, h = bh % H, gl = threadIdx.x % kGroup;
  const std::int64_t ld = 3 * static_cast<std::int64_t>(H) * D;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kRows, i = first + threadIdx.x / kGroup;
  // The last key any query of the block sees: its last query row (causal), or the last key.
  const std::int64_t last = Causal ? (first + kRows < Tn ? first + kRows : Tn) - 1 : Tn - 1;
  const T* q_base = qkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D;  // (T, D), row stride ld
  Frag<D> q, o;
  if (i < Tn) q.load(q_base + i * ld, gl, scale * kLog2e);
  else q.zero();
  o.zero();
  float m = -INFINITY, l = 0.f;
  for (std::int64_t j0 = 0; j0 <= last; j0 += KT) {
    __syncthreads();
    load_tile<D>(ks, q_base + D, ld, j0, Tn);
    load_tile<D>(vs, q_base + 2 * D, ld, j0, Tn);
    __syncthreads();
    const int jn = static_cast<int>(last - j0 + 1 < KT ? last - j0 + 1 : KT);
    for (int jj = 0; jj < jn; ++jj) {
      const float s = q.dot(ks + jj * D, gl);  // log2 units
      if (Causal && j0 + jj > i) continue;
      if (s > m) {
        const float corr = exp2f(m - s);
        l *= corr;
        o.axpy(corr, 0.f, vs, gl);
        m = s;
      }
      const float p = exp2f(s - m);
      l += p;
      o.axpy(1.f, p, vs + jj * D, gl);
    }
  }
  if (i < Tn) {
    o.store(out + (static_cast<std::int64_t>(b) * Tn + i) * H * D + h * D, gl, 1.f / l);
    if (gl == 0) lse[static_cast<std::int64_t>(bh) * Tn + i] = m * kLn2 + logf(l);
  }
}

// delta (B, H, T) = Σ_d dout · out, one group per row.
template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    delta_kernel(const T* __restrict__ dout, const T* __restrict__ out, float* __restrict__ delta, std::int64_t Tn,
                 int H) {
  const int bh = blockIdx.y, b = bh / H, h = bh % H, gl = threadIdx.x % kGroup;
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kRows + threadIdx.x / kGroup;
  if (i >= Tn) return;  // whole groups leave together: the group sum below stays within live lanes
  const std::int64_t off = (static_cast<std::int64_t>(b) * Tn + i) * H * D + h * D;
  Frag<D> a, c;
  a.load(dout + off, gl);
  c.load(out + off, gl);
  float acc = 0.f;
#pragma unroll
  for (int r = 0; r < Frag<D>::runs; ++r)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc += a.v[r][e] * c.v[r][e];
  for (int o = kGroup / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(__activemask(), acc, o);
  if (gl == 0) delta[static_cast<std::int64_t>(bh) * Tn + i] = acc;
}

// dq for a block of query rows, streaming keys and values j ≤ i (causal) or all.
template <class T, int D, bool Causal>
__global__ void __launch_bounds__(kThreads)
    backward_dq_kernel(const T* __restrict__ dout, const T* __restrict__ qkv, const float* __restrict__ lse,
                       const float* __restrict__ delta, T* __restrict__ dqkv, std::int64_t Tn, int H, float scale) {
  constexpr int KT = kTile<D>;
  __shared__ __align__(16) float ks[KT * D], vs[KT * D];
  const int bh = blockIdx.y, b = bh / H, h = bh % H, gl = threadIdx.x % kGroup;
  const std::int64_t ld = 3 * static_cast<std::int64_t>(H) * D;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kRows, i = first + threadIdx.x / kGroup;
  const std::int64_t last = Causal ? (first + kRows < Tn ? first + kRows : Tn) - 1 : Tn - 1;
  const T* q_base = qkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D;
  const std::int64_t o_off = (static_cast<std::int64_t>(b) * Tn + i) * H * D + h * D;
  Frag<D> q, dO, dq;
  float lse2 = 0.f, di = 0.f;
  if (i < Tn) {
    q.load(q_base + i * ld, gl, scale * kLog2e);
    dO.load(dout + o_off, gl);
    lse2 = lse[static_cast<std::int64_t>(bh) * Tn + i] * kLog2e;
    di = delta[static_cast<std::int64_t>(bh) * Tn + i];
  } else {
    q.zero();
    dO.zero();
  }
  dq.zero();
  for (std::int64_t j0 = 0; j0 <= last; j0 += KT) {
    __syncthreads();
    load_tile<D>(ks, q_base + D, ld, j0, Tn);
    load_tile<D>(vs, q_base + 2 * D, ld, j0, Tn);
    __syncthreads();
    const int jn = static_cast<int>(last - j0 + 1 < KT ? last - j0 + 1 : KT);
    for (int jj = 0; jj < jn; ++jj) {
      const float s = q.dot(ks + jj * D, gl);
      const float dp = dO.dot(vs + jj * D, gl);
      if (Causal && j0 + jj > i) continue;
      const float p = exp2f(s - lse2);
      dq.axpy(1.f, p * (dp - di), ks + jj * D, gl);
    }
  }
  if (i < Tn) dq.store(dqkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D + i * ld, gl, scale);
}

// dk, dv for a block of key rows, streaming queries i ≥ j (causal) or all.
template <class T, int D, bool Causal>
__global__ void __launch_bounds__(kThreads)
    backward_dkv_kernel(const T* __restrict__ dout, const T* __restrict__ qkv, const float* __restrict__ lse,
                        const float* __restrict__ delta, T* __restrict__ dqkv, std::int64_t Tn, int H, float scale) {
  constexpr int KT = kTile<D>;
  __shared__ __align__(16) float qs[KT * D], dos[KT * D];  // (KT, D) each
  __shared__ float lse2s[KT], ds_[KT];
  const int bh = blockIdx.y, b = bh / H, h = bh % H, gl = threadIdx.x % kGroup;
  const std::int64_t ld = 3 * static_cast<std::int64_t>(H) * D, ldo = static_cast<std::int64_t>(H) * D;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kRows, j = first + threadIdx.x / kGroup;
  const T* q_base = qkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D;  // (T, D), row stride ld
  const T* do_base = dout + static_cast<std::int64_t>(b) * Tn * ldo + h * D;   // (T, D), row stride ldo
  Frag<D> k, v, dk, dv;
  if (j < Tn) {
    k.load(q_base + D + j * ld, gl, scale * kLog2e);
    v.load(q_base + 2 * D + j * ld, gl);
  } else {
    k.zero();
    v.zero();
  }
  dk.zero();
  dv.zero();
  for (std::int64_t i0 = Causal ? first : 0; i0 < Tn; i0 += KT) {
    __syncthreads();
    load_tile<D>(qs, q_base, ld, i0, Tn);
    load_tile<D>(dos, do_base, ldo, i0, Tn);
    for (int r = threadIdx.x; r < KT; r += kThreads) {
      const bool in = i0 + r < Tn;
      lse2s[r] = in ? lse[static_cast<std::int64_t>(bh) * Tn + i0 + r] * kLog2e : 0.f;
      ds_[r] = in ? delta[static_cast<std::int64_t>(bh) * Tn + i0 + r] : 0.f;
    }
    __syncthreads();
    const int in_tile = static_cast<int>(Tn - i0 < KT ? Tn - i0 : KT);
    for (int ii = 0; ii < in_tile; ++ii) {
      const float s = k.dot(qs + ii * D, gl);
      const float dp = v.dot(dos + ii * D, gl);
      if ((Causal && i0 + ii < j) || j >= Tn) continue;  // causal: query i sees key j only if i ≥ j
      const float p = exp2f(s - lse2s[ii]);
      dv.axpy(1.f, p, dos + ii * D, gl);
      dk.axpy(1.f, p * (dp - ds_[ii]), qs + ii * D, gl);
    }
  }
  if (j < Tn) {
    T* row = dqkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D + j * ld;
    dk.store(row + D, gl, scale);
    dv.store(row + 2 * D, gl, 1.f);
  }
}

}  // namespace detail::attn

}  // namespace dpml::kernels::cuda
