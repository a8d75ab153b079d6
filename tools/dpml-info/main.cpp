// dpml-info: what a launch gives a dpml run, node by node, and (--probe) whether its links and
// GPUs deliver. Run it the way a training job is run (scripts/launch.sh -n <ranks> dpml-info
// --probe, mpiexec, srun); world rank 0 prints, each node once:
//
//   == host ==      name, cores, ranks on the node (MPI_Comm_split_type SHARED) and their world
//                   ranks, the MPI library (MPI_Get_library_version) and standard
//   == GPUs ==      built with CUDA and a device present: per CUDA device its name, memory, SMs,
//                   compute capability, PCI bus id and, through NVML (core/nvml.hpp, loaded at run
//                   time), power limit, clocks, utilisation; CUDA runtime and driver, cuBLASLt,
//                   cuDNN (where dpml links it) and NCCL versions. Else "built without CUDA" or
//                   "no CUDA device", and NVML's GPUs if the node has any. "no NVML" where
//                   libnvidia-ml.so.1 is missing.
//   == topology ==  per GPU of the node (NVML's numbering) its active NVLinks, to which GPU or to
//                   an NVSwitch; per pair: direct NVLinks, both on NVSwitches, or how near they sit
//                   on PCIe
//   == probe ==     (--probe) an MPI all-reduce (fp32 sum, out of place, the result checked) of each
//                   --sizes over all ranks, through comm::Mpi and, for comparison, the library's
//                   blocking MPI_Allreduce: time per call (the slowest rank's), algbw = bytes / time,
//                   busbw = 2(n−1)/n · algbw (each link's traffic in a ring, as nccl-tests report
//                   it; 0 on one rank). With a GPU per rank: the same through comm::Nccl on the
//                   device, and a bf16 GEMM (kernels::cuda::gemm, cuBLASLt) of --gemm-size³ on every
//                   rank with its TFLOP/s and, through NVML, the GPU's mean power under ~2 s more of
//                   it (the energy counter over the last second, nvml::PowerMeter) and TFLOP/J.
//
// The MPI probe uses comm::Mpi's all-reduce, which polls and yields the core while it waits: on
// ranks oversubscribing cores (CI) that is what dpml's runs see; on a cluster it costs little.
// Flags (train::Args; --help, --check-flags): --probe, --sizes (comma-separated, 4 B to 1 GiB
// each, K/M/G powers of 1024), --iters (1 – 100000) timed and --warmup (0 – 100000) untimed calls
// per size and of the GEMM, --gemm-size (256 – 16384). The GPU sections and probes are compiled
// with nvcc in CI, their NVML lines tested there against a stand-in library
// (tests/tools/fake_nvml.cpp), and run on GPUs by scripts/gpu-check.sh and gpu-metrics-check.sh.

#include <dpml/comm/launch.hpp>
#include <dpml/comm/local_rank.hpp>
#include <dpml/comm/mpi.hpp>
#include <dpml/core/error.hpp>
#include <dpml/core/nvml.hpp>
#include <dpml/train/args.hpp>

#ifdef DPML_WITH_CUDA
#include <dpml/comm/nccl.hpp>
#include <dpml/core/bf16.hpp>
#include <dpml/core/cuda_space.hpp>
#include <dpml/core/cuda_stream.hpp>
#include <dpml/core/tensor.hpp>
#include <dpml/kernels/cuda/gemm/dispatch.hpp>

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>
#ifdef DPML_HAS_CUDNN
#include <cudnn.h>
#endif
#endif

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef DPML_VERSION_TEXT
#define DPML_VERSION_TEXT "unknown"
#endif

using namespace dpml;

namespace {

struct Options {
  bool probe = false;
  std::string sizes = "64K,1M,16M";
  int iters = 20, warmup = 3;
  int gemm_size = 8192;
  std::vector<std::size_t> bytes;  // --sizes, parsed
};

// "64K,1M,16M": each from 4 bytes to 1 GiB, K/M/G (or KB/MB/GB) powers of 1024, a multiple of 4
// (whole fp32 elements).
std::vector<std::size_t> parse_sizes(const std::string& text) {
  std::vector<std::size_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    std::size_t digits = 0;
    while (digits < item.size() && std::isdigit(static_cast<unsigned char>(item[digits]))) ++digits;
    const std::string unit = item.substr(digits);
    const int shift = unit.empty() || unit == "B" ? 0 : unit == "K" || unit == "KB" ? 10
                      : unit == "M" || unit == "MB" ? 20 : unit == "G" || unit == "GB" ? 30 : -1;
    const bool parsed = digits > 0 && digits <= 10 && shift >= 0;
    const std::size_t bytes = parsed ? std::stoull(item.substr(0, digits)) << shift : 0;
    DPML_REQUIRE_EVERYWHERE(parsed && bytes >= 4 && bytes <= (std::size_t{1} << 30) && bytes % 4 == 0,
                            "flag --sizes '" << text << "': '" << item << "' is not a size from 4 bytes to 1G in "
                                             << "whole fp32 elements (such as 64K,1M,16M)");
    out.push_back(bytes);
  }
  DPML_REQUIRE_EVERYWHERE(!out.empty(), "flag --sizes '" << text << "' names no size (such as 64K,1M,16M)");
  return out;
}

// false after --help or --check-flags (printed by rank 0); a bad flag throws (Scope::everywhere).
bool parse(int argc, char** argv, int rank, Options& o) {
  train::Args args("dpml-info",
                   "What this launch gives dpml, node by node: host, MPI, GPUs, NVML, GPU topology; with --probe\n"
                   "an MPI all-reduce over all ranks and, with a GPU per rank, an NCCL all-reduce and a bf16 GEMM.\n"
                   "Run it like a training job: scripts/launch.sh -n <ranks> dpml-info --probe.");
  args.flag("--probe", o.probe, "measure: all-reduce bandwidth (MPI, NCCL) and bf16 GEMM TFLOP/s")
      .flag("--sizes", o.sizes, "all-reduce sizes, comma-separated (4 bytes to 1G each; K, M, G: powers of 1024)",
            [](const std::string& s) { parse_sizes(s); })
      .flag("--iters", o.iters, "timed calls per all-reduce size and of the GEMM", train::between(1, 100000))
      .flag("--warmup", o.warmup, "untimed calls before them", train::between(0, 100000))
      .flag("--gemm-size", o.gemm_size, "M = N = K of the bf16 GEMM probe", train::between(256, 16384));
  if (!args.parse(argc, argv, rank)) return false;
  o.bytes = parse_sizes(o.sizes);
  return true;
}

// Rank 0 prints the non-empty texts (one per node: its first rank's), in rank order.
void print_nodes(const comm::Mpi& world, const std::string& text) {
  const std::vector<std::string> all = world.allgather(text);
  if (world.rank() != 0) return;
  for (const std::string& t : all) std::fputs(t.c_str(), stdout);
  std::fflush(stdout);
}

void section(const comm::Mpi& world, const char* name) {
  if (world.rank() == 0) std::printf("== %s ==\n", name);
}

std::string host_name() {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  DPML_CHECK_MPI(MPI_Get_processor_name(name, &len));
  return std::string(name, static_cast<std::size_t>(len));
}

std::string mpi_library() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0, major = 0, minor = 0;
  DPML_CHECK_MPI(MPI_Get_library_version(v, &len));
  DPML_CHECK_MPI(MPI_Get_version(&major, &minor));
  std::string first(v, static_cast<std::size_t>(len));
  // MPICH and Open MPI say more on later lines; Open MPI's len counts the terminating NUL.
  first = first.substr(0, std::min(first.find('\n'), first.find('\0')));
  std::replace(first.begin(), first.end(), '\t', ' ');
  return first + " (MPI " + std::to_string(major) + "." + std::to_string(minor) + ")";
}

std::string fixed(double v, int digits) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}
std::string gib(unsigned long long bytes) { return fixed(static_cast<double>(bytes) / (1ull << 30), 1) + " GiB"; }

// The node's first rank describes it; the others return "".
struct Node {
  comm::NodeRank local;
  std::string host;
  std::vector<int> world_ranks;  // of this node's ranks (on its first rank)
};

Node describe_node(const comm::Mpi& world) {
  const comm::Mpi node = world.split_by_host(world.rank());
  Node n{{node.rank(), node.size()}, host_name(), std::vector<int>(static_cast<std::size_t>(node.size()))};
  const int me = world.rank();
  node.allgather(&me, n.world_ranks.data(), 1);
  return n;
}

std::string host_text(const Node& n) {
  if (n.local.rank != 0) return "";
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int usable = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : -1;
  std::ostringstream os;
  os << "node " << n.host << ": " << std::thread::hardware_concurrency() << " cores (" << usable
     << " usable by its first rank), " << n.local.size << " rank(s): world rank";
  for (std::size_t i = 0; i < n.world_ranks.size(); ++i) os << (i ? ", " : " ") << n.world_ranks[i];
  os << "\n  MPI library: " << mpi_library() << "\n";
  return os.str();
}

std::string nvml_line(const nvml::Library& lib) {
  if (!lib.available()) return "  no NVML (" + lib.why() + ")\n";
  return "  NVML: driver " + lib.driver_version().value_or("?") + ", " + std::to_string(lib.device_count()) + " GPU(s)\n";
}

// NVML's view of one GPU: power limit, clocks, utilisation, memory in use.
std::string nvml_details(const std::optional<nvml::Device>& d) {
  if (!d) return "";
  std::ostringstream os;
  if (auto w = d->power_limit_w()) os << ", power limit " << fixed(*w, 0) << " W";
  if (auto w = d->power_w()) os << " (drawing " << fixed(*w, 0) << " W)";
  if (auto sm = d->max_clock_mhz(nvml::Clock::sm)) {
    os << ", SM clock max " << *sm << " MHz";
    if (auto now = d->clock_mhz(nvml::Clock::sm)) os << " (now " << *now << ")";
  }
  if (auto mem = d->max_clock_mhz(nvml::Clock::memory)) os << ", memory clock " << *mem << " MHz";
  if (auto u = d->utilization()) os << ", " << u->gpu << "% busy";
  if (auto m = d->memory()) os << ", " << gib(m->used) << " in use";
  return os.str();
}

#ifdef DPML_WITH_CUDA
std::string cuda_version(int v) {  // CUDA's 12040 → "12.4"
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}
std::string library_version(long long v) {  // cuBLAS, cuDNN 9, NCCL ≥ 2.9: 22809 → "2.28.9"
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::string gpu_text(const Node& n, const nvml::Library& lib) {
  if (n.local.rank != 0) return "";
  std::ostringstream os;
  os << "node " << n.host << ":\n";
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    os << "  no CUDA device" << (e != cudaSuccess ? std::string(" (") + cudaGetErrorString(e) + ")" : "") << "\n";
    (void)cudaGetLastError();
    count = 0;
  }
  int runtime = 0, driver = 0, nccl = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  ncclGetVersion(&nccl);
  os << "  CUDA runtime " << cuda_version(runtime) << ", driver " << (driver ? cuda_version(driver) : std::string("none"))
     << ", cuBLASLt " << library_version(static_cast<long long>(cublasLtGetVersion()));
#ifdef DPML_HAS_CUDNN
  os << ", cuDNN " << library_version(static_cast<long long>(cudnnGetVersion()));
#else
  os << ", cuDNN not linked";
#endif
  os << ", NCCL " << library_version(nccl) << "\n";
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    DPML_CHECK_CUDA(cudaGetDeviceProperties(&p, i));
    char bus[32] = {};
    DPML_CHECK_CUDA(cudaDeviceGetPCIBusId(bus, sizeof bus, i));
    os << "  GPU " << i << ": " << p.name << ", " << gib(p.totalGlobalMem) << ", " << p.multiProcessorCount
       << " SMs, compute " << p.major << "." << p.minor << ", PCI " << bus
       << nvml_details(nvml::device_of_cuda(lib, i)) << "\n";
  }
  os << nvml_line(lib);
  return os.str();
}
#else
std::string gpu_text(const Node& n, const nvml::Library& lib) {
  if (n.local.rank != 0) return "";
  std::ostringstream os;
  os << "node " << n.host << ": built without CUDA\n";
  for (int i = 0; i < lib.device_count(); ++i)
    if (auto d = lib.device(i))
      os << "  NVML GPU " << i << ": " << d->name().value_or("?") << ", "
         << (d->memory() ? gib(d->memory()->total) : std::string("? GiB")) << nvml_details(d) << "\n";
  os << nvml_line(lib);
  return os.str();
}
#endif

// Pairs of the node's GPUs in NVML's numbering: direct NVLinks, NVSwitch, or their PCIe level.
std::string topology_text(const Node& n, const nvml::Library& lib) {
  if (n.local.rank != 0) return "";
  std::ostringstream os;
  os << "node " << n.host << ": ";
  if (!lib.available()) return os.str() + "no NVML, topology unknown\n";
  std::vector<nvml::Device> gpus;
  std::vector<nvml::PciAddress> where;
  for (int i = 0; i < lib.device_count(); ++i)
    if (auto d = lib.device(i); d && d->pci()) {
      gpus.push_back(*d);
      where.push_back(*d->pci());
    }
  os << gpus.size() << " GPU(s)\n";
  const std::size_t g = gpus.size();
  // (g, g) active links between two GPUs; (g) to anything else: an NVSwitch, or an end NVML does not name
  std::vector<int> direct(g * g, 0), to_switch(g, 0);
  for (std::size_t i = 0; i < g; ++i)
    for (const nvml::NvLink& l : gpus[i].nvlinks()) {
      const auto j = static_cast<std::size_t>(l.remote ? std::find(where.begin(), where.end(), *l.remote) - where.begin() : g);
      if (j < g) ++direct[i * g + j];
      else ++to_switch[i];
    }
  for (std::size_t i = 0; i < g; ++i) {
    os << "  GPU " << i << " (" << gpus[i].pci_bus_id().value_or("?") << "): " << to_switch[i]
       << " NVLink(s) to NVSwitch";
    for (std::size_t j = 0; j < g; ++j)
      if (direct[i * g + j]) os << ", " << direct[i * g + j] << " to GPU " << j;
    os << "\n";
  }
  for (std::size_t i = 0; i < g; ++i)
    for (std::size_t j = i + 1; j < g; ++j) {
      os << "  GPU " << i << " - GPU " << j << ": ";
      if (direct[i * g + j]) os << "NVLink x" << direct[i * g + j];
      else if (to_switch[i] && to_switch[j]) os << "NVLink through NVSwitch";
      else if (auto t = gpus[i].common_ancestor(gpus[j])) os << nvml::topology_name(*t);
      else os << "unknown";
      os << "\n";
    }
  return os.str();
}

// One all-reduce size's line: time per call (slowest rank), algbw and busbw.
std::string bandwidth_line(std::size_t bytes, double seconds, int ranks) {
  const double algbw = static_cast<double>(bytes) / seconds / 1e9;
  const double busbw = algbw * 2.0 * (ranks - 1) / ranks;
  char b[160];
  std::snprintf(b, sizeof b, "  %12zu bytes  %10.1f us  algbw %8.3f GB/s  busbw %8.3f GB/s\n", bytes, seconds * 1e6,
                algbw, busbw);
  return b;
}

// fp32 sums, out of place, of --sizes over the world: every element checked (rank r sends r + 1).
// Each size is timed through comm::Mpi (non-blocking, polled: what dpml's host collectives do)
// and through the library's own blocking MPI_Allreduce, whose time closes the line: a dpml
// path much slower than the library's is worth a look on a new cluster.
void probe_mpi(const comm::Mpi& world, const Options& o) {
  const int p = world.size();
  if (world.rank() == 0)
    std::printf("MPI all-reduce, fp32 sum over %d rank(s), %d calls per size%s; dpml's polled path, then "
                "MPI_Allreduce's time:\n",
                p, o.iters, p == 1 ? " (one rank: nothing crosses a link, busbw 0)" : "");
  for (std::size_t bytes : o.bytes) {
    const std::size_t n = bytes / sizeof(float);
    const std::vector<float> send(n, static_cast<float>(world.rank() + 1));
    std::vector<float> recv(n, 0.f);
    const auto timed = [&](auto&& allreduce) {  // the slowest rank's seconds per call
      for (int i = 0; i < o.warmup; ++i) allreduce();
      world.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < o.iters; ++i) allreduce();
      const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.iters;
      return world.allreduce(mine, comm::ReduceOp::max);
    };
    const double dpml = timed([&] { world.allreduce(send.data(), recv.data(), n, comm::ReduceOp::sum); });
    const auto expected = static_cast<float>(p * (p + 1) / 2);
    const bool right = std::all_of(recv.begin(), recv.end(), [&](float v) { return v == expected; });
    DPML_REQUIRE_EVERYWHERE(world.allreduce(right ? 1 : 0, comm::ReduceOp::min) == 1,
                            "MPI all-reduce of " << bytes << " bytes gave a wrong sum on some rank");
    const double blocking = timed([&] {
      DPML_CHECK_MPI(MPI_Allreduce(send.data(), recv.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, world.native()));
    });
    if (world.rank() == 0) {
      std::string line = bandwidth_line(bytes, dpml, p);
      char tail[80];
      std::snprintf(tail, sizeof tail, "  MPI_Allreduce %10.1f us\n", blocking * 1e6);
      line.replace(line.size() - 1, 1, tail);
      std::fputs(line.c_str(), stdout);
    }
  }
  std::fflush(stdout);
}

#ifdef DPML_WITH_CUDA
// The same sums through comm::Nccl on each rank's GPU, timed with events on its stream.
void probe_nccl(const comm::Mpi& world, const Options& o) {
  const int p = world.size();
  const comm::Nccl nccl = comm::Nccl::from(world);
  int version = 0;
  ncclGetVersion(&version);
  if (world.rank() == 0)
    std::printf("NCCL %s all-reduce, fp32 sum over %d GPU(s), %d calls per size%s:\n", library_version(version).c_str(), p, o.iters,
                p == 1 ? " (one rank: a copy, busbw 0)" : "");
  const Event start(true), stop(true);
  for (std::size_t bytes : o.bytes) {
    const std::size_t n = bytes / sizeof(float);
    const std::vector<float> host(n, static_cast<float>(world.rank() + 1));
    Tensor<float, CudaSpace> send(Shape{static_cast<std::int64_t>(n)}), recv(Shape{static_cast<std::int64_t>(n)});
    SpaceCopy<CudaSpace, HostSpace>::copy(send.data(), host.data(), bytes);
    for (int i = 0; i < o.warmup; ++i) nccl.allreduce(send.data(), recv.data(), n, comm::ReduceOp::sum);
    nccl.request().wait();
    world.barrier();
    start.record(nccl.stream());
    for (int i = 0; i < o.iters; ++i) nccl.allreduce(send.data(), recv.data(), n, comm::ReduceOp::sum);
    stop.record(nccl.stream());
    const double mine = 1e-3 * stop.elapsed_ms_since(start) / o.iters;
    std::vector<float> back(n);
    SpaceCopy<HostSpace, CudaSpace>::copy(back.data(), recv.data(), bytes);
    const auto expected = static_cast<float>(p * (p + 1) / 2);
    const bool right = std::all_of(back.begin(), back.end(), [&](float v) { return v == expected; });
    DPML_REQUIRE_EVERYWHERE(world.allreduce(right ? 1 : 0, comm::ReduceOp::min) == 1,
                            "NCCL all-reduce of " << bytes << " bytes gave a wrong sum on some rank");
    const double slowest = world.allreduce(mine, comm::ReduceOp::max);
    if (world.rank() == 0) std::fputs(bandwidth_line(bytes, slowest, p).c_str(), stdout);
  }
  std::fflush(stdout);
}

// C = A·B, n³, bf16 operands and output, fp32 accumulation, on each rank's GPU; every element of
// A and B is 0x3F3F (0.74609375), so every element of C is n · 0.74609375² (checked at three).
void probe_gemm(const comm::Mpi& world, const Node& node, int device, const Options& o) {
  const std::int64_t n = o.gemm_size;
  Tensor<bf16, CudaSpace> a(Shape{n, n}), b(Shape{n, n}), c(Shape{n, n});  // (n, n) each
  DPML_CHECK_CUDA(cudaMemset(a.data(), 0x3F, static_cast<std::size_t>(n * n) * sizeof(bf16)));
  DPML_CHECK_CUDA(cudaMemset(b.data(), 0x3F, static_cast<std::size_t>(n * n) * sizeof(bf16)));
  DPML_CHECK_CUDA(cudaDeviceSynchronize());
  kernels::cuda::GemmContext ctx;
  const Stream stream;
  kernels::cuda::GemmArgs<bf16> g;
  g.M = g.N = g.K = n;
  g.A = a.data();
  g.B = b.data();
  g.C = c.data();
  g.lda = g.ldb = g.ldc = n;
  for (int i = 0; i < o.warmup; ++i) kernels::cuda::gemm<kernels::cuda::epilogue::None>(ctx, g, stream);
  stream.synchronize();
  const Event start(true), stop(true);
  start.record(stream);
  for (int i = 0; i < o.iters; ++i) kernels::cuda::gemm<kernels::cuda::epilogue::None>(ctx, g, stream);
  stop.record(stream);
  const double seconds = 1e-3 * stop.elapsed_ms_since(start) / o.iters;
  // Power under load: ~2 s of the same GEMM in chunks of ~50 ms, the meter read as each chunk
  // ends while the next one runs; its window is the last second. The operands are constant, so
  // few bits toggle: an H200 draws ~450 W here at 900 TFLOP/s, ~670 W training GPT-2 at 44 % MFU
  // (bench/RESULTS.md) — a floor for the GPU's power, not its training figure.
  const std::optional<nvml::Device> gpu = nvml::device_of_cuda(nvml::Library::instance(), device);
  std::optional<nvml::Lap> lap;
  constexpr int kChunks = 40;
  const int per_chunk = std::max(1, static_cast<int>(0.05 / seconds));
  if (gpu) {
    nvml::PowerMeter meter(*gpu, /*window_s=*/1.0);
    const Event done[2];
    for (int k = 0; k < kChunks; ++k) {
      for (int i = 0; i < per_chunk; ++i) kernels::cuda::gemm<kernels::cuda::epilogue::None>(ctx, g, stream);
      done[k % 2].record(stream);
      if (k > 0) {
        done[(k - 1) % 2].synchronize();
        lap = meter.lap();
      }
    }
    stream.synchronize();
  }
  bf16 corners[3];
  for (int k = 0; k < 3; ++k) {
    const std::int64_t at = k == 0 ? 0 : k == 1 ? n * n - 1 : (n / 2) * n + n / 3;
    SpaceCopy<HostSpace, CudaSpace>::copy(&corners[k], c.data() + at, sizeof(bf16));
  }
  const double expected = static_cast<double>(n) * 0.74609375 * 0.74609375;
  bool right = true;
  for (bf16 v : corners) right = right && std::abs(static_cast<double>(static_cast<float>(v)) - expected) <= 1e-2 * expected;
  DPML_REQUIRE_EVERYWHERE(world.allreduce(right ? 1 : 0, comm::ReduceOp::min) == 1,
                          "bf16 GEMM " << n << "^3 gave a wrong product on some rank (expected " << expected << ")");
  std::ostringstream os;
  os << "  rank " << world.rank() << " (" << node.host << ", GPU " << device << "): "
     << fixed(2.0 * static_cast<double>(n) * n * n / seconds / 1e12, 1) << " TFLOP/s";
  if (lap && lap->watts)
    os << ", " << fixed(*lap->watts, 0) << " W under load (" << (lap->from_energy_counter ? "energy counter" : "power samples")
       << ", " << kChunks * per_chunk << " more calls), " << fixed(2.0 * static_cast<double>(n) * n * n / seconds / *lap->watts / 1e12, 2)
       << " TFLOP/J";
  else
    os << ", power unknown (" << (gpu ? "NVML gives no power" : "no NVML") << ")";
  os << "\n";
  if (world.rank() == 0)
    std::printf("bf16 GEMM %lld^3 (cuBLASLt through kernels::cuda::gemm, fp32 accumulation), %d calls, checked:\n",
                static_cast<long long>(n), o.iters);
  print_nodes(world, os.str());
}

// GPU probes where every rank has a GPU of its own; else one line saying why not.
void probe_gpus(const comm::Mpi& world, const Node& node, const Options& o) {
  const int devices = cuda_device_count();
  const bool own = world.allreduce(devices >= node.local.size ? 1 : 0, comm::ReduceOp::min) == 1;
  if (!own) {
    if (world.rank() == 0)
      std::printf("NCCL all-reduce, bf16 GEMM: skipped (a node has no CUDA device, or fewer than its ranks)\n");
    return;
  }
  const int device = comm::select_device(world);
  probe_nccl(world, o);
  probe_gemm(world, node, device, o);
}
#else
void probe_gpus(const comm::Mpi& world, const Node&, const Options&) {
  if (world.rank() == 0) std::printf("NCCL all-reduce, bf16 GEMM: built without CUDA\n");
}
#endif

}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const comm::Mpi& world) {
    Options o;
    if (!parse(argc, argv, world.rank(), o)) return 0;
    const Node node = describe_node(world);
    const int nodes = world.allreduce(node.local.rank == 0 ? 1 : 0, comm::ReduceOp::sum);
    const nvml::Library& nvml = nvml::Library::instance();
    if (world.rank() == 0)
      std::printf("dpml-info (dpml %s): %d rank(s) on %d node(s)\n", DPML_VERSION_TEXT, world.size(), nodes);
    section(world, "host");
    print_nodes(world, host_text(node));
    section(world, "GPUs");
    print_nodes(world, gpu_text(node, nvml));
    section(world, "topology");
    print_nodes(world, topology_text(node, nvml));
    if (o.probe) {
      section(world, "probe");
      probe_mpi(world, o);
      probe_gpus(world, node, o);
    }
    return 0;
  });
}
