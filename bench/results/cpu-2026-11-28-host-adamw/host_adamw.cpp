#include <dpml/core/bf16.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/optim/optimizer.hpp>
#include <dpml/kernels/host/blas_threads.hpp>
#include <chrono>
#include <cstdio>
#include <vector>
using namespace dpml;
int main(int argc, char** argv) {
  const std::int64_t n = std::int64_t{1} << 25;  // 33.5M
  std::vector<bf16> v(n, bf16(0.5f)), g(n, bf16(0.01f));
  std::vector<optim::Range<bf16>> r{{"w", std::span<bf16>(v.data(), n), std::span<const bf16>(g.data(), n)}};
  kernels::host::set_blas_threads(argc > 1 ? std::atoi(argv[1]) : 1);
  optim::Optimizer<optim::AdamW, bf16> opt(r, {.weight_decay = 0.1}, kernels::host_device());
  for (int i = 0; i < 2; ++i) opt.step(1e-3);
  const auto t0 = std::chrono::steady_clock::now();
  const int steps = 5;
  for (int i = 0; i < steps; ++i) opt.step(1e-3);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
  std::printf("threads %d: %.3f s per step of %lld elements: %.1f M elements/s\n", kernels::host::blas_threads(), s, (long long)n, n / s / 1e6);
}
