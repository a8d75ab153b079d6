#pragma once
// One generic optimizer-update kernel for every update rule: each block takes one UpdateSpan and
// runs the shared element (kernels/update.hpp) over it with the rule's functor, which the
// optimizer (optim/) passes in. Reads the master weights (or the values), the gradient and the K
// state slots once and writes them once: for AdamW with bf16 gradients and an fp32 master, 18
// bytes read + 14 written per parameter — the floor of the update (the fused AdamW of before was
// this kernel with the rule written in; bench/RESULTS.md has its speed, ~90 % of 3 TB/s).
//
// Spans come either from a table in device memory (many ranges in one launch: every parameter of
// a model, or a rank's ZeRO shards; the optimizer cuts them to at most max_update_span elements
// when it builds the table) or from one contiguous range cut on the fly (update_contiguous).
//
// Clipping enters as `scale`, a device pointer (nullable) to one M that multiplies every gradient:
// GradNormOps::clip_scale (grad_norm.hpp) writes it on the device, so the step needs no host
// synchronisation. A non-finite *scale (an overflowed or NaN gradient norm) skips the update
// entirely — every block sees the same value, so the buffers stay untouched.

#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/device.hpp"
#include "dpml/kernels/update.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace dpml::kernels::cuda {

namespace detail::update {

constexpr int kThreads = 256;
// Elements per block: 32 per thread, enough to hide a block's start-up, few enough that the last
// wave of a 124M-element update is short (15k blocks over 132 SMs).
constexpr std::int64_t kSpan = std::int64_t{kThreads} * 32;

// Span b of a table in device memory.
template <class T, class G>
struct Table {
  const UpdateSpan<T, G>* spans;
  __device__ UpdateSpan<T, G> operator[](std::int64_t b) const { return spans[b]; }
};

// Span b of one contiguous range of n elements cut every kSpan; the state arrays index like it.
template <class T, class G>
struct Contiguous {
  T* value;  // nullable
  const G* grad;
  std::int64_t n;
  __device__ UpdateSpan<T, G> operator[](std::int64_t b) const {
    const std::int64_t at = b * kSpan;
    return {value ? value + at : nullptr, grad + at, at, n - at < kSpan ? n - at : kSpan};
  }
};

template <class Step, class Spans, class M, int K>
__global__ void __launch_bounds__(kThreads) update_kernel(const Step step, const Spans spans, const UpdateState<M, K> state,
                                                        const M* __restrict__ scale) {
  const M gs = scale ? *scale : M(1);
  if (!isfinite(gs)) return;
  const auto s = spans[blockIdx.x];
  for (std::int64_t i = threadIdx.x; i < s.count; i += kThreads) update_element(step, s, state, i, gs);
}

template <class Step, class Spans, class M, int K>
void launch(const Step& step, const Spans& spans, std::int64_t blocks, const UpdateState<M, K>& state, const M* scale,
            cudaStream_t stream) {
  if (blocks == 0) return;
  DPML_REQUIRE(blocks <= std::int64_t{0x7fffffff}, "optimizer update: " << blocks << " spans exceed one launch's grid");
  update_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(step, spans, state, scale);
  DPML_CHECK_LAUNCH();
}

}  // namespace detail::update

// One step on n_spans spans (a device table, each span at most max_update_span elements) with the
// state arrays of `state` (device) and the gradient multiplier *scale (device, nullable).
template <class Step, class T, class G, class M, int K>
void update_spans(const Step& step, const UpdateSpan<T, G>* spans, std::int64_t n_spans, const UpdateState<M, K>& state,
                  const M* scale, cudaStream_t stream) {
  detail::update::launch(step, detail::update::Table<T, G>{spans}, n_spans, state, scale, stream);
}

// One step on one contiguous range: value (n, nullable), grad (n), and state arrays of n elements.
template <class Step, class T, class G, class M, int K>
void update_contiguous(const Step& step, T* value, const G* grad, std::int64_t n, const UpdateState<M, K>& state,
                       const M* scale, cudaStream_t stream) {
  DPML_REQUIRE(n >= 0, "optimizer update of " << n << " elements");
  detail::update::launch(step, detail::update::Contiguous<T, G>{value, grad, n}, ceil_div(n, detail::update::kSpan), state,
                         scale, stream);
}

// Ops<CudaSpace>'s optimizer-update family (kernels/host/update.hpp is the host one).
struct UpdateOps {
  using Dev = Device<CudaSpace>;
  static constexpr std::int64_t max_update_span = detail::update::kSpan;

  // spans (n_spans) in device memory, each at most max_update_span long; scale: device, nullable.
  template <class Step, class T, class G, class M, int K>
  static void update(Dev& dev, const Step& step, const UpdateSpan<T, G>* spans, std::int64_t n_spans,
                     const UpdateState<M, K>& state, const M* scale) {
    update_spans(step, spans, n_spans, state, scale, dev.stream());
  }
};

}  // namespace dpml::kernels::cuda
