#pragma once
// Build configuration seen by every header: whether CUDA is on, and DPML_HD, which marks small
// functions (bf16 conversions, Philox) that compile for host and device alike.
//
// A program may mix host C++ units and CUDA units that include the same headers (examples/
// train_gpt: main.cpp and gpu_*.cu), so an inline function must have one body in both: a header
// keys CUDA runtime calls (NVTX, the profiler API, device queries) on DPML_WITH_CUDA, the same in
// every unit of a dpml::cuda target, and uses __CUDACC__ only to add what host C++ cannot compile
// (kernels, device functions, CudaSpace specialisations), never to change a shared body.

#if defined(__CUDACC__)
#define DPML_HD __host__ __device__
#define DPML_DEVICE_COMPILE 1
#else
#define DPML_HD
#endif

#if defined(DPML_WITH_CUDA)
#define DPML_CUDA_ENABLED 1
#else
#define DPML_CUDA_ENABLED 0
#endif

namespace dpml {
inline constexpr bool cuda_enabled = DPML_CUDA_ENABLED != 0;
}
