// Background NVLink traffic shaped like a 2-GPU data-parallel step's, with no compute and no sync:
// every PERIOD ms, MB megabytes pushed each way between GPU 0 and GPU 1 by their copy engines,
// in 25 MB copies spread over SPREAD ms. Usage: traffic SECONDS PERIOD_MS MB SPREAD_MS
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
int main(int argc, char** argv) {
  if (argc < 5) return 2;
  const double seconds = atof(argv[1]), period = atof(argv[2]), mb = atof(argv[3]), spread = atof(argv[4]);
  const size_t chunk = size_t{25} << 20;
  const int chunks = static_cast<int>(mb * (1 << 20) / chunk);
  void *a0, *b0, *a1, *b1;
  cudaStream_t s0, s1;
  cudaSetDevice(0); cudaDeviceEnablePeerAccess(1, 0); cudaMalloc(&a0, chunk); cudaMalloc(&b0, chunk);
  cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking);
  cudaSetDevice(1); cudaDeviceEnablePeerAccess(0, 0); cudaMalloc(&a1, chunk); cudaMalloc(&b1, chunk);
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  using clk = std::chrono::steady_clock;
  const auto start = clk::now();
  long periods = 0;
  while (std::chrono::duration<double>(clk::now() - start).count() < seconds) {
    const auto p0 = clk::now();
    for (int c = 0; c < chunks; ++c) {
      cudaMemcpyAsync(b1, a0, chunk, cudaMemcpyDefault, s0);
      cudaMemcpyAsync(b0, a1, chunk, cudaMemcpyDefault, s1);
      std::this_thread::sleep_until(p0 + std::chrono::duration<double, std::milli>(spread * (c + 1) / chunks));
    }
    std::this_thread::sleep_until(p0 + std::chrono::duration<double, std::milli>(period));
    ++periods;
  }
  cudaStreamSynchronize(s1); cudaSetDevice(0); cudaStreamSynchronize(s0);
  std::printf("traffic: %ld periods of %.0f ms, %d × 25 MB each way per period (%s)\n", periods, period, chunks,
              cudaGetErrorString(cudaGetLastError()));
  return 0;
}
