#pragma once
// The element of an optimizer update, shared by the host loop (kernels/host/update.hpp) and the
// device kernel (kernels/cuda/update.hpp): both run update_element over a list of UpdateSpans,
// so an update rule's arithmetic (a DPML_HD functor from optim/) is written once and runs alike
// on both spaces. The kernels know no rule: `step` is any functor
//
//   step(M& p, M g, M* s)      p: the weight, g: its (scaled) gradient, s: the rule's K state
//                              values of this element (momentum, moments …), all updated in place
//
// Precision: values and gradients are stored as T and G (bf16, fp16, float, double); the update
// runs in M (float, or double for double parameters). With master weights (mixed precision) p is
// read from and written to the master array in M, and the value is the master rounded to T;
// without, p is the value itself, widened to M and rounded back.

#include "dpml/core/config.hpp"

#include <cstdint>

namespace dpml::kernels {

// One stretch of an update: `count` elements of value and gradient (a parameter, a ZeRO shard, or
// a piece of one), and where its elements sit in the master and state arrays.
template <class T, class G = T>
struct UpdateSpan {
  T* value;            // (count); nullptr: no working copy to write (master weights only)
  const G* grad;       // (count)
  std::int64_t state;  // index of element 0 in UpdateState's arrays
  std::int64_t count;
};

// The arrays a rule's state lives in, indexed by UpdateSpan::state + i: master weights (nullptr:
// the values are the weights) and K state slots (a nullptr slot reads as 0 and is not written:
// SGD without momentum keeps no buffer).
template <class M, int K>
struct UpdateState {
  M* master = nullptr;
  M* slot[K > 0 ? K : 1] = {};
};

// Element i of span s, its gradient multiplied by `scale` (clipping).
template <class Step, class T, class G, class M, int K>
DPML_HD inline void update_element(const Step& step, const UpdateSpan<T, G>& s, const UpdateState<M, K>& state,
                                   std::int64_t i, M scale) {
  const std::int64_t j = s.state + i;
  M p = state.master ? state.master[j] : static_cast<M>(s.value[i]);
  const M g = static_cast<M>(s.grad[i]) * scale;
  M x[K > 0 ? K : 1];
  for (int k = 0; k < K; ++k) x[k] = state.slot[k] ? state.slot[k][j] : M(0);
  step(p, g, x);
  for (int k = 0; k < K; ++k)
    if (state.slot[k]) state.slot[k][j] = x[k];
  if (state.master) state.master[j] = p;
  if (s.value) s.value[i] = static_cast<T>(p);
}

}  // namespace dpml::kernels
