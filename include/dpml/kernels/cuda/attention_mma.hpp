#pragma once
// Tensor-core kernels of the flash attention (attention.hpp has the maths and the entry points):
// bf16 or fp16 operands (T), fp32 accumulators, mma.sync.m16n8k16 (mma.hpp), FlashAttention-2's work split.
//
// A block of 4 warps owns 64 rows (16 per warp) and streams 64-row tiles of the other operands
// through shared memory (cp.async, rows padded by 16 bytes so that ldmatrix is conflict-free).
// Each product's accumulators are re-packed in registers as the A fragment of the next product
// (mma.hpp), so no score or probability tile ever touches shared memory:
//
//   forward   (rows = queries)  S = Q·Kᵀ → online softmax → O += P·V
//   dq        (rows = queries)  S = Q·Kᵀ, dP = dO·Vᵀ → dS = P ∘ (dP − δ) → dQ += dS·K
//   dk, dv    (rows = keys)     Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ → Pᵀ, dSᵀ → dV += Pᵀ·dO, dK += dSᵀ·Q
//
// The key/value kernel computes the transposed scores directly (rows = keys), so both of its
// products take their A operand from registers as well. Causal masking touches only the diagonal
// tile; query blocks run longest-first. Requirements (checked by the entry point, attention.hpp's
// mma_applies; other cases take the SIMT kernels): bf16 or fp16, head size D ∈ {32, 64}, 16-byte
// aligned tensors.

#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/mma.hpp"

#include <cuda_runtime.h>

#include <cstdint>

namespace dpml::kernels::cuda::detail::attn_mma {

inline constexpr int kRows = 64;     // rows owned by a block, and rows per streamed tile
inline constexpr int kThreads = 128;  // 4 warps × 16 rows
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

template <int D>
inline constexpr int kStride = D + 8;  // shared row stride (elements): +16 bytes against bank conflicts

// Rows [r0, r0 + 64) of a (Tn, D) operand with row stride ld → shared (64, D) tile; rows past Tn
// are zero-filled. Asynchronous: the caller commits and waits.
template <int D, class T>
__device__ __forceinline__ void load_tile(T* tile, const T* base, std::int64_t ld, std::int64_t r0,
                                          std::int64_t Tn) {
  constexpr int chunks = kRows * D / 8;
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    const bool in = r0 + r < Tn;
    cp_async_16(tile + r * kStride<D> + col, in ? base + (r0 + r) * ld + col : base, in ? 16 : 0);
  }
}

// acc (16 × N) += a (16 × K, A fragments) · B, with B a shared tile: KMajor → stored (N, K),
// else stored (K, N).
template <int N, int K, bool KMajor, int Stride, class T>
__device__ __forceinline__ void warp_mma(float (&acc)[N / 8][4], const std::uint32_t (&a)[K / 16][4], const T* b,
                                         int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
    for (int n = 0; n < N / 8; n += 2) {
      std::uint32_t r[4];
      if constexpr (KMajor) ldmatrix_b_kmajor(r, b, Stride, n * 8, kk * 16, lane);
      else ldmatrix_b_nmajor(r, b, Stride, n * 8, kk * 16, lane);
      mma_16816<T>(acc[n], a[kk], r[0], r[1]);
      mma_16816<T>(acc[n + 1], a[kk], r[2], r[3]);
    }
}

// A fragments of a warp's 16 rows of a shared (rows, K) tile.
template <int K, int Stride, class T>
__device__ __forceinline__ void load_a(std::uint32_t (&a)[K / 16][4], const T* rows16, int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) ldmatrix_a(a[kk], rows16, Stride, kk * 16, lane);
}

// Accumulators (16 × N) → A fragments (16 × N) of the next product, rounded to T.
template <int N, class T>
__device__ __forceinline__ void acc_to_a(const float (&acc)[N / 8][4], std::uint32_t (&a)[N / 16][4]) {
#pragma unroll
  for (int j = 0; j < N / 16; ++j) {
    a[j][0] = pack2<T>(acc[2 * j][0], acc[2 * j][1]);
    a[j][1] = pack2<T>(acc[2 * j][2], acc[2 * j][3]);
    a[j][2] = pack2<T>(acc[2 * j + 1][0], acc[2 * j + 1][1]);
    a[j][3] = pack2<T>(acc[2 * j + 1][2], acc[2 * j + 1][3]);
  }
}

// Stores accumulators (16 × D) · scale to rows of a global (Tn, D) operand with row stride ld.
template <int D, class T>
__device__ __forceinline__ void store_rows(const float (&acc)[D / 8][4], T* base, std::int64_t ld,
                                           std::int64_t row0, std::int64_t Tn, float scale0, float scale1, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const std::int64_t r = row0 + g + half * 8;
    if (r >= Tn) continue;
    const float sc = half ? scale1 : scale0;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<std::uint32_t*>(base + r * ld + n * 8 + 2 * t) =
          pack2<T>(acc[n][2 * half] * sc, acc[n][2 * half + 1] * sc);
  }
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ qkv, T* __restrict__ out, float* __restrict__ lse, std::int64_t Tn,
                   int H, float scale_log2) {
  constexpr int S = kStride<D>;
  __shared__ __align__(16) T qs[kRows * S], ks[kRows * S], vs[kRows * S];  // (64, D) each
  const int qb = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // longest blocks first
  const int bh = blockIdx.y, b = bh / H, h = bh % H, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const std::int64_t ld = 3 * static_cast<std::int64_t>(H) * D, q0 = static_cast<std::int64_t>(qb) * kRows;
  const T* base = qkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D;  // q of (b, 0, h): (T, D), stride ld

  load_tile<D>(qs, base, ld, q0, Tn);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  std::uint32_t qf[D / 16][4];
  load_a<D, S>(qf, qs + warp * 16 * S, lane);

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const std::int64_t row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  for (int kt = 0; kt <= qb; ++kt) {
    __syncthreads();  // the previous tile's readers are done
    load_tile<D>(ks, base + D, ld, static_cast<std::int64_t>(kt) * kRows, Tn);
    load_tile<D>(vs, base + 2 * D, ld, static_cast<std::int64_t>(kt) * kRows, Tn);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    float s[kRows / 8][4] = {};
    warp_mma<kRows, D, true, S>(s, qf, ks, lane);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kRows / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const std::int64_t col = static_cast<std::int64_t>(kt) * kRows + n * 8 + 2 * t + e;
          float& v = s[n][2 * half + e];
          v = (kt == qb && col > row[half]) ? -INFINITY : v * scale_log2;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[half], mx);  // finite: key kt·64 ≤ row is always visible
      const float corr = exp2f(m[half] - m_new);
      m[half] = m_new;
      l[half] *= corr;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][2 * half] *= corr;
        o[n][2 * half + 1] *= corr;
      }
#pragma unroll
      for (int n = 0; n < kRows / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& v = s[n][2 * half + e];
          v = exp2f(v - m_new);
          l[half] += v;
        }
    }
    std::uint32_t pa[kRows / 16][4];
    acc_to_a<kRows, T>(s, pa);
    warp_mma<D, kRows, false, S>(o, pa, vs, lane);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // l: the quad's partial sums
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
  }
  store_rows<D>(o, out + static_cast<std::int64_t>(b) * Tn * H * D + h * D, static_cast<std::int64_t>(H) * D,
                q0 + warp * 16, Tn, 1.f / l[0], 1.f / l[1], lane);
  if (t == 0)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      if (row[half] < Tn) lse[static_cast<std::int64_t>(bh) * Tn + row[half]] = (m[half] + log2f(l[half])) * kLn2;
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    backward_dq_kernel(const T* __restrict__ dout, const T* __restrict__ qkv, const float* __restrict__ lse,
                       const float* __restrict__ delta, T* __restrict__ dqkv, std::int64_t Tn, int H, float scale) {
  constexpr int S = kStride<D>;
  __shared__ __align__(16) T qs[kRows * S], dos[kRows * S], ks[kRows * S], vs[kRows * S];
  const int qb = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const int bh = blockIdx.y, b = bh / H, h = bh % H, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const std::int64_t ld = 3 * static_cast<std::int64_t>(H) * D, ldo = static_cast<std::int64_t>(H) * D;
  const std::int64_t q0 = static_cast<std::int64_t>(qb) * kRows;
  const T* base = qkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D;
  const T* do_base = dout + static_cast<std::int64_t>(b) * Tn * ldo + h * D;  // (T, D), stride ldo
  const float scale_log2 = scale * kLog2e;

  load_tile<D>(qs, base, ld, q0, Tn);
  load_tile<D>(dos, do_base, ldo, q0, Tn);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  std::uint32_t qf[D / 16][4], dof[D / 16][4];
  load_a<D, S>(qf, qs + warp * 16 * S, lane);
  load_a<D, S>(dof, dos + warp * 16 * S, lane);
  const std::int64_t row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float lse2[2], dl[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const bool in = row[half] < Tn;
    lse2[half] = in ? lse[static_cast<std::int64_t>(bh) * Tn + row[half]] * kLog2e : 0.f;
    dl[half] = in ? delta[static_cast<std::int64_t>(bh) * Tn + row[half]] : 0.f;
  }

  float dq[D / 8][4] = {};
  for (int kt = 0; kt <= qb; ++kt) {
    __syncthreads();
    load_tile<D>(ks, base + D, ld, static_cast<std::int64_t>(kt) * kRows, Tn);
    load_tile<D>(vs, base + 2 * D, ld, static_cast<std::int64_t>(kt) * kRows, Tn);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float s[kRows / 8][4] = {}, dp[kRows / 8][4] = {};
    warp_mma<kRows, D, true, S>(s, qf, ks, lane);
    warp_mma<kRows, D, true, S>(dp, dof, vs, lane);
#pragma unroll
    for (int n = 0; n < kRows / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;
        const std::int64_t col = static_cast<std::int64_t>(kt) * kRows + n * 8 + 2 * t + e % 2;
        const float p = (kt == qb && col > row[half]) ? 0.f : exp2f(s[n][e] * scale_log2 - lse2[half]);
        s[n][e] = p * (dp[n][e] - dl[half]);  // dS
      }
    std::uint32_t dsa[kRows / 16][4];
    acc_to_a<kRows, T>(s, dsa);
    warp_mma<D, kRows, false, S>(dq, dsa, ks, lane);
  }
  store_rows<D>(dq, dqkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D, ld, q0 + warp * 16, Tn, scale, scale,
                lane);
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    backward_dkv_kernel(const T* __restrict__ dout, const T* __restrict__ qkv, const float* __restrict__ lse,
                        const float* __restrict__ delta, T* __restrict__ dqkv, std::int64_t Tn, int H,
                        float scale) {
  constexpr int S = kStride<D>;
  __shared__ __align__(16) T ks[kRows * S], vs[kRows * S], qs[kRows * S], dos[kRows * S];
  __shared__ float lse2s[kRows], dls[kRows];
  const int kb = static_cast<int>(blockIdx.x);  // key blocks: the first ones see the most queries
  const int bh = blockIdx.y, b = bh / H, h = bh % H, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const std::int64_t ld = 3 * static_cast<std::int64_t>(H) * D, ldo = static_cast<std::int64_t>(H) * D;
  const std::int64_t k0 = static_cast<std::int64_t>(kb) * kRows;
  const T* base = qkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D;
  const T* do_base = dout + static_cast<std::int64_t>(b) * Tn * ldo + h * D;
  const float scale_log2 = scale * kLog2e;

  load_tile<D>(ks, base + D, ld, k0, Tn);
  load_tile<D>(vs, base + 2 * D, ld, k0, Tn);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  std::uint32_t kf[D / 16][4], vf[D / 16][4];
  load_a<D, S>(kf, ks + warp * 16 * S, lane);
  load_a<D, S>(vf, vs + warp * 16 * S, lane);
  const std::int64_t row[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};  // key rows

  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  const int q_tiles = static_cast<int>(ceil_div(Tn, kRows));
  for (int qt = kb; qt < q_tiles; ++qt) {
    const std::int64_t i0 = static_cast<std::int64_t>(qt) * kRows;
    __syncthreads();
    load_tile<D>(qs, base, ld, i0, Tn);
    load_tile<D>(dos, do_base, ldo, i0, Tn);
    cp_async_commit();
    for (int r = threadIdx.x; r < kRows; r += kThreads) {
      const bool in = i0 + r < Tn;
      lse2s[r] = in ? lse[static_cast<std::int64_t>(bh) * Tn + i0 + r] * kLog2e : 0.f;
      dls[r] = in ? delta[static_cast<std::int64_t>(bh) * Tn + i0 + r] : 0.f;
    }
    cp_async_wait<0>();
    __syncthreads();
    float st[kRows / 8][4] = {}, dpt[kRows / 8][4] = {};  // (16 keys, 64 queries)
    warp_mma<kRows, D, true, S>(st, kf, qs, lane);
    warp_mma<kRows, D, true, S>(dpt, vf, dos, lane);
#pragma unroll
    for (int n = 0; n < kRows / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2, c = n * 8 + 2 * t + e % 2;
        const std::int64_t col = i0 + c;  // query
        const bool masked = col >= Tn || (qt == kb && col < row[half]);
        const float p = masked ? 0.f : exp2f(st[n][e] * scale_log2 - lse2s[c]);
        st[n][e] = p;
        dpt[n][e] = p * (dpt[n][e] - dls[c]);  // dSᵀ
      }
    std::uint32_t pa[kRows / 16][4], dsa[kRows / 16][4];
    acc_to_a<kRows, T>(st, pa);
    acc_to_a<kRows, T>(dpt, dsa);
    warp_mma<D, kRows, false, S>(dv, pa, dos, lane);
    warp_mma<D, kRows, false, S>(dk, dsa, qs, lane);
  }
  T* drow = dqkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D;
  store_rows<D>(dk, drow + D, ld, k0 + warp * 16, Tn, scale, scale, lane);
  store_rows<D>(dv, drow + 2 * D, ld, k0 + warp * 16, Tn, 1.f, 1.f, lane);
}

}  // namespace dpml::kernels::cuda::detail::attn_mma
