#pragma once
// Pipeline schedules as data: for each pipeline rank, the ordered actions of one training step.
//
// A schedule is a table — one list of Actions per rank — produced by make_schedule(Tag, p, m)
// for a policy tag (GPipe, OneFOneB, ZeroBubbleH1, Interleaved1F1B{v}), checked by check_schedule
// and run by the executor (executor.hpp) on each rank, or by simulate() here on a cost model.
// Every backward is split in two: BackwardInput (B: the gradient of the stage's input, on the
// critical path between stages) and BackwardWeight (W: the weight gradients, needed by nobody
// downstream). GPipe, 1F1B and interleaved 1F1B put W right after its B; ZB-H1 delays W's to fill
// the bubble.
//
// Virtual stages. Under Interleaved1F1B{v} each of the p ranks holds v model chunks: the model is
// cut into P = v·p virtual stages, and chunk c of rank r is virtual stage k = c·p + r (Megatron's
// assignment: rank 0 holds virtual stages 0, p, 2p, …). Every Action names its chunk (0 in the
// other schedules, where P = p and the virtual stage is the rank). Activations go from virtual
// stage k to k + 1 — rank r chunk c to rank r + 1 chunk c, and rank p − 1 chunk c to rank 0 chunk
// c + 1 —, gradients back; so every rank talks to ranks r ± 1 mod p (route() in transport.hpp).
// Below, "stage" means virtual stage where it matters: virtual stage 0 receives no activations,
// virtual stage P − 1 computes the loss.
//
// Communication actions and their meaning (the executor follows this exactly), for a chunk c:
//   RecvForward(mb)   post the receive of mb's input activation from virtual stage k−1
//                     (non-blocking); Forward(mb) waits for it. The generators place it one
//                     compute action before the Forward that needs it, so the transfer overlaps
//                     that action.
//   SendForward(mb)   send mb's output activation to virtual stage k+1 (non-blocking).
//   RecvBackward(mb)  post the receive of the gradient of mb's output from virtual stage k+1;
//                     BackwardInput(mb) waits for it (placed like RecvForward).
//   SendBackward(mb)  send the gradient of mb's input to virtual stage k−1 (non-blocking). GPipe
//                     and (interleaved) 1F1B send it after W(mb), as their papers' unsplit
//                     backward does, so that their bubble is the classical one; ZB-H1 sends it
//                     right after B(mb).
//
// The schedules, p ranks, m micro-batches, rank s in 0..p−1, F/B/W = compute actions:
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
//   Interleaved 1F1B, v chunks (Narayanan et al., "Efficient Large-Scale Language Model Training
//          on GPU Clusters Using Megatron-LM", SC 2021, §2.2, figure 4; the order of Megatron's
//          forward_backward_pipelining_with_interleaving). Rank s runs the m·v (chunk,
//          micro-batch) pairs as a sequence of "virtual micro-batches" j = 0 … m·v−1, in groups
//          of p: forward j is micro-batch (j div (p·v))·p + j mod p of chunk (j mod (p·v)) div p
//          (p micro-batches through chunk 0, the same p through chunk 1, …, then the next p);
//          backward j the same micro-batch of chunk v−1−(j mod (p·v)) div p (last chunk first).
//          Warm-up of w = min((p−s−1)·2 + (v−1)·p, m·v) forwards, then steady pairs F(w+i),
//          B(i) W(i), then the cool-down B W of the last w. Needs m divisible by p (Megatron's
//          condition: a group of p micro-batches passes every chunk before the next group).
//          v = 1 gives the 1F1B table. Peak in flight on rank s: min(w + 1, m·v) (chunk, micro-batch) pairs,
//          each holding 1/v of a stage's activations.
//
// Bubble theory (costs F, B, W per micro-batch and stage — per chunk under interleaving, where a
// chunk does 1/v of a stage's work —, communication free):
//   GPipe, 1F1B:  makespan (m+p−1)(F+B+W); idle per stage (p−1)(F+B+W);
//                 idle / makespan = (p−1)/(m+p−1)   (= bubble/compute (p−1)/m).
//   ZB-H1:        idle per stage (p−1)(F+B−W) when W ≤ F, B and m ≥ p — a third of 1F1B's at
//                 F=B=W;
//                 idle / makespan = (p−1)(F+B−W) / (m(F+B+W) + (p−1)(F+B−W)).
//   Interleaved:  the fill and drain cross p−1 chunks, not p−1 stages: idle per rank (p−1)(F+B+W)
//                 in chunk costs, against busy m·v(F+B+W);
//                 idle / makespan = (p−1)/(v·m+p−1)  (= bubble/compute (p−1)/(v·m): the paper's
//                 §2.2.2 "(1/v)·(p−1)/m"; v times smaller than 1F1B's for the same model).
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
// Megatron's interleaved 1F1B: `chunks` (v) model chunks per rank, virtual stage c·p + r (see
// the top of the file). A size from the launch, so a value of the tag, not a template argument.
struct Interleaved1F1B {
  int chunks = 2;
};

// The model chunks each rank holds under a schedule: v under interleaving, else 1.
template <class Tag>
int chunks_of(const Tag&) {
  return 1;
}
inline int chunks_of(const Interleaved1F1B& t) { return t.chunks; }

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
  int chunk = 0;  // which of the rank's model chunks: virtual stage chunk·p + rank (0 unless interleaved)
  friend bool operator==(const Action&, const Action&) = default;
};

using Schedule = std::vector<std::vector<Action>>;  // (ranks) lists of actions, in execution order

// The virtual stage of a rank's chunk, and the chunks a table uses (1 + the largest chunk named).
inline int virtual_stage(int rank, int chunk, int ranks) { return chunk * ranks + rank; }
inline int chunks_in(const Schedule& schedule) {
  int v = 1;
  for (const auto& list : schedule)
    for (const Action& a : list) v = std::max(v, a.chunk + 1);
  return v;
}

inline bool is_compute(Op op) { return op == Op::Forward || op == Op::BackwardInput || op == Op::BackwardWeight; }

// One line per rank: "F0 F1 B0 W0 …" (communication actions left out unless `with_comm`); in a
// table of several chunks each action ends with its chunk: "F3.1" is micro-batch 3 of chunk 1.
inline std::string to_string(const Schedule& schedule, bool with_comm = false) {
  static constexpr const char* kShort[] = {"F", "B", "W", "sf", "rf", "sb", "rb"};
  const bool chunked = chunks_in(schedule) > 1;
  std::ostringstream os;
  for (std::size_t s = 0; s < schedule.size(); ++s) {
    os << "stage " << s << ':';
    for (const Action& a : schedule[s]) {
      if (!with_comm && !is_compute(a.op)) continue;
      os << ' ' << kShort[static_cast<int>(a.op)] << a.micro_batch;
      if (chunked) os << '.' << a.chunk;
    }
    os << '\n';
  }
  return os.str();
}
// "Forward(3)", or "Forward(3, chunk 1)" for a chunk other than 0.
inline std::string describe(const Action& a) {
  std::ostringstream os;
  os << op_name(a.op) << '(' << a.micro_batch;
  if (a.chunk != 0) os << ", chunk " << a.chunk;
  os << ')';
  return os.str();
}

namespace detail {

inline void require_sizes(int stages, int micro_batches) {
  DPML_REQUIRE_EVERYWHERE(stages >= 1, "a pipeline needs at least 1 stage, got " << stages);
  DPML_REQUIRE_EVERYWHERE(micro_batches >= 1, "a pipeline step needs at least 1 micro-batch, got " << micro_batches);
}

// Adds the communication actions to one rank's compute sequence (see the top of the file), on
// `ranks` ranks of `chunks` chunks each. fused_backward: the input gradient is sent after the W
// that follows its B (an unsplit backward).
inline std::vector<Action> with_communication(const std::vector<Action>& compute, int rank, int ranks, int chunks,
                                              bool fused_backward) {
  const int last_stage = ranks * chunks - 1;
  auto first = [&](const Action& a) { return virtual_stage(rank, a.chunk, ranks) == 0; };
  auto last = [&](const Action& a) { return virtual_stage(rank, a.chunk, ranks) == last_stage; };
  auto recv_for = [&](const Action& a) -> std::optional<Action> {
    if (a.op == Op::Forward && !first(a)) return Action{Op::RecvForward, a.micro_batch, a.chunk};
    if (a.op == Op::BackwardInput && !last(a)) return Action{Op::RecvBackward, a.micro_batch, a.chunk};
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
    if (a.op == Op::Forward && !last(a)) out.push_back({Op::SendForward, a.micro_batch, a.chunk});
    const bool backward_done = fused_backward ? a.op == Op::BackwardWeight : a.op == Op::BackwardInput;
    if (backward_done && !first(a)) out.push_back({Op::SendBackward, a.micro_batch, a.chunk});
  }
  return out;
}

// F/B/W order of one stage shaped like 1F1B over `count` forward/backward units (the micro-batches,
// or interleaved 1F1B's virtual micro-batches): `warmup` forwards, then F(warmup + i) B(i), then
// the cool-down B's; W's start `w_delay` units after their B. unit(j, forward) is the Action of
// unit j's F (forward) or B, whose W names the same micro-batch and chunk.
template <class Unit>
std::vector<Action> one_f_one_b_order(int count, int warmup, int w_delay, Unit&& unit) {
  std::vector<Action> c;
  std::deque<Action> pending_w;
  auto backward = [&](int j, int keep) {
    const Action b = unit(j, false);
    c.push_back(b);
    pending_w.push_back({Op::BackwardWeight, b.micro_batch, b.chunk});
    if (static_cast<int>(pending_w.size()) > keep) {
      c.push_back(pending_w.front());
      pending_w.pop_front();
    }
  };
  for (int j = 0; j < warmup; ++j) c.push_back(unit(j, true));
  for (int j = 0; j < count - warmup; ++j) {
    c.push_back(unit(warmup + j, true));
    backward(j, w_delay);
  }
  for (int j = count - warmup; j < count; ++j) backward(j, 0);  // cool-down: one delayed W after each B
  for (const Action& w : pending_w) c.push_back(w);
  return c;
}

inline std::vector<Action> one_f_one_b_compute(int stage, int stages, int m, int w_delay) {
  return one_f_one_b_order(m, std::min(stages - stage - 1, m), w_delay, [](int j, bool forward) {
    return Action{forward ? Op::Forward : Op::BackwardInput, j};
  });
}

// Megatron's interleaved order on rank `rank` (see the top of the file): virtual micro-batch j in
// groups of p·v — p micro-batches through each chunk in turn, the backward through the chunks in
// reverse.
inline std::vector<Action> interleaved_compute(int rank, int p, int m, int v) {
  const int count = m * v, group = p * v;
  const int warmup = std::min((p - rank - 1) * 2 + (v - 1) * p, count);
  return one_f_one_b_order(count, warmup, 0, [&](int j, bool forward) {
    const int in_group = (j % group) / p;
    return Action{forward ? Op::Forward : Op::BackwardInput, (j / group) * p + j % p, forward ? in_group : v - 1 - in_group};
  });
}

template <class ComputeOf>
Schedule build(int stages, bool fused_backward, ComputeOf&& compute_of, int chunks = 1) {
  Schedule s(static_cast<std::size_t>(stages));
  for (int st = 0; st < stages; ++st)
    s[static_cast<std::size_t>(st)] = with_communication(compute_of(st), st, stages, chunks, fused_backward);
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

// `stages`: the pipeline ranks p (the model is cut into chunks · p virtual stages). Refused on
// every rank: fewer than 1 chunk, several chunks on one rank (nothing to interleave), and m not
// divisible by p.
inline Schedule make_schedule(Interleaved1F1B tag, int stages, int micro_batches) {
  detail::require_sizes(stages, micro_batches);
  const int v = tag.chunks;
  DPML_REQUIRE_EVERYWHERE(v >= 1, "--num-virtual-stages-per-pipeline-rank " << v << " must be at least 1");
  if (v == 1) return make_schedule(OneFOneB{}, stages, micro_batches);
  DPML_REQUIRE_EVERYWHERE(stages >= 2, "--num-virtual-stages-per-pipeline-rank " << v
                                           << ": the interleaved schedule needs --pp 2 or more (one rank has no chunks to interleave)");
  DPML_REQUIRE_EVERYWHERE(micro_batches % stages == 0,
                          "the interleaved schedule needs the micro-batches per step (" << micro_batches
                              << " = --global-batch / (--micro-batch × dp)) to be a multiple of --pp " << stages
                              << " (Megatron's condition)");
  return detail::build(
      stages, true, [&](int s) { return detail::interleaved_compute(s, stages, micro_batches, v); }, v);
}

// Every rank's forward actions of `schedule` (its sends and receives of activations with them):
// an evaluation pass over the same micro-batches.
inline Schedule forward_only(const Schedule& schedule) {
  Schedule out(schedule.size());
  for (std::size_t r = 0; r < schedule.size(); ++r)
    for (const Action& a : schedule[r])
      if (a.op == Op::Forward || a.op == Op::SendForward || a.op == Op::RecvForward) out[r].push_back(a);
  return out;
}

// Micro-batch 0 forward through every virtual stage, chunk by chunk: p ranks of `chunks` chunks
// (train::Trainer's probe of the message shapes).
inline Schedule first_forward(int p, int chunks) {
  Schedule out(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s)
    for (int c = 0; c < chunks; ++c) {
      const int k = virtual_stage(s, c, p);
      auto& row = out[static_cast<std::size_t>(s)];
      if (k > 0) row.push_back({Op::RecvForward, 0, c});
      row.push_back({Op::Forward, 0, c});
      if (k < p * chunks - 1) row.push_back({Op::SendForward, 0, c});
    }
  return out;
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
// buffered (never blocking) sends. Fails with the stuck ranks when no rank can advance.
// costs: one per rank (stages of unequal work: the first holds the embedding, the last the head).
// The table's chunks are read off it (chunks_in); messages go between virtual stages.
inline Status replay(const Schedule& schedule, const std::vector<Costs>& per_stage, Simulation* out) {
  const int p = static_cast<int>(schedule.size()), last_stage = p * chunks_in(schedule) - 1;
  constexpr double kNotSent = std::numeric_limits<double>::infinity();
  int max_mb = 0;
  for (const auto& st : schedule)
    for (const Action& a : st) max_mb = std::max(max_mb, a.micro_batch + 1);
  // Time at which mb's message is usable at its destination, per (source virtual stage, mb).
  const auto cells = static_cast<std::size_t>(last_stage + 1) * static_cast<std::size_t>(max_mb);
  std::vector<double> fwd_ready(cells, kNotSent), bwd_ready(cells, kNotSent);
  auto cell = [&](int k, int mb) { return static_cast<std::size_t>(k) * static_cast<std::size_t>(max_mb) + static_cast<std::size_t>(mb); };
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
        const int k = virtual_stage(s, a.chunk, p);
        double start = clock[us], cost = 0;
        if (a.op == Op::Forward) {
          if (k > 0) {
            const double ready = fwd_ready[cell(k - 1, a.micro_batch)];
            if (ready == kNotSent) break;  // blocked on virtual stage k−1
            start = std::max(start, ready);
          }
          cost = costs.forward;
          sim.stages[us].peak_in_flight = std::max(sim.stages[us].peak_in_flight, ++in_flight[us]);
        } else if (a.op == Op::BackwardInput) {
          if (k < last_stage) {
            const double ready = bwd_ready[cell(k + 1, a.micro_batch)];
            if (ready == kNotSent) break;  // blocked on virtual stage k+1
            start = std::max(start, ready);
          }
          cost = costs.backward_input;
        } else if (a.op == Op::BackwardWeight) {
          cost = costs.backward_weight;
          --in_flight[us];
        } else if (a.op == Op::SendForward) {
          fwd_ready[cell(k, a.micro_batch)] = clock[us] + costs.comm;
        } else if (a.op == Op::SendBackward) {
          bwd_ready[cell(k, a.micro_batch)] = clock[us] + costs.comm;
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
    if (pc[us] < schedule[us].size())
      stuck << (stuck.tellp() > 0 ? "; " : "") << "stage " << s << " waits at action #" << pc[us] << ' '
            << describe(schedule[us][pc[us]]);
  }
  if (stuck.tellp() > 0) return Status::failure("pipeline schedule deadlocks: " + stuck.str());
  if (out) {
    sim.makespan = *std::max_element(clock.begin(), clock.end());
    for (auto& st : sim.stages) st.idle = sim.makespan - st.busy;
    *out = std::move(sim);
  }
  return {};
}

// What one send or receive action carries, the same on both ends: the flow (activation or
// gradient), the boundary it crosses (between virtual stages `low` and low + 1) and the
// micro-batch; and the rank at the other end.
struct Wire {
  bool activation;
  int low, micro_batch;
  friend bool operator==(const Wire&, const Wire&) = default;
};
inline Wire wire_of(const Action& a, int rank, int ranks) {
  const int k = virtual_stage(rank, a.chunk, ranks);
  const bool activation = a.op == Op::SendForward || a.op == Op::RecvForward;
  const bool up = activation == (a.op == Op::SendForward || a.op == Op::SendBackward);  // towards k + 1
  return {activation, up ? k : k - 1, a.micro_batch};
}
inline std::string describe(const Wire& w) {
  return std::string(w.activation ? "the activation" : "the gradient") + " of micro-batch " + std::to_string(w.micro_batch) +
         " between virtual stages " + std::to_string(w.low) + " and " + std::to_string(w.low + 1);
}

}  // namespace detail

// Why `schedule` is not a valid step for (stages, micro_batches, chunks), or ok. `stages` is the
// number of ranks p (one list each); with `chunks` v > 1 the virtual stages are k = c·p + r. Per
// virtual stage, each micro-batch has exactly one F, B and W, in that order; every message it
// needs is received (posted before the action that consumes it) and sent once by the neighbouring
// virtual stage after it is computed; between two ranks, each direction's sends come in the order
// the other rank posts the receives (what a transport that matches in posting order, NCCL, needs);
// virtual stage 0 receives no activations and the last none of the gradients; and no deadlock.
inline Status check_schedule(const Schedule& schedule, int stages, int micro_batches, int chunks = 1) {
  const std::vector<Costs> unit(schedule.size());
  std::ostringstream err;
  if (static_cast<int>(schedule.size()) != stages) {
    err << "schedule has " << schedule.size() << " stage lists for " << stages << " stages";
    return Status::failure(err.str());
  }
  if (chunks < 1) {
    err << "a schedule of " << chunks << " chunks per rank";
    return Status::failure(err.str());
  }
  const int m = micro_batches, p = stages, last_stage = p * chunks - 1;
  const auto um = static_cast<std::size_t>(m);
  // Per virtual stage and op: the index of each micro-batch's action (−1: absent).
  std::vector<std::vector<std::vector<int>>> where(static_cast<std::size_t>(last_stage + 1),
                                                   std::vector<std::vector<int>>(7, std::vector<int>(um, -1)));
  // Per (from rank, to rank): what the sender sends and what the receiver receives, in table order.
  std::vector<std::vector<detail::Wire>> sent(static_cast<std::size_t>(p * p)), received(static_cast<std::size_t>(p * p));
  for (int s = 0; s < stages; ++s) {
    const auto us = static_cast<std::size_t>(s);
    for (std::size_t i = 0; i < schedule[us].size(); ++i) {
      const Action a = schedule[us][i];
      if (a.chunk < 0 || a.chunk >= chunks) {
        err << "stage " << s << " action #" << i << ' ' << describe(a) << " names chunk " << a.chunk << ", outside [0, " << chunks << ")";
        return Status::failure(err.str());
      }
      const int k = virtual_stage(s, a.chunk, p);
      const bool first = k == 0, last = k == last_stage;
      if ((first && (a.op == Op::RecvForward || a.op == Op::SendBackward)) ||
          (last && (a.op == Op::SendForward || a.op == Op::RecvBackward))) {
        err << "stage " << s << " action #" << i << ' ' << describe(a) << " has no neighbour on that side";
        return Status::failure(err.str());
      }
      if (a.micro_batch < 0 || a.micro_batch >= m) {
        err << "stage " << s << " action #" << i << ' ' << op_name(a.op) << " names micro-batch " << a.micro_batch
            << ", outside [0, " << m << ")";
        return Status::failure(err.str());
      }
      int& slot = where[static_cast<std::size_t>(k)][static_cast<std::size_t>(a.op)][static_cast<std::size_t>(a.micro_batch)];
      if (slot >= 0) {
        err << "stage " << s << " has " << describe(a) << " twice (actions #" << slot << " and #" << i << ')';
        return Status::failure(err.str());
      }
      slot = static_cast<int>(i);
      if (!is_compute(a.op)) {
        const detail::Wire w = detail::wire_of(a, s, p);
        const int other = (w.low + (virtual_stage(s, a.chunk, p) == w.low ? 1 : 0)) % p;  // the rank of the far end
        const bool sends = a.op == Op::SendForward || a.op == Op::SendBackward;
        (sends ? sent : received)[static_cast<std::size_t>(sends ? s * p + other : other * p + s)].push_back(w);
      }
    }
  }
  // Each rule: `op` of every micro-batch must be present when `needed`, and after `after` when `has_after`.
  struct Rule { Op op; bool needed; Op after; bool has_after; };
  for (int k = 0; k <= last_stage; ++k) {
    const auto& at_k = where[static_cast<std::size_t>(k)];
    const bool first = k == 0, last = k == last_stage;
    const Rule rules[] = {
        {Op::Forward, true, Op::RecvForward, !first},   {Op::BackwardInput, true, Op::Forward, true},
        {Op::BackwardInput, true, Op::RecvBackward, !last}, {Op::BackwardWeight, true, Op::BackwardInput, true},
        {Op::SendForward, !last, Op::Forward, true},    {Op::SendBackward, !first, Op::BackwardInput, true},
        {Op::RecvForward, !first, Op::RecvForward, false}, {Op::RecvBackward, !last, Op::RecvBackward, false},
    };
    for (int mb = 0; mb < m; ++mb) {
      const auto umb = static_cast<std::size_t>(mb);
      auto name = [&](Op op) { return describe(Action{op, mb, k / p}); };
      for (const Rule& r : rules) {
        const int at = at_k[static_cast<std::size_t>(r.op)][umb];
        if (r.needed && at < 0) {
          err << "stage " << k % p << " lacks " << name(r.op);
          return Status::failure(err.str());
        }
        if (r.has_after && at >= 0 && at_k[static_cast<std::size_t>(r.after)][umb] > at) {
          err << "stage " << k % p << ": " << name(r.op) << " at action #" << at << " comes before " << name(r.after) << " at #"
              << at_k[static_cast<std::size_t>(r.after)][umb];
          return Status::failure(err.str());
        }
      }
    }
  }
  for (int from = 0; from < p; ++from)
    for (int to = 0; to < p; ++to) {
      const auto& out = sent[static_cast<std::size_t>(from * p + to)];
      const auto& in = received[static_cast<std::size_t>(from * p + to)];
      const auto [o, i] = std::mismatch(out.begin(), out.end(), in.begin(), in.end());
      if (o == out.end() && i == in.end()) continue;
      err << "stage " << from << " sends to stage " << to << " in another order than stage " << to << " receives: its send #"
          << (o - out.begin()) << " is " << (o == out.end() ? "absent" : detail::describe(*o)) << ", the receive "
          << (o == out.end() ? "expects " : "is ") << (i == in.end() ? "absent" : detail::describe(*i));
      return Status::failure(err.str());
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
// Narayanan et al. 2021, §2.2.2: bubble/compute (p−1)/(v·m), as idle / makespan (costs per chunk).
inline double theory_bubble(Interleaved1F1B t, int p, int m, const Costs&) {
  return double(p - 1) / (double(t.chunks) * m + p - 1);
}

}  // namespace dpml::parallel::pipeline
