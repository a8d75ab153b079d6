#pragma once
// The block tile of dpml's mma.sync kernels: what the implicit-GEMM convolution
// (conv/conv2d.hpp) runs its main loop on, and bench/gemm's TiledGemm with it.
//
//  * TileShape<BM, BN, BK>: a block computes a (BM, BN) tile of C, walking K in BK-wide slabs;
//    WarpTile<WM, WN>: each of its (BM/WM)·(BN/WN) warps owns a (WM, WN) sub-tile held in fp32
//    registers as (WM/16)·(WN/8) m16n8 accumulators.
//  * Slabs keep each operand's global layout in shared memory, rows padded by kPad = 8 elements
//    (16 bytes), which spreads the 8 row addresses of one ldmatrix over all 32 banks (no
//    conflicts, no swizzle; tests/cuda/test_fragments.cu checks it).
//  * multiply_slabs(): one warp's share of a slab pair — ldmatrix (or ldmatrix.trans for an M- or
//    N-contiguous slab) into mma.sync.m16n8k16, bf16 in, fp32 accumulate — so all four (ta, tb)
//    layouts share one loop.
//  * BlockLayout: threads, accumulator counts, slab types and shared-memory bytes of a block for a
//    tile, warp tile, stage count and operand layout.

#include "dpml/core/bf16.hpp"
#include "dpml/kernels/cuda/mma.hpp"

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace dpml::kernels::cuda {

template <int BM_, int BN_, int BK_>
struct TileShape {
  static constexpr int M = BM_, N = BN_, K = BK_;
};
template <int WM_, int WN_>
struct WarpTile {
  static constexpr int M = WM_, N = WN_;
};

namespace detail::tiled {

inline constexpr int kPad = 8;  // bf16 elements of padding per shared-memory row (16 bytes)

// A slab of one operand in shared memory: `Rows` rows of `Cols` contiguous elements (+ padding),
// in the operand's global layout.
template <int Rows, int Cols>
struct Slab {
  static constexpr int rows = Rows, cols = Cols, stride = Cols + kPad, elems = Rows * stride;
  static constexpr int chunks = Rows * Cols / 8;  // 16-byte vectors per slab
};

// acc += one warp's share of a slab pair: BK/16 steps of ldmatrix into mma.sync.m16n8k16 over the
// warp's (16·MI, 8·NI) tile at (wm0, wn0). A's slab is (BM, BK), or (BK, BM) when TransA; B's is
// (BK, BN), or (BN, BK) when TransB.
template <class SlabA, class SlabB, int BK, bool TransA, bool TransB, int MI, int NI>
__device__ __forceinline__ void multiply_slabs(float (&acc)[MI][NI][4], const bf16* As, const bf16* Bs, int wm0, int wn0,
                                               int lane) {
#pragma unroll
  for (int kk = 0; kk < BK; kk += 16) {
    std::uint32_t a[MI][4], b[NI][2];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      const int m = wm0 + mi * 16;
      if constexpr (TransA) ldmatrix_a_trans(a[mi], As + m, SlabA::stride, kk, lane);  // (BK, BM)
      else ldmatrix_a(a[mi], As + m * SlabA::stride, SlabA::stride, kk, lane);         // (BM, BK)
    }
#pragma unroll
    for (int nj = 0; nj < NI; nj += 2) {
      std::uint32_t r[4];
      if constexpr (TransB) ldmatrix_b_kmajor(r, Bs, SlabB::stride, wn0 + nj * 8, kk, lane);  // (BN, BK)
      else ldmatrix_b_nmajor(r, Bs, SlabB::stride, wn0 + nj * 8, kk, lane);                  // (BK, BN)
      b[nj][0] = r[0];
      b[nj][1] = r[1];
      b[nj + 1][0] = r[2];
      b[nj + 1][1] = r[3];
    }
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int nj = 0; nj < NI; ++nj) mma_16816<bf16>(acc[mi][nj], a[mi], b[nj][0], b[nj][1]);
  }
}

// The block of a (Tile, Warp) kernel with `Stages` slab pairs in flight: A's slab is (BM, BK) or,
// TransA, (BK, BM); B's (BK, BN) or, TransB, (BN, BK).
template <class Tile, class Warp, int Stages, bool TransA, bool TransB>
struct BlockLayout {
  static constexpr int BM = Tile::M, BN = Tile::N, BK = Tile::K, WM = Warp::M, WN = Warp::N;
  static constexpr int WarpsM = BM / WM, WarpsN = BN / WN, Threads = WarpsM * WarpsN * 32;
  static constexpr int MI = WM / 16, NI = WN / 8;
  static_assert(BM % WM == 0 && BN % WN == 0, "the warp tile must divide the block tile");
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tiles are made of m16 × n16 pieces");
  static_assert(BK % 16 == 0 && BM % 8 == 0 && BN % 8 == 0, "BK is a multiple of the mma's k = 16");
  static_assert(Stages >= 2, "a pipeline needs at least two stages");
  using SlabA = std::conditional_t<TransA, Slab<BK, BM>, Slab<BM, BK>>;
  using SlabB = std::conditional_t<TransB, Slab<BN, BK>, Slab<BK, BN>>;
  static constexpr int stage_elems = SlabA::elems + SlabB::elems;
  static constexpr std::size_t smem_bytes = static_cast<std::size_t>(Stages) * stage_elems * sizeof(bf16);
};

}  // namespace detail::tiled

}  // namespace dpml::kernels::cuda
