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
