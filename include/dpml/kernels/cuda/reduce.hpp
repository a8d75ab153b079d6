#pragma once
// Deterministic column sums over many rows: Σ_r f(r, c) for K quantities at once, without atomics,
// so that parameter gradients (LayerNorm's dw/db, a Linear's db, BatchNorm's statistics) are
// bit-identical from run to run.
//
// Stage 1 (partial_kernel): a block of 256 threads takes kRowChunk rows of G·V columns: G column
// groups of V adjacent columns (V = 8: one 16-byte load per tensor and row when the columns are
// bf16 and aligned; V = 1: one element) times L = 256 / G row lanes; each lane adds its rows in
// order, the lanes are added in order in shared memory, and one partial per (chunk, k, column)
// goes to `scratch`. G = 32 groups for wide matrices (coalesced rows of 32·V columns), fewer for
// narrow ones (BatchNorm's 64 channels: 8 groups × 32 lanes), so every thread has work.
// Stage 2 (final_kernel): per column, 32 lanes add strided chunk partials in order, a fixed tree
// adds the lanes, and the K sums go to `out`.
//
// What is summed: column_sums_v<K, V>(f, out, …) with f's `State setup(int c0) const`
// (per-thread constants of columns c0 … c0 + V − 1, loaded once) and `void add(const State&,
// std::int64_t r, Sums<K> (&acc)[V]) const` (adds row r's values of those columns; common.hpp's
// load_v reads them), and out's `void operator()(int c, const Sums<K>&) const`. Sums that must
// travel before they are used (a synchronised BatchNorm all-reduces them across ranks) are kept
// with out = StoreSums<K> and handed to an out functor later by apply_column_sums<K>.

#include "dpml/core/error.hpp"
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

inline constexpr int kPartialThreads = 256;

template <int K, int V, class F>
__global__ void __launch_bounds__(kPartialThreads) partial_kernel(F f, float* __restrict__ partial, std::int64_t rows,
                                                                  int C, int G) {
  __shared__ float s[K][kPartialThreads * V];  // [k][(lane · G + group) · V + e]
  const int t = static_cast<int>(threadIdx.x), g = t % G, lane = t / G, lanes = kPartialThreads / G;
  const int width = G * V;  // columns of this block
  const int c0 = static_cast<int>(blockIdx.x) * width + g * V;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kRowChunk;
  const std::int64_t r1 = r0 + kRowChunk < rows ? r0 + kRowChunk : rows;
  Sums<K> acc[V] = {};
  if (lane < lanes && c0 < C) {
    const auto state = f.setup(c0);
#pragma unroll 4  // independent loads in flight: the pass is bound by memory latency otherwise
    for (std::int64_t r = r0 + lane; r < r1; r += lanes) f.add(state, r, acc);
  }
  if (lane < lanes)
#pragma unroll
    for (int e = 0; e < V; ++e)
#pragma unroll
      for (int k = 0; k < K; ++k) s[k][(lane * G + g) * V + e] = acc[e].v[k];
  __syncthreads();
  for (int j = t; j < width; j += kPartialThreads) {
    const int c = static_cast<int>(blockIdx.x) * width + j;
    if (c >= C) break;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float sum = 0.f;
      for (int l = 0; l < lanes; ++l) sum += s[k][l * width + j];
      partial[(static_cast<std::int64_t>(blockIdx.y) * K + k) * C + c] = sum;
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

// Floats of scratch that column_sums_v<K, V> needs for (rows, C).
inline std::int64_t column_sums_scratch(std::int64_t rows, std::int64_t C, int K) {
  return ceil_div(rows, detail::colsum::kRowChunk) * K * C;
}

// V adjacent columns per thread (C % V == 0); see the top of the file for f and out.
template <int K, int V, class F, class Out>
void column_sums_v(F f, Out out, float* scratch, std::int64_t rows, std::int64_t C, cudaStream_t stream) {
  static_assert(V == 1 || V == 8);
  if (C == 0) return;
  using namespace detail::colsum;
  DPML_REQUIRE(C % V == 0 && C < (std::int64_t{1} << 31),
               "column_sums: " << C << " columns in groups of " << V << " (must divide, and fit an int)");
  const auto chunks = static_cast<unsigned>(ceil_div(rows, kRowChunk));
  if (chunks > 0) {
    const auto groups = C / V;
    const int G = static_cast<int>(groups < 32 ? groups : 32);
    partial_kernel<K, V><<<dim3(static_cast<unsigned>(ceil_div(groups, G)), chunks), kPartialThreads, 0, stream>>>(
        f, scratch, rows, static_cast<int>(C), G);
    DPML_CHECK_LAUNCH();
  }
  final_kernel<K><<<static_cast<unsigned>(ceil_div(C, 32)), dim3(32, kFinalLanes), 0, stream>>>(
      scratch, out, static_cast<int>(chunks), static_cast<int>(C));
  DPML_CHECK_LAUNCH();
}

// An out functor that keeps the sums: sums (K, C), row k holding quantity k of every column.
template <int K>
struct StoreSums {
  float* sums;
  int C;
  __device__ void operator()(int c, const Sums<K>& s) const {
#pragma unroll
    for (int k = 0; k < K; ++k) sums[static_cast<std::int64_t>(k) * C + c] = s.v[k];
  }
};

namespace detail::colsum {
template <int K, class Out>
__global__ void apply_kernel(const float* __restrict__ sums, Out out, int C) {
  const int c = static_cast<int>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  Sums<K> s;
#pragma unroll
  for (int k = 0; k < K; ++k) s.v[k] = sums[static_cast<std::int64_t>(k) * C + c];
  out(c, s);
}
}  // namespace detail::colsum

// out(c, sums of column c) for every column of sums (K, C) that StoreSums<K> kept.
template <int K, class Out>
void apply_column_sums(const float* sums, Out out, std::int64_t C, cudaStream_t stream) {
  if (C == 0) return;
  DPML_REQUIRE(C < (std::int64_t{1} << 31), "apply_column_sums: " << C << " columns do not fit an int");
  constexpr int kThreads = 256;
  detail::colsum::apply_kernel<K><<<static_cast<unsigned>(ceil_div(C, kThreads)), kThreads, 0, stream>>>(
      sums, out, static_cast<int>(C));
  DPML_CHECK_LAUNCH();
}

}  // namespace dpml::kernels::cuda
