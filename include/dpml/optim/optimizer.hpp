#pragma once
// Optimizer<Rule, T, Space>: one generic class that applies an update rule (Sgd, AdamW: see
// optim/rule.hpp) to a list of contiguous ranges in one memory space, each a (value, grad) pair of
// spans, on the host or the GPU alike: the rule's step functor runs through
// kernels::Ops<Space>::update (a loop on the host, one kernel launch for all ranges on the GPU).
//
// The ranges are whatever the caller owns: one per parameter (Optimizer::over(params)), the
// parameters of a flat buffer, or this rank's segments of it under ZeRO-1 — the rule only ever sees
// elements. State lives in one buffer per slot (state_names.size() of them, zero-initialised),
// range i's elements at the same place in each; with 16-bit T (master_t<T> = float) a master
// buffer of the same layout holds the fp32 weights, initialised from the values, and every update
// rounds it into the values. The step counter t (1 on the first update) is shared by all ranges.
//
//   state (per slot)  [ range 0 | range 1 | … ]        state(i, k): range i's part of slot k
//   master            [ range 0 | range 1 | … ]        (mixed precision only) master(i)
//
// State access (state(i, k), master(i), step_count / set_step_count) is what a checkpoint saves
// and restores: range names key the tensors, state_names() name the slots. The spans it returns
// are in the optimizer's memory space (read them on the host only for HostSpace), or on the host
// when the state is offloaded (state_on_host()).
//
// Offload (ZeRO-Offload; the constructor's `offload`): the state and the master weights live in
// host memory and the update runs there, an Optimizer<Rule, T, HostSpace> over host mirrors of the
// ranges. Each step copies the gradients (and, without master weights, the values) to the mirrors,
// updates on the host, and copies the values back: the GPU keeps only the 16-bit values and
// gradients. The same update element runs, so the result equals the GPU's update up to its
// arithmetic (bitwise on the host, where offload only adds the copies). The mirrors are in the
// space's host_mirror_space_t (page-locked for a GPU: DMA at the link's speed), and a step is a
// pipeline over chunks of elements (set_offload_chunk) on the device's stream:
//
//   stream   grads→mirror c0 | c1 | c2 | …                 values→device c0 | c1 | …
//   host                 wait c0, update c0 ─┘ wait c1, update c1 ─┘ …
//
// so the copies of the other chunks run while the host updates one; the device's next work (the
// next step's forward) follows the last copy back in stream order.
//
//   auto opt = Optimizer<AdamW, float>::over(model.parameters(), {.weight_decay = 0.1});
//   opt.step(schedule(opt.step_count() + 1));    // or opt.step(schedule)

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/kernels/update.hpp"
#include "dpml/optim/rule.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpml::optim {

// A contiguous range the optimizer updates: value (n) and its gradient (n), in the optimizer's space.
template <class T>
struct Range {
  std::string name;
  std::span<T> value;
  std::span<const T> grad;
};

// A learning-rate schedule: lr of the t-th update (t = 1 first). See optim/schedule.hpp.
template <class S>
concept Schedule = requires(const S& s, std::int64_t t) {
  { s(t) } -> std::convertible_to<double>;
};

template <UpdateRule Rule, class T, class Space = HostSpace>
class Optimizer {
  using Ops = kernels::Ops<Space>;

 public:
  using Options = typename Rule::Options;
  using master_type = master_t<T>;
  static constexpr std::size_t kStates = Rule::state_names.size();
  // Mixed precision: fp32 master weights beside 16-bit values.
  static constexpr bool keeps_master = !std::is_same_v<master_type, T>;

  // Host optimizers.
  Optimizer(std::vector<Range<T>> ranges, Options options)
    requires std::same_as<Space, HostSpace>
      : Optimizer(std::move(ranges), options, kernels::host_device()) {}
  // Any space: the kernels run on `dev` (its stream on a GPU), which must outlive the optimizer.
  // `offload`: the state and the update on the host (above).
  Optimizer(std::vector<Range<T>> ranges, Options options, kernels::Device<Space>& dev, bool offload = false)
      : ranges_(std::move(ranges)), options_(options), dev_(&dev) {
    Rule::validate(options_);
    before_.push_back(0);
    for (const auto& r : ranges_) {
      DPML_REQUIRE(r.value.size() == r.grad.size(), "optimizer range '" << r.name << "': value has " << r.value.size()
                                                                        << " elements, gradient " << r.grad.size());
      before_.push_back(before_.back() + static_cast<std::int64_t>(r.value.size()));
    }
    if (offload) {
      offload_to_host();
      return;
    }
    for (auto& s : state_) {
      s = Tensor<master_type, Space>(Shape{total()});
      Ops::zero(*dev_, s.data(), total());
    }
    if constexpr (keeps_master) {
      master_ = Tensor<master_type, Space>(Shape{total()});
      reload_master();
    }
    build_spans();
  }

  Optimizer(Optimizer&&) noexcept = default;
  Optimizer& operator=(Optimizer&&) noexcept = default;

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

  // One update of every range with learning rate `lr`, each gradient multiplied by *grad_scale (one
  // element in this space, nullptr: 1). A non-finite *grad_scale leaves everything as it was (the
  // step count still advances: the caller that knows the scale is non-finite sets it back).
  void step(double lr, const master_type* grad_scale = nullptr) {
    DPML_REQUIRE(std::isfinite(lr) && lr >= 0.0, "learning rate " << lr << " at step " << steps_ + 1 << " is not a finite, non-negative number");
    ++steps_;
    if (host_) {
      step_on_host(lr, grad_scale);
      return;
    }
    Ops::update(*dev_, Rule::template step<master_type>(options_, lr, steps_), spans_.data(), spans_.numel(), arrays(),
                grad_scale);
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
    if (host_) host_->set_options(o);
  }
  // The state and master weights live in host memory (offload), whatever the space.
  bool state_on_host() const noexcept { return std::same_as<Space, HostSpace> || host_ != nullptr; }
  // Offload: the last step's host time in seconds, waiting for the gradients' copies and updating.
  struct OffloadSeconds {
    double waiting = 0, updating = 0;
  };
  OffloadSeconds offload_seconds() const noexcept { return offload_seconds_; }
  // Offload: the pipeline's chunk in elements (kOffloadChunk, 64 Mi, by default). A smaller chunk
  // starts the host's update sooner, but under 4 Mi elements a core it leaves cores idle.
  void set_offload_chunk(std::int64_t elements) {
    DPML_REQUIRE(elements > 0, "offload chunk of " << elements << " elements: give at least 1");
    offload_chunk_ = elements;
  }

  // One update of elements [first, last) of the ranges laid end to end, at step count step_count()
  // (not advanced): an offloaded optimizer's host side updates a chunk at a time, each as soon as
  // its gradients have arrived. Host optimizers only.
  void update_elements(double lr, const master_type* grad_scale, std::int64_t first, std::int64_t last)
    requires std::same_as<Space, HostSpace>
  {
    const auto spans = spans_of(first, last);
    Ops::update(*dev_, Rule::template step<master_type>(options_, lr, steps_), spans.data(),
                static_cast<std::int64_t>(spans.size()), arrays(), grad_scale);
  }

  std::size_t range_count() const noexcept { return ranges_.size(); }
  const Range<T>& range(std::size_t i) const { return ranges_.at(i); }
  static constexpr const auto& state_names() noexcept { return Rule::state_names; }
  // State slot k (named state_names()[k]) of range i: as many elements as the range.
  std::span<master_type> state(std::size_t i, std::size_t k) {
    DPML_REQUIRE(i < ranges_.size() && k < kStates, "optimizer state (" << i << ", " << k << ") out of "
                                                                         << ranges_.size() << " ranges x " << kStates << " slots");
    if (host_) return host_->state(i, k);
    return {state_[k].data() + before_[i], ranges_[i].value.size()};
  }
  // Range i's master weights (mixed precision only).
  std::span<master_type> master(std::size_t i)
    requires keeps_master
  {
    DPML_REQUIRE(i < ranges_.size(), "optimizer master weights of range " << i << " out of " << ranges_.size());
    if (host_) return host_->master(i);
    return {master_.data() + before_[i], ranges_[i].value.size()};
  }
  // The master weights again from the values (mixed precision), after something other than step()
  // wrote the values: initialisation, a checkpoint's weights. Synchronous.
  void reload_master() {
    if (host_) {
      to_mirror(&Range<T>::value, mirror_values_.data());
      host_->reload_master();
      return;
    }
    if constexpr (keeps_master) {
      std::vector<T> v;
      std::vector<master_type> m;
      for (std::size_t i = 0; i < ranges_.size(); ++i) {
        const std::size_t n = ranges_[i].value.size();
        v.resize(n);
        m.resize(n);
        SpaceCopy<HostSpace, Space>::copy(v.data(), ranges_[i].value.data(), n * sizeof(T));
        std::transform(v.begin(), v.end(), m.begin(), [](T x) { return static_cast<master_type>(x); });
        SpaceCopy<Space, HostSpace>::copy(master_.data() + before_[i], m.data(), n * sizeof(master_type));
      }
    }
  }

 private:
  std::int64_t total() const noexcept { return before_.back(); }
  // f(range i, its first element `at` in the ranges laid end to end, count) for each range's part
  // of elements [lo, hi).
  template <class F>
  void for_parts(std::int64_t lo, std::int64_t hi, F&& f) const {
    auto i = static_cast<std::size_t>(std::upper_bound(before_.begin(), before_.end(), lo) - before_.begin()) - 1;
    for (; i < ranges_.size() && before_[i] < hi; ++i) {
      const std::int64_t a = std::max(lo, before_[i]), b = std::min(hi, before_[i + 1]);
      if (b > a) f(i, a, b - a);
    }
  }

  // ---- offload ------------------------------------------------------------------------------------
  // The host optimizer over mirrors of the ranges, laid out as the state ([range 0 | range 1 | …]).
  void offload_to_host() {
    mirror_values_ = Mirror(Shape{total()});
    mirror_grads_ = Mirror(Shape{total()});
    to_mirror(&Range<T>::value, mirror_values_.data());
    std::vector<Range<T>> mirrored;
    for (std::size_t i = 0; i < ranges_.size(); ++i) {
      const std::size_t n = ranges_[i].value.size();
      mirrored.push_back({ranges_[i].name, std::span<T>(mirror_values_.data() + before_[i], n),
                          std::span<const T>(mirror_grads_.data() + before_[i], n)});
    }
    host_ = std::make_unique<Optimizer<Rule, T, HostSpace>>(std::move(mirrored), options_, kernels::host_device());
  }
  // Each range's `field` (&Range::value or &Range::grad) into the mirror at `mirror`.
  template <class Field>
  void to_mirror(Field field, T* mirror) {
    for (std::size_t i = 0; i < ranges_.size(); ++i) {
      const auto span = ranges_[i].*field;
      SpaceCopy<HostSpace, Space>::copy(mirror + before_[i], span.data(), span.size() * sizeof(T));
    }
  }
  // The update on the host, the pipeline at the top: every chunk's gradients (and values, when
  // they are the weights) queued for the mirrors, then chunk by chunk the host's update once its
  // copies landed and its values queued back.
  void step_on_host(double lr, const master_type* grad_scale) {
    using Clock = std::chrono::steady_clock;
    master_type scale = 1;
    if (grad_scale) SpaceCopy<HostSpace, Space>::copy(&scale, grad_scale, sizeof(scale));
    host_->set_step_count(steps_);
    const std::int64_t chunk = offload_chunk_, chunks = (total() + chunk - 1) / chunk;
    if (static_cast<std::int64_t>(landed_.size()) < chunks) landed_.resize(static_cast<std::size_t>(chunks));
    for (std::int64_t c = 0; c < chunks; ++c) {
      for_parts(c * chunk, (c + 1) * chunk, [&](std::size_t i, std::int64_t at, std::int64_t n) {
        const std::int64_t off = at - before_[i];
        Ops::copy_to_host(*dev_, ranges_[i].grad.data() + off, mirror_grads_.data() + at, n);
        if constexpr (!keeps_master) Ops::copy_to_host(*dev_, ranges_[i].value.data() + off, mirror_values_.data() + at, n);
      });
      Ops::mark(*dev_, landed_[static_cast<std::size_t>(c)]);
    }
    offload_seconds_ = {};
    for (std::int64_t c = 0; c < chunks; ++c) {
      const auto t0 = Clock::now();
      Ops::wait_for(landed_[static_cast<std::size_t>(c)]);
      const auto t1 = Clock::now();
      host_->update_elements(lr, &scale, c * chunk, std::min(total(), (c + 1) * chunk));
      offload_seconds_.waiting += std::chrono::duration<double>(t1 - t0).count();
      offload_seconds_.updating += std::chrono::duration<double>(Clock::now() - t1).count();
      for_parts(c * chunk, (c + 1) * chunk, [&](std::size_t i, std::int64_t at, std::int64_t n) {
        Ops::copy_from_host(*dev_, mirror_values_.data() + at, ranges_[i].value.data() + (at - before_[i]), n);
      });
    }
  }

  // Elements [lo, hi) of the ranges laid end to end, as spans of at most Ops::max_update_span.
  std::vector<kernels::UpdateSpan<T>> spans_of(std::int64_t lo, std::int64_t hi) const {
    std::vector<kernels::UpdateSpan<T>> spans;
    for_parts(lo, hi, [&](std::size_t i, std::int64_t at, std::int64_t n) {
      for (std::int64_t d = 0; d < n; d += Ops::max_update_span) {
        const std::int64_t off = at - before_[i] + d;
        spans.push_back({ranges_[i].value.data() + off, ranges_[i].grad.data() + off, at + d, std::min(Ops::max_update_span, n - d)});
      }
    });
    return spans;
  }
  // The ranges cut into spans the space's update takes (the device gives each span one block).
  void build_spans() {
    const auto spans = spans_of(0, total());
    spans_ = Tensor<kernels::UpdateSpan<T>, Space>(Shape{static_cast<std::int64_t>(spans.size())});
    SpaceCopy<Space, HostSpace>::copy(spans_.data(), spans.data(), spans.size() * sizeof(spans[0]));
  }

  kernels::UpdateState<master_type, static_cast<int>(kStates)> arrays() const {
    kernels::UpdateState<master_type, static_cast<int>(kStates)> a;
    a.master = keeps_master ? master_.data() : nullptr;
    for (std::size_t k = 0; k < kStates; ++k) a.slot[k] = state_[k].data();
    return a;
  }

  std::vector<Range<T>> ranges_;
  std::vector<std::int64_t> before_;  // (ranges + 1) range i's first element in the state buffers
  Options options_;
  kernels::Device<Space>* dev_;
  std::array<Tensor<master_type, Space>, kStates> state_;  // (total) each
  Tensor<master_type, Space> master_;                       // (total) mixed precision only
  Tensor<kernels::UpdateSpan<T>, Space> spans_;
  std::int64_t steps_ = 0;
  // Offload: the host optimizer and its mirrors of the ranges' values and gradients (total each);
  // per chunk of the pipeline, the mark of its copies to the mirrors. The host update splits a
  // call over cores in parts of at least 4 Mi elements (kernels/host/update.hpp), so a chunk holds
  // 4 Mi per core of a large host: with 16 Mi, 16 cores updated GPT 2.7B 3.7× slower (RESULTS.md).
  static constexpr std::int64_t kOffloadChunk = std::int64_t{1} << 26;
  using Mirror = Tensor<T, host_mirror_space_t<Space>>;
  std::unique_ptr<Optimizer<Rule, T, HostSpace>> host_;
  Mirror mirror_values_, mirror_grads_;
  std::int64_t offload_chunk_ = kOffloadChunk;
  std::vector<typename Ops::Mark> landed_;
  OffloadSeconds offload_seconds_;
};

}  // namespace dpml::optim
