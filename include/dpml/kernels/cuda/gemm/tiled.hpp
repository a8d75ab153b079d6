#pragma once
// TiledGemm<TileShape<BM, BN, BK>, Stages, WarpTile<WM, WN>>: dpml's own tensor-core GEMM policy
// (Ampere-style mma.sync, which Hopper runs at part of its wgmma rate; wgmma needs sm_90a and a
// GPU to debug on, so correctness came first).
//
// The trick, in four parts:
//  * Block tile. A block computes a (BM, BN) tile of C; its (BM/WM)·(BN/WN) warps each own a
//    (WM, WN) sub-tile held in fp32 registers as (WM/16)·(WN/8) m16n8 accumulators.
//  * Multi-stage cp.async pipeline. K is walked in BK-wide slabs; `Stages` slabs of A and B are in
//    flight in shared memory at once: while the warps multiply slab k, cp.async (global → shared,
//    bypassing registers and L1) fetches slabs k+1 … k+Stages−1. Loads are 16-byte vectors; the
//    copy's source size (0…16 bytes) zero-fills what lies past M, N or K, so ragged edges need no
//    separate code path, only 16-byte aligned rows (ld % 8 == 0, aligned pointers: supports()).
//  * ldmatrix into mma.sync.m16n8k16 (bf16 in, fp32 accumulate). Each operand keeps its global
//    layout in shared memory: a K-contiguous slab is read with ldmatrix, an M- or N-contiguous one
//    with ldmatrix.trans, which transposes 8×8 pieces on the way into registers — so all four
//    (ta, tb) combinations share one kernel. Rows are padded by 8 elements (16 bytes), which
//    spreads the 8 row addresses of one ldmatrix over all 32 banks (no conflicts, no swizzle).
//  * Epilogue in registers: alpha, bias, beta·C (residual or accumulation), GELU, pre-activation
//    store, then paired 32-bit stores. Blocks are rasterised in groups of 8 tile-rows so that
//    neighbouring blocks share A and B tiles in L2. Both pieces are shared with the wgmma kernel
//    (gemm/epilogue.hpp).

#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/gemm/epilogue.hpp"
#include "dpml/kernels/cuda/gemm/gemm.hpp"
#include "dpml/kernels/cuda/mma.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <string_view>
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
// (BK, BN), or (BN, BK) when TransB. Shared with the implicit-GEMM convolution (conv/conv2d.hpp).
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

// Copies the (S::rows, S::cols) window at (r0, c0) of a row-major (rows, cols) global matrix with
// row stride ld into a slab; elements outside the matrix arrive as zeros.
template <class S, int Threads>
__device__ __forceinline__ void load_slab(bf16* slab, const bf16* g, std::int64_t ld, std::int64_t rows,
                                          std::int64_t cols, std::int64_t r0, std::int64_t c0) {
  constexpr int per_row = S::cols / 8;
#pragma unroll
  for (int i = threadIdx.x; i < S::chunks; i += Threads) {
    const int r = i / per_row, c = (i % per_row) * 8;
    const std::int64_t gr = r0 + r, gc = c0 + c;
    std::int64_t valid = gr < rows ? (cols - gc) * 2 : 0;
    valid = valid < 0 ? 0 : (valid > 16 ? 16 : valid);
    const bf16* src = valid > 0 ? g + gr * ld + gc : g;
    cp_async_16(slab + r * S::stride + c, src, static_cast<int>(valid));
  }
}

template <class Tile, class Warp, int Stages, bool TransA, bool TransB, class Epi, class TC>
struct Kernel {
  static constexpr int BM = Tile::M, BN = Tile::N, BK = Tile::K, WM = Warp::M, WN = Warp::N;
  static constexpr int WarpsM = BM / WM, WarpsN = BN / WN, Threads = WarpsM * WarpsN * 32;
  static constexpr int MI = WM / 16, NI = WN / 8;
  static_assert(BM % WM == 0 && BN % WN == 0, "the warp tile must divide the block tile");
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tiles are made of m16 × n16 pieces");
  static_assert(BK % 16 == 0 && BM % 8 == 0 && BN % 8 == 0, "BK is a multiple of the mma's k = 16");
  static_assert(Stages >= 2, "a pipeline needs at least two stages");
  // Shared slabs in the operands' global layouts: A (BM, BK) or (BK, BM); B (BK, BN) or (BN, BK).
  using SlabA = std::conditional_t<TransA, Slab<BK, BM>, Slab<BM, BK>>;
  using SlabB = std::conditional_t<TransB, Slab<BN, BK>, Slab<BK, BN>>;
  static constexpr int stage_elems = SlabA::elems + SlabB::elems;
  static constexpr std::size_t smem_bytes = static_cast<std::size_t>(Stages) * stage_elems * sizeof(bf16);
};

template <class Tile, class Warp, int Stages, bool TransA, bool TransB, class Epi, class TC>
__global__ void __launch_bounds__(Kernel<Tile, Warp, Stages, TransA, TransB, Epi, TC>::Threads, 1)
    tiled_gemm_kernel(std::int64_t M, std::int64_t N, std::int64_t K, const bf16* __restrict__ A, std::int64_t lda,
                      const bf16* __restrict__ B, std::int64_t ldb, EpilogueParams<TC, Epi> ep) {
  using Kn = Kernel<Tile, Warp, Stages, TransA, TransB, Epi, TC>;
  using SlabA = typename Kn::SlabA;
  using SlabB = typename Kn::SlabB;
  constexpr int BM = Kn::BM, BN = Kn::BN, BK = Kn::BK, MI = Kn::MI, NI = Kn::NI;
  extern __shared__ uint4 smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);

  const TileCoord tile = grouped_tile(static_cast<int>(blockIdx.x), static_cast<int>(ceil_div(M, BM)),
                                      static_cast<int>(ceil_div(N, BN)));
  const std::int64_t m0 = static_cast<std::int64_t>(tile.m) * BM, n0 = static_cast<std::int64_t>(tile.n) * BN;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm0 = (warp / Kn::WarpsN) * Kn::WM, wn0 = (warp % Kn::WarpsN) * Kn::WN;

  auto slab_a = [&](int s) { return smem + s * Kn::stage_elems; };
  auto slab_b = [&](int s) { return smem + s * Kn::stage_elems + SlabA::elems; };
  auto load_stage = [&](int s, std::int64_t k0) {
    if constexpr (TransA) load_slab<SlabA, Kn::Threads>(slab_a(s), A, lda, K, M, k0, m0);   // stored (K, M)
    else load_slab<SlabA, Kn::Threads>(slab_a(s), A, lda, M, K, m0, k0);                    // stored (M, K)
    if constexpr (TransB) load_slab<SlabB, Kn::Threads>(slab_b(s), B, ldb, N, K, n0, k0);   // stored (N, K)
    else load_slab<SlabB, Kn::Threads>(slab_b(s), B, ldb, K, N, k0, n0);                    // stored (K, N)
  };

  float acc[MI][NI][4] = {};
  const int k_tiles = static_cast<int>(ceil_div(K, BK));
#pragma unroll
  for (int s = 0; s < Stages - 1; ++s) {
    if (s < k_tiles) load_stage(s, static_cast<std::int64_t>(s) * BK);
    cp_async_commit();
  }

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<Stages - 2>();
    __syncthreads();  // slab kt has landed for everyone; slab kt − 1's readers are done
    const int next = kt + Stages - 1;
    if (next < k_tiles) load_stage(next % Stages, static_cast<std::int64_t>(next) * BK);
    cp_async_commit();

    const bf16* As = slab_a(kt % Stages);
    const bf16* Bs = slab_b(kt % Stages);
    multiply_slabs<SlabA, SlabB, BK, TransA, TransB>(acc, As, Bs, wm0, wn0, lane);
  }
  cp_async_wait<0>();

  // Accumulator (mi, nj) element e sits at row g + 8·(e/2), column 2·(lane%4) + e%2, g = lane/4.
  const int g = lane / 4, c2 = (lane % 4) * 2;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const std::int64_t row = m0 + wm0 + mi * 16 + g + half * 8;
      if (row >= M) continue;
#pragma unroll
      for (int nj = 0; nj < NI; ++nj)
        epilogue_pair(ep, N, row, n0 + wn0 + nj * 8 + c2, acc[mi][nj][half * 2], acc[mi][nj][half * 2 + 1]);
    }
}

}  // namespace detail::tiled

template <class Tile, int Stages, class Warp = WarpTile<64, 32>>
struct TiledGemm {
  static constexpr std::string_view name = "tiled";
  using tile = Tile;

  // 16-byte vectors on every operand row (cp.async), paired stores into C.
  template <class TC>
  static bool supports(const GemmArgs<TC>& g) {
    return detail::vector_rows<Tile::M, Tile::N>(g);
  }

  template <GemmEpilogue Epi, class TC>
  static void run(GemmContext&, const GemmArgs<TC>& g, cudaStream_t stream) {
    detail::check_gemm_args<Epi>(g, name);
    detail::require_vector_rows(supports(g), g, name);
    if (g.M == 0 || g.N == 0) return;
    detail::with_transposes(g, [&]<bool TA, bool TB>() { launch<TA, TB, Epi>(g, stream); });
  }

 private:
  template <bool TA, bool TB, class Epi, class TC>
  static void launch(const GemmArgs<TC>& g, cudaStream_t stream) {
    using Kn = detail::tiled::Kernel<Tile, Warp, Stages, TA, TB, Epi, TC>;
    auto* kernel = &detail::tiled::tiled_gemm_kernel<Tile, Warp, Stages, TA, TB, Epi, TC>;
    // Opting in to more than 48 KiB of dynamic shared memory is per kernel and idempotent; once
    // per instantiation.
    static const bool opted_in = [&] {
      DPML_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(Kn::smem_bytes)));
      return true;
    }();
    (void)opted_in;
    const auto blocks = static_cast<unsigned>(ceil_div(g.M, Tile::M) * ceil_div(g.N, Tile::N));
    const detail::EpilogueParams<TC, Epi> ep{g.C, g.ldc, g.alpha, g.beta, g.bias, g.pre_gelu};
    kernel<<<blocks, Kn::Threads, Kn::smem_bytes, stream>>>(g.M, g.N, g.K, g.A, g.lda, g.B, g.ldb, ep);
    DPML_CHECK_LAUNCH();
  }
};

}  // namespace dpml::kernels::cuda
