#pragma once
// Named ranges for a profiler's timeline: with Nsight Systems attached (`nsys profile -t cuda,nvtx,
// mpi …`), each pipeline action (F3, B3, W3: micro-batch 3), each gradient bucket's reduction, the
// optimizer's step and each checkpoint save shows as a bar on the host's row above the kernels it
// launched, so the timeline reads as the schedule. Where dpml::cuda is linked (DPML_WITH_CUDA) a
// range is an NVTX 3 push/pop (the toolkit's header-only nvtx3/nvToolsExt.h: a few nanoseconds when
// no tool listens) in host C++ and CUDA units alike — one definition for every unit of a program;
// in the host build it is empty and costs nothing.
//
//   { NvtxRange r("optimizer step"); ...; }      // one range, popped at scope exit
//   { NvtxRange r('F', mb); stage.forward(mb); } // "F<mb>"

#if defined(DPML_WITH_CUDA)
#include <nvtx3/nvToolsExt.h>

#include <cstdio>
#endif

namespace dpml {

class NvtxRange {
 public:
  explicit NvtxRange([[maybe_unused]] const char* name) {
#if defined(DPML_WITH_CUDA)
    nvtxRangePushA(name);
#endif
  }
  // `kind` followed by `index`, e.g. ('F', 3) → "F3".
  NvtxRange([[maybe_unused]] char kind, [[maybe_unused]] long long index) {
#if defined(DPML_WITH_CUDA)
    char name[24];
    std::snprintf(name, sizeof name, "%c%lld", kind, index);
    nvtxRangePushA(name);
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
  ~NvtxRange() {
#if defined(DPML_WITH_CUDA)
    nvtxRangePop();
#endif
  }
};

}  // namespace dpml
