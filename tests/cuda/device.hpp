#pragma once
// Helpers for the CUDA kernel tests: random bf16/float host vectors, device copies, poisoning
// (every byte 0xFF: a NaN in bf16 and in float, so an element a kernel forgot to write fails the
// comparison), and relative L2 errors against float64 references.
#include "gpu.hpp"
#include "test.hpp"

#include <dpml/core/bf16.hpp>
#include <dpml/core/cuda_error.hpp>
#include <dpml/core/cuda_space.hpp>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

namespace dpml::test {

// Tolerances: relative L2 error for results stored in bf16 (8 significant bits: one rounding is
// up to 2^-9 relative; fp16's 11 bits are checked against the same bound) and for fp32 paths
// (float arithmetic against a float64 reference).
inline constexpr double kBf16Tol = 1e-2;
inline constexpr double kFp32Tol = 1e-5;

template <class T>
std::vector<T> random_vec(std::size_t n, std::mt19937_64& gen, double lo = -1.0, double hi = 1.0) {
  std::vector<T> v(n);
  std::uniform_real_distribution<double> u(lo, hi);
  for (auto& x : v) x = T(static_cast<float>(u(gen)));
  return v;
}

template <class T>
struct DeviceVec {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceVec(std::size_t count) : n(count) { DPML_CHECK_CUDA(cudaMalloc(&ptr, std::max<std::size_t>(n, 1) * sizeof(T))); }
  explicit DeviceVec(const std::vector<T>& h) : DeviceVec(h.size()) { upload(h); }
  DeviceVec(const DeviceVec&) = delete;
  ~DeviceVec() { cudaFree(ptr); }
  // Both copies are done before they return (core/cuda_space.hpp's SpaceCopy: from pageable
  // memory a plain cudaMemcpy may return while its DMA still runs, which a Device's non-blocking
  // stream does not wait for).
  void upload(const std::vector<T>& h) { SpaceCopy<CudaSpace, HostSpace>::copy(ptr, h.data(), h.size() * sizeof(T)); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    SpaceCopy<HostSpace, CudaSpace>::copy(h.data(), ptr, n * sizeof(T));
    return h;
  }
  // Done before it returns: cudaMemset may run after the host goes on, on the legacy stream, which a
  // Device's non-blocking stream does not wait for (a 120 MB poison landed after the kernel did).
  void poison() {
    DPML_CHECK_CUDA(cudaMemset(ptr, 0xFF, n * sizeof(T)));
    DPML_CHECK_CUDA(cudaDeviceSynchronize());
  }
};

inline double as_double(bf16 v) { return static_cast<double>(static_cast<float>(v)); }
inline double as_double(__half v) { return static_cast<double>(__half2float(v)); }
inline double as_double(float v) { return v; }
inline double as_double(double v) { return v; }

// ‖got − want‖₂ / ‖want‖₂ over the listed indices (all when idx is empty); NaN if any got is NaN.
template <class G>
double rel_l2(const std::vector<G>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = as_double(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  std::vector<double> d(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) d[i] = as_double(v[i]);
  return d;
}

// True if every 16-bit or 32-bit word is still the poison pattern.
template <class T>
bool still_poisoned(const T& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(&v);
  for (std::size_t i = 0; i < sizeof(T); ++i)
    if (p[i] != 0xFF) return false;
  return true;
}

}  // namespace dpml::test
