#pragma once
// What the GPU benches share for timing: a run of steps timed with CUDA events (bench/gpt_train,
// bench/resnet_train, bench/kernels), and one more step bracketed for a profiler (included by
// relative path; this folder is not a program).
#include <dpml/core/cuda_error.hpp>

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>

namespace dpml::bench {

// Milliseconds per call of `steps` calls of step(), timed by events on `stream` (a training step
// is expected to end with its loss read back, as a training loop that prints it does).
template <class Step>
double ms_per_step(int steps, cudaStream_t stream, Step&& step) {
  cudaEvent_t t0, t1;
  DPML_CHECK_CUDA(cudaEventCreate(&t0));
  DPML_CHECK_CUDA(cudaEventCreate(&t1));
  DPML_CHECK_CUDA(cudaEventRecord(t0, stream));
  for (int i = 0; i < steps; ++i) step();
  DPML_CHECK_CUDA(cudaEventRecord(t1, stream));
  DPML_CHECK_CUDA(cudaEventSynchronize(t1));
  float ms = 0;
  DPML_CHECK_CUDA(cudaEventElapsedTime(&ms, t0, t1));
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  return ms / steps;
}

// One more step() between cudaProfilerStart and cudaProfilerStop: the one step that
// `ncu --profile-from-start off` records (bench/gpt_train/kernel_diff.py compares two such runs).
template <class Step>
void profiled_step(Step&& step) {
  DPML_CHECK_CUDA(cudaDeviceSynchronize());
  DPML_CHECK_CUDA(cudaProfilerStart());
  step();
  DPML_CHECK_CUDA(cudaDeviceSynchronize());
  DPML_CHECK_CUDA(cudaProfilerStop());
}

}  // namespace dpml::bench
