#pragma once
// The parallel strategy as one type: which axes exist and how each behaves. Degrees (how many
// ranks per axis) are not part of the type; they come from the launch and ProcessGrid.
//
//   using Strategy = dpml::Parallel<dpml::TensorParallel,
//                                   dpml::PipelineParallel<dpml::ZeroBubbleH1>,
//                                   dpml::DataParallel<dpml::Zero1>>;
//
// TensorParallel: Megatron column/row-parallel layers (parallel/tensor.hpp).
// PipelineParallel<Schedule>: the schedule tag (GPipe, OneFOneB, ZeroBubbleH1) that makes the
//   table of actions each stage runs (parallel/pipeline/schedule.hpp).
// DataParallel<Sharding>: gradient buckets all-reduced during backward (Replicated), or ZeRO-1
//   (Zero1: reduce-scatter, update own shard, all-gather).
// with_strategy() turns command-line choices (--schedule, --zero) into one of these types.

#include "dpml/core/error.hpp"
#include "dpml/parallel/pipeline/schedule.hpp"

#include <string>
#include <type_traits>

namespace dpml::parallel {

struct TensorParallel {};

template <class Schedule = pipeline::OneFOneB>
struct PipelineParallel {
  using schedule = Schedule;
};

struct Replicated {};  // plain data parallelism: every data rank holds all optimizer state
struct Zero1 {};       // ZeRO stage 1: optimizer state sharded over the data axis

template <class Sharding = Replicated>
struct DataParallel {
  static constexpr bool zero = std::is_same_v<Sharding, Zero1>;
};

template <class TP, class PP, class DP>
struct Parallel {
  using tensor = TP;
  using pipeline_policy = PP;
  using schedule = typename PP::schedule;
  using data = DP;
  static constexpr bool zero = DP::zero;
};

inline const char* schedule_name(pipeline::GPipe) { return "gpipe"; }
inline const char* schedule_name(pipeline::OneFOneB) { return "1f1b"; }
inline const char* schedule_name(pipeline::ZeroBubbleH1) { return "zb-h1"; }

// Calls body.template operator()<Strategy>() with the strategy named by `schedule` and `zero`.
template <class Body>
decltype(auto) with_strategy(const std::string& schedule, bool zero, Body&& body) {
  auto pick_dp = [&]<class Sched>() -> decltype(auto) {
    if (zero) return body.template operator()<Parallel<TensorParallel, PipelineParallel<Sched>, DataParallel<Zero1>>>();
    return body.template operator()<Parallel<TensorParallel, PipelineParallel<Sched>, DataParallel<Replicated>>>();
  };
  if (schedule == "gpipe") return pick_dp.template operator()<pipeline::GPipe>();
  if (schedule == "1f1b") return pick_dp.template operator()<pipeline::OneFOneB>();
  DPML_REQUIRE_EVERYWHERE(schedule == "zb-h1" || schedule == "zbh1",
                          "--schedule " << schedule << " is not one of gpipe, 1f1b, zb-h1");
  return pick_dp.template operator()<pipeline::ZeroBubbleH1>();
}

}  // namespace dpml::parallel

namespace dpml {
using parallel::DataParallel;
using parallel::Parallel;
using parallel::PipelineParallel;
using parallel::Replicated;
using parallel::TensorParallel;
using parallel::Zero1;
using parallel::pipeline::GPipe;
using parallel::pipeline::OneFOneB;
using parallel::pipeline::ZeroBubbleH1;
}  // namespace dpml
