#pragma once
// Token and position embedding, device kernels (the maths of kernels/host/embedding.hpp),
// including the vocabulary shard [begin, end) of a vocabulary-parallel table.
//
// The token backward is deterministic without float atomics: the N token ids are sorted together
// with their positions (CUB radix sort, stable, so equal tokens keep increasing n), and one warp
// per distinct token walks its run of the sorted list, adding the gradient rows into its table
// row in order of n. Every table element is written by one lane, in the order the host loop uses,
// so the result is bit-identical from run to run (and, in fp32, to the host's). Cost: the sort
// (N keys, a few µs for N = 16384) plus one read of dy and one read-modify-write of the touched
// table rows — untouched rows of a 50k-row table are never read. A long run (BERT's [MASK]: 15 %
// of the tokens) is a chain of dependent adds per column, spread over C / 256 warps (bf16):
// before they were, one warp walking 2458 rows of 768 columns took 30 ms of a 59 ms BERT step.
//
// The position backward sums over the batch in order, one thread per (t, c): also deterministic.
//
// EmbeddingOps at the end is Ops<CudaSpace>'s embedding family (kernels/host/embedding.hpp's twin);
// the token backward's workspace is the op's Device::scratch.

#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/device.hpp"

#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include <bit>
#include <cstdint>

namespace dpml::kernels::cuda {

namespace detail::emb {

template <class T>
__global__ void token_forward_kernel(const std::int32_t* __restrict__ tokens, const T* __restrict__ W,
                                     T* __restrict__ y, std::int64_t N, int C, std::int64_t begin,
                                     std::int64_t end) {
  for (std::int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const std::int64_t row = tokens[n];
    T* yn = y + n * C;
    const bool in = row >= begin && row < end;
    const T* w = W + (in ? row - begin : 0) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) yn[c] = in ? w[c] : from_f<T>(0.f);
  }
}

template <class T>
__global__ void position_forward_kernel(const T* __restrict__ P, T* __restrict__ y, std::int64_t B, std::int64_t Tn,
                                        int C) {
  const std::int64_t n = B * Tn * C;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = (i / C) % Tn, c = i % C;
    y[i] = from_f<T>(load_f(y[i]) + load_f(P[t * C + c]));
  }
}

static __global__ void iota_kernel(std::int32_t* v, std::int64_t n) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    v[i] = static_cast<std::int32_t>(i);
}

// One warp per (sorted position, slice of 32·V columns); at the first position of a run of equal
// tokens the warp walks the whole run, each lane summing its V columns in position order. The
// slices put several warps on one token (a [MASK] or padding token can hold a sixth of a batch),
// and the rows of the run are read 32 positions at a time, broadcast by shuffle, so that the
// dy loads of consecutive rows are independent and in flight together.
template <class T, int V>
__global__ void token_backward_kernel(const std::int32_t* __restrict__ keys, const std::int32_t* __restrict__ pos,
                                      const T* __restrict__ dy, T* __restrict__ dW, std::int64_t N, int C,
                                      std::int64_t begin, std::int64_t end, float scale, std::int64_t block_rows) {
  constexpr unsigned kAll = 0xffffffffu;
  const std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (p >= N) return;  // warp-uniform, as every exit before the shuffles
  const std::int32_t tok = keys[p];
  if ((p > 0 && keys[p - 1] == tok) || tok < begin || tok >= end) return;
  const int lane = threadIdx.x % 32;
  std::int64_t len = 0;  // the run's length: equal keys are a prefix of what follows p (sorted)
  for (;;) {
    const std::int64_t q = p + len + lane;
    const unsigned same = __ballot_sync(kAll, q < N && keys[q] == tok);
    if (same != kAll) {
      len += __ffs(static_cast<int>(~same)) - 1;
      break;
    }
    len += 32;
  }
  const int c = (static_cast<int>(blockIdx.y) * 32 + lane) * V;
  const bool owns = c < C;
  // The run lists its rows in position order (the sort is stable), so block by block.
  float total[V] = {}, block_sum[V] = {}, v[V];
  std::int64_t block = pos[p] / block_rows;
  for (std::int64_t base = 0; base < len; base += 32) {
    const int m = static_cast<int>(len - base < 32 ? len - base : 32);
    const std::int32_t mine = lane < m ? pos[p + base + lane] : 0;
#pragma unroll 8
    for (int i = 0; i < m; ++i) {
      const std::int64_t row = __shfl_sync(kAll, mine, i);
      if (row / block_rows != block) {
#pragma unroll
        for (int e = 0; e < V; ++e) total[e] += block_sum[e], block_sum[e] = 0.f;
        block = row / block_rows;
      }
      if (owns) {
        load_v<V>(dy + row * C + c, v);
#pragma unroll
        for (int e = 0; e < V; ++e) block_sum[e] += v[e];
      }
    }
  }
  if (!owns) return;
  T* dw = dW + (tok - begin) * C + c;
  load_v<V>(dw, v);
#pragma unroll
  for (int e = 0; e < V; ++e) v[e] = v[e] + scale * (total[e] + block_sum[e]);
  store_v<V>(dw, v);
}

template <class T>
__global__ void position_backward_kernel(const T* __restrict__ dy, T* __restrict__ dP, std::int64_t B,
                                         std::int64_t Tn, int C) {
  const std::int64_t n = Tn * C;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float acc = load_f(dP[i]);
    for (std::int64_t b = 0; b < B; ++b) acc += load_f(dy[b * n + i]);
    dP[i] = from_f<T>(acc);
  }
}

inline std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

// Bits of the sort key that can be set: tokens are in [0, vocab).
inline int key_bits(std::int64_t vocab) { return vocab <= 1 ? 1 : std::bit_width(static_cast<std::uint64_t>(vocab - 1)); }

inline std::size_t sort_temp_bytes(std::int64_t N, std::int64_t vocab) {
  std::size_t bytes = 0;
  DPML_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const std::int32_t*>(nullptr),
                                                  static_cast<std::int32_t*>(nullptr),
                                                  static_cast<const std::int32_t*>(nullptr),
                                                  static_cast<std::int32_t*>(nullptr), static_cast<int>(N), 0,
                                                  key_bits(vocab)));
  return bytes;
}

}  // namespace detail::emb

// Bytes of device workspace that embedding_token_backward needs for N tokens of a vocabulary of
// `vocab` ids (the full vocabulary, not the shard: tokens are sorted before the shard filter).
inline std::size_t embedding_backward_workspace(std::int64_t N, std::int64_t vocab) {
  using detail::emb::align256;
  return 3 * align256(static_cast<std::size_t>(N) * sizeof(std::int32_t)) +
         align256(detail::emb::sort_temp_bytes(N, vocab));
}

// tokens (N) in [0, vocab); W (end − begin, C); y (N, C), overwritten (zero rows for tokens
// outside the shard).
template <class T>
void embedding_token_forward(const std::int32_t* tokens, const T* W, T* y, std::int64_t N, std::int64_t C,
                             std::int64_t begin, std::int64_t end, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  if (N == 0) return;
  detail::emb::token_forward_kernel<<<grid_for(N, 1, 65535), 128, 0, stream>>>(tokens, W, y, N, static_cast<int>(C),
                                                                                begin, end);
  DPML_CHECK_LAUNCH();
}

// y (B, Tn, C) += P[t]; P (≥ Tn, C).
template <class T>
void embedding_position_forward(const T* P, T* y, std::int64_t B, std::int64_t Tn, std::int64_t C,
                                cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  if (B * Tn * C == 0) return;
  detail::emb::position_forward_kernel<<<grid_for(B * Tn * C, 256), 256, 0, stream>>>(P, y, B, Tn,
                                                                                      static_cast<int>(C));
  DPML_CHECK_LAUNCH();
}

// dW (end − begin, C) += scale · the sum of the rows of dy (N, C) whose token lies in the shard;
// deterministic. The sum per token is in fp32, in position order, formed apart for each block of
// `block_rows` rows (default: one block) and then over the blocks: the rows of K data-parallel
// ranks gathered in rank order (block_rows = N/K) with scale = 1/K give, when every rank had the
// same rows, exactly what one rank's rows give with scale 1. workspace:
// embedding_backward_workspace(N, vocab) bytes.
template <class T>
void embedding_token_backward(const std::int32_t* tokens, const T* dy, T* dW, std::int64_t N, std::int64_t C,
                              std::int64_t begin, std::int64_t end, std::int64_t vocab, void* workspace,
                              std::size_t workspace_bytes, cudaStream_t stream, float scale = 1.f,
                              std::int64_t block_rows = 0) {
  static_assert(detail::is_storage_v<T>);
  using namespace detail::emb;
  if (N == 0) return;
  DPML_REQUIRE(workspace_bytes >= embedding_backward_workspace(N, vocab),
               "embedding backward: workspace of " << workspace_bytes << " bytes, needs "
                                                   << embedding_backward_workspace(N, vocab));
  const std::size_t ints = align256(static_cast<std::size_t>(N) * sizeof(std::int32_t));
  auto* base = static_cast<char*>(workspace);
  auto* keys = reinterpret_cast<std::int32_t*>(base);             // (N) sorted tokens
  auto* pos_in = reinterpret_cast<std::int32_t*>(base + ints);    // (N) 0 … N−1
  auto* pos = reinterpret_cast<std::int32_t*>(base + 2 * ints);   // (N) positions in sorted order
  std::size_t temp_bytes = workspace_bytes - 3 * ints;
  iota_kernel<<<grid_for(N, 256), 256, 0, stream>>>(pos_in, N);
  DPML_CHECK_LAUNCH();
  DPML_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(base + 3 * ints, temp_bytes, tokens, keys, pos_in, pos,
                                                  static_cast<int>(N), 0, key_bits(vocab), stream));
  constexpr int kWarps = 8;
  const auto launch = [&]<int V>() {
    const dim3 grid(static_cast<unsigned>(ceil_div(N, kWarps)), static_cast<unsigned>(ceil_div(C, 32 * V)));
    token_backward_kernel<T, V><<<grid, kWarps * 32, 0, stream>>>(keys, pos, dy, dW, N, static_cast<int>(C), begin, end, scale,
                                                                  block_rows > 0 ? block_rows : N);
  };
  if (detail::whole_packs(C, 8, {dy, dW}))
    launch.template operator()<8>();
  else
    launch.template operator()<1>();
  DPML_CHECK_LAUNCH();
}

// dP[t] += Σ_b dy[b, t]; dy (B, Tn, C); deterministic.
template <class T>
void embedding_position_backward(const T* dy, T* dP, std::int64_t B, std::int64_t Tn, std::int64_t C,
                                 cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  if (Tn * C == 0) return;
  detail::emb::position_backward_kernel<<<grid_for(Tn * C, 256), 256, 0, stream>>>(dy, dP, B, Tn,
                                                                                   static_cast<int>(C));
  DPML_CHECK_LAUNCH();
}

// Ops<CudaSpace>'s embedding family.
struct EmbeddingOps {
  using Dev = Device<CudaSpace>;
  // y (N, C) = W[tokens[n] − begin] for tokens in [begin, end), zero rows for the others;
  // tokens (N); W (end − begin, C)
  template <class T>
  static void embedding_token_forward(Dev& dev, const std::int32_t* tokens, const T* W, T* y, std::int64_t N,
                                      std::int64_t C, std::int64_t begin, std::int64_t end) {
    cuda::embedding_token_forward(tokens, W, y, N, C, begin, end, dev.stream());
  }
  // y (B, Tn, C) += P[t]; P (≥ Tn, C)
  template <class T>
  static void embedding_position_forward(Dev& dev, const T* P, T* y, std::int64_t B, std::int64_t Tn, std::int64_t C) {
    cuda::embedding_position_forward(P, y, B, Tn, C, dev.stream());
  }
  // dW (end − begin, C) += the rows of dy (N, C) whose token lies in the shard, in token order;
  // tokens in [0, vocab), the sort's key width (an id outside it breaks the sorted runs: wrong sums,
  // never a write outside the table; the layer's IdCheck reports it)
  template <class T>
  static void embedding_token_backward(Dev& dev, const std::int32_t* tokens, const T* dy, T* dW, std::int64_t N,
                                       std::int64_t C, std::int64_t begin, std::int64_t end, std::int64_t vocab) {
    const std::size_t bytes = embedding_backward_workspace(N, vocab);
    cuda::embedding_token_backward(tokens, dy, dW, N, C, begin, end, vocab, dev.scratch<unsigned char>(
                                       static_cast<std::int64_t>(bytes)), bytes, dev.stream());
  }
  // dP[t] += Σ_b dy[b, t]; dy (B, Tn, C)
  template <class T>
  static void embedding_position_backward(Dev& dev, const T* dy, T* dP, std::int64_t B, std::int64_t Tn,
                                          std::int64_t C) {
    cuda::embedding_position_backward(dy, dP, B, Tn, C, dev.stream());
  }
};

}  // namespace dpml::kernels::cuda
