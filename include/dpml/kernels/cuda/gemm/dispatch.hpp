#pragma once
// gemm<Epilogue>(ctx, args, stream): the device GEMM entry point. It checks the arguments, looks
// the problem up in a constexpr table of measured choices (STYLE.md item 3: tuning is data) and
// runs the chosen policy; a shape missing from the table, or one the chosen policy cannot take
// (alignment), goes to cuBLASLt. Three layers: this entry, the table lookup, the policy's kernel.
//
// Table entries are GPT-2 124M's GEMMs at B·T = 16384 rows (d = 768, V = 50304) in the three
// passes of a Linear: forward y = x·Wᵀ (ta=no, tb=yes), backward_input dx = dy·W (no, no),
// backward_weight dW += dyᵀ·x (yes, no). Each entry says where its choice came from: bench/gemm on
// an H100 (2026-11-26, `build/cuda-openmpi/bench/gemm/bench_gemm --iters 20`, bench/RESULTS.md),
// cuBLASLt's TFLOP/s beside the best of our configurations (WgmmaGemm's cooperative schedule with
// its TMA-stored epilogue, split K where few tiles; the mma.sync TiledGemm reaches about a
// quarter of cuBLASLt). Ours reaches 0.74–0.98 of cuBLASLt and beats it on no shape, so every
// entry names cuBLASLt; the table can name the tiled kernel, and a wgmma choice would be added
// beside it once one wins by a margin.

#include "dpml/kernels/cuda/gemm/cublaslt.hpp"
#include "dpml/kernels/cuda/gemm/gemm.hpp"
#include "dpml/kernels/cuda/gemm/tiled.hpp"

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

namespace dpml::kernels::cuda {

// The tiled configuration the table can name: 128×128×32 slabs, 4 stages, 8 warps of 64×32.
using DefaultTiledGemm = TiledGemm<TileShape<128, 128, 32>, 4>;
static_assert(GemmPolicy<CublasLt> && GemmPolicy<DefaultTiledGemm>);

enum class GemmChoice { cublaslt, tiled };

struct GemmTableEntry {
  std::int64_t M, N, K;
  Trans ta, tb;
  GemmChoice choice;
  std::string_view source;  // where the choice comes from
};

namespace detail {
using enum Trans;
// clang-format off
inline constexpr std::array kGemmTable{
    //            M      N      K   ta   tb   choice        source
    GemmTableEntry{16384,  2304,   768, no,  yes, GemmChoice::cublaslt, "qkv forward: cuBLASLt 658 vs ours 493 (wgmma coop-tma 128x256) TFLOP/s (H100)"},
    GemmTableEntry{16384,   768,   768, no,  yes, GemmChoice::cublaslt, "attn proj forward: cuBLASLt 589 vs ours 454 (wgmma coop-tma 128x256) TFLOP/s (H100)"},
    GemmTableEntry{16384,  3072,   768, no,  yes, GemmChoice::cublaslt, "fc forward: cuBLASLt 672 vs ours 501 (wgmma coop-tma 128x256) TFLOP/s (H100)"},
    GemmTableEntry{16384,   768,  3072, no,  yes, GemmChoice::cublaslt, "fc proj forward: cuBLASLt 750 vs ours 690 (wgmma coop-tma 128x256) TFLOP/s (H100)"},
    GemmTableEntry{16384, 50304,   768, no,  yes, GemmChoice::cublaslt, "lm head forward: cuBLASLt 699 vs ours 516 (wgmma coop-tma 128x256) TFLOP/s (H100)"},
    GemmTableEntry{16384,   768,  2304, no,  no,  GemmChoice::cublaslt, "qkv backward_input: cuBLASLt 729 vs ours 658 (wgmma coop-tma 128x256) TFLOP/s (H100)"},
    GemmTableEntry{16384,   768,   768, no,  no,  GemmChoice::cublaslt, "attn proj backward_input: cuBLASLt 591 vs ours 450 (wgmma coop-tma 128x256) TFLOP/s (H100)"},
    GemmTableEntry{16384,   768,  3072, no,  no,  GemmChoice::cublaslt, "fc backward_input: cuBLASLt 748 vs ours 691 (wgmma coop-tma 128x256) TFLOP/s (H100)"},
    GemmTableEntry{16384,  3072,   768, no,  no,  GemmChoice::cublaslt, "fc proj backward_input: cuBLASLt 651 vs ours 501 (wgmma coop-tma 128x256) TFLOP/s (H100)"},
    GemmTableEntry{16384,   768, 50304, no,  no,  GemmChoice::cublaslt, "lm head backward_input: cuBLASLt 800 vs ours 780 (wgmma coop-tma 128x256) TFLOP/s (H100)"},
    GemmTableEntry{ 2304,   768, 16384, yes, no,  GemmChoice::cublaslt, "qkv backward_weight: cuBLASLt 685 vs ours 622 (wgmma coop-tma 128x256, split K 2) TFLOP/s (H100)"},
    GemmTableEntry{  768,   768, 16384, yes, no,  GemmChoice::cublaslt, "attn proj backward_weight: cuBLASLt 518 vs ours 469 (wgmma coop 128x128, split K 3) TFLOP/s (H100)"},
    GemmTableEntry{ 3072,   768, 16384, yes, no,  GemmChoice::cublaslt, "fc backward_weight: cuBLASLt 727 vs ours 576 (wgmma coop-tma 128x256, split K 3) TFLOP/s (H100)"},
    GemmTableEntry{  768,  3072, 16384, yes, no,  GemmChoice::cublaslt, "fc proj backward_weight: cuBLASLt 726 vs ours 582 (wgmma coop 128x256, split K 3) TFLOP/s (H100)"},
    GemmTableEntry{50304,   768, 16384, yes, no,  GemmChoice::cublaslt, "lm head backward_weight: cuBLASLt 795 vs ours 781 (wgmma coop-tma 128x256) TFLOP/s (H100)"},
};
// clang-format on
}  // namespace detail

// The table, for benchmarks and reports.
constexpr std::span<const GemmTableEntry> gemm_table() { return detail::kGemmTable; }

// The table's choice for a problem, or cuBLASLt for shapes it does not list.
template <class TC>
constexpr GemmChoice choose_gemm(const GemmArgs<TC>& g) {
  for (const auto& e : detail::kGemmTable)
    if (e.M == g.M && e.N == g.N && e.K == g.K && e.ta == g.ta && e.tb == g.tb) return e.choice;
  return GemmChoice::cublaslt;
}

// fp16 and fp32 operands always go to cuBLASLt: our kernels are bf16.
template <GemmEpilogue Epi, class TC, class TA>
void gemm(GemmContext& ctx, const GemmArgs<TC, TA>& g, cudaStream_t stream) {
  if constexpr (std::is_same_v<TA, bf16>) {
    if (choose_gemm(g) == GemmChoice::tiled && DefaultTiledGemm::supports(g)) {
      DefaultTiledGemm::run<Epi>(ctx, g, stream);
      return;
    }
  }
  CublasLt::run<Epi>(ctx, g, stream);
}

}  // namespace dpml::kernels::cuda
