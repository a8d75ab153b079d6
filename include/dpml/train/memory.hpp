#pragma once
// How much memory this process uses, now and at most, in the memory space it trains on — for the
// metrics of a logged step. One declaration, one specialisation per space:
//
//   HostSpace  current: the resident set (/proc/self/statm, Linux; 0 where it is absent);
//              peak: the most resident at once (getrusage's ru_maxrss), never below current
//   CudaSpace  (CUDA translation units) current: the device's used memory, total − free from
//              cudaMemGetInfo — the CUDA context, NCCL's and the libraries' buffers included, and
//              every process on the device (ranks sharing a GPU see their sum);
//              peak: what current would have read when dpml's tensors (CudaSpace::allocate,
//              core/cuda_space.hpp, which counts them) were largest — current − their bytes now +
//              their most — taking the memory outside them (context, NCCL, workspaces, Device
//              scratch) as it is now: it only grows in dpml's runs, so this errs high, by what it
//              grew since; never below any current returned before. A step's tensor temporaries
//              count even when freed between two calls; buffers outside CudaSpace count as they
//              are when sampled (dpml's GPU steps keep theirs from step to step).
//
//   const train::MemoryUse m = train::memory_now<Space>();   // bytes
//   log.write({…, {"mem_gib", m.current_bytes / 1073741824.0}, {"peak_mem_gib", m.peak_bytes / 1073741824.0}});

#include "dpml/core/memory_space.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>

#if defined(__CUDACC__)
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/cuda_space.hpp"

#include <cuda_runtime.h>

#include <atomic>
#endif

namespace dpml::train {

struct MemoryUse {
  std::int64_t current_bytes = 0;
  std::int64_t peak_bytes = 0;
};

template <class Space>
MemoryUse memory_now() {
  static_assert(dependent_false<Space>, "dpml train::memory_now: no memory probe for this space (is this a CUDA build?)");
  return {};
}

template <>
inline MemoryUse memory_now<HostSpace>() {
  MemoryUse m;
  std::ifstream statm("/proc/self/statm");  // pages: size resident shared text lib data dirty
  std::int64_t size = 0, resident = 0;
  if (statm >> size >> resident) m.current_bytes = resident * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) == 0) m.peak_bytes = static_cast<std::int64_t>(ru.ru_maxrss) * 1024;  // KiB on Linux
  m.peak_bytes = std::max(m.peak_bytes, m.current_bytes);
  return m;
}

#if defined(__CUDACC__)
template <>
inline MemoryUse memory_now<CudaSpace>() {
  std::size_t free = 0, total = 0;
  DPML_CHECK_CUDA(cudaMemGetInfo(&free, &total));
  const CudaSpaceBytes& ours = cuda_space_bytes();
  const auto in_use = static_cast<std::int64_t>(ours.in_use.load(std::memory_order_relaxed));
  const auto most = static_cast<std::int64_t>(ours.peak.load(std::memory_order_relaxed));
  MemoryUse m;
  m.current_bytes = static_cast<std::int64_t>(total - free);
  static std::atomic<std::int64_t> highest{0};  // the largest peak returned so far
  std::int64_t top = highest.load(std::memory_order_relaxed);
  const std::int64_t peak = std::max(m.current_bytes + std::max<std::int64_t>(most - in_use, 0), top);
  while (peak > top && !highest.compare_exchange_weak(top, peak, std::memory_order_relaxed)) {
  }
  m.peak_bytes = std::max(peak, top);
  return m;
}
#endif

}  // namespace dpml::train
