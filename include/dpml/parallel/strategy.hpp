#pragma once
// The parallel strategy as one type: which axes exist and how each behaves. Degrees (how many
// ranks per axis) are not part of the type; they come from the launch and ProcessGrid.
//
//   using Strategy = dpml::Parallel<dpml::TensorParallel,
//                                   dpml::PipelineParallel<dpml::ZeroBubbleH1>,
//                                   dpml::DataParallel<dpml::Zero1, dpml::Hierarchical>>;
//
// TensorParallel: Megatron column/row-parallel layers (parallel/tensor.hpp).
// PipelineParallel<Schedule>: the schedule tag (GPipe, OneFOneB, ZeroBubbleH1, Interleaved1F1B —
//   its v chunks from the launch: TrainOptions::virtual_stages) that makes the table of actions
//   each stage runs (parallel/pipeline/schedule.hpp).
// DataParallel<Policies…>: at most one of each, in any order —
//   sharding   gradient buckets all-reduced during backward (Replicated, the default), ZeRO-1
//              (Zero1: reduce-scatter, update own shard, all-gather), ZeRO-2 (Zero2: the same
//              without a whole gradient buffer — DistributedOptimizerOptions::shard_gradients,
//              which a program may also set at run time on a Zero1 strategy) or ZeRO-3 (Zero3:
//              without a whole values buffer either, each bucket's values gathered when read —
//              DistributedOptimizerOptions::shard_values, likewise)
//   all-reduce one collective over the data axis' communicator (Flat, the default), or two levels
//              over its nodes (Hierarchical: inside each node, across nodes, inside each node —
//              comm::Hierarchical; nodes from the launch's hosts or Layout::ranks_per_node). The
//              data axis' communicator type follows: data_comm_t<Strategy, Comm>.
//   compression what a gradient bucket puts on the wire (parallel/compression/policy.hpp):
//              NoCompression (the default), WirePrecision<bf16 | Fp16>, PowerSgd, TopK — over a
//              Flat all-reduce on host buckets; PowerSgd and TopK keep whole buckets (error
//              feedback), so not with Zero1. Their sizes: DistributedOptimizerOptions::compression.
// with_strategy() turns command-line choices (--schedule, --zero, --dp-allreduce,
// --grad-compression) into one of these types.

#include "dpml/comm/hierarchical.hpp"
#include "dpml/core/error.hpp"
#include "dpml/parallel/compression/policy.hpp"
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
struct Zero2 {};       // ZeRO stage 2: gradients too (parallel/data.hpp's sharded_gradients)
struct Zero3 {};       // ZeRO stage 3 (FSDP): values too (parallel/data.hpp's sharded_parameters)

struct Flat {};          // one all-reduce over the data axis
struct Hierarchical {};  // inside each node, across nodes, inside each node (comm/hierarchical.hpp)

namespace detail {
template <class P, class... Of>
inline constexpr bool is_one_of = (std::is_same_v<P, Of> || ...);
template <class... Ps>
struct FirstCompression {
  using type = NoCompression;
};
template <class P, class... Ps>
struct FirstCompression<P, Ps...> {
  using type = std::conditional_t<is_compression<P>, P, typename FirstCompression<Ps...>::type>;
};
}  // namespace detail

template <class... Policies>
struct DataParallel {
  template <class... Of>  // how many of the policies are one of Of
  static constexpr int count = (0 + ... + static_cast<int>(detail::is_one_of<Policies, Of...>));
  static constexpr int compressions = (0 + ... + static_cast<int>(is_compression<Policies>));
  static_assert(count<Replicated, Zero1, Zero2, Zero3, Flat, Hierarchical> + compressions == sizeof...(Policies),
                "dpml: DataParallel takes a sharding (Replicated, Zero1, Zero2, Zero3), an all-reduce (Flat, Hierarchical) and a "
                "compression (NoCompression, WirePrecision<bf16 | Fp16>, PowerSgd, TopK)");
  static_assert(count<Replicated, Zero1, Zero2, Zero3> <= 1 && count<Flat, Hierarchical> <= 1 && compressions <= 1,
                "dpml: DataParallel takes at most one sharding (Replicated, Zero1, Zero2, Zero3), one all-reduce (Flat, Hierarchical) "
                "and one compression");
  static constexpr bool zero = count<Zero1, Zero2, Zero3> == 1;
  static constexpr bool shard_gradients = count<Zero2, Zero3> == 1;
  static constexpr bool shard_values = count<Zero3> == 1;
  static constexpr bool hierarchical = count<Hierarchical> == 1;
  using compression = typename detail::FirstCompression<Policies...>::type;
  static constexpr bool compressed = !std::is_same_v<compression, NoCompression>;
  static_assert(!(compressed && hierarchical),
                "dpml: gradient compression runs over one flat data communicator: DataParallel<…, Flat, Compression>");
  static_assert(!(approximates<compression> && zero),
                "dpml: PowerSgd and TopK keep whole buckets on every rank (error feedback): not with Zero1");
  static_assert(!(compressed && shard_gradients), "dpml: gradient compression reduces whole buckets: not with Zero2 or Zero3");
  // The data axis' communicator over communicators of type Comm.
  template <class Comm>
  using comm_t = std::conditional_t<hierarchical, comm::Hierarchical<Comm>, Comm>;
};

template <class TP, class PP, class DP>
struct Parallel {
  using tensor = TP;
  using pipeline_policy = PP;
  using schedule = typename PP::schedule;
  using data = DP;
  static constexpr bool zero = DP::zero;
  static constexpr bool shard_gradients = DP::shard_gradients;
  static constexpr bool shard_values = DP::shard_values;
};

// What the gradient buckets reduce over: Comm, or comm::Hierarchical<Comm> under DataParallel<…, Hierarchical>.
template <class Strategy, class Comm>
using data_comm_t = typename Strategy::data::template comm_t<Comm>;

inline const char* schedule_name(pipeline::GPipe) { return "gpipe"; }
inline const char* schedule_name(pipeline::OneFOneB) { return "1f1b"; }
inline const char* schedule_name(pipeline::ZeroBubbleH1) { return "zb-h1"; }
inline const char* schedule_name(pipeline::Interleaved1F1B) { return "interleaved"; }
inline const char* compression_name(NoCompression) { return "none"; }
inline const char* compression_name(WirePrecision<bf16>) { return "bf16"; }
inline const char* compression_name(WirePrecision<Fp16>) { return "fp16"; }
inline const char* compression_name(PowerSgd) { return "powersgd"; }
inline const char* compression_name(TopK) { return "topk"; }

// The schedule a strategy runs: a name (--schedule), or a schedule tag where the program fixes it
// (pipeline::OneFOneB{} in a data-parallel-only program). Each schedule a name may pick is an
// instantiation of the whole step, so a program names the ones its model can run:
// schedule_among<GPipe, OneFOneB, ZeroBubbleH1>(name) for a model that cuts its own stages (no
// interleaving); a plain std::string may pick any of the four.
template <class S>
concept ScheduleTag = detail::is_one_of<S, pipeline::GPipe, pipeline::OneFOneB, pipeline::ZeroBubbleH1, pipeline::Interleaved1F1B>;

template <ScheduleTag... Schedules>
struct ScheduleChoice {
  std::string name;
};
template <ScheduleTag... Schedules>
ScheduleChoice<Schedules...> schedule_among(std::string name) {
  return {std::move(name)};
}

// The schedules of a model that cuts its own pipeline stages (train::StagedModel: models::Gpt,
// models::Bert), which the interleaved schedule cannot re-cut into chunks.
inline auto staged_model_schedule(std::string name) {
  return schedule_among<pipeline::GPipe, pipeline::OneFOneB, pipeline::ZeroBubbleH1>(std::move(name));
}

namespace detail {
template <class S>
bool names(const std::string& name) {
  return name == schedule_name(S{}) || (std::is_same_v<S, pipeline::ZeroBubbleH1> && name == "zbh1");
}
template <class Body, class S, class... Rest>
decltype(auto) call_with_schedule(const std::string& name, Body& body) {
  if constexpr (sizeof...(Rest) == 0) {
    return body.template operator()<S>();
  } else {
    if (names<S>(name)) return body.template operator()<S>();
    return call_with_schedule<Body, Rest...>(name, body);
  }
}
}  // namespace detail

// Calls body.template operator()<Sched>() with the schedule `choice` names; every rank refuses a
// name that is not among its schedules, listing them.
template <ScheduleTag... Schedules, class Body>
decltype(auto) with_schedule(const ScheduleChoice<Schedules...>& choice, Body&& body) {
  const bool known = (detail::names<Schedules>(choice.name) || ...);
  std::string listed;
  if (!known) ((listed += (listed.empty() ? "" : ", ") + std::string(schedule_name(Schedules{}))), ...);
  DPML_REQUIRE_EVERYWHERE(known, "--schedule " << choice.name << " is not one of " << listed);
  return detail::call_with_schedule<Body, Schedules...>(choice.name, body);
}
template <class Body>
decltype(auto) with_schedule(const std::string& name, Body&& body) {
  return with_schedule(schedule_among<pipeline::GPipe, pipeline::OneFOneB, pipeline::ZeroBubbleH1, pipeline::Interleaved1F1B>(name),
                       std::forward<Body>(body));
}
template <ScheduleTag Sched, class Body>
decltype(auto) with_schedule(Sched, Body&& body) {
  return body.template operator()<Sched>();
}

// Calls body.template operator()<Strategy>() with the strategy of `schedule` (a name or a tag, as
// with_schedule takes) and `zero`, its data axis all-reducing by AllReduce, its buckets compressed
// by Compression (NoCompression, WirePrecision<W>: either sharding; PowerSgd, TopK: Replicated
// only — with `zero` every rank refuses, naming the flags).
template <class AllReduce = Flat, class Compression = NoCompression, class Schedule, class Body>
decltype(auto) with_strategy(const Schedule& schedule, bool zero, Body&& body) {
  return with_schedule(schedule, [&]<class Sched>() -> decltype(auto) {
    if constexpr (approximates<Compression>) {
      DPML_REQUIRE_EVERYWHERE(!zero, "--grad-compression " << compression_name(Compression{})
                                                           << " keeps whole buckets on every rank (error feedback): not with --zero");
      return body.template operator()<Parallel<TensorParallel, PipelineParallel<Sched>, DataParallel<Replicated, AllReduce, Compression>>>();
    } else {
      if (zero)
        return body.template operator()<Parallel<TensorParallel, PipelineParallel<Sched>, DataParallel<Zero1, AllReduce, Compression>>>();
      return body.template operator()<Parallel<TensorParallel, PipelineParallel<Sched>, DataParallel<Replicated, AllReduce, Compression>>>();
    }
  });
}
// --dp-allreduce names the all-reduce: flat | hierarchical (a flag table's check, and with_strategy's).
inline void check_dp_allreduce(const std::string& name) {
  DPML_REQUIRE_EVERYWHERE(name == "flat" || name == "hierarchical", "--dp-allreduce " << name << " is not one of flat, hierarchical");
}
// The same with the all-reduce named by `dp_allreduce`.
template <class Schedule, class Body>
decltype(auto) with_strategy(const Schedule& schedule, bool zero, const std::string& dp_allreduce, Body&& body) {
  check_dp_allreduce(dp_allreduce);
  if (dp_allreduce == "hierarchical") return with_strategy<Hierarchical>(schedule, zero, std::forward<Body>(body));
  return with_strategy<Flat>(schedule, zero, std::forward<Body>(body));
}
// --grad-compression names the compression: none | bf16 | fp16 | powersgd | topk.
inline void check_grad_compression(const std::string& name) {
  DPML_REQUIRE_EVERYWHERE(name == "none" || name == "bf16" || name == "fp16" || name == "powersgd" || name == "topk",
                          "--grad-compression " << name << " is not one of none, bf16, fp16, powersgd, topk");
}
// The same with the buckets' compression named by `compression` (host buckets: a GPU program
// refuses anything but none before calling this, as no device compressor exists). Compression
// needs the flat all-reduce: with --dp-allreduce hierarchical every rank refuses.
template <class Schedule, class Body>
decltype(auto) with_strategy(const Schedule& schedule, bool zero, const std::string& dp_allreduce,
                             const std::string& compression, Body&& body) {
  check_grad_compression(compression);
  if (compression == "none") return with_strategy(schedule, zero, dp_allreduce, std::forward<Body>(body));
  check_dp_allreduce(dp_allreduce);
  DPML_REQUIRE_EVERYWHERE(dp_allreduce == "flat", "--grad-compression " << compression
                                                                        << " runs over one flat all-reduce: not with --dp-allreduce "
                                                                        << dp_allreduce);
  if (compression == "bf16") return with_strategy<Flat, WirePrecision<bf16>>(schedule, zero, std::forward<Body>(body));
  if (compression == "fp16") return with_strategy<Flat, WirePrecision<Fp16>>(schedule, zero, std::forward<Body>(body));
  if (compression == "powersgd") return with_strategy<Flat, PowerSgd>(schedule, zero, std::forward<Body>(body));
  return with_strategy<Flat, TopK>(schedule, zero, std::forward<Body>(body));
}

}  // namespace dpml::parallel

namespace dpml {
using parallel::DataParallel;
using parallel::Flat;
using parallel::Hierarchical;
using parallel::Parallel;
using parallel::PipelineParallel;
using parallel::Replicated;
using parallel::TensorParallel;
using parallel::Zero1;
using parallel::Zero2;
using parallel::Zero3;
using parallel::pipeline::GPipe;
using parallel::pipeline::Interleaved1F1B;
using parallel::pipeline::OneFOneB;
using parallel::pipeline::ZeroBubbleH1;
}  // namespace dpml
