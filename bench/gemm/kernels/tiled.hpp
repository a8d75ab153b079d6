#pragma once
// TiledGemm<TileShape<BM, BN, BK>, Stages, WarpTile<WM, WN>>: dpml's own mma.sync GEMM policy
// (Ampere-style, which Hopper runs at part of its wgmma rate). It reaches about a quarter of
// cuBLASLt on GPT-2's shapes, so no dispatch row selects it and it lives here, in bench/gemm,
// beside WgmmaGemm (README.md has the figures); its block tile (gemm/block_tile.hpp) is the
// library's implicit-GEMM convolution's.
//
// The trick, in four parts:
//  * Block tile. A block computes a (BM, BN) tile of C; its (BM/WM)·(BN/WN) warps each own a
//    (WM, WN) sub-tile held in fp32 registers as (WM/16)·(WN/8) m16n8 accumulators.
//  * Multi-stage cp.async pipeline. K is walked in BK-wide slabs; `Stages` slabs of A and B are in
//    flight in shared memory at once: while the warps multiply slab k, cp.async (global → shared,
//    bypassing registers and L1) fetches slabs k+1 … k+Stages−1. Loads are 16-byte vectors; the
//    copy's source size (0…16 bytes) zero-fills what lies past M, N or K, so ragged edges need no
//    separate code path, only 16-byte aligned rows (ld % 8 == 0, aligned pointers: supports()).
//  * ldmatrix into mma.sync.m16n8k16 (bf16 in, fp32 accumulate; block_tile.hpp's
//    multiply_slabs). Each operand keeps its global layout in shared memory, so all four (ta, tb)
//    combinations share one kernel.
//  * Epilogue in registers: alpha, bias, beta·C (residual or accumulation), GELU, pre-activation
//    store, then paired 32-bit stores. Blocks are rasterised in groups of 8 tile-rows so that
//    neighbouring blocks share A and B tiles in L2. Both pieces are shared with the wgmma kernel
//    and the convolution (gemm/epilogue.hpp).

#include "policy.hpp"

#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/gemm/block_tile.hpp"
#include "dpml/kernels/cuda/gemm/epilogue.hpp"
#include "dpml/kernels/cuda/gemm/gemm.hpp"
#include "dpml/kernels/cuda/mma.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <string_view>
#include <type_traits>

namespace dpml::kernels::cuda {

namespace detail::tiled {

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
__global__ void __launch_bounds__(BlockLayout<Tile, Warp, Stages, TransA, TransB>::Threads, 1)
    tiled_gemm_kernel(std::int64_t M, std::int64_t N, std::int64_t K, const bf16* __restrict__ A, std::int64_t lda,
                      const bf16* __restrict__ B, std::int64_t ldb, EpilogueParams<TC, Epi> ep) {
  using Kn = BlockLayout<Tile, Warp, Stages, TransA, TransB>;
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
    using Kn = detail::tiled::BlockLayout<Tile, Warp, Stages, TA, TB>;
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
