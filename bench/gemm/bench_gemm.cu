// bench_gemm: dpml's TiledGemm and WgmmaGemm configurations (kernels/) against cuBLASLt on GPT-2
// 124M's shapes (B·T = 16384: forward, backward_input and backward_weight GEMMs of every Linear)
// and on 4096³, bf16 operands, fp32 accumulation, bf16 output, no epilogue. Built
// for sm_90a (bench/gemm/CMakeLists.txt) so that the wgmma columns run; a policy whose supports()
// is false (wgmma off a compute capability 9.0 device) is left out of its row (0.0 in the table).
//
//   bench_gemm [--iters N] [--warmup N] [--shape TEXT] [--policy TEXT] [--splits N]
//
// Flags (train::Args; --help lists them with defaults and ranges, and needs no GPU; a bad value
// exits 1 naming the flag): --iters (≥ 1, default 20) timed runs per (shape, policy) after --warmup
// (≥ 0, default 3) untimed ones. --shape / --policy keep only the shapes / policies whose label
// contains TEXT (cuBLASLt, the reference, always runs): one kernel under a profiler (ncu
// --kernel-name) without the others. --splits forces N K-splits per tile on the wgmma policies that
// split K (≥ 0; default 0: the policy's own split_count) — sweeps that calibrate its cost model.
//
// Prints one JSON object per (shape, policy) — {"bench":"gemm","shape":..,"policy":..,"splits":..,
// "ms":..,"tflops":..,"rel_err_vs_cublaslt":..} — then a table with TFLOP/s per policy and the ratio of
// the best of our configurations (tiled or wgmma) to cuBLASLt. The ratio is what would earn one of
// ours a dispatch row (include/dpml/kernels/cuda/gemm/dispatch.hpp); see bench/gemm/README.md.
// Self-checking: C is poisoned (NaN) before each policy runs, and the program exits 1 if any
// policy's result differs from cuBLASLt's by more than 1e-2 relative L2 (bf16 output).
#include "../support/fill.cuh"
#include "kernels/tiled.hpp"
#include "kernels/wgmma.hpp"

#include <dpml/core/cuda_space.hpp>
#include <dpml/kernels/cuda/gemm/cublaslt.hpp>
#include <dpml/train/args.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace dpml;
using namespace dpml::kernels::cuda;

namespace {

struct Shape3 {
  std::int64_t M, N, K;
  Trans ta, tb;
  std::string label;
};

// run(ctx, g, stream, splits) and the K splits it uses (0: the policy does not split K).
struct Policy {
  std::string name;
  void (*run)(KernelContext&, const GemmArgs<bf16>&, cudaStream_t, int);
  bool (*supports)(const GemmArgs<bf16>&);
  int (*splits)(const KernelContext&, const GemmArgs<bf16>&, int);
};

// GPT-2 124M's GEMMs at B·T = 16384 rows (d = 768, V = 50304) in the three passes of a Linear:
// forward y = x·Wᵀ (ta=no, tb=yes), backward_input dx = dy·W (no, no), backward_weight
// dW += dyᵀ·x (yes, no) — the rows of README.md's table.
std::vector<Shape3> gpt2_shapes() {
  constexpr std::int64_t BT = 16384;
  struct Linear {
    std::int64_t in, out;
    const char* name;
  };
  const Linear linears[] = {{768, 2304, "qkv"}, {768, 768, "attn proj"}, {768, 3072, "fc"}, {3072, 768, "fc proj"},
                            {768, 50304, "lm head"}};
  std::vector<Shape3> shapes;
  for (const auto& l : linears) shapes.push_back({BT, l.out, l.in, Trans::no, Trans::yes, std::string(l.name) + " forward"});
  for (const auto& l : linears)
    shapes.push_back({BT, l.in, l.out, Trans::no, Trans::no, std::string(l.name) + " backward_input"});
  for (const auto& l : linears)
    shapes.push_back({l.out, l.in, BT, Trans::yes, Trans::no, std::string(l.name) + " backward_weight"});
  return shapes;
}

template <class P>
constexpr bool splits_k = requires(const GemmArgs<bf16>& g) { P::splits_used(g.M, g.N, g.K, 1, 0); };

template <class P>
Policy policy(std::string name) {
  return {std::move(name),
          [](KernelContext& c, const GemmArgs<bf16>& g, cudaStream_t s, int splits) {
            if constexpr (splits_k<P>) P::template run<epilogue::None>(c, g, s, splits);
            else P::template run<epilogue::None>(c, g, s);
          },
          [](const GemmArgs<bf16>& g) { return P::supports(g); },
          [](const KernelContext& c, const GemmArgs<bf16>& g, int forced) {
            if constexpr (splits_k<P>) return P::splits_used(g.M, g.N, g.K, c.sm_count(), forced);
            else return 0;
          }};
}

double rel_err(const std::vector<std::uint16_t>& a, const std::vector<std::uint16_t>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<float>(bf16::from_bits(a[i])), y = static_cast<float>(bf16::from_bits(b[i]));
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int iters = 20, warmup = 3, splits = 0;
    std::string shape_filter, policy_filter;
    train::Args args("bench_gemm",
                     "dpml's TiledGemm and WgmmaGemm configurations against cuBLASLt on GPT-2 124M's GEMMs (B*T = 16384:\n"
                     "forward, backward_input, backward_weight of every Linear) and 4096^3; bf16 operands, fp32\n"
                     "accumulation, bf16 output. One JSON line per (shape, policy), then a TFLOP/s table. Exits 1 if a\n"
                     "policy's result differs from cuBLASLt's by more than 1e-2 relative L2. One GPU (wgmma: sm_90).");
    args.flag("--iters", iters, "timed runs per (shape, policy) (ms is their mean)", train::at_least(1))
        .flag("--warmup", warmup, "untimed runs before them", train::at_least(0))
        .flag("--shape", shape_filter, "keep only the shapes whose label contains this text")
        .flag("--policy", policy_filter, "keep only the policies whose label contains this text (cuBLASLt always runs)")
        .flag("--splits", splits, "K-splits per tile forced on the wgmma policies that split K (0: the policy's own)",
              train::at_least(0));
    if (!args.parse(argc, argv)) return 0;  // --help: printed, before any CUDA call
    if (cuda_device_count() == 0) {
      std::fprintf(stderr, "bench_gemm: no CUDA device\n");
      return 1;
    }
    std::vector<Shape3> shapes = gpt2_shapes();
    shapes.push_back({4096, 4096, 4096, Trans::no, Trans::yes, "4096^3 (NT)"});
    shapes.push_back({4096, 4096, 4096, Trans::no, Trans::no, "4096^3 (NN)"});
    std::erase_if(shapes, [&](const Shape3& s) { return s.label.find(shape_filter) == std::string::npos; });

    const std::vector<Policy> policies{
        policy<CublasLt>("cublaslt"),
        policy<TiledGemm<TileShape<128, 128, 32>, 4>>("tiled 128x128x32 s4"),
        policy<TiledGemm<TileShape<128, 128, 64>, 3>>("tiled 128x128x64 s3"),
        policy<TiledGemm<TileShape<128, 256, 32>, 3, WarpTile<64, 64>>>("tiled 128x256x32 s3 w64x64"),
        policy<TiledGemm<TileShape<256, 128, 32>, 3, WarpTile<64, 64>>>("tiled 256x128x32 s3 w64x64"),
        policy<WgmmaGemm<TileShape<128, 128, 64>, 6, wgmma_schedule::Cooperative>>("wgmma coop 128x128x64 s6"),
        policy<WgmmaGemm<TileShape<128, 256, 64>, 4, wgmma_schedule::Cooperative>>("wgmma coop 128x256x64 s4"),
        policy<WgmmaGemm<TileShape<128, 128, 64>, 6, wgmma_schedule::CooperativeTmaStore>>("wgmma coop-tma 128x128x64 s6"),
        policy<WgmmaGemm<TileShape<128, 256, 64>, 4, wgmma_schedule::CooperativeTmaStore>>("wgmma coop-tma 128x256x64 s4"),
        policy<WgmmaGemm<TileShape<128, 128, 64>, 6, wgmma_schedule::CooperativeMulticast>>("wgmma coop-mc 128x128x64 s6"),
        policy<WgmmaGemm<TileShape<128, 256, 64>, 4, wgmma_schedule::CooperativeMulticast>>("wgmma coop-mc 128x256x64 s4"),
        policy<WgmmaGemm<TileShape<128, 128, 64>, 6>>("wgmma pingpong 128x128x64 s6"),
        policy<WgmmaGemm<TileShape<128, 128, 64>, 4>>("wgmma pingpong 128x128x64 s4"),
        policy<WgmmaGemm<TileShape<64, 256, 64>, 5>>("wgmma pingpong 64x256x64 s5"),
    };

    KernelContext ctx;
    cudaStream_t stream;
    DPML_CHECK_CUDA(cudaStreamCreate(&stream));
    cudaEvent_t t0, t1;
    DPML_CHECK_CUDA(cudaEventCreate(&t0));
    DPML_CHECK_CUDA(cudaEventCreate(&t1));

    int mismatches = 0;
    std::vector<std::vector<double>> table(shapes.size(), std::vector<double>(policies.size(), 0.0));
    for (std::size_t si = 0; si < shapes.size(); ++si) {
      const auto& sh = shapes[si];
      const std::int64_t a_rows = sh.ta == Trans::no ? sh.M : sh.K, a_cols = sh.ta == Trans::no ? sh.K : sh.M;
      const std::int64_t b_rows = sh.tb == Trans::no ? sh.K : sh.N, b_cols = sh.tb == Trans::no ? sh.N : sh.K;
      bf16 *A, *B, *C, *ref;
      DPML_CHECK_CUDA(cudaMalloc(&A, a_rows * a_cols * sizeof(bf16)));
      DPML_CHECK_CUDA(cudaMalloc(&B, b_rows * b_cols * sizeof(bf16)));
      DPML_CHECK_CUDA(cudaMalloc(&C, sh.M * sh.N * sizeof(bf16)));
      DPML_CHECK_CUDA(cudaMalloc(&ref, sh.M * sh.N * sizeof(bf16)));
      dpml::bench::fill_uniform(A, a_rows * a_cols, 1, -1.f, 1.f, stream);
      dpml::bench::fill_uniform(B, b_rows * b_cols, 2, -1.f, 1.f, stream);
      GemmArgs<bf16> g{sh.ta, sh.tb, sh.M, sh.N, sh.K, A, a_cols, B, b_cols, C, sh.N};
      g.alpha = 1.f / std::sqrt(static_cast<float>(sh.K));
      std::vector<std::uint16_t> ref_host(static_cast<std::size_t>(sh.M * sh.N)), got(ref_host.size());
      for (std::size_t pi = 0; pi < policies.size(); ++pi) {
        const auto& p = policies[pi];
        if (!p.supports(g) || (pi > 0 && p.name.find(policy_filter) == std::string::npos)) continue;
        DPML_CHECK_CUDA(cudaMemsetAsync(C, 0xFF, sh.M * sh.N * sizeof(bf16), stream));  // NaN until written
        for (int i = 0; i < warmup; ++i) p.run(ctx, g, stream, splits);
        DPML_CHECK_CUDA(cudaEventRecord(t0, stream));
        for (int i = 0; i < iters; ++i) p.run(ctx, g, stream, splits);
        DPML_CHECK_CUDA(cudaEventRecord(t1, stream));
        DPML_CHECK_CUDA(cudaEventSynchronize(t1));
        float ms = 0;
        DPML_CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
        ms /= static_cast<float>(iters);
        const double tflops = 2.0 * sh.M * sh.N * sh.K / (ms * 1e-3) / 1e12;
        table[si][pi] = tflops;
        DPML_CHECK_CUDA(cudaMemcpy(got.data(), C, got.size() * 2, cudaMemcpyDeviceToHost));
        if (pi == 0) ref_host = got;
        const double err = pi == 0 ? 0.0 : rel_err(got, ref_host);
        if (!(err <= 1e-2)) {
          std::fprintf(stderr, "bench_gemm: %s on %s differs from cuBLASLt: rel err %.3e\n", p.name.c_str(),
                       sh.label.c_str(), err);
          mismatches += 1;
        }
        std::printf("{\"bench\":\"gemm\",\"shape\":\"%s\",\"M\":%lld,\"N\":%lld,\"K\":%lld,\"ta\":%d,\"tb\":%d,"
                    "\"policy\":\"%s\",\"splits\":%d,\"ms\":%.4f,\"tflops\":%.1f,\"rel_err_vs_cublaslt\":%.2e}\n",
                    sh.label.c_str(), static_cast<long long>(sh.M), static_cast<long long>(sh.N),
                    static_cast<long long>(sh.K), sh.ta == Trans::yes, sh.tb == Trans::yes, p.name.c_str(),
                    p.splits(ctx, g, splits), ms, tflops, err);
        std::fflush(stdout);
      }
      cudaFree(A);
      cudaFree(B);
      cudaFree(C);
      cudaFree(ref);
    }

    std::printf("\n| shape | M | N | K | ta | tb |");
    for (const auto& p : policies) std::printf(" %s TFLOP/s |", p.name.c_str());
    std::printf(" best ours / cuBLASLt |\n|---|---|---|---|---|---|");
    for (std::size_t i = 0; i <= policies.size(); ++i) std::printf("---|");
    std::printf("\n");
    for (std::size_t si = 0; si < shapes.size(); ++si) {
      const auto& sh = shapes[si];
      std::printf("| %s | %lld | %lld | %lld | %d | %d |", sh.label.c_str(), static_cast<long long>(sh.M),
                  static_cast<long long>(sh.N), static_cast<long long>(sh.K), sh.ta == Trans::yes, sh.tb == Trans::yes);
      double best = 0;
      for (std::size_t pi = 0; pi < policies.size(); ++pi) {
        std::printf(" %.1f |", table[si][pi]);
        if (pi > 0) best = std::max(best, table[si][pi]);
      }
      std::printf(" %.2f |\n", table[si][0] > 0 ? best / table[si][0] : 0.0);
    }
    return mismatches == 0 ? 0 : 1;
  } catch (const Error& e) {  // a bad flag (Scope::everywhere): its message alone
    std::fprintf(stderr, "bench_gemm: %s\n", e.scope() == Scope::everywhere ? e.message().c_str() : e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm: %s\n", e.what());
    return 1;
  }
}
