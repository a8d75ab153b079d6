// The batches of the rendezvous transport (transport.hpp: BatchedTransport, P2pBatcher), on paper:
// every stage of a schedule runs the real executor with a stage that computes nothing and a
// launcher that records the batches it is given; then the stages' batch sequences are replayed
// together under rendezvous semantics (NCCL point-to-point, comm::Staged): a stage runs its
// batches one after the other, and a batch completes once the peer of each of its messages has
// posted the matching one (in a batch of its own that has started). GPipe, 1F1B and ZB-H1 on 1 to
// 8 stages with 1 to 16 micro-batches must all finish. The replay is checked to catch a deadlock:
// posting every message alone in table order deadlocks 1F1B on two stages.
//
// Also: plan_buffers and weight_follows_input (partition.hpp) on the three schedules.
#include "test.hpp"

#include <dpml/parallel/pipeline/executor.hpp>
#include <dpml/parallel/pipeline/partition.hpp>
#include <dpml/parallel/pipeline/schedule.hpp>
#include <dpml/parallel/pipeline/transport.hpp>

#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

namespace pl = dpml::parallel::pipeline;

namespace {

using Batches = std::vector<std::vector<pl::Message>>;  // one stage's batches, in launch order

// Launcher that records; marks are the posting order.
struct RecordingLauncher {
  using Mark = int;
  int stage, stages;
  Batches* out;
  std::set<std::pair<int, int>> sent;  // (flow, mb) launched, sends and receives alike
  int marks = 0;

  Mark mark() { return marks++; }
  template <class Batch>
  void launch(const Batch& b) {
    std::vector<pl::Message> messages;
    for (const auto& e : b) {
      messages.push_back(e.message);
      sent.insert(key(e.message));
    }
    out->push_back(std::move(messages));
  }
  bool launched(pl::Message m) const { return sent.contains(key(m)); }
  void wait(pl::Message) {}
  void wait_all() { sent.clear(); }
  int rank() const { return stage; }
  int size() const { return stages; }

  static std::pair<int, int> key(pl::Message m) { return {static_cast<int>(m.flow) * 2 + (m.send ? 1 : 0), m.micro_batch}; }
};

struct NullStage {
  using value_type = float;
  float cell = 0;
  void forward(int) {}
  void backward_input(int) {}
  void backward_weight(int) {}
  dpml::TensorView<float> recv_forward_buffer(int) { return {&cell, dpml::Shape{1}}; }
  dpml::TensorView<const float> send_forward_buffer(int) { return {&cell, dpml::Shape{1}}; }
  dpml::TensorView<float> recv_backward_buffer(int) { return {&cell, dpml::Shape{1}}; }
  dpml::TensorView<const float> send_backward_buffer(int) { return {&cell, dpml::Shape{1}}; }
};
static_assert(pl::Stage<NullStage>);

// The batches each stage's executor launches in one step.
std::vector<Batches> batched(const pl::Schedule& schedule) {
  const int p = static_cast<int>(schedule.size());
  std::vector<Batches> all(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    NullStage stage;
    pl::BatchedTransport<float, RecordingLauncher> transport(RecordingLauncher{s, p, &all[static_cast<std::size_t>(s)], {}});
    pl::run_stage(schedule[static_cast<std::size_t>(s)], stage, transport);
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
      b.push_back({pl::Message{forward ? pl::Flow::forward : pl::Flow::backward, a.micro_batch, send}});
    }
    all.push_back(std::move(b));
  }
  return all;
}

// Replays the stages' batches under rendezvous semantics; true when every stage finishes.
bool completes(const std::vector<Batches>& stages) {
  using Key = std::tuple<int, int, int>;  // (flow, sending stage, micro-batch)
  auto key = [](int stage, const pl::Message& m) {
    const int sender = m.send ? stage : pl::peer_of(m.flow, false, stage);
    return Key{static_cast<int>(m.flow), sender, m.micro_batch};
  };
  const std::size_t p = stages.size();
  std::vector<std::size_t> next(p, 0);
  std::set<Key> sends_posted, recvs_posted;
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t s = 0; s < p; ++s) {
      while (next[s] < stages[s].size()) {
        const auto& batch = stages[s][next[s]];
        for (const auto& m : batch) (m.send ? sends_posted : recvs_posted).insert(key(static_cast<int>(s), m));
        const bool matched = std::all_of(batch.begin(), batch.end(), [&](const pl::Message& m) {
          return (m.send ? recvs_posted : sends_posted).contains(key(static_cast<int>(s), m));
        });
        if (!matched) break;
        ++next[s];
        progress = true;
      }
    }
  }
  for (std::size_t s = 0; s < p; ++s)
    if (next[s] < stages[s].size()) return false;
  return true;
}

template <class Tag>
void check_batches_complete(const char* name) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      CAPTURE(name, p, m);
      const auto schedule = pl::make_schedule(Tag{}, p, m);
      REQUIRE(pl::check_schedule(schedule, p, m).ok());
      const auto stages = batched(schedule);
      CHECK(completes(stages));
      std::size_t messages = 0;  // every communication action is launched exactly once
      for (const auto& b : stages)
        for (const auto& batch : b) messages += batch.size();
      std::size_t actions = 0;
      for (const auto& a : schedule)
        actions += static_cast<std::size_t>(std::count_if(a.begin(), a.end(), [](const pl::Action& x) { return !pl::is_compute(x.op); }));
      CHECK(messages == actions);
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
TEST_CASE("batched transport: one message at a time deadlocks 1F1B (the replay sees it)", "[pipeline]") {
  CHECK_FALSE(completes(one_at_a_time(pl::make_schedule(pl::OneFOneB{}, 2, 4))));
  CHECK(completes(batched(pl::make_schedule(pl::OneFOneB{}, 2, 4))));
}
TEST_CASE("batched transport: 1F1B's steady state pairs a send with the opposite receive", "[pipeline]") {
  // Stage 0 of 2, m = 4: after F1 it sends activation 1 and receives gradient 0 in one group.
  const auto stages = batched(pl::make_schedule(pl::OneFOneB{}, 2, 4));
  const std::vector<pl::Message> want{{pl::Flow::forward, 0, true}, {pl::Flow::forward, 1, true}, {pl::Flow::backward, 0, false}};
  CHECK(stages[0].front() == want);
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
