#pragma once
// Multi-head attention, flash style (Dao et al. 2022), causal or bidirectional (the mask policies
// of kernels/attention_mask.hpp; bidirectional without a key-padding mask), device kernels with
// the layout and maths of kernels/host/attention.hpp: qkv (B, T, H, 3, D) in, out (B, T, H, D).
//
// No (T, T) matrix exists in memory. The forward streams key/value tiles through shared memory
// and keeps, per query row, a running max m, a running sum l of exp(s − m) and the unnormalised
// output o; a new maximum rescales l and o by exp(m_old − m_new) (online softmax). It saves only
// the row's logsumexp, lse = m + ln l, (B, H, T) fp32. The backward recomputes each probability
// as p = exp(s − lse) and needs, per query row, δ = Σ_d dout·out (a small pre-pass), then
//
//   dv_j += p_ij · dout_i     dp_ij = dout_i · v_j     ds_ij = p_ij (dp_ij − δ_i)
//   dq_i += ds_ij · k_j / √D  dk_j += ds_ij · q_i / √D
//
// in two kernels that each own their output rows — one per query row block (dq; streams keys),
// one per key row block (dk, dv; streams queries) — so no atomics are needed and the gradients are
// deterministic. Causality skips every tile above the diagonal: half the work of a dense pass.
// Bidirectional runs the dense pass; the kernels take the mask as a template argument (Causal).
//
// Two policies, one interface: attention::TensorCore (attention_mma.hpp: mma.sync, bf16 or fp16,
// 16-byte aligned tensors) and attention::Simt (attention_simt.hpp: fp32 FMAs, bf16, fp16 or
// fp32); both take D ∈ {32, 64, 128}. attention::Auto, the default, takes the tensor cores where they
// apply and SIMT otherwise.
//
// Scratch: lse (B, H, T) fp32 from the forward; delta (B, H, T) fp32 for the backward.
//
// Ops<CudaSpace>'s attention family (AttentionOps, at the end; kernels/host/attention.hpp's is the
// twin) keeps lse in its AttentionState<T>, the state a layer holds per micro-batch slot, and takes
// delta from the Device's per-op scratch.

#include "dpml/core/cuda_space.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/attention_mask.hpp"
#include "dpml/kernels/cuda/attention_mma.hpp"
#include "dpml/kernels/cuda/attention_simt.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/device.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace dpml::kernels::cuda {

namespace attention {
struct Auto {};
struct TensorCore {};
struct Simt {};
}  // namespace attention

namespace detail::attn {

template <int D, class F>
void with_head_dim(std::int64_t d, F&& f) {
  if constexpr (D <= 128) {
    if (d == D) return f.template operator()<D>();
    return with_head_dim<D * 2>(d, static_cast<F&&>(f));
  } else {
    DPML_REQUIRE(false, "attention: head dimension " << d << " is not supported (32, 64 or 128)");
  }
}

// Whether the tensor-core kernels take this problem.
template <class T>
bool mma_applies(std::int64_t D, std::initializer_list<const void*> tensors) {
  if constexpr (std::is_same_v<T, float>) {
    return false;
  } else {
    for (const void* p : tensors)
      if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
    return D == 32 || D == 64 || D == 128;
  }
}

// The kernels' Causal argument for a mask policy, known at compile time (a model instantiates
// only its own mask's kernels); a key-padding mask has no kernel here.
template <class Mask>
inline constexpr bool kCausal = std::is_same_v<Mask, ::dpml::attention::Causal>;
inline void require_kernel(::dpml::attention::Causal) {}
inline void require_kernel(::dpml::attention::Bidirectional mask) {
  DPML_REQUIRE(mask.keys == nullptr, "attention on the GPU: a key-padding mask has no kernel yet (bidirectional attention "
                                     "over every key only); pad to whole sequences or train on CPU ranks");
}

template <class Policy, class T>
bool use_mma(std::int64_t D, std::initializer_list<const void*> tensors) {
  const bool ok = mma_applies<T>(D, tensors);
  if constexpr (std::is_same_v<Policy, attention::TensorCore>)
    DPML_REQUIRE(ok, "attention (tensor cores): needs bf16 or fp16, head size 32, 64 or 128 (got "
                         << D << ") and 16-byte aligned tensors");
  return !std::is_same_v<Policy, attention::Simt> && ok;
}

}  // namespace detail::attn

// qkv (B, T, H, 3, D) → out (B, T, H, D); lse (B, H, T) fp32, saved for the backward.
// D ∈ {32, 64, 128}; Policy: attention::Auto, TensorCore or Simt; Mask: ::dpml::attention::Causal
// or Bidirectional (keys null).
template <class T, class Policy = attention::Auto, class Mask = ::dpml::attention::Causal>
void attention_forward(const T* qkv, T* out, float* lse, std::int64_t B, std::int64_t Tn, std::int64_t H,
                       std::int64_t D, cudaStream_t stream, Mask mask = {}) {
  static_assert(detail::is_storage_v<T>);
  using namespace detail::attn;
  if (B * Tn * H == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(Tn, kRows)), static_cast<unsigned>(B * H));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  require_kernel(mask);
  constexpr bool C = kCausal<Mask>;
  if (use_mma<Policy, T>(D, {qkv, out})) {
    if constexpr (!std::is_same_v<T, float>) {
      const dim3 mgrid(static_cast<unsigned>(ceil_div(Tn, detail::attn_mma::kRows)), static_cast<unsigned>(B * H));
      const float scale_log2 = scale * detail::attn_mma::kLog2e;
      with_head_dim<32>(D, [&]<int HD>() {
        detail::attn_mma::forward_kernel<T, HD, C><<<mgrid, detail::attn_mma::kThreads, 0, stream>>>(
            qkv, out, lse, Tn, static_cast<int>(H), scale_log2);
        DPML_CHECK_LAUNCH();
      });
    }
    return;
  }
  with_head_dim<32>(D, [&]<int HD>() {
    forward_kernel<T, HD, C><<<grid, kThreads, 0, stream>>>(qkv, out, lse, Tn, static_cast<int>(H), scale);
    DPML_CHECK_LAUNCH();
  });
}

// dout (B, T, H, D), qkv, out and lse from the forward → dqkv (B, T, H, 3, D), overwritten;
// delta (B, H, T) fp32 scratch; the forward's Mask.
template <class T, class Policy = attention::Auto, class Mask = ::dpml::attention::Causal>
void attention_backward(const T* dout, const T* qkv, const T* out, const float* lse, float* delta, T* dqkv,
                        std::int64_t B, std::int64_t Tn, std::int64_t H, std::int64_t D, cudaStream_t stream,
                        Mask mask = {}) {
  static_assert(detail::is_storage_v<T>);
  using namespace detail::attn;
  if (B * Tn * H == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(Tn, kRows)), static_cast<unsigned>(B * H));
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const int h = static_cast<int>(H);
  require_kernel(mask);
  constexpr bool C = kCausal<Mask>;
  with_head_dim<32>(D, [&]<int HD>() {
    delta_kernel<T, HD><<<grid, kThreads, 0, stream>>>(dout, out, delta, Tn, h);
    DPML_CHECK_LAUNCH();
  });
  if (use_mma<Policy, T>(D, {dout, qkv, dqkv})) {
    if constexpr (!std::is_same_v<T, float>) {
      const dim3 mgrid(static_cast<unsigned>(ceil_div(Tn, detail::attn_mma::kRows)), static_cast<unsigned>(B * H));
      with_head_dim<32>(D, [&]<int HD>() {
        detail::attn_mma::backward_dq_kernel<T, HD, C><<<mgrid, detail::attn_mma::kThreads, 0, stream>>>(
            dout, qkv, lse, delta, dqkv, Tn, h, scale);
        DPML_CHECK_LAUNCH();
        detail::attn_mma::backward_dkv_kernel<T, HD, C><<<mgrid, detail::attn_mma::kThreads, 0, stream>>>(
            dout, qkv, lse, delta, dqkv, Tn, h, scale);
        DPML_CHECK_LAUNCH();
      });
    }
    return;
  }
  with_head_dim<32>(D, [&]<int HD>() {
    backward_dq_kernel<T, HD, C><<<grid, kThreads, 0, stream>>>(dout, qkv, lse, delta, dqkv, Tn, h, scale);
    DPML_CHECK_LAUNCH();
    backward_dkv_kernel<T, HD, C><<<grid, kThreads, 0, stream>>>(dout, qkv, lse, delta, dqkv, Tn, h, scale);
    DPML_CHECK_LAUNCH();
  });
}

// Ops<CudaSpace>'s attention family, on the Device's stream (Policy: attention::Auto).
struct AttentionOps {
  using Dev = Device<CudaSpace>;
  // The head dimensions the kernels are compiled for (with_head_dim): layers check theirs at
  // construction, on every rank, rather than fail in the first forward.
  static constexpr const char* attention_head_dims = "32, 64 or 128";
  static constexpr bool attention_head_dim_supported(std::int64_t D) { return D == 32 || D == 64 || D == 128; }
  // Both policies; bidirectional over every key (a key-padding mask is refused when given).
  static constexpr const char* attention_masks = "causal, bidirectional (no key padding)";
  static constexpr bool attention_mask_supported(::dpml::attention::Causal) { return true; }
  static constexpr bool attention_mask_supported(::dpml::attention::Bidirectional) { return true; }
  // What the forward keeps for the backward: the rows' log-sum-exp, sized by the forward (the
  // backward also reads the forward's output, which the layer keeps anyway).
  template <class T>
  struct AttentionState {
    Tensor<float, CudaSpace> lse;  // (B, H, T)
  };
  // qkv (B, T, H, 3, D) → out (B, T, H, D); D ∈ {32, 64, 128}
  template <class T, class Mask = ::dpml::attention::Causal>
  static void attention_forward(Dev& dev, const T* qkv, T* out, AttentionState<T>& state, std::int64_t B,
                                std::int64_t Tn, std::int64_t H, std::int64_t D, Mask mask = {}) {
    state.lse.resize(Shape{B, H, Tn});
    cuda::attention_forward<T, attention::Auto>(qkv, out, state.lse.data(), B, Tn, H, D, dev.stream(), mask);
  }
  // dout (B, T, H, D), with the forward's qkv, out and state → dqkv (B, T, H, 3, D), overwritten;
  // delta (B, H, T) in the Device's scratch
  template <class T, class Mask = ::dpml::attention::Causal>
  static void attention_backward(Dev& dev, const T* dout, const T* qkv, const T* out, const AttentionState<T>& state,
                                 T* dqkv, std::int64_t B, std::int64_t Tn, std::int64_t H, std::int64_t D, Mask mask = {}) {
    cuda::attention_backward<T, attention::Auto>(dout, qkv, out, state.lse.data(), dev.scratch<float>(B * H * Tn), dqkv, B, Tn,
                                                 H, D, dev.stream(), mask);
  }
};

}  // namespace dpml::kernels::cuda
