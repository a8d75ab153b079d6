#pragma once
// Token and position embedding, host kernels.
//
//   token     y[n] = W[tokens[n] − begin]   when begin ≤ tokens[n] < end, else 0
//   position  y[b, t] += P[t]
//
// The token kernels work on one vocabulary shard [begin, end) of the table, so that a
// vocabulary-parallel embedding calls them unchanged (tokens outside the shard give zero rows,
// and the tensor axis sums the shards). The backward passes are deterministic: one thread walks
// the tokens in order and adds each gradient row into its table row, so repeated tokens
// accumulate in a fixed order — no atomics, bit-identical from run to run.
//
// EmbeddingOps at the end is Ops<HostSpace>'s embedding family (kernels/ops.hpp); its CUDA twin is
// in kernels/cuda/embedding.hpp, with the same ops and arguments.

#include "dpml/kernels/device.hpp"

#include <cstdint>

namespace dpml::kernels::host {

// tokens (N); W (end − begin, C); y (N, C), overwritten.
template <class T>
void embedding_token_forward(const std::int32_t* tokens, const T* W, T* y, std::int64_t N, std::int64_t C,
                             std::int64_t begin, std::int64_t end) {
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t row = tokens[n];
    T* yn = y + n * C;
    if (row >= begin && row < end) {
      const T* w = W + (row - begin) * C;
      for (std::int64_t c = 0; c < C; ++c) yn[c] = w[c];
    } else {
      for (std::int64_t c = 0; c < C; ++c) yn[c] = T(0);
    }
  }
}

// dW (end − begin, C) += the rows of dy (N, C) whose token lies in the shard.
template <class T>
void embedding_token_backward(const std::int32_t* tokens, const T* dy, T* dW, std::int64_t N, std::int64_t C,
                              std::int64_t begin, std::int64_t end) {
  for (std::int64_t n = 0; n < N; ++n) {
    const std::int64_t row = tokens[n];
    if (row < begin || row >= end) continue;
    T* dw = dW + (row - begin) * C;
    const T* g = dy + n * C;
    for (std::int64_t c = 0; c < C; ++c) dw[c] += g[c];
  }
}

// y (B, Tn, C) += P[t] for t < Tn; P (≥ Tn, C).
template <class T>
void embedding_position_forward(const T* P, T* y, std::int64_t B, std::int64_t Tn, std::int64_t C) {
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < Tn; ++t) {
      T* yt = y + (b * Tn + t) * C;
      const T* p = P + t * C;
      for (std::int64_t c = 0; c < C; ++c) yt[c] += p[c];
    }
}

// dP[t] += Σ_b dy[b, t]; dy (B, Tn, C).
template <class T>
void embedding_position_backward(const T* dy, T* dP, std::int64_t B, std::int64_t Tn, std::int64_t C) {
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < Tn; ++t) {
      const T* g = dy + (b * Tn + t) * C;
      T* dp = dP + t * C;
      for (std::int64_t c = 0; c < C; ++c) dp[c] += g[c];
    }
}

// Ops<HostSpace>'s embedding family.
struct EmbeddingOps {
  using Dev = Device<HostSpace>;
  // y (N, C) = W[tokens[n] − begin] for tokens in [begin, end), zero rows for the others;
  // tokens (N); W (end − begin, C)
  template <class T>
  static void embedding_token_forward(Dev&, const std::int32_t* tokens, const T* W, T* y, std::int64_t N,
                                      std::int64_t C, std::int64_t begin, std::int64_t end) {
    host::embedding_token_forward(tokens, W, y, N, C, begin, end);
  }
  // y (B, Tn, C) += P[t]; P (≥ Tn, C)
  template <class T>
  static void embedding_position_forward(Dev&, const T* P, T* y, std::int64_t B, std::int64_t Tn, std::int64_t C) {
    host::embedding_position_forward(P, y, B, Tn, C);
  }
  // dW (end − begin, C) += the rows of dy (N, C) whose token lies in the shard, in token order;
  // tokens in [0, vocab) (the device's sort needs the bound; the host loop does not)
  template <class T>
  static void embedding_token_backward(Dev&, const std::int32_t* tokens, const T* dy, T* dW, std::int64_t N,
                                       std::int64_t C, std::int64_t begin, std::int64_t end, std::int64_t /*vocab*/) {
    host::embedding_token_backward(tokens, dy, dW, N, C, begin, end);
  }
  // dP[t] += Σ_b dy[b, t]; dy (B, Tn, C)
  template <class T>
  static void embedding_position_backward(Dev&, const T* dy, T* dP, std::int64_t B, std::int64_t Tn, std::int64_t C) {
    host::embedding_position_backward(dy, dP, B, Tn, C);
  }
};

}  // namespace dpml::kernels::host
