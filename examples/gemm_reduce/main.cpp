// gemm_reduce: C = A · B shared by K MPI ranks — each multiplies its part with dpml's GEMM
// (kernels::Ops<Space>), the parts are combined over a communicator, rank 0 checks C against a
// float64 host GEMM and times the whole against one rank doing it alone (seed 004's exercise).
//
//   --split k   rank r takes the columns [K·r/R, K·(r+1)/R) of A and those rows of B: a partial
//               C (M, N) per rank, summed over the ranks (all-reduce)
//   --split m   rank r takes the rows [M·r/R, M·(r+1)/R) of A and all of B: a block of C's rows
//               per rank, gathered (all-gather)
//   --device cpu   host buffers, OpenBLAS, combined over MPI (comm::Mpi)
//   --device cuda  device buffers, cuBLASLt, combined over NCCL with a GPU per rank, or comm::Staged
//                  through host memory when ranks share a GPU (--gpu-comm auto | nccl | staged)
//
//   scripts/launch.sh -n 4 build/cpu/examples/gemm_reduce/gemm_reduce --m 2048 --n 2048 --k 2048
//
// A and B are uniform in [−1, 1) from --seed (every rank draws the same matrices and keeps its
// part), fp32 on both spaces. Printed on rank 0: one JSON line and a table — the one-rank time,
// the K-rank time split into GEMM and combine (medians over --repeat, the slowest rank's), the
// speedup, and the largest error against the float64 reference (the run fails above --tolerance).

#include <dpml/comm/launch.hpp>
#include <dpml/comm/mpi.hpp>
#include <dpml/core/error.hpp>
#include <dpml/core/philox.hpp>
#include <dpml/core/tensor.hpp>
#include <dpml/kernels/device.hpp>
#include <dpml/kernels/ops.hpp>
#include <dpml/train/args.hpp>

#ifdef DPML_WITH_CUDA
#include <dpml/comm/cuda_placement.hpp>
#include <dpml/comm/nccl.hpp>
#include <dpml/comm/staged.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace {

using namespace dpml;

struct Flags {
  std::int64_t m = 1024, n = 1024, k = 1024;
  std::string split = "k", device = "cpu", gpu_comm = "auto";
  int repeat = 5;
  std::uint64_t seed = 1;
  double tolerance = 1e-3;
  std::string metrics;  // rank 0 also writes the JSON record here (scripts/report.sh reads it)
};

// Element (i, j) of a rows × cols matrix drawn from (seed, which): the same on every rank.
float entry(std::uint64_t seed, std::uint64_t which, std::int64_t i, std::int64_t j, std::int64_t cols) {
  const auto index = static_cast<std::uint64_t>(i * cols + j);
  return 2.0f * PhiloxStream(seed, which).uniform(index) - 1.0f;
}

// The rows [r0, r1) × columns [c0, c1) of matrix `which` (rows × cols), row-major.
std::vector<float> block(const Flags& f, std::uint64_t which, std::int64_t cols, std::int64_t r0, std::int64_t r1,
                         std::int64_t c0, std::int64_t c1) {
  std::vector<float> out(static_cast<std::size_t>((r1 - r0) * (c1 - c0)));
  for (std::int64_t i = r0; i < r1; ++i)
    for (std::int64_t j = c0; j < c1; ++j) out[static_cast<std::size_t>((i - r0) * (c1 - c0) + (j - c0))] = entry(f.seed, which, i, j, cols);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// C (rows, cols) = A (rows, inner) · B (inner, cols), on `dev`'s space (LinearOps' input-gradient
// product: dx (rows, in) = dy (rows, out) · W (out, in)).
template <class Space>
void gemm(kernels::Device<Space>& dev, const float* a, const float* b, float* c, std::int64_t rows, std::int64_t inner,
          std::int64_t cols) {
  kernels::Ops<Space>::linear_backward_input(dev, a, b, c, rows, cols, inner);
}

template <class Space>
Tensor<float, Space> upload(const std::vector<float>& host, Shape shape) {
  Tensor<float, HostSpace> t(shape);
  std::copy(host.begin(), host.end(), t.data());
  return to_space<Space>(t.cview());
}

// Waits for the device's queued work (nothing to wait for on the host).
template <class Space>
void synchronize(kernels::Device<Space>& dev) {
  if constexpr (requires { dev.synchronize(); }) dev.synchronize();
}

template <class Space, class Comm>
int run(const Flags& f, const comm::Mpi& world, kernels::Device<Space>& dev, const Comm& comm, const char* comm_name) {
  const int R = world.size(), r = world.rank();
  const bool by_k = f.split == "k";
  const std::int64_t parts = by_k ? f.k : f.m;
  const std::int64_t lo = parts * r / R, hi = parts * (r + 1) / R;
  auto seconds = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };

  // One rank alone: the whole product on rank 0 while the others wait.
  double one_rank = 0;
  if (r == 0) {
    const auto a = upload<Space>(block(f, 0, f.k, 0, f.m, 0, f.k), {f.m, f.k});
    const auto b = upload<Space>(block(f, 1, f.n, 0, f.k, 0, f.n), {f.k, f.n});
    Tensor<float, Space> c({f.m, f.n});
    gemm(dev, a.data(), b.data(), c.data(), f.m, f.k, f.n);  // warm-up
    std::vector<double> t;
    for (int i = 0; i < f.repeat; ++i) {
      synchronize(dev);
      const double t0 = seconds();
      gemm(dev, a.data(), b.data(), c.data(), f.m, f.k, f.n);
      synchronize(dev);
      t.push_back(seconds() - t0);
    }
    one_rank = median(t);
  }
  world.barrier();

  // K ranks: this rank's part, then the combine.
  const auto a = by_k ? upload<Space>(block(f, 0, f.k, 0, f.m, lo, hi), {f.m, hi - lo})
                      : upload<Space>(block(f, 0, f.k, lo, hi, 0, f.k), {hi - lo, f.k});
  const auto b = by_k ? upload<Space>(block(f, 1, f.n, lo, hi, 0, f.n), {hi - lo, f.n})
                      : upload<Space>(block(f, 1, f.n, 0, f.k, 0, f.n), {f.k, f.n});
  Tensor<float, Space> c(by_k ? Shape{f.m, f.n} : Shape{hi - lo, f.n}), all({f.m, f.n});
  std::vector<int> counts(static_cast<std::size_t>(R));
  for (int q = 0; q < R; ++q) counts[static_cast<std::size_t>(q)] = static_cast<int>((f.m * (q + 1) / R - f.m * q / R) * f.n);
  auto product = [&] {
    if (by_k) gemm(dev, a.data(), b.data(), c.data(), f.m, hi - lo, f.n);
    else gemm(dev, a.data(), b.data(), c.data(), hi - lo, f.k, f.n);
  };
  auto combine = [&] {
    if (by_k) comm.allreduce(c.data(), all.data(), static_cast<std::size_t>(f.m * f.n), comm::ReduceOp::sum);
    else comm.allgatherv(c.data(), all.data(), counts);
  };
  product(), combine(), synchronize(dev);  // warm-up (and the communicators' first connection)
  std::vector<double> gemm_s, combine_s;
  for (int i = 0; i < f.repeat; ++i) {
    world.barrier();
    const double t0 = seconds();
    product();
    synchronize(dev);
    const double t1 = seconds();
    combine();
    synchronize(dev);
    gemm_s.push_back(world.allreduce(t1 - t0, comm::ReduceOp::max));
    combine_s.push_back(world.allreduce(seconds() - t1, comm::ReduceOp::max));
  }

  // Rank 0: the combined C against a float64 product on the host.
  const auto got = to_space<HostSpace>(all.cview());
  double max_err = 0;
  if (r == 0) {
    const auto a64 = block(f, 0, f.k, 0, f.m, 0, f.k), b64 = block(f, 1, f.n, 0, f.k, 0, f.n);
    std::vector<double> ad(a64.begin(), a64.end()), bd(b64.begin(), b64.end()), want(static_cast<std::size_t>(f.m * f.n));
    kernels::Device<HostSpace> host;
    kernels::Ops<HostSpace>::linear_backward_input(host, ad.data(), bd.data(), want.data(), f.m, f.n, f.k);
    for (std::size_t i = 0; i < want.size(); ++i)
      max_err = std::max(max_err, std::abs(want[i] - static_cast<double>(got.data()[i])));
  }
  max_err = world.allreduce(max_err, comm::ReduceOp::max);
  const double g = median(gemm_s), x = median(combine_s), total = g + x;
  if (r == 0) {
    char record[512];
    std::snprintf(record, sizeof record,
                  "{\"example\":\"gemm_reduce\",\"device\":\"%s\",\"comm\":\"%s\",\"ranks\":%d,\"split\":\"%s\",\"m\":%lld,\"n\":%lld,"
                  "\"k\":%lld,\"one_rank_ms\":%.3f,\"gemm_ms\":%.3f,\"combine_ms\":%.3f,\"total_ms\":%.3f,\"speedup\":%.3f,"
                  "\"gflops\":%.1f,\"max_abs_error\":%.3g}\n",
                  f.device.c_str(), comm_name, R, f.split.c_str(), static_cast<long long>(f.m), static_cast<long long>(f.n),
                  static_cast<long long>(f.k), one_rank * 1e3, g * 1e3, x * 1e3, total * 1e3, one_rank / total,
                  2.0 * static_cast<double>(f.m * f.n * f.k) / total * 1e-9, max_err);
    std::fputs(record, stdout);
    if (!f.metrics.empty()) {
      std::ofstream out(f.metrics, std::ios::trunc);
      out << record;
      DPML_REQUIRE(out.good(), "--metrics '" << f.metrics << "': could not write the record");
    }
    std::printf("\n| ranks | split | comm | one rank ms | GEMM ms | combine ms | total ms | speedup | max |error| |\n"
                "|---:|---|---|---:|---:|---:|---:|---:|---:|\n"
                "| %d | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2g |\n",
                R, f.split.c_str(), comm_name, one_rank * 1e3, g * 1e3, x * 1e3, total * 1e3, one_rank / total, max_err);
  }
  DPML_REQUIRE_EVERYWHERE(max_err <= f.tolerance, "C differs from the float64 product by " << max_err << ", above --tolerance "
                                                                                           << f.tolerance);
  return 0;
}

int main_checked(int argc, char** argv, const comm::Mpi& world) {
  Flags f;
  train::Args args("gemm_reduce",
                   "C = A · B over K MPI ranks: each multiplies its part with dpml's GEMM, the parts are summed (--split k)\n"
                   "or gathered (--split m) over MPI (host buffers) or NCCL / comm::Staged (GPU buffers), checked against a\n"
                   "float64 host product and timed against one rank.");
  args.flag("--m", f.m, "rows of A and C", train::at_least<std::int64_t>(1))
      .flag("--n", f.n, "columns of B and C", train::at_least<std::int64_t>(1))
      .flag("--k", f.k, "columns of A, rows of B", train::at_least<std::int64_t>(1))
      .flag("--split", f.split, "k (partial products, summed) | m (row blocks, gathered)")
      .flag("--device", f.device, "cpu (host buffers, MPI) | cuda (GPU buffers, NCCL or Staged)")
      .flag("--gpu-comm", f.gpu_comm, "--device cuda: auto | nccl (a GPU per rank) | staged (ranks sharing GPUs)")
      .flag("--repeat", f.repeat, "timed repetitions (the median is reported)", train::at_least(1))
      .flag("--seed", f.seed, "seed of A and B")
      .flag("--tolerance", f.tolerance, "largest error against the float64 product accepted", train::positive<double>())
      .flag("--metrics", f.metrics, "rank 0 also writes the JSON record to this file");
  if (!args.parse(argc, argv, world.rank())) return 0;
  train::require_writable_output("--metrics", f.metrics);
  DPML_REQUIRE_EVERYWHERE(f.split == "k" || f.split == "m", "--split " << f.split << " is not k or m");
  DPML_REQUIRE_EVERYWHERE(f.device == "cpu" || f.device == "cuda", "--device " << f.device << " is not cpu or cuda");
  DPML_REQUIRE_EVERYWHERE((f.split == "k" ? f.k : f.m) >= world.size(),
                          "--split " << f.split << ": " << (f.split == "k" ? "--k " : "--m ") << (f.split == "k" ? f.k : f.m)
                                     << " is below the " << world.size() << " ranks (each needs a part)");
  DPML_REQUIRE_EVERYWHERE(f.m * f.n <= (std::int64_t{1} << 31) - 1, "--m × --n = " << f.m * f.n << " exceeds the 2^31 − 1 "
                                                                                      "elements a gather counts");
  if (f.device == "cpu") {
    kernels::Device<HostSpace> dev;
    return run(f, world, dev, world, "mpi");
  }
#ifdef DPML_WITH_CUDA
  const auto gpus = comm::place_on_gpus(world, f.gpu_comm);  // before any CUDA allocation
  kernels::Device<CudaSpace> dev;
  if (gpus.comm == comm::GpuComm::nccl) return run(f, world, dev, comm::Nccl::from(world, dev.stream()), "nccl");
  return run(f, world, dev, comm::Staged::from(world, dev.stream()), "staged");
#else
  DPML_REQUIRE_EVERYWHERE(false, "--device cuda: this gemm_reduce was built without CUDA (build it with the cuda preset)");
  return 1;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const dpml::comm::Mpi& world) { return main_checked(argc, argv, world); });
}
