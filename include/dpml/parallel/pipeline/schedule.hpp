#pragma once
// Pipeline schedules as data: for each stage, the ordered actions of one training step.
//
// A schedule is a table — one list of Actions per stage — produced by make_schedule(Tag, p, m)
// for a policy tag (GPipe, OneFOneB, ZeroBubbleH1), checked by check_schedule and run by the
// executor (executor.hpp) on each stage, or by simulate() here on a cost model. Every backward is
// split in two: BackwardInput (B: the gradient of the stage's input, on the critical path between
// stages) and BackwardWeight (W: the weight gradients, needed by nobody downstream). GPipe and 1F1B
// put W right after its B; ZB-H1 delays W's to fill the bubble.
//
// Communication actions and their meaning (the executor follows this exactly):
//   RecvForward(mb)   post the receive of mb's input activation from stage s−1 (non-blocking);
//                     Forward(mb) waits for it. The generators place it one compute action before
//                     the Forward that needs it, so the transfer overlaps that action.
//   SendForward(mb)   send mb's output activation to stage s+1 (non-blocking).
//   RecvBackward(mb)  post the receive of the gradient of mb's output from stage s+1;
//                     BackwardInput(mb) waits for it (placed like RecvForward).
//   SendBackward(mb)  send the gradient of mb's input to stage s−1 (non-blocking). GPipe and 1F1B
//                     send it after W(mb), as their papers' unsplit backward does, so that their
//                     bubble is the classical one; ZB-H1 sends it right after B(mb).
//
// The three schedules, p stages, m micro-batches, stage s in 0..p−1, F/B/W = compute actions:
//   GPipe  F0 … F(m−1), then B0 W0 … B(m−1) W(m−1). Peak in flight: m micro-batches.
//   1F1B   (PipeDream-flush, Narayanan et al. 2021) warm-up of w = min(p−s−1, m) forwards, then
//          steady pairs F(w+i), B(i) W(i), then the cool-down B W of the last w micro-batches.
//          Peak in flight on stage s: min(p−s, m).
//   ZB-H1  (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §2.1, figure 3 top) the
//          1F1B order of F and B, but stage s starts its W's s micro-batches late, so that every
//          stage holds the same number (p) of micro-batches in flight — stage 0's 1F1B peak,
//          hence the same peak activation memory as 1F1B. In the cool-down, each B is followed by
//          one delayed W, which fills the wait for the next gradient; the remaining W's end the
//          step and fill the tail where 1F1B stages idle.
//
// Bubble theory (costs F, B, W per micro-batch and stage, communication free):
//   GPipe, 1F1B:  makespan (m+p−1)(F+B+W); idle per stage (p−1)(F+B+W);
//                 idle / makespan = (p−1)/(m+p−1)   (= bubble/compute (p−1)/m).
//   ZB-H1:        idle per stage (p−1)(F+B−W) when W ≤ F, B and m ≥ p — a third of 1F1B's at
//                 F=B=W;
//                 idle / makespan = (p−1)(F+B−W) / (m(F+B+W) + (p−1)(F+B−W)).
// theory_bubble() returns these; simulate() measures any table on the same model.

#include "dpml/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <deque>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace dpml::parallel::pipeline {

// Policy tags.
struct GPipe {};
struct OneFOneB {};
struct ZeroBubbleH1 {};

enum class Op { Forward, BackwardInput, BackwardWeight, SendForward, RecvForward, SendBackward, RecvBackward };

inline const char* op_name(Op op) {
  switch (op) {
    case Op::Forward: return "Forward";
    case Op::BackwardInput: return "BackwardInput";
    case Op::BackwardWeight: return "BackwardWeight";
    case Op::SendForward: return "SendForward";
    case Op::RecvForward: return "RecvForward";
    case Op::SendBackward: return "SendBackward";
    case Op::RecvBackward: return "RecvBackward";
  }
  return "?";
}

struct Action {
  Op op;
  int micro_batch;
  friend bool operator==(const Action&, const Action&) = default;
};

using Schedule = std::vector<std::vector<Action>>;  // (stages) lists of actions, in execution order

inline bool is_compute(Op op) { return op == Op::Forward || op == Op::BackwardInput || op == Op::BackwardWeight; }

// One line per stage: "F0 F1 B0 W0 …" (communication actions left out unless `with_comm`).
inline std::string to_string(const Schedule& schedule, bool with_comm = false) {
  static constexpr const char* kShort[] = {"F", "B", "W", "sf", "rf", "sb", "rb"};
  std::ostringstream os;
  for (std::size_t s = 0; s < schedule.size(); ++s) {
    os << "stage " << s << ':';
    for (const Action& a : schedule[s])
      if (with_comm || is_compute(a.op)) os << ' ' << kShort[static_cast<int>(a.op)] << a.micro_batch;
    os << '\n';
  }
  return os.str();
}

namespace detail {

inline void require_sizes(int stages, int micro_batches) {
  DPML_REQUIRE_EVERYWHERE(stages >= 1, "a pipeline needs at least 1 stage, got " << stages);
  DPML_REQUIRE_EVERYWHERE(micro_batches >= 1, "a pipeline step needs at least 1 micro-batch, got " << micro_batches);
}

// Adds the communication actions to one stage's compute sequence (see the header comment).
// fused_backward: the input gradient is sent after the W that follows its B (an unsplit backward).
inline std::vector<Action> with_communication(const std::vector<Action>& compute, int stage, int stages,
                                              bool fused_backward) {
  const bool first = stage == 0, last = stage == stages - 1;
  auto recv_for = [&](const Action& a) -> std::optional<Action> {
    if (a.op == Op::Forward && !first) return Action{Op::RecvForward, a.micro_batch};
    if (a.op == Op::BackwardInput && !last) return Action{Op::RecvBackward, a.micro_batch};
    return std::nullopt;
  };
  std::vector<Action> out;
  if (!compute.empty())
    if (auto r = recv_for(compute[0])) out.push_back(*r);
  for (std::size_t i = 0; i < compute.size(); ++i) {
    if (i + 1 < compute.size())
      if (auto r = recv_for(compute[i + 1])) out.push_back(*r);  // posted one action early: overlap
    const Action& a = compute[i];
    out.push_back(a);
    if (a.op == Op::Forward && !last) out.push_back({Op::SendForward, a.micro_batch});
    const bool backward_done = fused_backward ? a.op == Op::BackwardWeight : a.op == Op::BackwardInput;
    if (backward_done && !first) out.push_back({Op::SendBackward, a.micro_batch});
  }
  return out;
}

// F/B/W order of one stage shaped like 1F1B; W's start `w_delay` micro-batches after their B.
inline std::vector<Action> one_f_one_b_compute(int stage, int stages, int m, int w_delay) {
  const int warmup = std::min(stages - stage - 1, m);
  std::vector<Action> c;
  std::deque<int> pending_w;
  auto backward = [&](int mb, int keep) {
    c.push_back({Op::BackwardInput, mb});
    pending_w.push_back(mb);
    if (static_cast<int>(pending_w.size()) > keep) {
      c.push_back({Op::BackwardWeight, pending_w.front()});
      pending_w.pop_front();
    }
  };
  for (int i = 0; i < warmup; ++i) c.push_back({Op::Forward, i});
  for (int i = 0; i < m - warmup; ++i) {
    c.push_back({Op::Forward, warmup + i});
    backward(i, w_delay);
  }
  for (int i = m - warmup; i < m; ++i) backward(i, 0);  // cool-down: one delayed W after each B
  for (int mb : pending_w) c.push_back({Op::BackwardWeight, mb});
  return c;
}

template <class ComputeOf>
Schedule build(int stages, bool fused_backward, ComputeOf&& compute_of) {
  Schedule s(static_cast<std::size_t>(stages));
  for (int st = 0; st < stages; ++st)
    s[static_cast<std::size_t>(st)] = with_communication(compute_of(st), st, stages, fused_backward);
  return s;
}

}  // namespace detail

inline Schedule make_schedule(GPipe, int stages, int micro_batches) {
  detail::require_sizes(stages, micro_batches);
  return detail::build(stages, true, [&](int) {
    std::vector<Action> c;
    for (int i = 0; i < micro_batches; ++i) c.push_back({Op::Forward, i});
    for (int i = 0; i < micro_batches; ++i) {
      c.push_back({Op::BackwardInput, i});
      c.push_back({Op::BackwardWeight, i});
    }
    return c;
  });
}

inline Schedule make_schedule(OneFOneB, int stages, int micro_batches) {
  detail::require_sizes(stages, micro_batches);
  return detail::build(stages, true, [&](int s) { return detail::one_f_one_b_compute(s, stages, micro_batches, 0); });
}

inline Schedule make_schedule(ZeroBubbleH1, int stages, int micro_batches) {
  detail::require_sizes(stages, micro_batches);
  return detail::build(stages, false, [&](int s) { return detail::one_f_one_b_compute(s, stages, micro_batches, s); });
}

// ---- simulation ------------------------------------------------------------------------------

// Cost of each action, in any time unit; comm = latency from a send to the matching data being
// usable on the neighbour.
struct Costs {
  double forward = 1, backward_input = 1, backward_weight = 1, comm = 0;
};

struct StageTime {
  double busy = 0;      // time in F, B and W
  double idle = 0;      // makespan − busy
  int peak_in_flight = 0;  // most micro-batches forwarded and not yet through BackwardWeight
};

struct Simulation {
  double makespan = 0;
  std::vector<StageTime> stages;
  // Σ idle / (stages · makespan): the fraction of the pipeline's time lost to the bubble.
  double bubble_fraction() const {
    double idle = 0;
    for (const auto& s : stages) idle += s.idle;
    return stages.empty() || makespan <= 0 ? 0.0 : idle / (static_cast<double>(stages.size()) * makespan);
  }
};

namespace detail {

// Replays a schedule with blocking waits at the compute action that consumes a message and
// buffered (never blocking) sends. Fails with the stuck stages when no stage can advance.
// costs: one per stage (stages of unequal work: the first holds the embedding, the last the head).
inline Status replay(const Schedule& schedule, const std::vector<Costs>& per_stage, Simulation* out) {
  const int p = static_cast<int>(schedule.size());
  constexpr double kNotSent = std::numeric_limits<double>::infinity();
  // Time at which mb's message is usable at its destination, per (source stage, mb).
  std::vector<std::vector<double>> fwd_ready(static_cast<std::size_t>(p)), bwd_ready(static_cast<std::size_t>(p));
  int max_mb = 0;
  for (const auto& st : schedule)
    for (const Action& a : st) max_mb = std::max(max_mb, a.micro_batch + 1);
  for (int s = 0; s < p; ++s) {
    fwd_ready[static_cast<std::size_t>(s)].assign(static_cast<std::size_t>(max_mb), kNotSent);
    bwd_ready[static_cast<std::size_t>(s)].assign(static_cast<std::size_t>(max_mb), kNotSent);
  }
  std::vector<std::size_t> pc(static_cast<std::size_t>(p), 0);
  std::vector<double> clock(static_cast<std::size_t>(p), 0.0);
  std::vector<int> in_flight(static_cast<std::size_t>(p), 0);
  Simulation sim;
  sim.stages.resize(static_cast<std::size_t>(p));
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const auto us = static_cast<std::size_t>(s);
      const Costs& costs = per_stage[us];
      while (pc[us] < schedule[us].size()) {
        const Action a = schedule[us][pc[us]];
        const auto mb = static_cast<std::size_t>(a.micro_batch);
        double start = clock[us], cost = 0;
        if (a.op == Op::Forward) {
          if (s > 0) {
            const double ready = fwd_ready[us - 1][mb];
            if (ready == kNotSent) break;  // blocked on stage s−1
            start = std::max(start, ready);
          }
          cost = costs.forward;
          sim.stages[us].peak_in_flight = std::max(sim.stages[us].peak_in_flight, ++in_flight[us]);
        } else if (a.op == Op::BackwardInput) {
          if (s < p - 1) {
            const double ready = bwd_ready[us + 1][mb];
            if (ready == kNotSent) break;  // blocked on stage s+1
            start = std::max(start, ready);
          }
          cost = costs.backward_input;
        } else if (a.op == Op::BackwardWeight) {
          cost = costs.backward_weight;
          --in_flight[us];
        } else if (a.op == Op::SendForward) {
          fwd_ready[us][mb] = clock[us] + costs.comm;
        } else if (a.op == Op::SendBackward) {
          bwd_ready[us][mb] = clock[us] + costs.comm;
        }
        clock[us] = start + cost;
        sim.stages[us].busy += cost;
        ++pc[us];
        progress = true;
      }
    }
  }
  std::ostringstream stuck;
  for (int s = 0; s < p; ++s) {
    const auto us = static_cast<std::size_t>(s);
    if (pc[us] < schedule[us].size()) {
      const Action a = schedule[us][pc[us]];
      stuck << (stuck.tellp() > 0 ? "; " : "") << "stage " << s << " waits at action #" << pc[us] << ' '
            << op_name(a.op) << '(' << a.micro_batch << ')';
    }
  }
  if (stuck.tellp() > 0) return Status::failure("pipeline schedule deadlocks: " + stuck.str());
  if (out) {
    sim.makespan = *std::max_element(clock.begin(), clock.end());
    for (auto& st : sim.stages) st.idle = sim.makespan - st.busy;
    *out = std::move(sim);
  }
  return {};
}

}  // namespace detail

// Why `schedule` is not a valid step for (stages, micro_batches), or ok: per stage, each
// micro-batch has exactly one F, B and W, in that order; every message a stage needs is received
// (posted before the action that consumes it) and sent once by the neighbour after it is
// computed; sends and receives between two neighbours come in the same micro-batch order; the
// first stage receives no activations and the last none of the gradients; and no deadlock.
inline Status check_schedule(const Schedule& schedule, int stages, int micro_batches) {
  const std::vector<Costs> unit(schedule.size());
  std::ostringstream err;
  if (static_cast<int>(schedule.size()) != stages) {
    err << "schedule has " << schedule.size() << " stage lists for " << stages << " stages";
    return Status::failure(err.str());
  }
  const int m = micro_batches;
  // Per stage and op: the index of each micro-batch's action (−1: absent), and the mb order.
  std::vector<std::vector<std::vector<int>>> where(static_cast<std::size_t>(stages));
  std::vector<std::vector<std::vector<int>>> order(static_cast<std::size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    const auto us = static_cast<std::size_t>(s);
    where[us].assign(7, std::vector<int>(static_cast<std::size_t>(m), -1));
    order[us].assign(7, {});
    const bool first = s == 0, last = s == stages - 1;
    for (std::size_t i = 0; i < schedule[us].size(); ++i) {
      const Action a = schedule[us][i];
      const int k = static_cast<int>(a.op);
      if ((first && (a.op == Op::RecvForward || a.op == Op::SendBackward)) ||
          (last && (a.op == Op::SendForward || a.op == Op::RecvBackward))) {
        err << "stage " << s << " action #" << i << ' ' << op_name(a.op) << '(' << a.micro_batch << ") has no neighbour on that side";
        return Status::failure(err.str());
      }
      if (a.micro_batch < 0 || a.micro_batch >= m) {
        err << "stage " << s << " action #" << i << ' ' << op_name(a.op) << " names micro-batch " << a.micro_batch
            << ", outside [0, " << m << ")";
        return Status::failure(err.str());
      }
      int& slot = where[us][static_cast<std::size_t>(k)][static_cast<std::size_t>(a.micro_batch)];
      if (slot >= 0) {
        err << "stage " << s << " has " << op_name(a.op) << '(' << a.micro_batch << ") twice (actions #" << slot << " and #" << i << ')';
        return Status::failure(err.str());
      }
      slot = static_cast<int>(i);
      order[us][static_cast<std::size_t>(k)].push_back(a.micro_batch);
    }
    // Each rule: `op` of every micro-batch must be present when `needed`, and after `after` when `has_after`.
    struct Rule { Op op; bool needed; Op after; bool has_after; };
    const Rule rules[] = {
        {Op::Forward, true, Op::RecvForward, !first},   {Op::BackwardInput, true, Op::Forward, true},
        {Op::BackwardInput, true, Op::RecvBackward, !last}, {Op::BackwardWeight, true, Op::BackwardInput, true},
        {Op::SendForward, !last, Op::Forward, true},    {Op::SendBackward, !first, Op::BackwardInput, true},
        {Op::RecvForward, !first, Op::RecvForward, false}, {Op::RecvBackward, !last, Op::RecvBackward, false},
    };
    for (int mb = 0; mb < m; ++mb) {
      const auto umb = static_cast<std::size_t>(mb);
      for (const Rule& r : rules) {
        const int at = where[us][static_cast<std::size_t>(r.op)][umb];
        if (r.needed && at < 0) {
          err << "stage " << s << " lacks " << op_name(r.op) << '(' << mb << ')';
          return Status::failure(err.str());
        }
        if (r.has_after && at >= 0 && where[us][static_cast<std::size_t>(r.after)][umb] > at) {
          err << "stage " << s << ": " << op_name(r.op) << '(' << mb << ") at action #" << at << " comes before "
              << op_name(r.after) << '(' << mb << ") at #" << where[us][static_cast<std::size_t>(r.after)][umb];
          return Status::failure(err.str());
        }
      }
    }
  }
  for (int s = 0; s + 1 < stages; ++s) {
    const auto us = static_cast<std::size_t>(s);
    if (order[us][static_cast<int>(Op::SendForward)] != order[us + 1][static_cast<int>(Op::RecvForward)]) {
      err << "stage " << s << " sends activations in another micro-batch order than stage " << s + 1 << " receives them";
      return Status::failure(err.str());
    }
    if (order[us + 1][static_cast<int>(Op::SendBackward)] != order[us][static_cast<int>(Op::RecvBackward)]) {
      err << "stage " << s + 1 << " sends gradients in another micro-batch order than stage " << s << " receives them";
      return Status::failure(err.str());
    }
  }
  return detail::replay(schedule, unit, nullptr);
}

// Per-stage busy and idle time of a valid schedule on the cost model (blocking receives,
// buffered sends); throws when the schedule deadlocks. Costs per stage, or one for all.
inline Simulation simulate(const Schedule& schedule, const std::vector<Costs>& per_stage) {
  DPML_REQUIRE(per_stage.size() == schedule.size(), per_stage.size() << " stage costs for " << schedule.size() << " stages");
  Simulation sim;
  detail::replay(schedule, per_stage, &sim).throw_if_error();
  return sim;
}
inline Simulation simulate(const Schedule& schedule, const Costs& costs) {
  return simulate(schedule, std::vector<Costs>(schedule.size(), costs));
}

// The bubble fraction Σ idle / (p · makespan) the theory above predicts (communication free).
inline double theory_bubble(GPipe, int p, int m, const Costs&) { return double(p - 1) / double(m + p - 1); }
inline double theory_bubble(OneFOneB, int p, int m, const Costs&) { return double(p - 1) / double(m + p - 1); }
inline double theory_bubble(ZeroBubbleH1, int p, int m, const Costs& c) {
  const double idle = (p - 1) * (c.forward + c.backward_input - c.backward_weight);
  return idle / (m * (c.forward + c.backward_input + c.backward_weight) + idle);
}

}  // namespace dpml::parallel::pipeline
