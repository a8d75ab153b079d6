#pragma once
// Refusing a size that cannot fit, before anything is allocated: a program estimates the bytes its
// largest rank will hold (models::Gpt: models::estimate_gpt_memory, models/gpt_memory.hpp — what
// the layers, trainer and optimizer really allocate) and require_fits compares it with the memory
// a rank of this launch has — on the host, the node's MemAvailable (/proc/meminfo; else the free
// physical pages) shared by the node's ranks; on a GPU (CUDA translation units), its free device
// memory shared by the node's ranks on that GPU (comm::GpuPlacement::gpu_ranks) — the smallest
// over the world. Too large is one Error on every rank alike, naming the estimate, what drives it
// (the flags) and what is there, instead of a std::bad_alloc naming nothing after minutes of
// set-up. An estimate is not a bound: a run within a few percent of the memory may still fail.
//
//   const double need = models::estimate_gpt_memory(cfg, layout, terms).largest().total();
//   train::require_fits(world, need, train::host_bytes_per_rank(world), "the GPT of --num-layers …");
//   train::require_fits(world, need_on_gpu, train::device_bytes_per_rank(world, gpus), "…", train::kDeviceMemory);

#include "dpml/comm/local_rank.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"

#if defined(__CUDACC__)
#include "dpml/comm/cuda_placement.hpp"
#include "dpml/core/cuda_error.hpp"

#include <cuda_runtime.h>
#endif

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace dpml::train {

// Bytes of host memory the node has available now (MemAvailable), or its free physical pages
// where /proc/meminfo is missing.
inline double host_available_bytes() {
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    double kib = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::strncmp(line, "MemAvailable:", 13) == 0 && std::sscanf(line + 13, "%lf", &kib) == 1) break;
    std::fclose(f);
    if (kib >= 0) return kib * 1024.0;
  }
  return static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// The host memory one rank may use: its node's available bytes over the node's ranks, the smallest
// over the world (the same on every rank). Collective over `world`.
inline double host_bytes_per_rank(const comm::Mpi& world) {
  const comm::NodeRank node = comm::node_local_rank(world);
  return world.allreduce(host_available_bytes() / node.size, comm::ReduceOp::min);
}

#if defined(__CUDACC__)
// The device memory one rank may use: the free memory of its current GPU over the ranks of its
// node on that GPU (`gpus`, from comm::place_on_gpus, which made the GPU current: ranks sharing a
// GPU through comm::Staged split it), the smallest over the world. Call before allocating.
// Collective over `world`.
inline double device_bytes_per_rank(const comm::Mpi& world, const comm::GpuPlacement& gpus) {
  std::size_t free = 0, total = 0;
  DPML_CHECK_CUDA(cudaMemGetInfo(&free, &total));
  return world.allreduce(static_cast<double>(free) / gpus.gpu_ranks, comm::ReduceOp::min);
}
#endif

// What `have` of require_fits is, for its message.
inline constexpr const char* kHostMemory = "the node's available memory over its ranks";
inline constexpr const char* kDeviceMemory = "the GPU's free memory over the ranks on it";
inline constexpr const char* kPlannedMemory = "--gpu-memory-gib";

// Refuses, on every rank alike, a run whose estimate `need` (bytes, this rank's; the largest
// over the world is compared) exceeds `have` (bytes a rank has, the same on every rank).
// `what`: the estimate's parts and the flags that drive them, for the message; `memory`: what
// `have` is (kHostMemory, kDeviceMemory). Collective.
inline void require_fits(const comm::Mpi& world, double need, double have, const std::string& what,
                         const char* memory = kHostMemory) {
  need = world.allreduce(need, comm::ReduceOp::max);
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  char sizes[160];
  std::snprintf(sizes, sizeof sizes, "an estimated %.3g GiB on a rank, more than the %.3g GiB a rank has", need / kGiB,
                have / kGiB);
  DPML_REQUIRE_EVERYWHERE(need <= have, what << " need " << sizes
                                             << " (" << memory << "): make them smaller or "
                                                "spread the model over more ranks (--tp, --pp)");
}

}  // namespace dpml::train
