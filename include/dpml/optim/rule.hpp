#pragma once
// What an update rule is, and the precision it runs in.
//
// An update rule (optim::Sgd, optim::AdamW) is a tag type with
//   Options                       its hyper-parameters (PyTorch's names and defaults)
//   state_names                   the per-element state it keeps ("momentum"; "exp_avg", "exp_avg_sq")
//   validate(options)             an Error naming a bad option
//   step<A>(options, lr, t)       the per-element update of the t-th step (t = 1 first): a small
//                                 DPML_HD functor, coefficients computed once on the host,
//                                   step(A& p, A g, A* s)   weight, gradient, the element's state
// The functor is the rule's arithmetic, written once: the host loop and the one generic device
// kernel run it alike (kernels/update.hpp), so Optimizer<Rule, T, Space> and
// parallel::DistributedOptimizer serve any rule on either memory space.
//
// Precision: parameters and gradients are stored as T; the update runs in master_t<T>, which is
// also the type of the rule's state and, where it differs from T, of master weights kept beside
// the parameters (mixed precision: bf16 or fp16 parameters, fp32 master weights and moments, the
// values rounded from the master after each update, as the fused GPU models do). float and double
// parameters are their own master. Loss scaling for fp16 is not part of the update: 1/S folds into
// the clipping scale the update multiplies each gradient by (optim/loss_scale.hpp).

#include "dpml/core/error.hpp"
#include "dpml/kernels/host/update.hpp"

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

namespace dpml::optim {

// The arithmetic, state and master type of an update of T parameters: float for 16-bit T (bf16,
// fp16), T itself for float and double.
template <class T>
using master_t = std::conditional_t<(sizeof(T) < sizeof(float)), float, T>;

template <class R>
concept UpdateRule = requires(const typename R::Options& o, float& p, float g, float* s) {
  { R::state_names.size() } -> std::convertible_to<std::size_t>;
  R::validate(o);
  R::template step<float>(o, 1.0, std::int64_t{1})(p, g, s);
};

namespace detail {
// One step of `Rule` on contiguous host spans (value, grad and each state slot of one length):
// the rules' update() for callers that hold plain arrays (reference computations in tests).
template <class Rule, class T, std::size_t K>
void update_host(std::span<T> value, std::span<const T> grad, const std::array<std::span<master_t<T>>, K>& state,
                 const typename Rule::Options& o, double lr, std::int64_t step) {
  Rule::validate(o);
  const std::int64_t n = static_cast<std::int64_t>(value.size());
  DPML_REQUIRE(grad.size() == value.size(), "update: " << value.size() << " values, " << grad.size() << " gradients");
  kernels::UpdateState<master_t<T>, static_cast<int>(K)> arrays;
  for (std::size_t k = 0; k < K; ++k) {
    DPML_REQUIRE(state[k].size() == value.size(), "update: state slot " << k << " has " << state[k].size()
                                                                         << " elements, the values " << value.size());
    arrays.slot[k] = state[k].data();
  }
  const kernels::UpdateSpan<T> span{value.data(), grad.data(), 0, n};
  kernels::host::UpdateOps::update(kernels::host_device(), Rule::template step<master_t<T>>(o, lr, step), &span, 1, arrays,
                                   static_cast<const master_t<T>*>(nullptr));
}
}  // namespace detail

}  // namespace dpml::optim
