#pragma once
// What the one-GPU models (models/cuda/) share: a per-family kernel timer and the bump carving of
// one device allocation into typed slices.
//
//   KernelProfiler<Family>  CUDA event pairs around kernel families (Family: an enum whose last
//                           enumerator is `count`); collect() synchronises and sums the
//                           milliseconds per family. A model brackets each family with timed();
//                           with no profiler attached that costs nothing.
//   Carver                  slices of one byte buffer at 256-byte-aligned offsets: run the same
//                           sequence of take() once on a null base to size the buffer, then again
//                           on the allocation (rebase) to get the pointers.
//   align_up                flat-buffer offsets rounded up to 64 elements (128 bytes of bf16), so
//                           every tensor slice is 16-byte aligned for vector loads and cuBLASLt.

#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dpml::models::cuda {

template <class Family>
class KernelProfiler {
 public:
  static constexpr int kFamilies = static_cast<int>(Family::count);

  explicit KernelProfiler(int max_pairs = 4096) : events_(2 * static_cast<std::size_t>(max_pairs)) {
    for (auto& e : events_) DPML_CHECK_CUDA(cudaEventCreate(&e));
  }
  KernelProfiler(const KernelProfiler&) = delete;
  KernelProfiler& operator=(const KernelProfiler&) = delete;
  ~KernelProfiler() {
    for (auto e : events_) cudaEventDestroy(e);
  }
  void begin(Family f, cudaStream_t s) {
    DPML_REQUIRE(used_ + 2 <= events_.size(), "Profiler: more than " << events_.size() / 2 << " timed ranges in one window");
    DPML_CHECK_CUDA(cudaEventRecord(events_[used_], s));
    families_.push_back(f);
  }
  void end(cudaStream_t s) {
    DPML_CHECK_CUDA(cudaEventRecord(events_[used_ + 1], s));
    used_ += 2;
  }
  // Milliseconds per family since the last collect(); synchronises.
  std::array<double, kFamilies> collect() {
    std::array<double, kFamilies> ms{};
    if (used_) DPML_CHECK_CUDA(cudaEventSynchronize(events_[used_ - 1]));
    for (std::size_t i = 0; i < families_.size(); ++i) {
      float t = 0.f;
      DPML_CHECK_CUDA(cudaEventElapsedTime(&t, events_[2 * i], events_[2 * i + 1]));
      ms[static_cast<int>(families_[i])] += t;
    }
    families_.clear();
    used_ = 0;
    return ms;
  }

  // run() bracketed by events when a profiler is attached (p may be null).
  template <class F>
  static void timed(KernelProfiler* p, Family f, cudaStream_t s, F&& run) {
    if (p) p->begin(f, s);
    run();
    if (p) p->end(s);
  }

 private:
  std::vector<cudaEvent_t> events_;
  std::vector<Family> families_;
  std::size_t used_ = 0;
};

namespace detail {

inline constexpr std::int64_t kAlign = 64;  // elements: 128 bytes of bf16
inline std::int64_t align_up(std::int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Bump allocation of typed slices inside one device byte buffer.
class Carver {
 public:
  template <class T>
  T* take(std::int64_t n) {
    const std::size_t off = (bytes_ + 255) / 256 * 256;
    bytes_ = off + static_cast<std::size_t>(n) * sizeof(T);
    return reinterpret_cast<T*>(base_ + off);
  }
  std::size_t bytes() const { return bytes_; }
  void rebase(char* base) {
    base_ = base;
    bytes_ = 0;
  }

 private:
  char* base_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace detail
}  // namespace dpml::models::cuda
