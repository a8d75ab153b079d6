// Device halves of the core tests: Philox and bf16 on the GPU give the host's bits; tensors copy
// between spaces. Skipped (exit 77) without a GPU.
#include "gpu.hpp"
#include "test.hpp"

#include <dpml/core/bf16.hpp>
#include <dpml/core/cuda_space.hpp>
#include <dpml/core/philox.hpp>
#include <dpml/core/tensor.hpp>

#include <cuda_bf16.h>

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstdint>
#include <vector>

using namespace dpml;

__global__ void philox_kernel(std::uint64_t seed, std::uint64_t stream, std::uint32_t* out, float* uni, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    PhiloxStream s(seed, stream);
    out[i] = s.u32(static_cast<std::uint64_t>(i));
    uni[i] = s.uniform(static_cast<std::uint64_t>(i));
  }
}

__global__ void bf16_kernel(const float* in, std::uint16_t* ours, std::uint16_t* cudas, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    ours[i] = bf16(in[i]).bits;
    cudas[i] = std::bit_cast<std::uint16_t>(__float2bfloat16(in[i]));
  }
}

TEST_CASE("philox: the device stream equals the host stream", "[philox][gpu]") {
  const int n = 1 << 16;
  Tensor<std::uint32_t, CudaSpace> d_out(Shape{n});
  Tensor<float, CudaSpace> d_uni(Shape{n});
  philox_kernel<<<(n + 255) / 256, 256>>>(0xdeadbeefcafeull, 17, d_out.data(), d_uni.data(), n);
  DPML_CHECK_LAUNCH();
  auto out = to_space<HostSpace>(d_out.cview());
  auto uni = to_space<HostSpace>(d_uni.cview());
  PhiloxStream s(0xdeadbeefcafeull, 17);
  int mismatches = 0;
  for (int i = 0; i < n; ++i) mismatches += (out[i] != s.u32(i)) + (uni[i] != s.uniform(i));
  CHECK(mismatches == 0);
}

TEST_CASE("bf16: device conversion is bit-identical to the host's and CUDA's", "[bf16][gpu]") {
  // Every bf16 upper half with a spread of lower halves: ties, just-below, just-above, NaNs.
  const std::uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234, 0xedcb};
  std::vector<float> in;
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (auto lo : lows) in.push_back(std::bit_cast<float>(hi << 16 | lo));
  const int n = static_cast<int>(in.size());
  Tensor<float> h_in(Shape{n});
  std::copy(in.begin(), in.end(), h_in.begin());
  auto d_in = to_space<CudaSpace>(h_in.cview());
  Tensor<std::uint16_t, CudaSpace> d_ours(Shape{n}), d_cudas(Shape{n});
  bf16_kernel<<<(n + 255) / 256, 256>>>(d_in.data(), d_ours.data(), d_cudas.data(), n);
  DPML_CHECK_LAUNCH();
  auto ours = to_space<HostSpace>(d_ours.cview());
  auto cudas = to_space<HostSpace>(d_cudas.cview());
  int dev_vs_cuda = 0, dev_vs_host = 0;
  for (int i = 0; i < n; ++i) {
    dev_vs_cuda += ours[i] != cudas[i];
    dev_vs_host += ours[i] != bf16(in[static_cast<std::size_t>(i)]).bits;
  }
  CHECK(dev_vs_cuda == 0);
  CHECK(dev_vs_host == 0);
}

TEST_CASE("tensor: host → device → host copies keep every element", "[tensor][gpu]") {
  auto gen = test::rng(3);
  auto h = test::random_tensor<float>(Shape{1000003}, gen);
  auto d = to_space<CudaSpace>(h.cview());
  Tensor<float, CudaSpace> d2(h.shape());
  copy(d2.view(), d.cview());
  auto back = to_space<HostSpace>(d2.cview());
  CHECK(test::rel_error(back, h) == 0.0);
}

TEST_CASE("pinned host memory: page-locked, and copies through it keep every element", "[tensor][gpu]") {
  static_assert(std::same_as<host_mirror_space_t<CudaSpace>, PinnedHostSpace>);
  static_assert(std::same_as<host_mirror_space_t<HostSpace>, HostSpace>);
  const std::int64_t n = 1000003;
  Tensor<float, PinnedHostSpace> pinned(Shape{n});
  cudaPointerAttributes attributes{};
  REQUIRE(cudaPointerGetAttributes(&attributes, pinned.data()) == cudaSuccess);
  CHECK(attributes.type == cudaMemoryTypeHost);  // pageable memory reads cudaMemoryTypeUnregistered
  auto gen = test::rng(4);
  const auto h = test::random_tensor<float>(Shape{n}, gen);
  std::copy(h.data(), h.data() + n, pinned.data());
  Tensor<float, CudaSpace> d(Shape{n});
  SpaceCopy<CudaSpace, HostSpace>::copy(d.data(), pinned.data(), static_cast<std::size_t>(n) * sizeof(float));
  Tensor<float, PinnedHostSpace> back(Shape{n});
  SpaceCopy<HostSpace, CudaSpace>::copy(back.data(), d.data(), static_cast<std::size_t>(n) * sizeof(float));
  std::int64_t differ = 0;
  for (std::int64_t i = 0; i < n; ++i) differ += back.data()[i] != h.data()[i];
  CHECK(differ == 0);
}
