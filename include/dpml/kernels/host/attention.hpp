#pragma once
// Multi-head self-attention, causal or bidirectional, host kernels (scaled dot-product, Vaswani
// et al. 2017).
//
// Layout. qkv is (B, T, H, 3, D): for each token, head after head, that head's query, key and
// value vectors side by side. One head's q, k and v are therefore contiguous, and a
// tensor-parallel rank holding heads [h0, h0 + H) holds one contiguous slice of the projection
// output — the layout layers/attention.hpp gives the qkv weight. The output is (B, T, H, D) =
// (B, T, C) with C = H·D: heads concatenated, ready for the output projection.
//
// Per (b, h), with q, k, v the (T, D) matrices read in place through a row stride of 3·H·D:
//
//   S = q · kᵀ / √D                     one GEMM, (T, T)
//   P = softmax(S) row i over j ≤ i     causal: future keys get probability 0
//       softmax(S) row i over valid j   bidirectional (kernels/attention_mask.hpp): a padded key's
//                                       score is −∞ before the softmax, so its probability is 0
//   out = P · v                         one GEMM, (T, D)
//
//   dP = dout · vᵀ,   dv = Pᵀ · dout
//   dS = P ⊙ (dP − rowsum(P ⊙ dP))      (softmax backward; zero where P is masked: above the
//                                       diagonal, or at padded keys, where P = 0)
//   dq = dS · k / √D, dk = dSᵀ · q / √D
//
// Memory: the host path stores the probabilities P, (B, H, T, T), for the backward pass — the
// simplest exact choice for small T. It computes whole (T, T) score blocks and masks the upper
// triangle (about twice the necessary multiply-adds). The device path (kernels/cuda/attention.hpp)
// keeps only the row log-sum-exp, (B, H, T), and recomputes P blockwise: what a forward keeps for
// its backward differs per space, so Ops<Space>'s attention family (AttentionOps, at the end)
// names it, AttentionState<T>, which a layer keeps per micro-batch slot without looking inside.

#include "dpml/core/tensor.hpp"
#include "dpml/kernels/attention_mask.hpp"
#include "dpml/kernels/device.hpp"
#include "dpml/kernels/host/gemm.hpp"
#include "dpml/kernels/host/softmax.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace dpml::kernels::host {

// qkv (B, T, H, 3, D) → out (B, T, H, D); probs (B, H, T, T), saved for the backward. Mask:
// attention::Causal or attention::Bidirectional (with its key mask, (B, T), or none).
template <class T, class Mask = attention::Causal>
void attention_forward(const T* qkv, T* out, T* probs, std::int64_t B, std::int64_t Tn, std::int64_t H,
                       std::int64_t D, Mask mask = {}) {
  const std::int64_t ld = 3 * H * D, ldo = H * D;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const T* q = qkv + b * Tn * ld + h * 3 * D;  // (T, D), row stride ld
      const T* k = q + D;
      const T* v = q + 2 * D;
      T* P = probs + (b * H + h) * Tn * Tn;  // (T, T)
      gemm(Trans::no, Trans::yes, Tn, Tn, D, scale, q, ld, k, ld, T(0), P, Tn);
      for (std::int64_t i = 0; i < Tn; ++i) {
        T* row = P + i * Tn;
        if constexpr (std::is_same_v<Mask, attention::Causal>) {
          softmax_row(row, row, i + 1);
          for (std::int64_t j = i + 1; j < Tn; ++j) row[j] = T(0);
        } else {
          if (mask.keys != nullptr)
            for (std::int64_t j = 0; j < Tn; ++j)
              if (mask.keys[b * Tn + j] == 0) row[j] = -std::numeric_limits<T>::infinity();  // exp → 0
          softmax_row(row, row, Tn);
        }
      }
      gemm(Trans::no, Trans::no, Tn, D, Tn, T(1), P, Tn, v, ld, T(0), out + b * Tn * ldo + h * D, ldo);
    }
}

// dout (B, T, H, D), qkv and probs as saved by forward → dqkv (B, T, H, 3, D), overwritten. The
// mask's keys are not read: probs is 0 wherever the forward masked.
template <class T, class Mask = attention::Causal>
void attention_backward(const T* dout, const T* qkv, const T* probs, T* dqkv, std::int64_t B, std::int64_t Tn,
                        std::int64_t H, std::int64_t D, Mask = {}) {
  const std::int64_t ld = 3 * H * D, ldo = H * D;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
  std::vector<T> dS(static_cast<std::size_t>(Tn * Tn));  // (T, T): dP, then dS in place
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t off = b * Tn * ld + h * 3 * D;
      const T *q = qkv + off, *k = q + D, *v = q + 2 * D;
      T *dq = dqkv + off, *dk = dq + D, *dv = dq + 2 * D;
      const T* dO = dout + b * Tn * ldo + h * D;  // (T, D), row stride ldo
      const T* P = probs + (b * H + h) * Tn * Tn;
      gemm(Trans::no, Trans::yes, Tn, Tn, D, T(1), dO, ldo, v, ld, T(0), dS.data(), Tn);
      gemm(Trans::yes, Trans::no, Tn, D, Tn, T(1), P, Tn, dO, ldo, T(0), dv, ld);
      for (std::int64_t i = 0; i < Tn; ++i) {
        T* row = dS.data() + i * Tn;
        if constexpr (std::is_same_v<Mask, attention::Causal>) {
          softmax_backward_row(P + i * Tn, row, row, i + 1);
          for (std::int64_t j = i + 1; j < Tn; ++j) row[j] = T(0);
        } else {
          softmax_backward_row(P + i * Tn, row, row, Tn);
        }
      }
      gemm(Trans::no, Trans::no, Tn, D, Tn, scale, dS.data(), Tn, k, ld, T(0), dq, ld);
      gemm(Trans::yes, Trans::no, Tn, D, Tn, scale, dS.data(), Tn, q, ld, T(0), dk, ld);
    }
}

// Ops<HostSpace>'s attention family (kernels/cuda/attention.hpp's AttentionOps is the twin).
struct AttentionOps {
  using Dev = Device<HostSpace>;
  // Any head dimension (the GPU's kernels take fewer: kernels/cuda/attention.hpp).
  static constexpr const char* attention_head_dims = "any";
  static constexpr bool attention_head_dim_supported(std::int64_t D) { return D > 0; }
  // Both mask policies (kernels/attention_mask.hpp).
  static constexpr const char* attention_masks = "causal, bidirectional";
  static constexpr bool attention_mask_supported(attention::Causal) { return true; }
  static constexpr bool attention_mask_supported(attention::Bidirectional) { return true; }
  // What the forward keeps for the backward: the probabilities, sized by the forward.
  template <class T>
  struct AttentionState {
    Tensor<T> probs;  // (B, H, T, T)
  };
  // qkv (B, T, H, 3, D) → out (B, T, H, D); state: what attention_backward needs
  template <class T, class Mask = attention::Causal>
  static void attention_forward(Dev&, const T* qkv, T* out, AttentionState<T>& state, std::int64_t B, std::int64_t Tn,
                                std::int64_t H, std::int64_t D, Mask mask = {}) {
    state.probs.resize(Shape{B, H, Tn, Tn});
    host::attention_forward(qkv, out, state.probs.data(), B, Tn, H, D, mask);
  }
  // dout (B, T, H, D), with the forward's qkv, out and state → dqkv (B, T, H, 3, D), overwritten
  template <class T, class Mask = attention::Causal>
  static void attention_backward(Dev&, const T* dout, const T* qkv, const T* /*out*/, const AttentionState<T>& state,
                                 T* dqkv, std::int64_t B, std::int64_t Tn, std::int64_t H, std::int64_t D, Mask mask = {}) {
    host::attention_backward(dout, qkv, state.probs.data(), dqkv, B, Tn, H, D, mask);
  }
};

}  // namespace dpml::kernels::host
