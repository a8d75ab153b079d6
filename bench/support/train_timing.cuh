#pragma once
// What the GPU benches share for timing: a run of steps timed with CUDA events (bench/gpt_train,
// bench/resnet_train, bench/kernels), and for the training benches one more step under a
// per-family kernel profiler, printed as JSON lines and a Markdown table (included by relative
// path; this folder is not a program).
#include <dpml/core/cuda_error.hpp>

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdio>
#include <string_view>

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

// Milliseconds per kernel family of one more step() with a Profiler (models/cuda/profiler.hpp)
// attached to the model.
template <class Profiler, class Model, class Step>
auto family_ms(Model& model, Step&& step) {
  Profiler prof;
  model.set_profiler(&prof);
  step();
  const auto ms = prof.collect();
  model.set_profiler(nullptr);
  return ms;
}

// One JSON line per family: {"bench":<bench>,"impl":..,"family":..,"ms":..,"share":..}.
template <std::size_t F>
void print_families(const char* bench, const char* impl, const std::array<double, F>& ms,
                    const std::array<std::string_view, F>& names) {
  double total = 0;
  for (double m : ms) total += m;
  for (std::size_t f = 0; f < F; ++f)
    std::printf("{\"bench\":\"%s\",\"impl\":\"%s\",\"family\":\"%.*s\",\"ms\":%.3f,\"share\":%.4f}\n", bench, impl,
                static_cast<int>(names[f].size()), names[f].data(), ms[f], total > 0 ? ms[f] / total : 0.0);
}
// The same as a Markdown table.
template <std::size_t F>
void print_family_table(const std::array<double, F>& ms, const std::array<std::string_view, F>& names) {
  double total = 0;
  for (double m : ms) total += m;
  std::printf("| kernel family | ms (one profiled step) | share |\n|---|---|---|\n");
  for (std::size_t f = 0; f < F; ++f)
    std::printf("| %.*s | %.2f | %.1f%% |\n", static_cast<int>(names[f].size()), names[f].data(), ms[f],
                total > 0 ? 100 * ms[f] / total : 0.0);
}

}  // namespace dpml::bench
