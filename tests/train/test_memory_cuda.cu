// train/memory.hpp and train/flops.hpp on a GPU: the device's memory now and at most follow a
// 256 MiB tensor in and out, a temporary freed between two calls still shows in the peak, and
// this GPU's name is in the bf16 peak table (the lent machines are H100s and H200s).
#include "gpu.hpp"
#include "test.hpp"

#include <dpml/core/cuda_space.hpp>
#include <dpml/core/tensor.hpp>
#include <dpml/train/flops.hpp>
#include <dpml/train/memory.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

using namespace dpml;

TEST_CASE("memory_now<CudaSpace>: a tensor shows in current and peak; a freed temporary in peak", "[train][memory][gpu]") {
  constexpr std::int64_t MiB = 1 << 20;
  const train::MemoryUse before = train::memory_now<CudaSpace>();
  CAPTURE(before.current_bytes, before.peak_bytes);
  CHECK(before.current_bytes > 0);
  CHECK(before.peak_bytes >= before.current_bytes);

  train::MemoryUse during;
  {
    Tensor<float, CudaSpace> held(Shape{256 * MiB / 4});
    during = train::memory_now<CudaSpace>();
  }
  CAPTURE(during.current_bytes, during.peak_bytes);
  CHECK(during.current_bytes >= before.current_bytes + 250 * MiB);
  CHECK(during.peak_bytes >= during.current_bytes);

  const train::MemoryUse after = train::memory_now<CudaSpace>();  // freed: current falls, peak stays
  CAPTURE(after.current_bytes, after.peak_bytes);
  CHECK(after.current_bytes <= during.current_bytes - 250 * MiB);
  CHECK(after.peak_bytes >= during.current_bytes);

  { Tensor<float, CudaSpace> temporary(Shape{512 * MiB / 4}); }  // never sampled while held
  const train::MemoryUse later = train::memory_now<CudaSpace>();
  CAPTURE(later.current_bytes, later.peak_bytes);
  CHECK(later.peak_bytes >= later.current_bytes + 500 * MiB);
}

TEST_CASE("device_peak_bf16_tflops: this GPU is in the table", "[train][flops][gpu]") {
  cudaDeviceProp prop{};
  DPML_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  CAPTURE(prop.name);
  const double peak = train::device_peak_bf16_tflops(true, 0);
  CHECK(peak == train::peak_bf16_tflops(prop.name));
  CHECK(std::isfinite(peak));
}
