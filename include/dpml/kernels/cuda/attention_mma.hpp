#pragma once
// Tensor-core kernels of the flash attention (attention.hpp has the maths and the entry points):
// bf16 or fp16 operands (T), fp32 accumulators, mma.sync.m16n8k16 (mma.hpp), FlashAttention-2's work split.
//
// A block of 4 warps owns 64 rows (16 per warp) and streams tiles of kTileRows<D> rows of the
// other operands (64 for D ≤ 64; 32 for D = 128, so that a thread's accumulators and fragments
// stay in its registers and the tiles in 48 KiB of shared memory) through shared memory (cp.async,
// rows padded by 16 bytes so that ldmatrix is conflict-free) in two stages: tile j + 1 is in
// flight while tile j is multiplied. The block's own rows go to registers first, through the
// second stage (and the first, where the second cannot hold them all), before the first
// prefetch needs it.
// Each product's accumulators are re-packed in registers as the A fragment of the next product
// (mma.hpp), so no score or probability tile ever touches shared memory:
//
//   forward   (rows = queries)  S = Q·Kᵀ → online softmax → O += P·V
//   dq        (rows = queries)  S = Q·Kᵀ, dP = dO·Vᵀ → dS = P ∘ (dP − δ) → dQ += dS·K
//   dk, dv    (rows = keys)     Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ → Pᵀ, dSᵀ → dV += Pᵀ·dO, dK += dSᵀ·Q
//
// The key/value kernel computes the transposed scores directly (rows = keys), so both of its
// products take their A operand from registers as well. Causal masking touches only the tiles
// that cross the diagonal; query blocks run longest-first. Bidirectional (Causal = false) streams every tile and hides
// only the zero-filled keys past T in the last one. Requirements (checked by the entry point, attention.hpp's
// mma_applies; other cases take the SIMT kernels): bf16 or fp16, head size D ∈ {32, 64, 128},
// 16-byte aligned tensors.

#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/mma.hpp"

#include <cuda_runtime.h>

#include <cstdint>

namespace dpml::kernels::cuda::detail::attn_mma {

inline constexpr int kRows = 64;      // rows owned by a block
inline constexpr int kThreads = 128;  // 4 warps × 16 rows
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

template <int D>
inline constexpr int kStride = D + 8;  // shared row stride (elements): +16 bytes against bank conflicts
template <int D>
inline constexpr int kTileRows = D <= 64 ? 64 : 32;  // rows of a streamed tile

// The shared memory of a kernel: two stages, each a K and a V (or Q and dO) tile of kTileRows<D>
// rows. A stage holds 2 · kTileRows<D> ≥ 64 rows, so one of the block's own (64, D) operands can
// pass through it; both of them fit in stage 1 alone only where kTileRows<D> = 64.
template <int D>
inline constexpr int kSharedElems = 4 * kTileRows<D> * kStride<D>;
template <int D, class T>
__device__ __forceinline__ T* tile_a(T* smem, int stage) { return smem + 2 * stage * kTileRows<D> * kStride<D>; }
template <int D, class T>
__device__ __forceinline__ T* tile_b(T* smem, int stage) { return smem + (2 * stage + 1) * kTileRows<D> * kStride<D>; }

// Rows [r0, r0 + Rows) of a (Tn, D) operand with row stride ld → shared (Rows, D) tile; rows past
// Tn are zero-filled. Each thread copies the same column's 16 bytes in every kRowStep-th row, so
// its offsets are fixed and the loop unrolls. Asynchronous: the caller commits and waits.
template <int D, int Rows = kTileRows<D>, class T>
__device__ __forceinline__ void load_tile(T* tile, const T* base, std::int64_t ld, std::int64_t r0,
                                          std::int64_t Tn) {
  constexpr int kPerRow = D / 8, kRowStep = kThreads / kPerRow;
  static_assert(kThreads % kPerRow == 0 && Rows % kRowStep == 0);
  const int r = static_cast<int>(threadIdx.x) / kPerRow, col = (static_cast<int>(threadIdx.x) % kPerRow) * 8;
  const T* src = base + (r0 + r) * ld + col;
  const std::int64_t left = Tn - r0 - r;  // this thread's rows i·kRowStep < left exist
#pragma unroll
  for (int i = 0; i < Rows / kRowStep; ++i) {
    const bool in = i * kRowStep < left;
    cp_async_16(tile + (r + i * kRowStep) * kStride<D> + col, in ? src + i * kRowStep * ld : base, in ? 16 : 0);
  }
}

// 2^x on the special-function unit, subnormal results flushed to 0 (exp2f adds a range check and
// two multiplies around the same instruction to keep them); 2^−∞ = 0.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Waits for the tile about to be multiplied: every cp.async group but the newest when the next
// tile's group is in flight behind it, else every group.
__device__ __forceinline__ void wait_for_current_tile(bool next_in_flight) {
  if (next_in_flight) cp_async_wait<1>();
  else cp_async_wait<0>();
}

// Sets the scores that the causal mask hides in a tile crossing the diagonal to −∞: a warp's 16
// rows from row0 against the tile's N columns from col0 (positions in the sequence). Rows are
// queries (keys after the row's query are hidden: col > row), or, in the key/value kernel's
// transposed scores, keys (queries before the row's key: col < row).
template <bool RowsAreKeys, int N>
__device__ __forceinline__ void mask_causal(float (&s)[N / 8][4], std::int64_t row0, std::int64_t col0, int lane) {
  const int g = lane / 4, t = lane % 4;
  const int shift = static_cast<int>(col0 - row0);  // |shift| < 64 + N where the caller applies it
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = g + (e / 2) * 8, col = shift + n * 8 + 2 * t + e % 2;
      if (RowsAreKeys ? col < row : col > row) s[n][e] = -INFINITY;
    }
}

// Sets the scores of the columns at or past Tn (the zero-filled rows of a last tile starting at
// col0) to −∞.
template <int N>
__device__ __forceinline__ void mask_columns_past(float (&s)[N / 8][4], std::int64_t col0, std::int64_t Tn, int lane) {
  const int t = lane % 4;
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (col0 + n * 8 + 2 * t + e % 2 >= Tn) s[n][e] = -INFINITY;
}

// One key tile's step of the online softmax for a warp's 16 query rows (two per thread: half 0 and
// 1): s holds the raw scores Q·Kᵀ (−∞ where masked), m the running maxima in log2 units (scores ·
// scale_log2), l the running sums, o the unnormalised output. On return s holds P = 2^(s·scale_log2 − m).
template <int N, int D>
__device__ __forceinline__ void online_softmax(float (&s)[N / 8][4], float (&o)[D / 8][4], float (&m)[2],
                                               float (&l)[2], float scale_log2) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < N / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[half], mx * scale_log2);  // finite: key 0 of a row's first tile is visible
    const float corr = exp2_ftz(m[half] - m_new);
    m[half] = m_new;
    l[half] *= corr;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][2 * half] *= corr;
      o[n][2 * half + 1] *= corr;
    }
#pragma unroll
    for (int n = 0; n < N / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& v = s[n][2 * half + e];
        v = exp2_ftz(fmaf(v, scale_log2, -m_new));
        l[half] += v;
      }
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

// The last key tile a causal query block from row q0 sees: the one holding its last query.
__device__ __forceinline__ int last_causal_tile(std::int64_t q0, int key_tiles, int tile_rows) {
  const auto diagonal = static_cast<int>((q0 + kRows - 1) / tile_rows);
  return diagonal < key_tiles - 1 ? diagonal : key_tiles - 1;
}

// Loads the block's own 64 rows of two operands (a and b, row strides lda and ldb, from row r0)
// into A fragments, and starts the first streamed tiles, rows [first, first + kTileRows<D>) of c
// and d, into stage 0. Where stage 1 holds both own operands, all four loads fly together; else the own rows
// pass through both stages first and the tile follows them.
template <int D, class T>
__device__ __forceinline__ void load_own_rows(std::uint32_t (&af)[D / 16][4], std::uint32_t (&bf)[D / 16][4], T* smem,
                                              const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
                                              std::int64_t r0, const T* c, std::int64_t ldc, const T* d,
                                              std::int64_t ldd, std::int64_t first, std::int64_t Tn, int warp,
                                              int lane) {
  constexpr int S = kStride<D>;
  constexpr bool kStageOneHoldsBoth = kTileRows<D> >= kRows;
  T* a_rows = kStageOneHoldsBoth ? tile_a<D>(smem, 1) : tile_a<D>(smem, 0);  // kRows rows each
  T* b_rows = tile_b<D>(smem, 1) - (kStageOneHoldsBoth ? 0 : (kRows - kTileRows<D>) * S);
  load_tile<D, kRows>(a_rows, a, lda, r0, Tn);
  load_tile<D, kRows>(b_rows, b, ldb, r0, Tn);
  if constexpr (kStageOneHoldsBoth) {
    load_tile<D>(tile_a<D>(smem, 0), c, ldc, first, Tn);
    load_tile<D>(tile_b<D>(smem, 0), d, ldd, first, Tn);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  load_a<D, S>(af, a_rows + warp * 16 * S, lane);
  load_a<D, S>(bf, b_rows + warp * 16 * S, lane);
  if constexpr (!kStageOneHoldsBoth) {
    __syncthreads();  // every warp has its fragments before stage 0 is overwritten
    load_tile<D>(tile_a<D>(smem, 0), c, ldc, first, Tn);
    load_tile<D>(tile_b<D>(smem, 0), d, ldd, first, Tn);
    cp_async_commit();
  }
}

template <class T, int D, bool Causal>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ qkv, T* __restrict__ out, float* __restrict__ lse, std::int64_t Tn,
                   int H, float scale_log2) {
  constexpr int S = kStride<D>, KT = kTileRows<D>;
  __shared__ __align__(16) T smem[kSharedElems<D>];  // two stages of K and V tiles (KT, D)
  const int qb = static_cast<int>(gridDim.x - 1 - blockIdx.x);  // longest blocks first
  const int bh = blockIdx.y, b = bh / H, h = bh % H, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const std::int64_t ld = 3 * static_cast<std::int64_t>(H) * D, q0 = static_cast<std::int64_t>(qb) * kRows;
  const T* base = qkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D;  // q of (b, 0, h): (T, D), stride ld

  // Q, through stage 1 (2 · KT ≥ 64 rows), beside the first K and V tiles in stage 0
  T* q_rows = tile_a<D>(smem, 1);
  load_tile<D, kRows>(q_rows, base, ld, q0, Tn);
  load_tile<D>(tile_a<D>(smem, 0), base + D, ld, 0, Tn);
  load_tile<D>(tile_b<D>(smem, 0), base + 2 * D, ld, 0, Tn);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  std::uint32_t qf[D / 16][4];
  load_a<D, S>(qf, q_rows + warp * 16 * S, lane);

  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const std::int64_t wrow0 = q0 + warp * 16, row[2] = {wrow0 + g, wrow0 + g + 8};
  const int key_tiles = static_cast<int>(ceil_div(Tn, KT));
  // the key tiles [0, last_tile] this block sees
  const int last_tile = Causal ? last_causal_tile(q0, key_tiles, KT)
                               : key_tiles - 1;
  for (int kt = 0; kt <= last_tile; ++kt) {
    const int st = kt & 1;
    const std::int64_t j0 = static_cast<std::int64_t>(kt) * KT;
    __syncthreads();  // the other stage's readers (tile kt − 1, or Q) are done
    if (kt < last_tile) {
      load_tile<D>(tile_a<D>(smem, st ^ 1), base + D, ld, j0 + KT, Tn);
      load_tile<D>(tile_b<D>(smem, st ^ 1), base + 2 * D, ld, j0 + KT, Tn);
      cp_async_commit();
    }
    wait_for_current_tile(kt < last_tile);
    __syncthreads();

    float s[KT / 8][4] = {};
    warp_mma<KT, D, true, S>(s, qf, tile_a<D>(smem, st), lane);
    if (Causal && j0 + KT - 1 > wrow0) mask_causal<false, KT>(s, wrow0, j0, lane);
    if (!Causal && kt == last_tile) mask_columns_past<KT>(s, j0, Tn, lane);
    online_softmax<KT, D>(s, o, m, l, scale_log2);
    std::uint32_t pa[KT / 16][4];
    acc_to_a<KT, T>(s, pa);
    warp_mma<D, KT, false, S>(o, pa, tile_b<D>(smem, st), lane);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // l: the quad's partial sums
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
  }
  store_rows<D>(o, out + static_cast<std::int64_t>(b) * Tn * H * D + h * D, static_cast<std::int64_t>(H) * D,
                wrow0, Tn, 1.f / l[0], 1.f / l[1], lane);
  if (t == 0)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      if (row[half] < Tn) lse[static_cast<std::int64_t>(bh) * Tn + row[half]] = (m[half] + log2f(l[half])) * kLn2;
}

template <class T, int D, bool Causal>
__global__ void __launch_bounds__(kThreads)
    backward_dq_kernel(const T* __restrict__ dout, const T* __restrict__ qkv, const float* __restrict__ lse,
                       const float* __restrict__ delta, T* __restrict__ dqkv, std::int64_t Tn, int H, float scale) {
  constexpr int S = kStride<D>, KT = kTileRows<D>;
  __shared__ __align__(16) T smem[kSharedElems<D>];  // two stages of K and V tiles (KT, D)
  const int qb = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const int bh = blockIdx.y, b = bh / H, h = bh % H, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4;
  const std::int64_t ld = 3 * static_cast<std::int64_t>(H) * D, ldo = static_cast<std::int64_t>(H) * D;
  const std::int64_t q0 = static_cast<std::int64_t>(qb) * kRows;
  const T* base = qkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D;
  const T* do_base = dout + static_cast<std::int64_t>(b) * Tn * ldo + h * D;  // (T, D), stride ldo
  const float scale_log2 = scale * kLog2e;

  std::uint32_t qf[D / 16][4], dof[D / 16][4];  // the block's Q and dO rows; K and V tile 0 follow
  load_own_rows<D>(qf, dof, smem, base, ld, do_base, ldo, q0, base + D, ld, base + 2 * D, ld, 0, Tn, warp, lane);
  const std::int64_t wrow0 = q0 + warp * 16, row[2] = {wrow0 + g, wrow0 + g + 8};
  float lse2[2], dl[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const bool in = row[half] < Tn;
    lse2[half] = in ? lse[static_cast<std::int64_t>(bh) * Tn + row[half]] * kLog2e : 0.f;
    dl[half] = in ? delta[static_cast<std::int64_t>(bh) * Tn + row[half]] : 0.f;
  }

  float dq[D / 8][4] = {};
  const int key_tiles = static_cast<int>(ceil_div(Tn, KT));
  const int last_tile = Causal ? last_causal_tile(q0, key_tiles, KT)
                               : key_tiles - 1;
  for (int kt = 0; kt <= last_tile; ++kt) {
    const int st = kt & 1;
    const std::int64_t j0 = static_cast<std::int64_t>(kt) * KT;
    __syncthreads();
    if (kt < last_tile) {
      load_tile<D>(tile_a<D>(smem, st ^ 1), base + D, ld, j0 + KT, Tn);
      load_tile<D>(tile_b<D>(smem, st ^ 1), base + 2 * D, ld, j0 + KT, Tn);
      cp_async_commit();
    }
    wait_for_current_tile(kt < last_tile);
    __syncthreads();
    const T* ks = tile_a<D>(smem, st);
    float s[KT / 8][4] = {}, dp[KT / 8][4] = {};
    warp_mma<KT, D, true, S>(s, qf, ks, lane);
    warp_mma<KT, D, true, S>(dp, dof, tile_b<D>(smem, st), lane);
    if (Causal && j0 + KT - 1 > wrow0) mask_causal<false, KT>(s, wrow0, j0, lane);
    if (!Causal && kt == last_tile) mask_columns_past<KT>(s, j0, Tn, lane);
#pragma unroll
    for (int n = 0; n < KT / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;
        const float p = exp2_ftz(fmaf(s[n][e], scale_log2, -lse2[half]));
        s[n][e] = p * (dp[n][e] - dl[half]);  // dS
      }
    std::uint32_t dsa[KT / 16][4];
    acc_to_a<KT, T>(s, dsa);
    warp_mma<D, KT, false, S>(dq, dsa, ks, lane);
  }
  store_rows<D>(dq, dqkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D, ld, wrow0, Tn, scale, scale, lane);
}

template <class T, int D, bool Causal>
__global__ void __launch_bounds__(kThreads)
    backward_dkv_kernel(const T* __restrict__ dout, const T* __restrict__ qkv, const float* __restrict__ lse,
                        const float* __restrict__ delta, T* __restrict__ dqkv, std::int64_t Tn, int H,
                        float scale) {
  constexpr int S = kStride<D>, KT = kTileRows<D>;
  __shared__ __align__(16) T smem[kSharedElems<D>];              // two stages of Q and dO tiles (KT, D)
  __shared__ __align__(16) float lse2s[2][KT], dls[2][KT];  // the query tile's lse · log2 e and δ, per stage
  const int kb = static_cast<int>(blockIdx.x);  // key blocks: the first ones see the most queries
  const int bh = blockIdx.y, b = bh / H, h = bh % H, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = lane % 4;
  const std::int64_t ld = 3 * static_cast<std::int64_t>(H) * D, ldo = static_cast<std::int64_t>(H) * D;
  const std::int64_t k0 = static_cast<std::int64_t>(kb) * kRows, wrow0 = k0 + warp * 16;
  const T* base = qkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D;
  const T* do_base = dout + static_cast<std::int64_t>(b) * Tn * ldo + h * D;
  const float* lse_bh = lse + static_cast<std::int64_t>(bh) * Tn;
  const float* delta_bh = delta + static_cast<std::int64_t>(bh) * Tn;
  const float scale_log2 = scale * kLog2e;
  // Row r (threads 0..KT−1) of query tile qt's lse · log2 e and δ (0 past Tn).
  const int r = static_cast<int>(threadIdx.x);
  auto row_stats = [&](int qt, float& l2, float& dl) {
    const std::int64_t i = static_cast<std::int64_t>(qt) * KT + r;
    l2 = i < Tn ? lse_bh[i] * kLog2e : 0.f;
    dl = i < Tn ? delta_bh[i] : 0.f;
  };

  const int first_tile = Causal ? static_cast<int>(k0 / KT) : 0;  // causal: the tile holding query k0
  if (r < KT) row_stats(first_tile, lse2s[0][r], dls[0][r]);  // read after load_own_rows' barrier
  std::uint32_t kf[D / 16][4], vf[D / 16][4];  // the block's K and V rows; Q and dO tile first_tile follow
  load_own_rows<D>(kf, vf, smem, base + D, ld, base + 2 * D, ld, k0, base, ld, do_base, ldo,
                   static_cast<std::int64_t>(first_tile) * KT, Tn, warp, lane);

  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  const int q_tiles = static_cast<int>(ceil_div(Tn, KT));
  for (int qt = first_tile; qt < q_tiles; ++qt) {
    const int sg = (qt - first_tile) & 1;
    const bool next = qt + 1 < q_tiles;
    const std::int64_t i0 = static_cast<std::int64_t>(qt) * KT;
    __syncthreads();
    float next_l2 = 0.f, next_dl = 0.f;  // tile qt + 1's row stats: loaded now, stored after the products
    if (next) {
      load_tile<D>(tile_a<D>(smem, sg ^ 1), base, ld, i0 + KT, Tn);
      load_tile<D>(tile_b<D>(smem, sg ^ 1), do_base, ldo, i0 + KT, Tn);
      cp_async_commit();
      if (r < KT) row_stats(qt + 1, next_l2, next_dl);
    }
    wait_for_current_tile(next);
    __syncthreads();
    const T* qs = tile_a<D>(smem, sg);
    const T* dos = tile_b<D>(smem, sg);
    float st[KT / 8][4] = {}, dpt[KT / 8][4] = {};  // (16 keys, KT queries)
    warp_mma<KT, D, true, S>(st, kf, qs, lane);
    warp_mma<KT, D, true, S>(dpt, vf, dos, lane);
    if (Causal && i0 < wrow0 + 15) mask_causal<true, KT>(st, wrow0, i0, lane);
    if (i0 + KT > Tn)  // the last tile's zero-filled queries past Tn
#pragma unroll
      for (int n = 0; n < KT / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (i0 + n * 8 + 2 * t + e % 2 >= Tn) st[n][e] = -INFINITY;
#pragma unroll
    for (int n = 0; n < KT / 8; ++n) {  // columns n·8 + 2t and + 1 of the tile: their queries' stats
      const float2 l2 = reinterpret_cast<const float2*>(lse2s[sg])[n * 4 + t];
      const float2 dl = reinterpret_cast<const float2*>(dls[sg])[n * 4 + t];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2_ftz(fmaf(st[n][e], scale_log2, -(e % 2 ? l2.y : l2.x)));
        st[n][e] = p;
        dpt[n][e] = p * (dpt[n][e] - (e % 2 ? dl.y : dl.x));  // dSᵀ
      }
    }
    std::uint32_t pa[KT / 16][4], dsa[KT / 16][4];
    acc_to_a<KT, T>(st, pa);
    acc_to_a<KT, T>(dpt, dsa);
    warp_mma<D, KT, false, S>(dv, pa, dos, lane);
    warp_mma<D, KT, false, S>(dk, dsa, qs, lane);
    if (next && r < KT) {  // stage sg ^ 1's readers finished before this iteration's first barrier
      lse2s[sg ^ 1][r] = next_l2;
      dls[sg ^ 1][r] = next_dl;
    }
  }
  T* drow = dqkv + static_cast<std::int64_t>(b) * Tn * ld + h * 3 * D;
  store_rows<D>(dk, drow + D, ld, wrow0, Tn, scale, scale, lane);
  store_rows<D>(dv, drow + 2 * D, ld, wrow0, Tn, 1.f, 1.f, lane);
}

}  // namespace dpml::kernels::cuda::detail::attn_mma
