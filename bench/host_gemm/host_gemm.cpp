// host_gemm: dpml's host GEMM path (kernels::host::gemm) against a raw cblas_sgemm call, at 1024³
// and at the im2col GEMM shapes of the ResNet-style CNN (width 16, 28×28 input): per image,
// M = Cout, N = Ho·Wo, K = Cin·9 for every 3×3 convolution of models::ResNet.
//
//   OPENBLAS_NUM_THREADS=1 host_gemm
//   OPENBLAS_NUM_THREADS=2 host_gemm
//
// Per shape, the two calls alternate over --trials trials; each trial repeats one call until
// --min-ms have passed; the figure is the median trial's GFLOP/s (2·M·N·K per call). The threads
// are OpenBLAS's own (the environment variable above; "unset" when it is not set).
// Output: one JSON object per line ({"bench":"host_gemm",...}), then a table on stderr.
#include <dpml/comm/launch.hpp>
#include <dpml/kernels/host/gemm.hpp>
#include <dpml/train/args.hpp>

#include <algorithm>
#include <cblas.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

struct Shape {
  const char* name;
  std::int64_t M, N, K;
};

// The 3×3 convolutions of ResNet width w = 16 on 28×28 (stem, stage 1 at 28², stage 2 at 14²,
// stage 3 at 7²; the stride-2 first conv of a stage has Cin of the previous stage).
constexpr Shape kShapes[] = {
    {"square 1024", 1024, 1024, 1024},     {"stem 1->16 28x28", 16, 784, 9},
    {"stage1 16->16 28x28", 16, 784, 144}, {"stage2 16->32 s2 14x14", 32, 196, 144},
    {"stage2 32->32 14x14", 32, 196, 288}, {"stage3 32->64 s2 7x7", 64, 49, 288},
    {"stage3 64->64 7x7", 64, 49, 576},
};

// Median GFLOP/s over trials of `call`, each trial at least min_ms long.
template <class Call>
double trial_gflops(Call&& call, const Shape& s, double min_ms) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  std::int64_t calls = 0;
  double ms = 0;
  do {
    call();
    ++calls;
    ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  } while (ms < min_ms);
  return 2.0 * static_cast<double>(s.M * s.N * s.K) * static_cast<double>(calls) / (ms * 1e6);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const dpml::comm::Mpi& world) {
    int trials = 5;
    double min_ms = 40;
    dpml::train::Args args("host_gemm",
                           "dpml host GEMM (kernels::host::gemm) vs raw cblas_sgemm: GFLOP/s at 1024^3 and at the\n"
                           "im2col shapes of the ResNet CNN. Set OPENBLAS_NUM_THREADS to choose the BLAS threads.");
    args.flag("--trials", trials, "timed trials per shape and path (median reported)", dpml::train::at_least(1))
        .flag("--min-ms", min_ms, "minimum duration of one trial, ms", dpml::train::positive<double>());
    if (!args.parse(argc, argv, world.rank())) return 0;
    DPML_REQUIRE_EVERYWHERE(trials >= 1 && min_ms > 0, "--trials must be ≥ 1 and --min-ms > 0");
    const char* env = std::getenv("OPENBLAS_NUM_THREADS");
    const std::string threads = env ? env : "unset";
    std::mt19937_64 gen(1);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    struct Row {
      Shape s;
      double dpml, raw;
    };
    std::vector<Row> rows;
    for (const Shape& s : kShapes) {
      std::vector<float> A(static_cast<std::size_t>(s.M * s.K)), B(static_cast<std::size_t>(s.K * s.N)),
          C(static_cast<std::size_t>(s.M * s.N));
      for (auto& v : A) v = dist(gen);
      for (auto& v : B) v = dist(gen);
      auto via_dpml = [&] {
        dpml::kernels::host::gemm(dpml::kernels::host::Trans::no, dpml::kernels::host::Trans::no, s.M, s.N, s.K, 1.f,
                                  A.data(), B.data(), 0.f, C.data());
      };
      auto via_cblas = [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(s.M), static_cast<int>(s.N),
                    static_cast<int>(s.K), 1.f, A.data(), static_cast<int>(s.K), B.data(), static_cast<int>(s.N), 0.f,
                    C.data(), static_cast<int>(s.N));
      };
      via_dpml();  // warm-up (thread pool, caches)
      via_cblas();
      std::vector<double> d, r;
      for (int t = 0; t < trials; ++t) {
        d.push_back(trial_gflops(via_dpml, s, min_ms));
        r.push_back(trial_gflops(via_cblas, s, min_ms));
      }
      rows.push_back({s, median(d), median(r)});
    }
    if (world.rank() == 0) {
      for (const auto& row : rows)
        std::printf("{\"bench\":\"host_gemm\",\"shape\":\"%s\",\"M\":%lld,\"N\":%lld,\"K\":%lld,"
                    "\"openblas_threads\":\"%s\",\"dpml_gflops\":%.2f,\"cblas_gflops\":%.2f,\"ratio\":%.3f}\n",
                    row.s.name, static_cast<long long>(row.s.M), static_cast<long long>(row.s.N),
                    static_cast<long long>(row.s.K), threads.c_str(), row.dpml, row.raw, row.dpml / row.raw);
      std::fflush(stdout);
      std::fprintf(stderr, "\nOPENBLAS_NUM_THREADS=%s\n%-24s %5s %5s %5s %10s %10s %7s\n", threads.c_str(), "shape", "M",
                   "N", "K", "dpml GF/s", "cblas GF/s", "ratio");
      for (const auto& row : rows)
        std::fprintf(stderr, "%-24s %5lld %5lld %5lld %10.1f %10.1f %7.3f\n", row.s.name,
                     static_cast<long long>(row.s.M), static_cast<long long>(row.s.N),
                     static_cast<long long>(row.s.K), row.dpml, row.raw, row.dpml / row.raw);
    }
    return 0;
  });
}
