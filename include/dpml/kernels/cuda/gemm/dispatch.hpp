#pragma once
// gemm<Epilogue>(ctx, args, stream): the device GEMM entry point. It checks the arguments, looks
// the problem up in a constexpr table of measured choices (STYLE.md item 3: tuning is data) and
// runs the chosen policy; a shape missing from the table, or one the chosen policy cannot take
// (alignment), goes to cuBLASLt. Three layers: this entry, the table lookup, the policy's kernel.
//
// Table entries are GPT-2 124M's GEMMs at B·T = 16384 rows (d = 768, V = 50304) in the three
// passes of a Linear: forward y = x·Wᵀ (ta=no, tb=yes), backward_input dx = dy·W (no, no),
// backward_weight dW += dyᵀ·x (yes, no). Each entry says where its choice came from; entries
// marked "to be measured" hold a provisional choice until bench/gemm (bench/gemm/README.md) has
// been run on an H100 and the faster policy of the two is written in with its TFLOP/s.

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
inline constexpr GemmChoice kProvisional = GemmChoice::tiled;
// clang-format off
inline constexpr std::array kGemmTable{
    //            M      N      K   ta   tb   choice        source
    GemmTableEntry{16384,  2304,   768, no,  yes, kProvisional, "qkv forward: to be measured (bench/gemm)"},
    GemmTableEntry{16384,   768,   768, no,  yes, kProvisional, "attn proj forward: to be measured"},
    GemmTableEntry{16384,  3072,   768, no,  yes, kProvisional, "fc forward: to be measured"},
    GemmTableEntry{16384,   768,  3072, no,  yes, kProvisional, "fc proj forward: to be measured"},
    GemmTableEntry{16384, 50304,   768, no,  yes, kProvisional, "lm head forward: to be measured"},
    GemmTableEntry{16384,   768,  2304, no,  no,  kProvisional, "qkv backward_input: to be measured"},
    GemmTableEntry{16384,   768,   768, no,  no,  kProvisional, "attn proj backward_input: to be measured"},
    GemmTableEntry{16384,   768,  3072, no,  no,  kProvisional, "fc backward_input: to be measured"},
    GemmTableEntry{16384,  3072,   768, no,  no,  kProvisional, "fc proj backward_input: to be measured"},
    GemmTableEntry{16384,   768, 50304, no,  no,  kProvisional, "lm head backward_input: to be measured"},
    GemmTableEntry{ 2304,   768, 16384, yes, no,  kProvisional, "qkv backward_weight: to be measured"},
    GemmTableEntry{  768,   768, 16384, yes, no,  kProvisional, "attn proj backward_weight: to be measured"},
    GemmTableEntry{ 3072,   768, 16384, yes, no,  kProvisional, "fc backward_weight: to be measured"},
    GemmTableEntry{  768,  3072, 16384, yes, no,  kProvisional, "fc proj backward_weight: to be measured"},
    GemmTableEntry{50304,   768, 16384, yes, no,  kProvisional, "lm head backward_weight: to be measured"},
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

template <GemmEpilogue Epi, class TC>
void gemm(GemmContext& ctx, const GemmArgs<TC>& g, cudaStream_t stream) {
  if (choose_gemm(g) == GemmChoice::tiled && DefaultTiledGemm::supports(g))
    DefaultTiledGemm::run<Epi>(ctx, g, stream);
  else
    CublasLt::run<Epi>(ctx, g, stream);
}

}  // namespace dpml::kernels::cuda
