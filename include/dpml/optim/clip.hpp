#pragma once
// Global gradient-norm clipping, torch.nn.utils.clip_grad_norm_ semantics:
//
//   norm = √(reduce(Σ local g²))       coef = min(1, max_norm / (norm + 1e-6))       g ·= coef if coef < 1
//
// The sum of squares of this rank's gradients (accumulated in double) goes through `reduce`, a
// callable double → double supplied by the caller: identity on one process; under tensor or
// pipeline parallelism the caller sums over those axes and counts each replicated parameter once
// (e.g. passes only the tp-rank-0 share of replicated tensors, or pre-divides them). Every rank
// must reach the same total, so they all scale alike. Returns the total norm. A non-finite norm
// (an overflow, a NaN gradient) leaves the gradients untouched and is returned as is, for the
// caller to skip the step. The coefficient is the parallel runtime's (kernels/host/grad_norm.hpp).

#include "dpml/core/parameter.hpp"
#include "dpml/kernels/host/grad_norm.hpp"

#include <cmath>
#include <concepts>
#include <cstddef>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpml::optim {

namespace detail {
struct LocalNorm {
  double operator()(double squared_sum) const noexcept { return squared_sum; }
};

template <class T, class Reduce>
double clip_spans(std::span<const std::span<T>> grads, double max_norm, Reduce&& reduce) {
  DPML_REQUIRE(max_norm > 0.0, "clip_grad_norm: max_norm " << max_norm << " must be positive");
  double local = 0.0;
  for (const auto& g : grads)
    for (const T x : g) local += static_cast<double>(x) * static_cast<double>(x);
  const double total = static_cast<double>(reduce(local));
  double coef = 1.0;  // NaN for a non-finite norm
  kernels::host::GradNormOps::clip_scale(kernels::host_device(), &total, &coef, max_norm);
  const double norm = std::sqrt(total);
  if (std::isfinite(coef) && coef < 1.0)
    for (const auto& g : grads)
      for (T& x : g) x = static_cast<T>(static_cast<double>(x) * coef);
  return norm;
}

template <class>
inline constexpr bool is_mutable_span = false;
template <class T>
inline constexpr bool is_mutable_span<std::span<T>> = !std::is_const_v<T>;
}  // namespace detail

// Over gradient ranges: a contiguous range of std::span<T> (a flat buffer, a ZeRO shard, one span
// per parameter).
template <std::ranges::contiguous_range Grads, class Reduce = detail::LocalNorm>
  requires detail::is_mutable_span<std::ranges::range_value_t<Grads>>
double clip_grad_norm(Grads&& grads, double max_norm, Reduce&& reduce = {}) {
  using T = typename std::ranges::range_value_t<Grads>::element_type;
  return detail::clip_spans<T>(std::span<const std::span<T>>(std::ranges::data(grads), std::ranges::size(grads)), max_norm,
                               std::forward<Reduce>(reduce));
}

// Over parameters (pointers to Param<T>).
template <std::ranges::range Params, class Reduce = detail::LocalNorm>
  requires requires(std::ranges::range_value_t<Params> p) { p->grad().data(); }
double clip_grad_norm(Params&& params, double max_norm, Reduce&& reduce = {}) {
  using T = std::remove_pointer_t<decltype(std::declval<std::ranges::range_value_t<Params>>()->grad().data())>;
  std::vector<std::span<T>> grads;
  for (const auto& p : params) {
    DPML_REQUIRE(p->grad().is_contiguous(), "clip_grad_norm: gradient of '" << p->name() << "' is not contiguous");
    grads.emplace_back(p->grad().data(), static_cast<std::size_t>(p->numel()));
  }
  return detail::clip_spans<T>(std::span<const std::span<T>>(grads), max_norm, std::forward<Reduce>(reduce));
}

}  // namespace dpml::optim
