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

#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/parallel/pipeline/executor.hpp"
#include "dpml/parallel/pipeline/schedule.hpp"
#include "dpml/parallel/pipeline/transport.hpp"

#include <cstddef>
#include <set>
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
