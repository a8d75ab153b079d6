// Pipeline schedules: every table passes the validator, corrupted tables fail it with a message
// naming the fault, and the simulator reproduces the bubble theory of schedule.hpp.
#include "test.hpp"

#include <dpml/parallel/pipeline/schedule.hpp>

#include <algorithm>
#include <string>

namespace pl = dpml::parallel::pipeline;
using pl::Action;
using pl::Op;

namespace {

template <class Tag>
void check_all_sizes() {
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 8}) {
      CAPTURE(p, m);
      const pl::Schedule s = pl::make_schedule(Tag{}, p, m);
      const dpml::Status st = pl::check_schedule(s, p, m);
      INFO(st.message() << '\n' << pl::to_string(s, true));
      CHECK(st.ok());
    }
}

// Index of `a` in stage `s`'s list.
std::size_t find(const pl::Schedule& sch, int s, Action a) {
  const auto& l = sch[static_cast<std::size_t>(s)];
  return static_cast<std::size_t>(std::find(l.begin(), l.end(), a) - l.begin());
}

}  // namespace

TEST_CASE("schedules: every table for 1-4 stages and 1-8 micro-batches passes the validator", "[pipeline]") {
  check_all_sizes<pl::GPipe>();
  check_all_sizes<pl::OneFOneB>();
  check_all_sizes<pl::ZeroBubbleH1>();
}

TEST_CASE("schedules: 1F1B and ZB-H1 have the documented shape", "[pipeline]") {
  const auto f = pl::make_schedule(pl::OneFOneB{}, 4, 8);
  CHECK(pl::to_string(f) ==
        "stage 0: F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7\n"
        "stage 1: F0 F1 F2 B0 W0 F3 B1 W1 F4 B2 W2 F5 B3 W3 F6 B4 W4 F7 B5 W5 B6 W6 B7 W7\n"
        "stage 2: F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 F4 B3 W3 F5 B4 W4 F6 B5 W5 F7 B6 W6 B7 W7\n"
        "stage 3: F0 B0 W0 F1 B1 W1 F2 B2 W2 F3 B3 W3 F4 B4 W4 F5 B5 W5 F6 B6 W6 F7 B7 W7\n");
  const auto z = pl::make_schedule(pl::ZeroBubbleH1{}, 4, 8);
  CHECK(pl::to_string(z) ==
        "stage 0: F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7\n"
        "stage 1: F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7\n"
        "stage 2: F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7\n"
        "stage 3: F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7\n");
  // ZB-H1 sends the input gradient right after B; 1F1B after the whole backward (B then W).
  CHECK(find(z, 1, {Op::SendBackward, 0}) == find(z, 1, {Op::BackwardInput, 0}) + 1);
  CHECK(find(f, 1, {Op::SendBackward, 0}) == find(f, 1, {Op::BackwardWeight, 0}) + 1);
  // Receives are posted one compute action before the one that consumes them.
  CHECK(find(f, 1, {Op::RecvForward, 1}) < find(f, 1, {Op::Forward, 0}));
}

TEST_CASE("schedules: corrupted tables fail the validator with a message", "[pipeline]") {
  const int p = 3, m = 4;
  const auto good = pl::make_schedule(pl::OneFOneB{}, p, m);
  auto msg = [&](const pl::Schedule& s) { return pl::check_schedule(s, p, m).message(); };
  auto contains = [](const std::string& text, const std::string& part) {
    INFO(text);
    CHECK(text.find(part) != std::string::npos);
  };
  {  // a W dropped
    auto s = good;
    auto& l = s[1];
    l.erase(l.begin() + static_cast<long>(find(s, 1, {Op::BackwardWeight, 2})));
    contains(msg(s), "stage 1 lacks BackwardWeight(2)");
  }
  {  // a micro-batch twice
    auto s = good;
    s[2][find(s, 2, {Op::BackwardWeight, 3})].micro_batch = 1;
    contains(msg(s), "stage 2 has BackwardWeight(1) twice");
  }
  {  // B before F
    auto s = good;
    std::swap(s[0][find(s, 0, {Op::Forward, 0})], s[0][find(s, 0, {Op::BackwardInput, 0})]);
    contains(msg(s), "stage 0: BackwardInput(0)");
  }
  {  // sends in another order than the neighbour receives
    auto s = good;
    std::swap(s[0][find(s, 0, {Op::SendForward, 0})].micro_batch, s[0][find(s, 0, {Op::SendForward, 1})].micro_batch);
    const std::string text = msg(s);
    CHECK_FALSE(text.empty());
  }
  {  // a receive on the first stage
    auto s = good;
    s[0].insert(s[0].begin(), Action{Op::RecvForward, 0});
    contains(msg(s), "has no neighbour on that side");
  }
  {  // out of range, and the wrong number of stages
    auto s = good;
    s[1].back().micro_batch = m;
    contains(msg(s), "outside [0, 4)");
    contains(pl::check_schedule(good, p + 1, m).message(), "3 stage lists for 4 stages");
  }
  {  // structurally fine but deadlocked: stage 0 sends mb 1's activation only after its own B1,
     // which waits for mb 1's gradient from stage 1, which waits for that activation.
    pl::Schedule s = {
        {{Op::Forward, 0}, {Op::SendForward, 0}, {Op::Forward, 1}, {Op::RecvBackward, 0}, {Op::BackwardInput, 0},
         {Op::BackwardWeight, 0}, {Op::RecvBackward, 1}, {Op::BackwardInput, 1}, {Op::BackwardWeight, 1},
         {Op::SendForward, 1}},
        {{Op::RecvForward, 0}, {Op::RecvForward, 1}, {Op::Forward, 0}, {Op::BackwardInput, 0}, {Op::SendBackward, 0},
         {Op::BackwardWeight, 0}, {Op::Forward, 1}, {Op::BackwardInput, 1}, {Op::SendBackward, 1},
         {Op::BackwardWeight, 1}}};
    const std::string text = pl::check_schedule(s, 2, 2).message();
    contains(text, "deadlocks");
    contains(text, "stage 0 waits at action #7 BackwardInput(1)");
    contains(text, "stage 1 waits at action #6 Forward(1)");
    CHECK_THROWS_AS(pl::simulate(s, pl::Costs{}), dpml::Error);
  }
  CHECK(pl::check_schedule(good, p, m).ok());
}

TEST_CASE("simulator: GPipe and 1F1B bubble is (p-1)/(m+p-1) of the step, ZB-H1 a third of it", "[pipeline]") {
  // Theory (schedule.hpp), communication free: GPipe/1F1B idle per stage = (p−1)(F+B+W), so
  // idle/makespan = (p−1)/(m+p−1); ZB-H1 idle per stage = (p−1)(F+B−W) for m ≥ p.
  for (const pl::Costs c : {pl::Costs{1, 1, 1, 0}, pl::Costs{1, 2, 1, 0}, pl::Costs{2, 1.5, 1, 0}})
    for (int p : {2, 3, 4})
      for (int m : {1, 2, 4, 8}) {
        CAPTURE(c.forward, c.backward_input, c.backward_weight, p, m);
        const double unit = c.forward + c.backward_input + c.backward_weight;
        for (const auto& sim : {pl::simulate(pl::make_schedule(pl::GPipe{}, p, m), c),
                                pl::simulate(pl::make_schedule(pl::OneFOneB{}, p, m), c)}) {
          CHECK(sim.makespan == dpml::test::Approx((m + p - 1) * unit));
          for (const auto& st : sim.stages) CHECK(st.idle == dpml::test::Approx((p - 1) * unit));
          CHECK(sim.bubble_fraction() == dpml::test::Approx(double(p - 1) / (m + p - 1)));
        }
        const auto zb = pl::simulate(pl::make_schedule(pl::ZeroBubbleH1{}, p, m), c);
        if (m >= p) {
          for (const auto& st : zb.stages)
            CHECK(st.idle == dpml::test::Approx((p - 1) * (c.forward + c.backward_input - c.backward_weight)));
          CHECK(zb.bubble_fraction() == dpml::test::Approx(pl::theory_bubble(pl::ZeroBubbleH1{}, p, m, c)));
        }
        const auto one = pl::simulate(pl::make_schedule(pl::OneFOneB{}, p, m), c);
        CHECK(zb.makespan <= one.makespan);
        if (m >= p && c.backward_input == c.forward && c.backward_weight == c.forward)
          CHECK(zb.stages[0].idle == dpml::test::Approx(one.stages[0].idle / 3));
      }
}

TEST_CASE("simulator: ZB-H1 keeps 1F1B's peak of micro-batches in flight; GPipe holds all", "[pipeline]") {
  for (int p : {2, 3, 4})
    for (int m : {2, 4, 8}) {
      CAPTURE(p, m);
      const auto g = pl::simulate(pl::make_schedule(pl::GPipe{}, p, m), pl::Costs{});
      const auto f = pl::simulate(pl::make_schedule(pl::OneFOneB{}, p, m), pl::Costs{});
      const auto z = pl::simulate(pl::make_schedule(pl::ZeroBubbleH1{}, p, m), pl::Costs{});
      for (int s = 0; s < p; ++s) {
        const auto us = static_cast<std::size_t>(s);
        CHECK(g.stages[us].peak_in_flight == m);
        CHECK(f.stages[us].peak_in_flight == std::min(p - s, m));
        CHECK(z.stages[us].peak_in_flight <= f.stages[0].peak_in_flight);
      }
    }
}

TEST_CASE("simulator: communication latency lengthens the step", "[pipeline]") {
  // One micro-batch: the path crosses the 3 links forth and back once.
  const auto one = pl::make_schedule(pl::OneFOneB{}, 4, 1);
  CHECK(pl::simulate(one, pl::Costs{1, 1, 1, 0.5}).makespan == dpml::test::Approx(pl::simulate(one, pl::Costs{}).makespan + 2 * 3 * 0.5));
  const auto s = pl::make_schedule(pl::OneFOneB{}, 4, 8);
  CHECK(pl::simulate(s, pl::Costs{1, 1, 1, 0.5}).makespan > pl::simulate(s, pl::Costs{}).makespan + 3);
}

TEST_CASE("schedules: bad sizes are refused", "[pipeline]") {
  CHECK_THROWS_AS(pl::make_schedule(pl::OneFOneB{}, 0, 4), dpml::Error);
  CHECK_THROWS_AS(pl::make_schedule(pl::GPipe{}, 2, 0), dpml::Error);
}

TEST_CASE("interleaved 1F1B: every table for p 2-8, v 2-4 and m a multiple of p passes the validator", "[pipeline][interleaved]") {
  for (int p : {2, 3, 4, 8})
    for (int v : {2, 3, 4})
      for (int m : {p, 2 * p, 3 * p}) {
        CAPTURE(p, v, m);
        const pl::Schedule s = pl::make_schedule(pl::Interleaved1F1B{v}, p, m);
        const dpml::Status st = pl::check_schedule(s, p, m, v);
        INFO(st.message() << '\n' << pl::to_string(s, true));
        CHECK(st.ok());
        CHECK(pl::chunks_in(s) == v);
        // One F, B and W per (chunk, micro-batch) on each rank: 3·m·v compute actions.
        for (const auto& l : s) CHECK(std::count_if(l.begin(), l.end(), [](const Action& a) { return pl::is_compute(a.op); }) == 3 * m * v);
        // The same table read as one of fewer chunks is refused: it names chunks outside the range.
        CHECK_FALSE(pl::check_schedule(s, p, m, v - 1).ok());
      }
  // One chunk per rank is the 1F1B table.
  CHECK(pl::make_schedule(pl::Interleaved1F1B{1}, 4, 6) == pl::make_schedule(pl::OneFOneB{}, 4, 6));
}

TEST_CASE("interleaved 1F1B: Megatron's order — warm-up, chunks in groups of p, backward last chunk first", "[pipeline][interleaved]") {
  // p = 2, v = 2, m = 4: rank 0 warms up with (p−0−1)·2 + (v−1)·p = 4 forwards, rank 1 with 2.
  CHECK(pl::to_string(pl::make_schedule(pl::Interleaved1F1B{2}, 2, 4)) ==
        "stage 0: F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 W0.1 F3.0 B1.1 W1.1 F2.1 B0.0 W0.0 F3.1 B1.0 W1.0 B2.1 W2.1 B3.1 W3.1 B2.0 W2.0 B3.0 W3.0\n"
        "stage 1: F0.0 F1.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 F2.0 B0.0 W0.0 F3.0 B1.0 W1.0 F2.1 B2.1 W2.1 F3.1 B3.1 W3.1 B2.0 W2.0 B3.0 W3.0\n");
  const auto s = pl::make_schedule(pl::Interleaved1F1B{2}, 2, 4);
  // Rank 1 chunk 0 (virtual stage 1) sends to rank 0 chunk 1 (virtual stage 2); rank 0 chunk 1
  // sends its gradient back there. The last virtual stage (rank 1, chunk 1) sends no activation.
  CHECK(find(s, 1, {Op::SendForward, 0, 0}) < s[1].size());
  CHECK(find(s, 0, {Op::RecvForward, 0, 1}) < find(s, 0, {Op::Forward, 0, 1}));
  CHECK(find(s, 0, {Op::SendBackward, 0, 1}) == find(s, 0, {Op::BackwardWeight, 0, 1}) + 1);
  CHECK(find(s, 1, {Op::SendForward, 0, 1}) == s[1].size());
  CHECK(find(s, 0, {Op::RecvForward, 0, 0}) == s[0].size());
}

TEST_CASE("interleaved 1F1B: the bubble is (p-1)/(v·m+p-1) of the step, v times less compute than 1F1B's", "[pipeline][interleaved]") {
  // Costs per chunk: a chunk does 1/v of a stage's work. Theory (schedule.hpp; Narayanan et al.
  // 2021 §2.2.2): idle per rank (p−1)(F+B+W) in chunk costs, bubble/compute (p−1)/(v·m).
  for (const pl::Costs c : {pl::Costs{1, 1, 1, 0}, pl::Costs{1, 2, 1, 0}, pl::Costs{2, 1.5, 1, 0}})
    for (int p : {2, 3, 4})
      for (int v : {2, 3})
        for (int m : {p, 2 * p, 4 * p}) {
          CAPTURE(c.forward, c.backward_input, c.backward_weight, p, v, m);
          const double unit = c.forward + c.backward_input + c.backward_weight;
          const auto sim = pl::simulate(pl::make_schedule(pl::Interleaved1F1B{v}, p, m), c);
          CHECK(sim.makespan == dpml::test::Approx((m * v + p - 1) * unit));
          for (const auto& st : sim.stages) CHECK(st.idle == dpml::test::Approx((p - 1) * unit));
          CHECK(sim.bubble_fraction() == dpml::test::Approx(pl::theory_bubble(pl::Interleaved1F1B{v}, p, m, c)));
          // The same model as 1F1B, each chunk 1/v of a stage: a smaller bubble, the same work.
          pl::Costs stage = c;
          stage.forward *= v, stage.backward_input *= v, stage.backward_weight *= v;
          const auto one = pl::simulate(pl::make_schedule(pl::OneFOneB{}, p, m), stage);
          CHECK(sim.bubble_fraction() < one.bubble_fraction());
          CHECK(sim.stages[0].idle == dpml::test::Approx(one.stages[0].idle / v));
          CHECK(sim.stages[0].busy == dpml::test::Approx(one.stages[0].busy));
        }
}

TEST_CASE("interleaved 1F1B: broken tables and bad sizes are refused", "[pipeline][interleaved]") {
  const int p = 2, v = 2, m = 4;
  const auto good = pl::make_schedule(pl::Interleaved1F1B{v}, p, m);
  REQUIRE(pl::check_schedule(good, p, m, v).ok());
  auto msg = [&](const pl::Schedule& s) { return pl::check_schedule(s, p, m, v).message(); };
  auto contains = [](const std::string& text, const std::string& part) {
    INFO(text);
    CHECK(text.find(part) != std::string::npos);
  };
  {  // a chunk's W dropped
    auto s = good;
    s[1].erase(s[1].begin() + static_cast<long>(find(s, 1, {Op::BackwardWeight, 2, 1})));
    contains(msg(s), "stage 1 lacks BackwardWeight(2, chunk 1)");
  }
  {  // a chunk's F and B swapped
    auto s = good;
    std::swap(s[0][find(s, 0, {Op::Forward, 0, 1})], s[0][find(s, 0, {Op::BackwardInput, 0, 1})]);
    contains(msg(s), "stage 0: BackwardInput(0, chunk 1)");
  }
  {  // rank 0 posts the receives of two activations from rank 1 in another order than rank 1 sends them
    auto s = good;
    std::swap(s[0][find(s, 0, {Op::RecvForward, 0, 1})].micro_batch, s[0][find(s, 0, {Op::RecvForward, 1, 1})].micro_batch);
    contains(msg(s), "stage 1 sends to stage 0 in another order than stage 0 receives");
  }
  {  // the two chunks' messages between the same ranks swapped: a transport matching in posting
     // order would hand chunk 1's activation to chunk 0 (p = 2: rank 0 → 1 carries both flows)
    auto s = good;
    auto& l = s[0];
    const auto i = find(s, 0, {Op::SendForward, 0, 0}), j = find(s, 0, {Op::SendForward, 0, 1});
    std::swap(l[i], l[j]);
    CHECK_FALSE(msg(s).empty());
  }
  {  // a chunk outside the table's range, and the last virtual stage sending on
    auto s = good;
    s[0].back().chunk = 2;
    contains(msg(s), "names chunk 2, outside [0, 2)");
    auto t = good;
    t[1].push_back({Op::SendForward, 0, 1});
    contains(msg(t), "has no neighbour on that side");
  }
  {  // rank 0 runs chunk 1's first forward before chunk 0's: it waits for an activation that
     // needs its own; on two ranks every reordering also changes the order between the pair
    auto s = good;
    auto& l = s[0];
    for (const Action a : {Action{Op::SendForward, 0, 1}, Action{Op::Forward, 0, 1}, Action{Op::RecvForward, 0, 1}}) {
      l.erase(l.begin() + static_cast<long>(find(s, 0, a)));
      l.insert(l.begin(), a);
    }
    const std::string text = msg(s);
    CHECK((text.find("deadlocks") != std::string::npos || text.find("in another order") != std::string::npos));
    CHECK_THROWS_AS(pl::simulate(s, pl::Costs{}), dpml::Error);
  }
  // m not a multiple of p (Megatron's condition), v < 1, one rank: refused naming the flags.
  contains(dpml::test::error_of([] { pl::make_schedule(pl::Interleaved1F1B{2}, 4, 6); }), "--global-batch / (--micro-batch × dp)");
  contains(dpml::test::error_of([] { pl::make_schedule(pl::Interleaved1F1B{2}, 4, 6); }), "multiple of --pp 4");
  contains(dpml::test::error_of([] { pl::make_schedule(pl::Interleaved1F1B{0}, 2, 4); }), "--num-virtual-stages-per-pipeline-rank 0 must be at least 1");
  contains(dpml::test::error_of([] { pl::make_schedule(pl::Interleaved1F1B{2}, 1, 4); }), "needs --pp 2 or more");
}
