#pragma once
// Build configuration seen by every header: whether CUDA is on, and DPML_HD, which marks small
// functions (bf16 conversions, Philox) that compile for host and device alike.

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
