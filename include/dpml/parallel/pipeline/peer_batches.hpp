#pragma once
// pipeline::peer_batches(schedule, stage): for each message the stage sends or receives, which of
// its neighbour's batches carries the match — what BatchedTransport (transport.hpp) needs to launch
// its batches in groups that the neighbours launch alike (see "Groups alike on both sides" there).
//
// A stage's batches depend on its row of the table alone (P2pBatcher's rule), so every stage can
// work out its neighbours' batches itself: batches_of() walks a row with the executor, a stage
// that computes nothing (detail::NullStage) and a launcher that only records (detail::
// RecordingLauncher). No message is exchanged to agree.
//
// The rounds need one order of the pair's groups that both sides follow: along this stage's
// batches the neighbour's batch indices may not go down (else this stage would launch a group
// before one that the neighbour launches first). peer_batches() checks that and refuses a table
// without it; GPipe, 1F1B and ZB-H1 have it (tests/pipeline/test_transport.cpp, 1–8 stages).
//
//   const auto schedule = make_schedule(OneFOneB{}, p, m);
//   BatchedTransport<T, L> transport(launcher, peer_batches(schedule, stage));
//
// The interleaved table has no such order; message_order(schedule, stage) gives the one global
// order of single-message groups that BatchedTransport launches instead (transport.hpp, "One
// order for the interleaved table"), again from the table alone:
//
//   const MessageOrder order = message_order(schedule, stage);
//   BatchedTransport<T, L> transport(launcher, &order, chunks_in(schedule));

#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/parallel/pipeline/executor.hpp"
#include "dpml/parallel/pipeline/schedule.hpp"
#include "dpml/parallel/pipeline/transport.hpp"

#include <algorithm>
#include <cstddef>
#include <map>
#include <set>
#include <tuple>
#include <vector>

namespace dpml::parallel::pipeline {

using Batches = std::vector<std::vector<Message>>;  // one stage's groups, in launch order

namespace detail {
// A stage of any number of chunks that computes nothing; every buffer is one element.
struct NullStage {
  using value_type = char;
  char cell = 0;
  void forward(int, int) {}
  void backward_input(int, int) {}
  void backward_weight(int, int) {}
  TensorView<char> recv_forward_buffer(int, int) { return {&cell, Shape{1}}; }
  TensorView<const char> send_forward_buffer(int, int) { return {&cell, Shape{1}}; }
  TensorView<char> recv_backward_buffer(int, int) { return {&cell, Shape{1}}; }
  TensorView<const char> send_backward_buffer(int, int) { return {&cell, Shape{1}}; }
};

// A BatchedTransport launcher that records what it is given; marks are the posting order.
struct RecordingLauncher {
  using Mark = int;
  int stage, stages;
  Batches* out;
  std::set<MessageKey> launched_this_step;
  int marks = 0;

  Mark mark() { return marks++; }
  template <class Batch>
  void launch(const Batch& b) {
    std::vector<Message> messages;
    for (const auto& e : b) {
      messages.push_back(e.message);
      launched_this_step.insert(key_of(e.message));
    }
    out->push_back(std::move(messages));
  }
  bool launched(Message m) const { return launched_this_step.contains(key_of(m)); }
  void wait(Message) {}
  void wait_all() { launched_this_step.clear(); }
  int rank() const { return stage; }
  int size() const { return stages; }
};

// A transport that records the executor's calls of one rank, in order: a post or a wait of a
// message (a wait on a send: before its buffer is written again), or the step's finish.
struct TransportCall {
  enum Kind { post, wait, finish } kind;
  Message message;
};
struct CallRecorder {
  int stage, stages, v;
  std::vector<TransportCall>* out;
  int rank() const { return stage; }
  int size() const { return stages; }
  int chunks() const { return v; }
  void post_recv(Flow f, char*, std::size_t, int mb, int c) { out->push_back({TransportCall::post, {f, mb, false, c}}); }
  void post_send(Flow f, const char*, std::size_t, int mb, int c) { out->push_back({TransportCall::post, {f, mb, true, c}}); }
  void wait_recv(Flow f, int mb, int c) { out->push_back({TransportCall::wait, {f, mb, false, c}}); }
  void wait_send(Flow f, int mb, int c) { out->push_back({TransportCall::wait, {f, mb, true, c}}); }
  void finish() { out->push_back({TransportCall::finish, {}}); }
  void abandon() noexcept {}
  std::size_t pending_receives() const { return 0; }
};

// A message as both ends name it (schedule.hpp's Wire of its action), as a map key; p ranks.
inline std::tuple<bool, int, int> wire_key(const Message& m, int rank, int p) {
  const bool forward = m.flow == Flow::forward;
  const Op op = m.send ? (forward ? Op::SendForward : Op::SendBackward) : (forward ? Op::RecvForward : Op::RecvBackward);
  const Wire w = wire_of(Action{op, m.micro_batch, m.chunk}, rank, p);
  return {w.activation, w.low, w.micro_batch};
}
}  // namespace detail

// The groups stage `stage` launches in one step of `schedule` (a checked table): its batches, or
// with `peer_batches` the rounds they are launched in.
inline Batches batches_of(const Schedule& schedule, int stage, PeerBatches peer_batches = {}) {
  Batches out;
  detail::NullStage null;
  BatchedTransport<char, detail::RecordingLauncher> transport(
      detail::RecordingLauncher{stage, static_cast<int>(schedule.size()), &out, {}}, std::move(peer_batches), chunks_in(schedule));
  run_stage(schedule[static_cast<std::size_t>(stage)], null, transport);
  return out;
}

// Stage `stage`'s messages of one step of `schedule` (a checked table) in the order every rank
// launches them (transport.hpp, "One order for the interleaved table"). Every rank's executor
// calls are recorded (detail::CallRecorder) and replayed together: posts go at once, a wait blocks
// until the other end has posted its side (a send's wait: the receive), finish until every send of
// the rank has its receive. Each executed call takes the next tick; a message's time is the later
// of its two posts' ticks, and the rank's messages are ordered by it (the ticks are distinct).
inline MessageOrder message_order(const Schedule& schedule, int stage) {
  using detail::TransportCall;
  using Key = std::tuple<bool, int, int>;
  const int p = static_cast<int>(schedule.size()), v = chunks_in(schedule);
  std::vector<std::vector<TransportCall>> calls(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    detail::NullStage null;
    detail::CallRecorder recorder{r, p, v, &calls[static_cast<std::size_t>(r)]};
    run_stage(schedule[static_cast<std::size_t>(r)], null, recorder);
  }
  std::map<Key, long> send_posted, recv_posted;  // tick of each end's post
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  long tick = 0;
  auto ready = [&](int r, const TransportCall& c) {
    if (c.kind == TransportCall::post) return true;
    if (c.kind == TransportCall::wait) {
      const Key k = detail::wire_key(c.message, r, p);
      return (c.message.send ? recv_posted : send_posted).contains(k) || (c.message.send && !send_posted.contains(k));
    }
    for (const TransportCall& mine : calls[static_cast<std::size_t>(r)])  // finish: every send received
      if (mine.kind == TransportCall::post && mine.message.send && !recv_posted.contains(detail::wire_key(mine.message, r, p)))
        return false;
    return true;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      auto& at = next[static_cast<std::size_t>(r)];
      const auto& mine = calls[static_cast<std::size_t>(r)];
      for (; at < mine.size() && ready(r, mine[at]); ++at, ++tick, progress = true)
        if (mine[at].kind == TransportCall::post)
          (mine[at].message.send ? send_posted : recv_posted)[detail::wire_key(mine[at].message, r, p)] = tick;
    }
  }
  for (int r = 0; r < p; ++r)
    DPML_REQUIRE(next[static_cast<std::size_t>(r)] == calls[static_cast<std::size_t>(r)].size(),
                 "pipeline: the schedule's transport calls deadlock even with every message posted at once (stage "
                     << r << " waits at call #" << next[static_cast<std::size_t>(r)] << "; schedule not checked?)");
  std::vector<std::pair<long, Message>> timed;
  for (const TransportCall& c : calls[static_cast<std::size_t>(stage)])
    if (c.kind == TransportCall::post) {
      const Key k = detail::wire_key(c.message, stage, p);
      DPML_REQUIRE(send_posted.contains(k) && recv_posted.contains(k),
                   "pipeline stage " << stage << ": the " << flow_name(c.message.flow) << " of micro-batch " << c.message.micro_batch
                                     << " has no other end (schedule not checked?)");
      timed.emplace_back(std::max(send_posted.at(k), recv_posted.at(k)), c.message);
    }
  std::sort(timed.begin(), timed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  MessageOrder order;
  for (const auto& [time, m] : timed) order.push_back(m);
  return order;
}

// The neighbours: ranks stage ± 1 (mod p under interleaving, where the last rank sends to the
// first; one rank for both sides when p = 2).
inline PeerBatches peer_batches(const Schedule& schedule, int stage) {
  const int p = static_cast<int>(schedule.size()), v = chunks_in(schedule);
  const Batches mine = batches_of(schedule, stage);
  auto far = [&](const Message& m, int at) { return route(m.flow, m.send, at, m.chunk, m.micro_batch, p, v); };
  std::set<int> peers;
  for (const int peer : {stage - 1, stage + 1})
    if (v > 1 || (peer >= 0 && peer < p)) peers.insert((peer + p) % p);
  peers.erase(stage);
  PeerBatches out;
  for (const int peer : peers) {
    const Batches theirs = batches_of(schedule, peer);
    for (std::size_t i = 0; i < theirs.size(); ++i)
      for (const Message& m : theirs[i])
        if (const Route r = far(m, peer); r.peer == stage)
          out[key_of({m.flow, m.micro_batch, !m.send, r.peer_chunk})] = static_cast<int>(i);
    int highest = -1;  // of the neighbour's batch indices met so far along this stage's batches
    for (const auto& batch : mine) {
      int lowest_here = -1, highest_here = -1;
      for (const Message& m : batch) {
        if (far(m, stage).peer != peer) continue;
        const auto at = out.find(key_of(m));
        DPML_REQUIRE(at != out.end(), "pipeline stage " << stage << ": stage " << peer << " never launches the match of the "
                                                        << flow_name(m.flow) << " of micro-batch " << m.micro_batch << " (chunk "
                                                        << m.chunk << "; schedule not checked?)");
        lowest_here = lowest_here < 0 ? at->second : std::min(lowest_here, at->second);
        highest_here = std::max(highest_here, at->second);
      }
      if (lowest_here < 0) continue;
      DPML_REQUIRE(lowest_here >= highest, "pipeline stages " << stage << " and " << peer
                                                              << ": their batches cross, so they cannot launch their "
                                                                 "point-to-point groups in one order (schedule unsupported)");
      highest = highest_here;
    }
  }
  return out;
}

}  // namespace dpml::parallel::pipeline
