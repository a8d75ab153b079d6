#pragma once
// Where a training bench's device memory goes (bench/gpt_train, bench/resnet_train): the bytes
// this process took, by cudaMemGetInfo, from the MemoryPhases' construction to the end of each
// set-up phase it is told of (the Device, communicators, model, optimizer or trainer buffers, the
// first step's activations and scratch), printed as one JSON line per phase,
// {"bench":"<bench>","impl":..,"after":"<phase>","gib":..} — cumulative, so that a phase's share is
// its difference from the line before. Included by relative path; this folder is not a program.
#include <dpml/core/cuda_error.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <utility>
#include <vector>

namespace dpml::bench {

class MemoryPhases {
 public:
  using Phases = std::vector<std::pair<const char*, double>>;  // (phase, GiB taken by its end)

  MemoryPhases() : free0_(free_bytes()) {}

  // GiB of device memory taken since construction, now.
  double gib() const { return static_cast<double>(free0_ - free_bytes()) / (1 << 30); }
  // Records the memory taken so far as the end of `phase` (a string literal).
  void after(const char* phase) { phases_.emplace_back(phase, gib()); }
  const Phases& phases() const noexcept { return phases_; }

 private:
  static std::size_t free_bytes() {
    std::size_t free = 0, total = 0;
    DPML_CHECK_CUDA(cudaMemGetInfo(&free, &total));
    return free;
  }

  std::size_t free0_;
  Phases phases_;
};

// The JSON lines of `phases` (MemoryPhases::phases()) under the bench name `bench`.
inline void print_memory_phases(const char* bench, const char* impl, const MemoryPhases::Phases& phases) {
  for (const auto& [phase, gib] : phases)
    std::printf("{\"bench\":\"%s\",\"impl\":\"%s\",\"after\":\"%s\",\"gib\":%.3f}\n", bench, impl, phase, gib);
}

}  // namespace dpml::bench
