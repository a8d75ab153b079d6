// All-reduce bus bandwidth of dpml's paths against a raw ncclAllReduce on the same stream, for
// fp32 and bf16, 1 MB – 1 GB:
//   dpml      comm::Nccl::allreduce on the whole buffer (the communicator's own overhead)
//   bucketed  the library's data-parallel gradient buckets (parallel::GradientBuckets over
//             FlatParameters on CudaSpace, what the trainer's DataParallel runs): the buffer as
//             1 MiB parameters in flat buffers cut into --bucket-mb buckets, each summed on the
//             communicator's own stream after an event of the compute stream, finish() making the
//             compute stream wait — what bucketing for overlap costs when nothing overlaps
//   copy-engine  the same buckets over comm::CopyEngine (2 ranks of one host only: the copy
//             engines move the data, one kernel sums each half; DeviceGrid's data axis may be one)
//   nccl      one raw ncclAllReduce (sum)
//
// One GPU per rank (comm::select_device); run under mpirun -n <GPUs> (scripts/launch.sh). Each
// (dtype, size) gets `--warmup` calls of each path, then `--repeats` timed batches of `--iters`
// back-to-back sums per path (out of place for dpml and nccl, in place on the flat gradients for the
// buckets), the paths interleaved batch by batch; a batch is timed with CUDA events on the stream
// the path's work ends on (the communicator's; the compute stream for the buckets). The time of a call is the median batch
// time / iters, the slowest rank's. algbw = bytes / time; busbw = algbw · 2(n−1)/n (the traffic
// per link of a ring all-reduce, comparable across rank counts, as in nccl-tests).
//
// Flags (train::Args; --help lists them with defaults and ranges, printed by rank 0, before any
// CUDA or NCCL call; a bad value exits 1 on every rank naming the flag): --min-bytes and
// --max-bytes (sizes such as 1M, 256MB, 1G, from 4 bytes to 1 TiB; default 1M – 1G), --factor
// between sizes (2 – 2^20), --warmup (≥ 0), --iters (≥ 1), --repeats (≥ 1), --bucket-mb (> 0).
//
// Prints one JSON object per (dtype, size, path) — {"bench":"allreduce","dtype":..,"bytes":..,
// "path":"dpml"|"bucketed"|"copy-engine"|"nccl","ranks":..,"us":..,"algbw_GBps":..,"busbw_GBps":..} — then a Markdown table
// with dpml / raw NCCL busbw (the Step 5 target is ≥ 0.95 at ≥ 100 MB).

#include <dpml/comm/launch.hpp>
#include <dpml/comm/local_rank.hpp>
#include <dpml/comm/nccl.hpp>
#include <dpml/comm/nccl_copy_engine.hpp>
#include <dpml/core/bf16.hpp>
#include <dpml/core/cuda_error.hpp>
#include <dpml/core/cuda_space.hpp>
#include <dpml/core/flat_parameters.hpp>
#include <dpml/core/parameter.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/parallel/data.hpp>
#include <dpml/train/args.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace dpml;

namespace {
struct Options {
  std::size_t min_bytes = std::size_t{1} << 20, max_bytes = std::size_t{1} << 30;
  int factor = 4, warmup = 5, iters = 20, repeats = 7;
  double bucket_mb = 25;
};

struct Row {
  std::string dtype;
  std::size_t bytes;
  double us[4];     // Path order (NaN: not run)
  double busbw[4];
};
enum Path { dpml_path, bucketed_path, copy_engine_path, nccl_path, path_count };
constexpr const char* kPathNames[path_count] = {"dpml", "bucketed", "copy-engine", "nccl"};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// n elements of T as the library holds a model's gradients: parameters of at most 1 MiB each in one
// flat device buffer, cut into buckets of at least --bucket-mb.
template <class T>
struct FlatGradients {
  std::vector<std::unique_ptr<Param<T, CudaSpace>>> params;
  std::optional<FlatParameters<T, CudaSpace>> flat;
  FlatGradients(std::size_t n, const Options& o) {
    const auto piece = static_cast<std::int64_t>((std::size_t{1} << 20) / sizeof(T));
    std::vector<Param<T, CudaSpace>*> ptrs;
    for (std::int64_t at = 0; at < static_cast<std::int64_t>(n); at += piece) {
      const std::int64_t count = std::min(piece, static_cast<std::int64_t>(n) - at);
      params.push_back(std::make_unique<Param<T, CudaSpace>>("g" + std::to_string(params.size()), Shape{count}, Init{}));
      ptrs.push_back(params.back().get());
    }
    const auto bucket = static_cast<std::int64_t>(o.bucket_mb * (1 << 20)) / static_cast<std::int64_t>(sizeof(T));
    flat.emplace(ptrs, FlatLayout{.align = flat_alignment<CudaSpace>, .bucket_elements = std::max<std::int64_t>(1, bucket)});
    DPML_CHECK_CUDA(cudaMemset(flat->grads().data(), 0, static_cast<std::size_t>(flat->numel()) * sizeof(T)));
  }
};

// Microseconds per call of each Path for `n` elements of T, slowest rank.
template <class T>
void time_paths(const comm::Mpi& world, const comm::Nccl& nccl, std::size_t n, const Options& o, double us[path_count]) {
  T *send = nullptr, *recv = nullptr;
  DPML_CHECK_CUDA(cudaMalloc(&send, n * sizeof(T)));
  DPML_CHECK_CUDA(cudaMalloc(&recv, n * sizeof(T)));
  DPML_CHECK_CUDA(cudaMemset(send, 0, n * sizeof(T)));
  kernels::Device<CudaSpace> dev;  // the compute stream the buckets order against
  FlatGradients<T> grads(n, o);
  DPML_CHECK_CUDA(cudaDeviceSynchronize());
  const comm::Nccl bucket_comm = comm::Nccl::from(world);  // a stream of its own, as DeviceGrid's data axis
  parallel::GradientBuckets<T, CudaSpace, comm::Nccl> buckets(*grads.flat, &bucket_comm, parallel::GradReduction::all_reduce, dev);
  std::optional<comm::CopyEngine> ce;  // two ranks only
  std::optional<parallel::GradientBuckets<T, CudaSpace, comm::CopyEngine>> copy_engine;
  if (world.size() == 2) {
    ce.emplace(comm::CopyEngine::from(world));
    copy_engine.emplace(*grads.flat, &*ce, parallel::GradReduction::all_reduce, dev);
  }
  auto runs = [&](int path) { return path != copy_engine_path || copy_engine.has_value(); };
  auto call = [&](int path) {
    if (path == dpml_path)
      nccl.allreduce(send, recv, n, comm::ReduceOp::sum);
    else if (path == bucketed_path) {
      buckets.begin_step(1);
      buckets.finish();  // every bucket started here, nothing reported by a backward
    } else if (path == copy_engine_path) {
      copy_engine->begin_step(1);
      copy_engine->finish();
    }
    else
      DPML_CHECK_NCCL(ncclAllReduce(send, recv, n, comm::NcclType<T>::value, ncclSum, nccl.native(), nccl.stream()));
  };
  cudaEvent_t start, stop;
  DPML_CHECK_CUDA(cudaEventCreate(&start));
  DPML_CHECK_CUDA(cudaEventCreate(&stop));
  for (int path = 0; path < path_count; ++path)
    for (int i = 0; runs(path) && i < o.warmup; ++i) call(path);
  nccl.request().wait();
  dev.synchronize();
  std::vector<double> batches[path_count];
  for (int r = 0; r < o.repeats; ++r)
    for (int path = 0; path < path_count; ++path) {
      if (!runs(path)) continue;
      const cudaStream_t stream = path == bucketed_path || path == copy_engine_path ? dev.stream() : nccl.stream();
      DPML_CHECK_CUDA(cudaEventRecord(start, stream));
      for (int i = 0; i < o.iters; ++i) call(path);
      DPML_CHECK_CUDA(cudaEventRecord(stop, stream));
      DPML_CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0;
      DPML_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      batches[path].push_back(1e3 * ms / o.iters);
    }
  for (int path = 0; path < path_count; ++path)
    us[path] = runs(path) ? world.allreduce(median(batches[path]), comm::ReduceOp::max) : std::numeric_limits<double>::quiet_NaN();
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(send);
  cudaFree(recv);
}

// "1M", "256MB", "1G", "4096" (bytes): at least one fp32 element, at most 1 TiB (the sizes are
// multiplied by --factor up to --max-bytes).
std::size_t parse_bytes(const char* flag, const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  const std::string unit = end ? end : "";
  const double scale = unit == "" || unit == "B" ? 1 : unit == "K" || unit == "KB" ? 1 << 10
                       : unit == "M" || unit == "MB" ? 1 << 20 : unit == "G" || unit == "GB" ? 1 << 30 : -1;
  DPML_REQUIRE_EVERYWHERE(!s.empty() && end != s.c_str() && scale > 0 && std::isfinite(v) && v * scale >= 4 &&
                              v * scale <= std::ldexp(1.0, 40),
                          "flag " << flag << " '" << s << "': expected a size from 4 bytes to 1 TiB, such as 1M, 256MB or 1G");
  return static_cast<std::size_t>(v * scale);
}

// Parses argv into o (a bad flag throws, Scope::everywhere); false after --help (printed by rank 0).
bool parse(int argc, char** argv, int rank, Options& o) {
  std::string min_bytes = "1M", max_bytes = "1G";
  train::Args args("bench_allreduce",
                   "All-reduce busbw of comm::Nccl::allreduce, of the library's gradient buckets (over NCCL, and on 2 ranks over\n"
                   "comm::CopyEngine) vs raw ncclAllReduce (fp32, bf16): JSON lines, then a Markdown table. One GPU per\n"
                   "rank: mpirun -n <GPUs> bench_allreduce [flags] (scripts/launch.sh). Sizes go from --min-bytes to\n"
                   "--max-bytes, times --factor each; sizes take B, K(B), M(B), G(B) (powers of 1024).");
  args.flag("--min-bytes", min_bytes, "smallest buffer (4 bytes to 1 TiB)")
      .flag("--max-bytes", max_bytes, "largest buffer (4 bytes to 1 TiB; >= --min-bytes)")
      .flag("--factor", o.factor, "ratio of one size to the next", train::between(2, 1 << 20))
      .flag("--warmup", o.warmup, "untimed calls of each path per (dtype, size)", train::at_least(0))
      .flag("--iters", o.iters, "back-to-back calls in one timed batch", train::at_least(1))
      .flag("--repeats", o.repeats, "timed batches per path (the median is reported)", train::at_least(1))
      .flag("--bucket-mb", o.bucket_mb, "MB per gradient bucket, at least (bucketed and copy-engine paths)",
            train::positive<double>());
  if (!args.parse(argc, argv, rank)) return false;
  o.min_bytes = parse_bytes("--min-bytes", min_bytes);
  o.max_bytes = parse_bytes("--max-bytes", max_bytes);
  DPML_REQUIRE_EVERYWHERE(o.min_bytes <= o.max_bytes,
                          "--min-bytes " << o.min_bytes << " exceeds --max-bytes " << o.max_bytes);
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const comm::Mpi& world) {
    Options o;
    if (!parse(argc, argv, world.rank(), o)) return 0;  // --help: printed, before any CUDA or NCCL call
    const int device = comm::select_device(world);
    const comm::Nccl nccl = comm::Nccl::from(world);
    const int p = world.size();
    const double bus_factor = 2.0 * (p - 1) / p;
    if (world.rank() == 0) {
      cudaDeviceProp prop{};
      DPML_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
      int nccl_version = 0;
      DPML_CHECK_NCCL(ncclGetVersion(&nccl_version));
      std::fprintf(stderr, "bench_allreduce: %d ranks, %s, NCCL %d, NCCL_NVLS_ENABLE=%s\n", p, prop.name, nccl_version,
                   std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "(unset)");
    }
    std::vector<Row> rows;
    for (const std::string dtype : {"fp32", "bf16"})
      for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= static_cast<std::size_t>(o.factor)) {
        Row row{dtype, bytes, {}, {}};
        if (dtype == "fp32")
          time_paths<float>(world, nccl, bytes / sizeof(float), o, row.us);
        else
          time_paths<bf16>(world, nccl, bytes / sizeof(bf16), o, row.us);
        for (int path = 0; path < path_count; ++path) {
          row.busbw[path] = row.us[path];  // NaN where not run
          if (std::isnan(row.us[path])) continue;
          const double algbw = static_cast<double>(bytes) / (row.us[path] * 1e-6) / 1e9;
          row.busbw[path] = algbw * bus_factor;
          if (world.rank() == 0)
            std::printf("{\"bench\":\"allreduce\",\"dtype\":\"%s\",\"bytes\":%zu,\"path\":\"%s\",\"ranks\":%d,"
                        "\"us\":%.2f,\"algbw_GBps\":%.2f,\"busbw_GBps\":%.2f}\n",
                        dtype.c_str(), bytes, kPathNames[path], p, row.us[path], algbw, row.busbw[path]);
        }
        std::fflush(stdout);
        rows.push_back(row);
      }
    if (world.rank() == 0) {
      std::printf("\n| dtype | size | busbw GB/s: dpml | bucketed (%.0f MB) | copy engines | NCCL | dpml / NCCL | bucketed / NCCL | copy engines / NCCL |\n"
                  "|---|---|---|---|---|---|---|---|---|\n", o.bucket_mb);
      for (const Row& r : rows)  // (nan: copy engines not run, more than 2 ranks)
        std::printf("| %s | %.0f MiB | %.1f | %.1f | %.1f | %.1f | %.3f | %.3f | %.3f |\n", r.dtype.c_str(),
                    static_cast<double>(r.bytes) / (1 << 20), r.busbw[dpml_path], r.busbw[bucketed_path],
                    r.busbw[copy_engine_path], r.busbw[nccl_path], r.us[nccl_path] / r.us[dpml_path],
                    r.us[nccl_path] / r.us[bucketed_path], r.us[nccl_path] / r.us[copy_engine_path]);
    }
    return 0;
  });
}
