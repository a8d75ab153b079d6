#pragma once
// The kernels of gradient compression (parallel/compression/*.hpp) on the device: the pieces of
// PowerSGD and top-k that are neither a GEMM nor a collective, the twin of
// kernels/host/compression.hpp (same definitions; see there). CompressionOps at the end is
// Ops<CudaSpace>'s compression family; every op is queued on the Device's stream, synchronises
// nothing, and takes its workspace from the Device's per-op scratch. T: the gradient buckets' type
// (bf16 or fp16 in training: element arithmetic in fp32, rounded once on the store; float and
// double bitwise as the host's).
//
//   subtract               y = a − b, a grid-stride loop (bitwise the host's)
//   orthonormalise_columns modified Gram–Schmidt on P (n, r) in double, ONE block of 1024 threads:
//                          P is copied into scratch as doubles, column-major (n·r·8 bytes), each
//                          thread owns rows tid, tid + 1024, …; column c takes c + 1 passes over
//                          its n values, each fusing the subtraction of one projection with the
//                          next dot product (or the final norm) and ending in a block reduction,
//                          then one scaling pass: ≈ r²/2 + 2r passes over n doubles, all on one SM
//                          (n = 60k, r = 32: some 600 passes of 0.5 MB, a few ms). Equal to the
//                          host's within double rounding (the sums run in another order) before
//                          the cast to T.
//   redraw_zero_rows       one block per row of Qt (r, m): a block-wide "any nonzero", then the
//                          Philox normals (bitwise up to logf/cosf's last ulp)
//   take_top_magnitude     keys ~magnitude_key(x[i]) with values i, a stable ascending radix sort
//                          (CUB, double-buffered) puts the k largest first, ties in index order;
//                          their indices are sorted ascending (a second radix sort over k), then one
//                          kernel writes idx, val and zeroes x there. k = n skips both sorts.
//                          Scratch: take_top_magnitude_scratch<T>(n, k) bytes ≈ (2·sizeof(T) + 8)·n
//                          (16n for float: 480 MB for n = 3·10⁷) plus CUB's temporary storage.
//                          Cost: the sort of n (key, index) pairs, ~4 passes of 8 bits (bitwise
//                          the host's choice and order)
//   scatter_add            y[idx[i]] += val[i], a grid-stride loop (the indices are distinct: no atomics)

#include "dpml/core/philox.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/device.hpp"
#include "dpml/kernels/host/compression.hpp"  // magnitude_key, kOrthoKeep

#include <cub/block/block_reduce.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace dpml::kernels::cuda {

namespace detail::compress {

template <class T>
inline constexpr bool is_real_v = is_storage_v<T> || std::is_same_v<T, double>;

// Element conversions: float and double as they are, bf16 / fp16 through float.
template <class T>
__device__ __forceinline__ double to_double(T v) {
  if constexpr (sizeof(T) >= 4) return static_cast<double>(v);
  else return static_cast<double>(load_f(v));
}
template <class T>
__device__ __forceinline__ T from_double(double v) {
  if constexpr (sizeof(T) >= 4) return static_cast<T>(v);
  else return from_f<T>(static_cast<float>(v));
}
// a − b and a + b in T: native for float and double, in fp32 rounded once for 16-bit types.
template <class T>
__device__ __forceinline__ T minus(T a, T b) {
  if constexpr (sizeof(T) >= 4) return a - b;
  else return from_f<T>(load_f(a) - load_f(b));
}
template <class T>
__device__ __forceinline__ T plus(T a, T b) {
  if constexpr (sizeof(T) >= 4) return a + b;
  else return from_f<T>(load_f(a) + load_f(b));
}

inline constexpr int kThreads = 256;
inline constexpr int kOrthoThreads = 1024;

// The radix-sort key of x: larger magnitude_key → smaller key (an ascending sort puts it first).
template <class T>
using KeyOf = MagnitudeKey<T>;

inline std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

// y (n) = a − b; y may alias a or b.
template <class T>
__global__ void subtract_kernel(const T* a, const T* b, T* y, std::int64_t n) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = minus(a[i], b[i]);
}

// Σ v over the block, in every thread. The result is read from shared memory after a barrier;
// the next call's reduction has a barrier of its own before thread 0 writes it again.
__device__ __forceinline__ double ortho_block_sum(double v, typename cub::BlockReduce<double, kOrthoThreads>::TempStorage& tmp,
                                                  double& total) {
  const double s = cub::BlockReduce<double, kOrthoThreads>(tmp).Sum(v);
  if (threadIdx.x == 0) total = s;
  __syncthreads();
  return total;
}

// P (n, r) row-major: modified Gram–Schmidt of its columns in double, as the host's. a (r, n):
// scratch, the columns as doubles. Thread t owns rows t, t + kOrthoThreads, …: between the load
// and the store every element of a is read and written by its owner only, so the passes need no
// barrier but their reductions'. Products are rounded apart (no FMA), as on the host.
template <class T>
__global__ void __launch_bounds__(kOrthoThreads) orthonormalise_kernel(T* __restrict__ P, double* __restrict__ a,
                                                                       std::int64_t n, int r) {
  __shared__ typename cub::BlockReduce<double, kOrthoThreads>::TempStorage tmp;
  __shared__ double total;
  const std::int64_t tid = threadIdx.x, nr = n * r;
  for (std::int64_t e = tid; e < nr; e += kOrthoThreads) a[(e % r) * n + e / r] = to_double(P[e]);
  __syncthreads();
  for (int c = 0; c < r; ++c) {
    double* ac = a + c * n;
    // Pass 0: ‖column c‖² before the projections, and its dot product with column 0.
    double before = 0.0, d = 0.0;
    for (std::int64_t i = tid; i < n; i += kOrthoThreads) {
      const double v = ac[i];
      before += __dmul_rn(v, v);
      if (c > 0) d += __dmul_rn(a[i], v);
    }
    before = ortho_block_sum(before, tmp, total);
    double dot = c > 0 ? ortho_block_sum(d, tmp, total) : 0.0;
    double norm = before;  // c = 0: no projections
    // Pass k + 1: column c minus its projection on column k, and the dot product with column
    // k + 1 of what is left (after the last projection: the norm²).
    for (int k = 0; k < c; ++k) {
      const double* ak = a + k * n;
      const double* next = a + (k + 1) * n;  // column c itself after the last projection
      const bool last = k + 1 == c;
      double s = 0.0;
      for (std::int64_t i = tid; i < n; i += kOrthoThreads) {
        const double v = ac[i] - __dmul_rn(dot, ak[i]);
        ac[i] = v;
        s += __dmul_rn(last ? v : next[i], v);
      }
      s = ortho_block_sum(s, tmp, total);
      if (last) norm = s;
      else dot = s;
    }
    const bool keep = norm > 0.0 && norm > kOrthoKeep * before && isfinite(norm);
    const double inv = keep ? 1.0 / sqrt(norm) : 0.0;
    for (std::int64_t i = tid; i < n; i += kOrthoThreads) ac[i] *= inv;
  }
  __syncthreads();
  for (std::int64_t e = tid; e < nr; e += kOrthoThreads) P[e] = from_double<T>(a[(e % r) * n + e / r]);
}

// Qt (r, m), block c = row c: left alone when any element is nonzero, else Philox normals.
template <class T>
__global__ void redraw_zero_rows_kernel(T* Qt, std::int64_t m, std::uint64_t seed, std::uint64_t stream,
                                        std::uint64_t offset) {
  const std::int64_t c = blockIdx.x;
  T* row = Qt + c * m;
  int nonzero = 0;
  for (std::int64_t j = threadIdx.x; j < m; j += blockDim.x) nonzero |= to_double(row[j]) != 0.0;
  if (__syncthreads_or(nonzero)) return;  // the same answer in every thread
  const PhiloxStream rng(seed, stream);
  for (std::int64_t j = threadIdx.x; j < m; j += blockDim.x)
    row[j] = from_double<T>(rng.normal(offset + static_cast<std::uint64_t>(c * m + j)));
}

// keys[i] = ~magnitude_key(x[i]), pos[i] = i, i < n.
template <class T>
__global__ void top_keys_kernel(const T* __restrict__ x, KeyOf<T>* __restrict__ keys, std::int32_t* __restrict__ pos,
                                std::int64_t n) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    keys[i] = static_cast<KeyOf<T>>(~magnitude_key(x[i]));
    pos[i] = static_cast<std::int32_t>(i);
  }
}

// idx[j] = chosen[j] (chosen null: j), val[j] = x[idx[j]], then x[idx[j]] = 0, j < k; distinct
// indices.
template <class T>
__global__ void take_kernel(T* __restrict__ x, const std::int32_t* __restrict__ chosen, std::int64_t k,
                            std::int32_t* __restrict__ idx, T* __restrict__ val) {
  for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < k;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int32_t i = chosen ? chosen[j] : static_cast<std::int32_t>(j);
    idx[j] = i;
    val[j] = x[i];
    x[i] = T{};
  }
}

// y[idx[i]] += val[i], i < k; distinct indices.
template <class T>
__global__ void scatter_add_kernel(const std::int32_t* __restrict__ idx, const T* __restrict__ val, std::int64_t k,
                                   T* __restrict__ y) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < k;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[idx[i]] = plus(y[idx[i]], val[i]);
}

// The key bits the first sort looks at: ~magnitude_key always has the top bit set.
template <class T>
constexpr int top_key_bits() {
  return static_cast<int>(sizeof(KeyOf<T>)) * 8 - 1;
}
// The key bits of the second sort: indices in [0, n).
inline int index_bits(std::int64_t n) {
  return std::max(1, static_cast<int>(std::bit_width(static_cast<std::uint64_t>(n - 1))));
}

// CUB's temporary bytes: the (key, index) sort of n and the index sort of k, double-buffered.
template <class T>
std::size_t top_sort_temp_bytes(std::int64_t n, std::int64_t k) {
  std::size_t pairs = 0, keys = 0;
  cub::DoubleBuffer<KeyOf<T>> kb(nullptr, nullptr);
  cub::DoubleBuffer<std::int32_t> vb(nullptr, nullptr);
  DPML_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, pairs, kb, vb, static_cast<int>(n), 0, top_key_bits<T>()));
  DPML_CHECK_CUDA(cub::DeviceRadixSort::SortKeys(nullptr, keys, vb, static_cast<int>(k), 0, index_bits(n)));
  return std::max(pairs, keys);
}

}  // namespace detail::compress

// Bytes of scratch take_top_magnitude needs for x (n), k of them: two key buffers (n keys of
// sizeof(T) bytes), two index buffers (n int32) and CUB's temporary storage, each 256-byte aligned;
// k = n needs none.
template <class T>
std::size_t take_top_magnitude_scratch(std::int64_t n, std::int64_t k) {
  using detail::compress::align256;
  if (k >= n) return 0;
  return 2 * align256(static_cast<std::size_t>(n) * sizeof(detail::compress::KeyOf<T>)) +
         2 * align256(static_cast<std::size_t>(n) * sizeof(std::int32_t)) +
         align256(detail::compress::top_sort_temp_bytes<T>(n, k));
}

// Ops<CudaSpace>'s compression family (kernels/host/compression.hpp is the host one).
struct CompressionOps {
  using Dev = Device<CudaSpace>;

  // y (n) = a − b; y may alias a or b.
  template <class T>
  static void subtract(Dev& dev, const T* a, const T* b, T* y, std::int64_t n) {
    static_assert(detail::compress::is_real_v<T>, "subtract: bf16, fp16, float or double");
    if (n <= 0) return;
    using detail::compress::kThreads;
    detail::compress::subtract_kernel<T><<<grid_for(n, kThreads), kThreads, 0, dev.stream()>>>(a, b, y, n);
    DPML_CHECK_LAUNCH();
  }

  // P (n, r), row-major, in place: column c minus its projections on the columns before it, then
  // scaled to norm 1, in double; a column with nothing left (norm² ≤ kOrthoKeep · its norm² before
  // the projections, zero, or not finite) becomes zero. Scratch: n·r doubles.
  template <class T>
  static void orthonormalise_columns(Dev& dev, T* P, std::int64_t n, int r) {
    static_assert(detail::compress::is_real_v<T>, "orthonormalise_columns: bf16, fp16, float or double");
    if (n <= 0 || r <= 0) return;
    double* a = dev.scratch<double>(n * r);  // (r, n): the columns
    detail::compress::orthonormalise_kernel<T><<<1, detail::compress::kOrthoThreads, 0, dev.stream()>>>(P, a, n, r);
    DPML_CHECK_LAUNCH();
  }

  // Qt (r, m): every row that is all zero becomes Qt[c][j] = PhiloxStream(seed, stream).normal(offset
  // + c·m + j); the other rows are left as they are.
  template <class T>
  static void redraw_zero_rows(Dev& dev, T* Qt, int r, std::int64_t m, std::uint64_t seed, std::uint64_t stream,
                               std::uint64_t offset) {
    static_assert(detail::compress::is_real_v<T>, "redraw_zero_rows: bf16, fp16, float or double");
    if (r <= 0 || m <= 0) return;
    using detail::compress::kThreads;
    detail::compress::redraw_zero_rows_kernel<T><<<static_cast<unsigned>(r), kThreads, 0, dev.stream()>>>(Qt, m, seed, stream,
                                                                                                          offset);
    DPML_CHECK_LAUNCH();
  }

  // idx (k): the indices of the k entries of x (n) with the largest magnitude_key (ties: the lower
  // index), ascending; val (k): those entries; then they are zeroed in x. 1 ≤ k ≤ n < 2³¹.
  // Scratch: take_top_magnitude_scratch<T>(n, k) bytes.
  template <class T>
  static void take_top_magnitude(Dev& dev, T* x, std::int64_t n, std::int64_t k, std::int32_t* idx, T* val) {
    static_assert(detail::compress::is_real_v<T>, "take_top_magnitude: bf16, fp16, float or double");
    using namespace detail::compress;
    DPML_REQUIRE(k >= 1 && k <= n && n <= std::numeric_limits<std::int32_t>::max(),
                 "take_top_magnitude: k = " << k << " of n = " << n << " (1 ≤ k ≤ n < 2^31)");
    const cudaStream_t s = dev.stream();
    if (k == n) {  // every entry, in index order
      take_kernel<T><<<grid_for(k, kThreads), kThreads, 0, s>>>(x, nullptr, k, idx, val);
      DPML_CHECK_LAUNCH();
      return;
    }
    using K = KeyOf<T>;
    const std::size_t key_bytes = align256(static_cast<std::size_t>(n) * sizeof(K)),
                      pos_bytes = align256(static_cast<std::size_t>(n) * sizeof(std::int32_t)),
                      temp_bytes = align256(top_sort_temp_bytes<T>(n, k));
    char* base = dev.scratch<char>(static_cast<std::int64_t>(2 * key_bytes + 2 * pos_bytes + temp_bytes));
    cub::DoubleBuffer<K> keys(reinterpret_cast<K*>(base), reinterpret_cast<K*>(base + key_bytes));
    cub::DoubleBuffer<std::int32_t> pos(reinterpret_cast<std::int32_t*>(base + 2 * key_bytes),
                                        reinterpret_cast<std::int32_t*>(base + 2 * key_bytes + pos_bytes));
    void* temp = base + 2 * key_bytes + 2 * pos_bytes;
    top_keys_kernel<T><<<grid_for(n, kThreads), kThreads, 0, s>>>(x, keys.Current(), pos.Current(), n);
    DPML_CHECK_LAUNCH();
    std::size_t bytes = temp_bytes;  // stable: equal keys keep the index order
    DPML_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(temp, bytes, keys, pos, static_cast<int>(n), 0, top_key_bits<T>(), s));
    // pos.Current()[0, k): the chosen indices, largest first; now ascending (both buffers hold n ≥ k)
    const std::int32_t* chosen = pos.Current();
    if (k > 1) {
      cub::DoubleBuffer<std::int32_t> ascending(pos.Current(), pos.Alternate());
      bytes = temp_bytes;
      DPML_CHECK_CUDA(cub::DeviceRadixSort::SortKeys(temp, bytes, ascending, static_cast<int>(k), 0, index_bits(n), s));
      chosen = ascending.Current();
    }
    take_kernel<T><<<grid_for(k, kThreads), kThreads, 0, s>>>(x, chosen, k, idx, val);
    DPML_CHECK_LAUNCH();
  }

  // y[idx[i]] += val[i], i < k; the indices are distinct.
  template <class T>
  static void scatter_add(Dev& dev, const std::int32_t* idx, const T* val, std::int64_t k, T* y) {
    static_assert(detail::compress::is_real_v<T>, "scatter_add: bf16, fp16, float or double");
    if (k <= 0) return;
    using detail::compress::kThreads;
    detail::compress::scatter_add_kernel<T><<<grid_for(k, kThreads), kThreads, 0, dev.stream()>>>(idx, val, k, y);
    DPML_CHECK_LAUNCH();
  }
};

}  // namespace dpml::kernels::cuda
