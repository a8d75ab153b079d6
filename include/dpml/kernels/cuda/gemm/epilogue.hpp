#pragma once
// What dpml's own tensor-core GEMMs share around their main loops — the implicit-GEMM convolution
// (conv/conv2d.hpp) and bench/gemm's TiledGemm (mma.sync) and WgmmaGemm (Hopper wgmma) — so that
// they stay one epilogue and one block order:
//
//  * grouped_tile(): which (BM, BN) output tile block `pid` computes. Blocks are rasterised in
//    groups of 8 tile-rows that sweep N together, so that neighbouring blocks share A and B tiles
//    in L2.
//  * epilogue_values(): the epilogue of two neighbouring fp32 accumulators of one output row —
//    alpha, bias, beta·C (residual or accumulation), GELU with the optional pre-activation store;
//    epilogue_pair() then stores them as one pair (float2 or two packed bf16), where WgmmaGemm's
//    staged schedule writes them to shared memory for a TMA store instead. All of them hold their
//    accumulators in the mma fragment layout, where a thread owns columns (2t, 2t + 1) of a row.

#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/gemm/gemm.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace dpml::kernels::cuda::detail {

template <class TC, class Epi>
struct EpilogueParams {
  TC* C;  // (M, N), row stride ldc
  std::int64_t ldc;
  float alpha, beta;
  const bf16* bias;  // (N)
  bf16* pre_gelu;    // (M, N), row stride ldc, optional
};

struct TileCoord {
  int m, n;  // tile row and column
};

__device__ __forceinline__ TileCoord grouped_tile(int pid, int tiles_m, int tiles_n) {
  constexpr int kGroup = 8;
  const int group = pid / (kGroup * tiles_n), first_m = group * kGroup;
  const int group_rows = min(tiles_m - first_m, kGroup);
  return {first_m + (pid % (kGroup * tiles_n)) % group_rows, (pid % (kGroup * tiles_n)) / group_rows};
}

// The outputs at (row, col) and (row, col + 1) from accumulators a0, a1 (the second only where
// col + 1 < N; row < M and col < N are the caller's checks). Writes pre_gelu when it is set.
template <class Epi, class TC>
__device__ __forceinline__ float2 epilogue_values(const EpilogueParams<TC, Epi>& ep, std::int64_t N, std::int64_t row,
                                                  std::int64_t col, float a0, float a1) {
  const bool pair = col + 1 < N;
  float v[2] = {ep.alpha * a0, ep.alpha * a1};
  const TC* c = ep.C + row * ep.ldc + col;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    if (e == 1 && !pair) break;
    if constexpr (!std::is_same_v<Epi, epilogue::None>) v[e] += load_f(ep.bias[col + e]);
    if (ep.beta != 0.f) v[e] += ep.beta * load_f(c[e]);
    if constexpr (std::is_same_v<Epi, epilogue::BiasGelu>) {
      if (ep.pre_gelu) ep.pre_gelu[row * ep.ldc + col + e] = from_f<bf16>(v[e]);
      v[e] = gelu(v[e]);
    }
  }
  return make_float2(v[0], v[1]);
}

// Output (row, col) and (row, col + 1) from accumulators a0, a1, stored as one pair; row < M is
// the caller's check, columns at or past N are skipped here.
template <class Epi, class TC>
__device__ __forceinline__ void epilogue_pair(const EpilogueParams<TC, Epi>& ep, std::int64_t N, std::int64_t row,
                                              std::int64_t col, float a0, float a1) {
  if (col >= N) return;
  const float2 v = epilogue_values(ep, N, row, col, a0, a1);
  TC* c = ep.C + row * ep.ldc + col;
  if (col + 1 < N) {
    if constexpr (std::is_same_v<TC, float>) {
      *reinterpret_cast<float2*>(c) = v;
    } else {
      *reinterpret_cast<std::uint32_t*>(c) = pack2<bf16>(v.x, v.y);
    }
  } else {
    c[0] = from_f<TC>(v.x);
  }
}

}  // namespace dpml::kernels::cuda::detail
