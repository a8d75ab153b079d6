// The batches of the rendezvous transport (transport.hpp: BatchedTransport, P2pBatcher), on paper:
// every stage of a schedule runs the real executor with a stage that computes nothing and a
// launcher that records the batches it is given (peer_batches.hpp: batches_of); then the stages'
// batch sequences are replayed together under rendezvous semantics (NCCL point-to-point,
// comm::Staged): a stage runs its batches one after the other, and a batch completes once the peer
// of each of its messages has posted the matching one (in a batch of its own that has started).
// GPipe, 1F1B and ZB-H1 on 1 to 8 stages with 1 to 16 micro-batches must all finish. The replay is
// checked to catch a deadlock: posting every message alone in table order deadlocks 1F1B on two
// stages. The groups launched in rounds (peer_batches) must also finish under the strict replay
// NCCL needs — each group holds, per neighbour, exactly what one group of the neighbour holds —
// which the plain batches fail (GPipe). The interleaved table's batches cross around the ring of
// ranks; its messages launched alone in message_order()'s global order must finish under both
// replays for p ≤ 8, v ≤ 4, m ≤ 16 (as must the other schedules' in that order).
//
// Also: plan_buffers and weight_follows_input (partition.hpp) on the three schedules.
#include "test.hpp"

#include <dpml/parallel/pipeline/executor.hpp>
#include <dpml/parallel/pipeline/partition.hpp>
#include <dpml/parallel/pipeline/peer_batches.hpp>
#include <dpml/parallel/pipeline/schedule.hpp>
#include <dpml/parallel/pipeline/transport.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <vector>

namespace pl = dpml::parallel::pipeline;

namespace {

using pl::Batches;

// The batches each stage's executor launches in one step (one group each, as without PeerBatches).
std::vector<Batches> batched(const pl::Schedule& schedule) {
  std::vector<Batches> all;
  for (int s = 0; s < static_cast<int>(schedule.size()); ++s) all.push_back(pl::batches_of(schedule, s));
  return all;
}

// The groups each stage launches with its PeerBatches: its batches in rounds.
std::vector<Batches> rounds(const pl::Schedule& schedule) {
  std::vector<Batches> all;
  for (int s = 0; s < static_cast<int>(schedule.size()); ++s) all.push_back(pl::batches_of(schedule, s, pl::peer_batches(schedule, s)));
  return all;
}

// The groups each stage launches with its MessageOrder: each message alone, in the global order.
std::vector<Batches> ordered(const pl::Schedule& schedule) {
  std::vector<Batches> all;
  for (int s = 0; s < static_cast<int>(schedule.size()); ++s) {
    Batches b;
    pl::detail::NullStage null;
    const pl::MessageOrder order = pl::message_order(schedule, s);
    pl::BatchedTransport<char, pl::detail::RecordingLauncher> transport(
        pl::detail::RecordingLauncher{s, static_cast<int>(schedule.size()), &b, {}}, &order, pl::chunks_in(schedule));
    pl::run_stage(schedule[static_cast<std::size_t>(s)], null, transport);
    all.push_back(std::move(b));
  }
  return all;
}

// Every communication action alone, in table order (what a transport without batching posts).
std::vector<Batches> one_at_a_time(const pl::Schedule& schedule) {
  std::vector<Batches> all;
  for (const auto& actions : schedule) {
    Batches b;
    for (const pl::Action& a : actions) {
      if (pl::is_compute(a.op)) continue;
      const bool forward = a.op == pl::Op::SendForward || a.op == pl::Op::RecvForward;
      const bool send = a.op == pl::Op::SendForward || a.op == pl::Op::SendBackward;
      b.push_back({pl::Message{forward ? pl::Flow::forward : pl::Flow::backward, a.micro_batch, send, a.chunk}});
    }
    all.push_back(std::move(b));
  }
  return all;
}

// Replays the stages' groups together: a stage runs its groups one after the other, and
// start(s, group) records stage s's next group as started and says whether it completes now (what
// it waits for has been posted). Called again for a group that waits. True when every stage finishes.
template <class Stages, class Start>
bool replay(const Stages& stages, Start&& start) {
  const std::size_t p = stages.size();
  std::vector<std::size_t> next(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t s = 0; s < p; ++s)
      while (next[s] < stages[s].size() && start(static_cast<int>(s), stages[s][next[s]])) {
        ++next[s];
        progress = true;
      }
  }
  for (std::size_t s = 0; s < p; ++s)
    if (next[s] < stages[s].size()) return false;
  return true;
}

// A message as both ends name it, seen from `stage`: (flow, sending virtual stage, micro-batch),
// and the rank at the other end; v chunks per rank (virtual stage c·p + rank).
using Key = std::tuple<int, int, int>;
std::pair<Key, int> identify(int stage, const pl::Message& m, int p, int v) {
  const pl::Route r = pl::route(m.flow, m.send, stage, m.chunk, m.micro_batch, p, v);
  const int sender = m.send ? m.chunk * p + stage : r.peer_chunk * p + r.peer;
  return {Key{static_cast<int>(m.flow), sender, m.micro_batch}, r.peer};
}

// Rendezvous semantics: a batch completes once the peer of each of its messages has posted the
// matching one (in a batch of its own that has started).
bool completes(const std::vector<Batches>& stages, int v = 1) {
  const int p = static_cast<int>(stages.size());
  auto key = [&](int stage, const pl::Message& m) { return identify(stage, m, p, v).first; };
  std::set<Key> sends_posted, recvs_posted;
  return replay(stages, [&](int s, const std::vector<pl::Message>& batch) {
    for (const auto& m : batch) (m.send ? sends_posted : recvs_posted).insert(key(s, m));
    return std::all_of(batch.begin(), batch.end(), [&](const pl::Message& m) {
      return (m.send ? recvs_posted : sends_posted).contains(key(s, m));
    });
  });
}

// The stricter semantics NCCL needs (transport.hpp, "Groups alike on both sides"): a group
// completes once, for each neighbour it talks to, that neighbour has started a group whose
// messages with this stage are exactly the matches of this group's messages with it.
bool completes_alike(const std::vector<Batches>& stages, int v = 1) {
  using Block = std::tuple<int, int, std::vector<Key>>;  // (from stage, to stage, sorted messages)
  const int p = static_cast<int>(stages.size());
  auto blocks = [&](int s, const std::vector<pl::Message>& group) {
    std::map<int, std::vector<Key>> by_peer;
    for (const auto& m : group) {
      const auto [key, peer] = identify(s, m, p, v);
      by_peer[peer].push_back(key);
    }
    std::vector<Block> out;
    for (auto& [peer, keys] : by_peer) {
      std::sort(keys.begin(), keys.end());
      out.emplace_back(s, peer, std::move(keys));
    }
    return out;
  };
  std::set<Block> started;
  return replay(stages, [&](int s, const std::vector<pl::Message>& group) {
    const auto mine = blocks(s, group);
    started.insert(mine.begin(), mine.end());
    return std::all_of(mine.begin(), mine.end(), [&](const Block& b) {
      return started.contains(Block{std::get<1>(b), std::get<0>(b), std::get<2>(b)});
    });
  });
}

// Every communication action of the table launched exactly once.
void check_each_launched_once(const pl::Schedule& schedule, const std::vector<Batches>& launched) {
  std::size_t actions = 0, messages = 0;
  for (const auto& a : schedule)
    actions += static_cast<std::size_t>(std::count_if(a.begin(), a.end(), [](const pl::Action& x) { return !pl::is_compute(x.op); }));
  for (const auto& b : launched)
    for (const auto& batch : b) messages += batch.size();
  CHECK(messages == actions);
}

// ---- the hosts' side -------------------------------------------------------------------------
// Where a host blocks: comm::Staged's calls return once matched, NCCL connects two peers on their
// first message inside the launch, and the trainer's first step (its probe, first_forward) learns
// each message's shape over MPI when it posts the receive, from the sender's post. A rank's host
// events: its posts and its launches, in the order it makes them.
struct HostEvent {
  bool launch;                        // else a post
  std::vector<pl::Message> messages;  // a post: its one message
};
using HostEvents = std::vector<HostEvent>;

// A BatchedTransport launcher recording each group as a launch.
struct HostLauncher {
  using Mark = int;
  int stage, stages;
  HostEvents* out;
  std::set<pl::MessageKey> launched_this_step;
  Mark mark() { return 0; }
  template <class Batch>
  void launch(const Batch& b) {
    HostEvent e{true, {}};
    for (const auto& entry : b) {
      e.messages.push_back(entry.message);
      launched_this_step.insert(pl::key_of(entry.message));
    }
    out->push_back(std::move(e));
  }
  bool launched(pl::Message m) const { return launched_this_step.contains(pl::key_of(m)); }
  void wait(pl::Message) {}
  void wait_all() { launched_this_step.clear(); }
  int rank() const { return stage; }
  int size() const { return stages; }
};

// The transport the executor drives, recording each post before the launches it may cause.
struct PostTap {
  pl::BatchedTransport<char, HostLauncher>& inner;
  HostEvents* out;
  int rank() const { return inner.rank(); }
  int size() const { return inner.size(); }
  int chunks() const { return inner.chunks(); }
  void post_recv(pl::Flow f, char* d, std::size_t n, int mb, int c) {
    out->push_back({false, {{f, mb, false, c}}});
    inner.post_recv(f, d, n, mb, c);
  }
  void post_send(pl::Flow f, const char* d, std::size_t n, int mb, int c) {
    out->push_back({false, {{f, mb, true, c}}});
    inner.post_send(f, d, n, mb, c);
  }
  void wait_recv(pl::Flow f, int mb, int c) { inner.wait_recv(f, mb, c); }
  void wait_send(pl::Flow f, int mb, int c) { inner.wait_send(f, mb, c); }
  void finish() { inner.finish(); }
  void abandon() noexcept { inner.abandon(); }
  std::size_t pending_receives() const { return inner.pending_receives(); }
};

// Each rank's host events for `tables` (every rank's) under the message order of those tables.
std::vector<HostEvents> host_events(const pl::Schedule& tables) {
  const int p = static_cast<int>(tables.size());
  std::vector<HostEvents> all(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    const pl::MessageOrder order = pl::message_order(tables, s);
    pl::BatchedTransport<char, HostLauncher> transport(HostLauncher{s, p, &all[static_cast<std::size_t>(s)], {}}, &order,
                                                       pl::chunks_in(tables));
    PostTap tap{transport, &all[static_cast<std::size_t>(s)]};
    pl::detail::NullStage null;
    pl::run_stage(tables[static_cast<std::size_t>(s)], null, tap);
  }
  return all;
}

// The hosts replayed together: a launch completes once each peer has started launching the
// match of each of its messages; with `shapes`, posting a receive waits for the sender's post.
bool hosts_finish(const std::vector<HostEvents>& hosts, int v, bool shapes) {
  const int p = static_cast<int>(hosts.size());
  std::set<Key> sends_posted, launched_sends, launched_recvs;
  return replay(hosts, [&](int s, const HostEvent& e) {
    if (!e.launch) {
      const auto& m = e.messages.front();
      const Key k = identify(s, m, p, v).first;
      if (m.send) sends_posted.insert(k);
      return m.send || !shapes || sends_posted.contains(k);
    }
    for (const auto& m : e.messages) (m.send ? launched_sends : launched_recvs).insert(identify(s, m, p, v).first);
    return std::all_of(e.messages.begin(), e.messages.end(), [&](const pl::Message& m) {
      return (m.send ? launched_recvs : launched_sends).contains(identify(s, m, p, v).first);
    });
  });
}

template <class Tag>
void check_batches_complete(const char* name) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      CAPTURE(name, p, m);
      const auto schedule = pl::make_schedule(Tag{}, p, m);
      REQUIRE(pl::check_schedule(schedule, p, m).ok());
      const auto stages = batched(schedule), groups = rounds(schedule), singles = ordered(schedule);
      CHECK(completes(stages));
      CHECK(completes_alike(groups));
      CHECK(completes_alike(singles));
      for (const auto* launched : {&stages, &groups, &singles}) check_each_launched_once(schedule, *launched);
    }
}

}  // namespace

TEST_CASE("batched transport: GPipe's batches finish under rendezvous semantics", "[pipeline]") {
  check_batches_complete<pl::GPipe>("gpipe");
}
TEST_CASE("batched transport: 1F1B's batches finish under rendezvous semantics", "[pipeline]") {
  check_batches_complete<pl::OneFOneB>("1f1b");
}
TEST_CASE("batched transport: ZB-H1's batches finish under rendezvous semantics", "[pipeline]") {
  check_batches_complete<pl::ZeroBubbleH1>("zb-h1");
}
TEST_CASE("batched transport: interleaved 1F1B's batches deadlock; its messages in one global order finish", "[pipeline][interleaved]") {
  // The host's MPI transport posts every message at once (the validator's replay: no deadlock);
  // the batches held back until a wait close a cycle around the ring of ranks (the last rank
  // sends to the first), and their neighbours' batch indices cross, so no rounds exist either.
  const auto schedule = pl::make_schedule(pl::Interleaved1F1B{2}, 3, 6);
  REQUIRE(pl::check_schedule(schedule, 3, 6, 2).ok());
  CHECK_FALSE(completes(batched(schedule), 2));
  CHECK(completes(batched(pl::make_schedule(pl::Interleaved1F1B{1}, 3, 6))));  // one chunk: 1F1B's table
  // Launched alone in message_order()'s order (what the GPU transport does for it):
  for (int p = 2; p <= 8; ++p)
    for (int v = 2; v <= 4; ++v)
      for (int m = p; m <= 16; m += p) {
        CAPTURE(p, v, m);
        const auto table = pl::make_schedule(pl::Interleaved1F1B{v}, p, m);
        REQUIRE(pl::check_schedule(table, p, m, v).ok());
        const auto singles = ordered(table);
        CHECK(completes(singles, v));
        CHECK(completes_alike(singles, v));
        check_each_launched_once(table, singles);
      }
}
TEST_CASE("batched transport: interleaved hosts that block in their calls finish (step, evaluation, shape probe)",
          "[pipeline][interleaved]") {
  // The first GPU run of the interleaved schedule (2×H200, NCCL) hung in the trainer's probe while
  // the messages went out only at the waits: rank 0 waited in MPI for rank 1's shape before it had
  // launched its first send, rank 1 waited inside NCCL's first launch for rank 0. Launching each
  // message as soon as it and all before it are posted lets every host finish.
  for (int p = 2; p <= 4; ++p)
    for (int v = 2; v <= 3; ++v)
      for (int m = p; m <= 3 * p; m += p) {
        CAPTURE(p, v, m);
        const auto step = pl::make_schedule(pl::Interleaved1F1B{v}, p, m);
        CHECK(hosts_finish(host_events(step), v, false));
        CHECK(hosts_finish(host_events(pl::forward_only(step)), v, false));
        CHECK(hosts_finish(host_events(pl::first_forward(p, v)), v, true));
      }
}
TEST_CASE("batched transport: one message at a time deadlocks 1F1B (the replay sees it)", "[pipeline]") {
  CHECK_FALSE(completes(one_at_a_time(pl::make_schedule(pl::OneFOneB{}, 2, 4))));
  CHECK(completes(batched(pl::make_schedule(pl::OneFOneB{}, 2, 4))));
}
TEST_CASE("batched transport: batches grouped unlike the neighbour's fail the strict replay; rounds pass it", "[pipeline]") {
  // GPipe, 2 stages: stage 0's first batch holds all four activations and a gradient, stage 1
  // receives each activation alone — what NCCL leaves undefined (and hung on 2×H200).
  const auto gpipe = pl::make_schedule(pl::GPipe{}, 2, 4);
  const auto stages = batched(gpipe), groups = rounds(gpipe);
  CHECK(stages[0].front().size() == 5);
  CHECK(completes(stages));
  CHECK_FALSE(completes_alike(stages));
  for (std::size_t i = 0; i < 5; ++i) CHECK(groups[0][i].size() == 1);  // the batch in five rounds
  CHECK(completes_alike(groups));
}
TEST_CASE("batched transport: 1F1B's steady state pairs a send with the opposite receive", "[pipeline]") {
  // Stage 0 of 2, m = 4: after F1 it sends activation 1 and receives gradient 0 in one group.
  const auto stages = batched(pl::make_schedule(pl::OneFOneB{}, 2, 4));
  const std::vector<pl::Message> want{{pl::Flow::forward, 0, true}, {pl::Flow::forward, 1, true}, {pl::Flow::backward, 0, false}};
  CHECK(stages[0].front() == want);
  // In rounds, as stage 1 groups them: activation 0 alone, then activation 1 with gradient 0.
  const auto groups = rounds(pl::make_schedule(pl::OneFOneB{}, 2, 4));
  CHECK(groups[0][0] == std::vector<pl::Message>{{pl::Flow::forward, 0, true}});
  CHECK(groups[0][1] == std::vector<pl::Message>{{pl::Flow::forward, 1, true}, {pl::Flow::backward, 0, false}});
  CHECK(groups[1][0] == std::vector<pl::Message>{{pl::Flow::forward, 0, false}});
}

TEST_CASE("plan_buffers: activation sets are the schedule's peak in flight", "[pipeline]") {
  using pl::Op;
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 4, 8})
      for (int s = 0; s < p; ++s) {
        CAPTURE(p, m, s);
        const auto gpipe = pl::make_schedule(pl::GPipe{}, p, m)[static_cast<std::size_t>(s)];
        const auto ofob = pl::make_schedule(pl::OneFOneB{}, p, m)[static_cast<std::size_t>(s)];
        const auto zb = pl::make_schedule(pl::ZeroBubbleH1{}, p, m)[static_cast<std::size_t>(s)];
        const auto fbw = {Op::Forward, Op::BackwardInput, Op::BackwardWeight};
        CHECK(pl::plan_buffers(gpipe, m, fbw).count == m);
        CHECK(pl::plan_buffers(ofob, m, fbw).count == std::min(p - s, m));
        CHECK(pl::plan_buffers(zb, m, fbw).count == std::min(p, m));
        CHECK(pl::weight_follows_input(gpipe));
        CHECK(pl::weight_follows_input(ofob));
        if (s == 0) CHECK(pl::weight_follows_input(zb));  // ZB-H1 delays stage s's W's by s
        // Every micro-batch has a buffer below the count, and two micro-batches in flight at once never share one.
        const auto plan = pl::plan_buffers(ofob, m, fbw);
        std::vector<int> holder(static_cast<std::size_t>(plan.count), -1);
        for (const pl::Action& a : ofob) {
          if (!pl::is_compute(a.op)) continue;
          const int b = plan.index[static_cast<std::size_t>(a.micro_batch)];
          REQUIRE((b >= 0 && b < plan.count));
          int& h = holder[static_cast<std::size_t>(b)];
          if (a.op == Op::Forward) {
            CHECK(h == -1);
            h = a.micro_batch;
          }
          CHECK(h == a.micro_batch);
          if (a.op == Op::BackwardWeight) h = -1;
        }
      }
  CHECK_FALSE(pl::weight_follows_input(pl::make_schedule(pl::ZeroBubbleH1{}, 2, 4)[1]));
}
