#pragma once
// Deterministic column sums over many rows: Σ_r f(r, c) for K quantities at once, without atomics,
// so that parameter gradients (LayerNorm's dw/db, a Linear's db) are bit-identical from run to run.
//
// Stage 1: a block of (32 columns × 8 row lanes) sums kRowChunk rows of its 32 columns and writes
// one partial per (chunk, k, column) to `scratch`; 32 consecutive columns per warp keep the loads
// coalesced, and (columns / 32) × (rows / kRowChunk) blocks fill the GPU even for C = 768.
// Stage 2: per column, 32 lanes add strided chunk partials in order, a fixed tree adds the lanes,
// and the K sums go to `out` (final_kernel).
//
// f is a functor `Sums<K> operator()(std::int64_t r, int c) const` (device), out a functor
// `void operator()(int c, const Sums<K>&) const`.

#include "dpml/kernels/cuda/common.hpp"

#include <cuda_runtime.h>

#include <cstdint>

namespace dpml::kernels::cuda {

template <int K>
struct Sums {
  float v[K];
};

namespace detail::colsum {

inline constexpr int kRowChunk = 256;
inline constexpr int kFinalLanes = 32;

template <int K, class F>
__global__ void partial_kernel(F f, float* __restrict__ partial, std::int64_t rows, int C) {
  __shared__ float s[K][8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kRowChunk;
  const std::int64_t r1 = r0 + kRowChunk < rows ? r0 + kRowChunk : rows;
  Sums<K> acc{};
  if (c < C)
#pragma unroll 8  // eight independent loads in flight per thread: the pass is bound by memory latency otherwise
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const Sums<K> v = f(r, c);
#pragma unroll
      for (int k = 0; k < K; ++k) acc.v[k] += v.v[k];
    }
#pragma unroll
  for (int k = 0; k < K; ++k) s[k][threadIdx.y][threadIdx.x] = acc.v[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float t = s[k][0][threadIdx.x];
      for (int i = 1; i < 8; ++i) t += s[k][i][threadIdx.x];
      partial[(static_cast<std::int64_t>(blockIdx.y) * K + k) * C + c] = t;
    }
  }
}

// One block per 32 columns: lane y adds chunks y, y + 32, … in order, then the 32 lanes are added
// by a fixed tree in shared memory — the same order every run, and the chunks are read by 1024
// threads per 32 columns instead of one serial loop per column (BatchNorm's stem has 12544 chunks).
template <int K, class Out>
__global__ void final_kernel(const float* __restrict__ partial, Out out, int chunks, int C) {
  __shared__ float s[K][kFinalLanes][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  Sums<K> acc{};
  if (c < C)
    for (int j = threadIdx.y; j < chunks; j += kFinalLanes)
#pragma unroll
      for (int k = 0; k < K; ++k) acc.v[k] += partial[(static_cast<std::int64_t>(j) * K + k) * C + c];
#pragma unroll
  for (int k = 0; k < K; ++k) s[k][threadIdx.y][threadIdx.x] = acc.v[k];
  __syncthreads();
  for (int half = kFinalLanes / 2; half > 0; half /= 2) {
    if (threadIdx.y < half)
#pragma unroll
      for (int k = 0; k < K; ++k) s[k][threadIdx.y][threadIdx.x] += s[k][threadIdx.y + half][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && c < C) {
#pragma unroll
    for (int k = 0; k < K; ++k) acc.v[k] = s[k][0][threadIdx.x];
    out(c, acc);
  }
}

}  // namespace detail::colsum

// Floats of scratch that column_sums<K> needs for (rows, C).
inline std::int64_t column_sums_scratch(std::int64_t rows, std::int64_t C, int K) {
  return ceil_div(rows, detail::colsum::kRowChunk) * K * C;
}

template <int K, class F, class Out>
void column_sums(F f, Out out, float* scratch, std::int64_t rows, std::int64_t C, cudaStream_t stream) {
  if (C == 0) return;
  using namespace detail::colsum;
  const auto chunks = static_cast<unsigned>(ceil_div(rows, kRowChunk));
  if (chunks > 0) {
    partial_kernel<K><<<dim3(static_cast<unsigned>(ceil_div(C, 32)), chunks), dim3(32, 8), 0, stream>>>(
        f, scratch, rows, static_cast<int>(C));
    DPML_CHECK_LAUNCH();
  }
  final_kernel<K><<<static_cast<unsigned>(ceil_div(C, 32)), dim3(32, kFinalLanes), 0, stream>>>(
      scratch, out, static_cast<int>(chunks), static_cast<int>(C));
  DPML_CHECK_LAUNCH();
}

}  // namespace dpml::kernels::cuda
