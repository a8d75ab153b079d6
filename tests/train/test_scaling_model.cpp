// train/scaling_model.hpp: the all-reduce and pipeline pieces against their closed forms, one GPU
// reproducing its own calibration, and the directions the model must get right (hierarchical
// against flat across slow links, compression, more stages), plus its refusals.
#include "test.hpp"

#include <dpml/train/scaling_model.hpp>

using namespace dpml::train::scaling;
namespace pl = dpml::parallel::pipeline;

namespace {
const dpml::models::GptConfig kGpt2{.vocab = 50257, .max_seq = 1024, .layers = 12, .heads = 12, .dim = 768};
}

TEST_CASE("scaling model: ring all-reduce time and a pipeline replay with stages of unequal cost", "[scaling]") {
  CHECK(ring_allreduce_s(1e9, 1, 100, 10) == 0.0);
  CHECK(ring_allreduce_s(1e9, 2, 100, 10) == dpml::test::Approx(1e9 / 100e9 + 2 * 10e-6));
  CHECK(ring_allreduce_s(1e9, 8, 100, 10) == dpml::test::Approx(1.75 * 1e9 / 100e9 + 6 * 10e-6));
  // 1F1B on 2 stages, the second twice as slow, no communication time: stage 0's first forward,
  // then the second stage's m micro-batches back to back (it sends each gradient after its W),
  // then stage 0's last B and W.
  const auto table = pl::make_schedule(pl::OneFOneB{}, 2, 4);
  const auto sim = pl::simulate(table, std::vector<pl::Costs>{{1, 1, 1, 0}, {2, 2, 2, 0}});
  CHECK(sim.makespan == dpml::test::Approx(1 + 4 * 6 + 1 + 1));
  CHECK(sim.stages[1].busy == dpml::test::Approx(24));
  // One cost for all stages is the same as that cost per stage.
  CHECK(pl::simulate(table, pl::Costs{1, 2, 1, 0.5}).makespan ==
        pl::simulate(table, std::vector<pl::Costs>(2, pl::Costs{1, 2, 1, 0.5})).makespan);
}

TEST_CASE("scaling model: one GPU is its calibration; layouts move the step the right way", "[scaling]") {
  const Calibration cal{.tokens_per_s = 400'000, .batch = 16};
  const Links links;
  const auto one = predict(kGpt2, 1024, {}, cal, links);
  CHECK(one.tokens_per_s == dpml::test::Approx(400'000));
  CHECK(one.scaling == dpml::test::Approx(1.0));
  CHECK(one.bubble_s == 0.0);
  CHECK(one.dp_exposed_s == 0.0);

  const auto dp2 = predict(kGpt2, 1024, {.dp = 2}, cal, links);
  CHECK(dp2.scaling < 1.0);
  CHECK(dp2.scaling > 0.9);  // the gradients hide behind the backward on NVLink: the lock-step cost remains
  CHECK(dp2.dp_exposed_s >= cal.dp_lock_step_ms * 1e-3);

  // 64 data ranks over 8 nodes on slow links: hierarchical beats flat, compression helps both,
  // and within one node the two are the same all-reduce.
  const Links slow{.gpus_per_node = 8, .inter_busbw_gbs = 5};
  const auto flat = predict(kGpt2, 1024, {.dp = 64}, cal, slow);
  const auto hier = predict(kGpt2, 1024, {.dp = 64, .hierarchical = true}, cal, slow);
  const auto squeezed = predict(kGpt2, 1024, {.dp = 64, .hierarchical = true, .compression = 0.1}, cal, slow);
  CHECK(hier.dp_exposed_s < flat.dp_exposed_s);
  CHECK(squeezed.dp_exposed_s < hier.dp_exposed_s);
  CHECK(predict(kGpt2, 1024, {.dp = 8, .hierarchical = true}, cal, slow).step_s ==
        predict(kGpt2, 1024, {.dp = 8}, cal, slow).step_s);
  // fp32 on the wire costs more than bf16 once the reduction is exposed.
  CHECK(predict(kGpt2, 1024, {.dp = 64, .wire_bytes = 4}, cal, slow).step_s > flat.step_s);

  // Pipelines: more micro-batches shrink the bubble; ZB-H1's is below 1F1B's.
  const auto pp_m4 = predict(kGpt2, 1024, {.pp = 4, .schedule = "1f1b", .micro_batches = 4, .micro_batch = 4}, cal, links);
  const auto pp_m16 = predict(kGpt2, 1024, {.pp = 4, .schedule = "1f1b", .micro_batches = 16, .micro_batch = 4}, cal, links);
  const auto zb_m4 = predict(kGpt2, 1024, {.pp = 4, .schedule = "zb-h1", .micro_batches = 4, .micro_batch = 4}, cal, links);
  CHECK(pp_m16.bubble_s / pp_m16.step_s < pp_m4.bubble_s / pp_m4.step_s);
  CHECK(zb_m4.bubble_s < pp_m4.bubble_s);
  // Tensor parallel: the all-reduces are on the critical path.
  const auto tp2 = predict(kGpt2, 1024, {.tp = 2}, cal, links);
  CHECK(tp2.tp_comm_s > 0);
  CHECK(tp2.scaling < dp2.scaling);
}

TEST_CASE("scaling model: layouts it cannot place are refused, naming the size", "[scaling]") {
  const Calibration cal;
  const Links links;
  CHECK(dpml::test::message_of([&] { predict(kGpt2, 1024, {.pp = 13}, cal, links); }).find("pp 13 exceeds the 12 layers") !=
        std::string::npos);
  CHECK(dpml::test::message_of([&] { predict(kGpt2, 1024, {.tp = 3}, cal, links); }).find("tp 3 must divide the 8 GPUs") !=
        std::string::npos);
  CHECK(dpml::test::message_of([&] { predict(kGpt2, 1024, {.pp = 2, .schedule = "looped"}, cal, links); })
            .find("schedule 'looped' is not gpipe, 1f1b, zb-h1 or interleaved") != std::string::npos);
  CHECK(dpml::test::message_of([&] { predict(kGpt2, 1024, {.pp = 4, .schedule = "interleaved", .virtual_stages = 4}, cal, links); })
            .find("4 stages × 4 chunks exceed the 12 layers") != std::string::npos);
}

TEST_CASE("scaling model: the interleaved schedule's bubble is 1F1B's over v", "[scaling]") {
  // Balanced stages (a 256-token head is 2 % of a block) and links without cost: the bubble over
  // the busiest stage's compute is the schedule's (p−1)/(v·m), from the replayed table.
  const dpml::models::GptConfig deep{.vocab = 256, .max_seq = 1024, .layers = 16, .heads = 16, .dim = 1024};
  const Calibration cal{.tokens_per_s = 100'000, .batch = 32};
  const Links free_links{.gpus_per_node = 8, .intra_busbw_gbs = 1e12, .intra_latency_us = 0};
  double previous = 1e9;
  for (int v : {1, 2, 4}) {
    const Layout l{.pp = 4, .schedule = v == 1 ? "1f1b" : "interleaved", .virtual_stages = v, .micro_batches = 8, .micro_batch = 4};
    const auto r = predict(deep, 1024, l, cal, free_links);
    CAPTURE(v, r.bubble_s, r.compute_s);
    CHECK(r.bubble_s / r.compute_s == dpml::test::Approx(3.0 / (v * 8.0)).epsilon(0.05));
    CHECK(r.step_s < previous);  // more chunks, a shorter step
    previous = r.step_s;
  }
}
