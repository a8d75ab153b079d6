#pragma once
// --profile-steps A:B — the steps a profiler records. Nsight Systems started with
// `--capture-range=cudaProfilerApi` (and Nsight Compute with `--profile-from-start off`) records
// only between cudaProfilerStart and cudaProfilerStop: the trainer's loop calls before(step) and
// after(step), which start the capture before step A and stop it after step B, so a long run
// yields a timeline of the steady state, not of the start-up. The NVTX ranges of core/nvtx.hpp
// name what runs inside. Parsed with the flags (A and B ≥ 1, A ≤ B; refused naming the flag);
// without dpml::cuda (DPML_WITH_CUDA, the same in a program's host and CUDA units) before/after do
// nothing.
//
//   const auto window = train::ProfileSteps::parse("--profile-steps", "10:12");
//   for (step …) { window.before(step); trainer.train_step(…); window.after(step); }

#include "dpml/core/error.hpp"

#if defined(DPML_WITH_CUDA)
#include "dpml/core/cuda_error.hpp"

#include <cuda_profiler_api.h>
#endif

#include <cstdint>
#include <stdexcept>
#include <string>

namespace dpml::train {

struct ProfileSteps {
  std::int64_t first = 0, last = -1;  // [first, last]; empty when last < first

  // "A:B" (or "" for none) as given to `flag`.
  static ProfileSteps parse(const std::string& flag, const std::string& text) {
    if (text.empty()) return {};
    ProfileSteps w;
    std::size_t colon = text.find(':'), end_a = 0, end_b = 0;
    bool ok = colon != std::string::npos;
    try {
      if (ok) {
        const std::string a = text.substr(0, colon), b = text.substr(colon + 1);
        w.first = std::stoll(a, &end_a), w.last = std::stoll(b, &end_b);
        ok = end_a == a.size() && end_b == b.size();
      }
    } catch (const std::exception&) {
      ok = false;
    }
    DPML_REQUIRE_EVERYWHERE(ok && w.first >= 1 && w.first <= w.last,
                            flag << " " << text << " is not A:B with steps 1 <= A <= B (e.g. 10:12)");
    return w;
  }
  bool empty() const noexcept { return last < first; }
  void before([[maybe_unused]] std::int64_t step) const {
#if defined(DPML_WITH_CUDA)
    if (!empty() && step == first) DPML_CHECK_CUDA(cudaProfilerStart());
#endif
  }
  void after([[maybe_unused]] std::int64_t step) const {
#if defined(DPML_WITH_CUDA)
    if (!empty() && step == last) DPML_CHECK_CUDA(cudaProfilerStop());
#endif
  }
};

}  // namespace dpml::train
