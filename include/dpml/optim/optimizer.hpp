#pragma once
// Optimizer<Rule, T>: one generic class that applies an update rule (Sgd, AdamW: tags with
// Options, state_names and a static update()) to a list of contiguous ranges, each a (value, grad)
// pair of spans with its own state tensors (state_names.size() of them, zero-initialised, same
// length as the range).
//
// The ranges are whatever the caller owns: one per parameter (Optimizer::over(params)), one for a
// whole flat buffer (FlatParameters), or this rank's segments of it under ZeRO-1 — the rule only
// ever sees spans. The step counter t (1 on the first update) is shared by all ranges.
//
// State access (state(range, k), step_count / set_step_count) is what a checkpoint saves and
// restores: range names key the tensors, state_names() name the slots.
//
//   auto opt = Optimizer<AdamW, float>::over(model.parameters(), {.weight_decay = 0.1});
//   opt.step(schedule(opt.step_count() + 1));    // or opt.step(schedule)

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"

#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dpml::optim {

// A contiguous range the optimizer updates: value (n) and its gradient (n).
template <class T>
struct Range {
  std::string name;
  std::span<T> value;
  std::span<const T> grad;
};

template <class R>
concept UpdateRule = requires(const typename R::Options& o) {
  { R::state_names.size() } -> std::convertible_to<std::size_t>;
  R::validate(o);
};

// A learning-rate schedule: lr of the t-th update (t = 1 first). See optim/schedule.hpp.
template <class S>
concept Schedule = requires(const S& s, std::int64_t t) {
  { s(t) } -> std::convertible_to<double>;
};

template <UpdateRule Rule, class T>
class Optimizer {
 public:
  using Options = typename Rule::Options;
  static constexpr std::size_t kStates = Rule::state_names.size();

  Optimizer(std::vector<Range<T>> ranges, Options options) : ranges_(std::move(ranges)), options_(options) {
    Rule::validate(options_);
    for (const auto& r : ranges_) {
      DPML_REQUIRE(r.value.size() == r.grad.size(), "optimizer range '" << r.name << "': value has " << r.value.size()
                                                                        << " elements, gradient " << r.grad.size());
      std::array<std::vector<T>, kStates> s;
      for (auto& v : s) v.assign(r.value.size(), T(0));
      state_.push_back(std::move(s));
    }
  }

  // One range per parameter, in the order given. The spans are taken now: build the optimizer
  // after FlatParameters has bound the parameters, not before.
  template <std::ranges::range Params>
    requires std::convertible_to<std::ranges::range_value_t<Params>, const Param<T>*>
  static Optimizer over(Params&& params, Options options) {
    std::vector<Range<T>> ranges;
    for (const Param<T>* p : params) {
      DPML_REQUIRE(p->value().is_contiguous() && p->grad().is_contiguous(),
                   "parameter '" << p->name() << "' is not contiguous; the optimizer updates contiguous ranges");
      const auto n = static_cast<std::size_t>(p->numel());
      ranges.push_back({p->name(), std::span<T>(p->value().data(), n), std::span<const T>(p->grad().data(), n)});
    }
    return Optimizer(std::move(ranges), options);
  }

  // One update of every range with learning rate `lr`.
  void step(double lr) {
    DPML_REQUIRE(std::isfinite(lr) && lr >= 0.0, "learning rate " << lr << " at step " << steps_ + 1 << " is not a finite, non-negative number");
    ++steps_;
    for (std::size_t i = 0; i < ranges_.size(); ++i)
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        Rule::update(ranges_[i].value, ranges_[i].grad, std::span<T>(state_[i][K])..., options_, lr, steps_);
      }(std::make_index_sequence<kStates>{});
  }
  // One update with the schedule's rate for this step; returns that rate.
  template <Schedule S>
  double step(const S& schedule) {
    const double lr = schedule(steps_ + 1);
    step(lr);
    return lr;
  }

  std::int64_t step_count() const noexcept { return steps_; }
  void set_step_count(std::int64_t t) {
    DPML_REQUIRE(t >= 0, "optimizer step count " << t << " is negative");
    steps_ = t;
  }
  const Options& options() const noexcept { return options_; }
  void set_options(const Options& o) {
    Rule::validate(o);
    options_ = o;
  }

  std::size_t range_count() const noexcept { return ranges_.size(); }
  const Range<T>& range(std::size_t i) const { return ranges_.at(i); }
  static constexpr const auto& state_names() noexcept { return Rule::state_names; }
  // State slot k (named state_names()[k]) of range i: as many elements as the range.
  std::span<T> state(std::size_t i, std::size_t k) {
    DPML_REQUIRE(i < ranges_.size() && k < kStates, "optimizer state (" << i << ", " << k << ") out of "
                                                                         << ranges_.size() << " ranges x " << kStates << " slots");
    return state_[i][k];
  }

 private:
  std::vector<Range<T>> ranges_;
  std::vector<std::array<std::vector<T>, kStates>> state_;
  Options options_;
  std::int64_t steps_ = 0;
};

}  // namespace dpml::optim
