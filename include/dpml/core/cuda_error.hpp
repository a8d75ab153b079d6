#pragma once
// Checked calls for the CUDA runtime, NCCL, cuBLAS and cuDNN: each failing call becomes a
// dpml::Error naming the call and the library's own error text. CUDA builds only (DPML_WITH_CUDA).

#include "dpml/core/error.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

namespace dpml::detail {
inline std::string cublas_status_text(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS status " + std::to_string(static_cast<int>(s));
  }
}
}  // namespace dpml::detail

#define DPML_CHECK_CUDA(call)                                                                   \
  do {                                                                                          \
    const cudaError_t dpml_cuda_rc_ = (call);                                                   \
    if (dpml_cuda_rc_ != cudaSuccess)                                                           \
      throw ::dpml::Error(std::string(#call) + " failed: " + cudaGetErrorName(dpml_cuda_rc_) + \
                          " (" + cudaGetErrorString(dpml_cuda_rc_) + ")");                      \
  } while (0)

// After a kernel launch: the launch's own error (bad configuration), not an asynchronous one.
#define DPML_CHECK_LAUNCH() DPML_CHECK_CUDA(cudaGetLastError())

#define DPML_CHECK_NCCL(call)                                                                  \
  do {                                                                                         \
    const ncclResult_t dpml_nccl_rc_ = (call);                                                 \
    if (dpml_nccl_rc_ != ncclSuccess)                                                          \
      throw ::dpml::Error(std::string(#call) + " failed: " + ncclGetErrorString(dpml_nccl_rc_)); \
  } while (0)

#define DPML_CHECK_CUBLAS(call)                                                        \
  do {                                                                                 \
    const cublasStatus_t dpml_cublas_rc_ = (call);                                     \
    if (dpml_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                      \
      throw ::dpml::Error(std::string(#call) + " failed: " +                           \
                          ::dpml::detail::cublas_status_text(dpml_cublas_rc_));        \
  } while (0)

// cuDNN is optional (DPML_HAS_CUDNN), so this header does not include <cudnn.h>: the macro expands
// only in code that does (kernels/cuda/conv/cudnn.hpp).
#define DPML_CHECK_CUDNN(call)                                                         \
  do {                                                                                 \
    const cudnnStatus_t dpml_cudnn_rc_ = (call);                                       \
    if (dpml_cudnn_rc_ != CUDNN_STATUS_SUCCESS)                                        \
      throw ::dpml::Error(std::string(#call) + " failed: " +                           \
                          cudnnGetErrorString(dpml_cudnn_rc_));                        \
  } while (0)
