// Every layout equals sequential: a tiny GPT trained 5 steps under each (dp, tp, pp) that this
// launch's world size allows, with every schedule, with and without ZeRO (stages 1, 2 and 3: the
// final weights then come back from the value shards when the trainer goes) and recomputation,
// gives the sequential run's losses, evaluations between steps and final weights; and with the hierarchical data-parallel
// all-reduce (DataParallel<…, Hierarchical>), the data axis as nodes of 2 ranks; and under the
// interleaved 1F1B schedule, the model cut into 2 chunks per pipeline rank (models::GptChunks).
//
// Tolerance: float32 arithmetic summed in different orders (tensor-parallel partial sums, micro-
// batch accumulation, bucketed reductions): relative error ≤ 1e-4 for each step's loss and for
// each parameter tensor (L2 over the tensor), as the issue asks. The vocabulary (67) does not
// divide by tp, so the padded vocabulary path is always on.
//
// AdamW runs with eps = 1e-3: some gradients are zero in exact arithmetic (the key bias of
// attention: softmax ignores a shift shared by all keys) and only rounding noise (~1e-9) in
// float32; AdamW's m/√v turns any such noise into a full-size step whose sign is noise, which no
// tolerance can compare. A larger eps keeps those steps at noise size and leaves the real ones.
#include "test.hpp"
#include "layouts.hpp"  // worst_weight_error

#include <dpml/data/token_shards.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/gpt.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/gpt_trainer.hpp>

#include <string>
#include <vector>

using namespace dpml;

namespace {
constexpr double kTolerance = 1e-4;
constexpr int kSteps = 5;
constexpr std::int64_t kGlobalBatch = 24, kSeq = 8;  // 24: divisible by every dp of 1-8 ranks (1, 2, 3, 4, 8)

// first, last: the blocks of the first and last pipeline stage (0: an even cut).
models::GptConfig tiny(bool recompute, std::int64_t first = 0, std::int64_t last = 0) {
  return {.vocab = 67, .max_seq = kSeq, .layers = 4, .heads = 4, .dim = 16, .recompute = recompute,
          .first_stage_layers = first, .last_stage_layers = last};
}

// The global batch of step s: random inputs, and targets a fixed function of them (learnable,
// so that the loss falls).
data::TokenBatch global_batch(int step) {
  data::TokenBatch b{Tensor<std::int32_t>(Shape{kGlobalBatch, kSeq}), Tensor<std::int32_t>(Shape{kGlobalBatch, kSeq})};
  const PhiloxStream rng(99, static_cast<std::uint64_t>(step));
  for (std::int64_t i = 0; i < b.inputs.numel(); ++i) {
    b.inputs[i] = static_cast<std::int32_t>(rng.u32(2 * static_cast<std::uint64_t>(i)) % 67);
    b.targets[i] = (b.inputs[i] * 7 + 3) % 67;
  }
  return b;
}
// Rows [r·n/dp, (r+1)·n/dp) of a global batch.
data::TokenBatch local_rows(const data::TokenBatch& g, int r, int dp) {
  const std::int64_t n = g.inputs.size(0) / dp;
  data::TokenBatch b{Tensor<std::int32_t>(Shape{n, kSeq}), Tensor<std::int32_t>(Shape{n, kSeq})};
  std::copy_n(g.inputs.data() + r * n * kSeq, n * kSeq, b.inputs.data());
  std::copy_n(g.targets.data() + r * n * kSeq, n * kSeq, b.targets.data());
  return b;
}

struct Trained {
  std::vector<double> losses, evals;
  std::unique_ptr<models::Gpt<float>> model;
};

// Step s on this rank's rows of the global batch; after steps 1 and 3 an evaluation of a held-out
// batch, between steps (its reads of the weights follow no step's order: ZeRO-3's prefetch).
template <class Trainer, class Out>
void step(Trainer& trainer, const ProcessGrid& grid, int s, Out& out) {
  const int r = grid.coord(Axis::data), dp = grid.dp();
  out.losses.push_back(trainer.train_step(local_rows(global_batch(s), r, dp), 1e-2).loss);
  if (s % 2 == 1) out.evals.push_back(trainer.evaluate(local_rows(global_batch(1000 + s), r, dp)));
}

// zero: 0 none, 1 ZeRO-1, 2 ZeRO-2, 3 ZeRO-3 (ZeRO-1's strategy with DistributedOptimizerOptions::shard_gradients,
// and shard_values).
template <class AllReduce = parallel::Flat>
Trained train_tiny(const ProcessGrid& grid, const std::string& schedule, int zero, bool recompute, std::int64_t micro_batch,
                   const models::GptConfig& config) {
  Trained out;
  out.model = std::make_unique<models::Gpt<float>>(config, grid);
  layers::initialize_all(out.model->parameters(), 1234, &grid);
  parallel::with_strategy<AllReduce>(parallel::staged_model_schedule(schedule), zero > 0, [&]<class Strategy>() {
    train::GptTrainer<Strategy, optim::AdamW> trainer(*out.model, grid, {.eps = 1e-3, .weight_decay = 0.1},
                                                      {.bucket_bytes = 2048, .shard_gradients = zero >= 2, .shard_values = zero == 3, .clip = 1.0},
                                                      {.micro_batch = micro_batch, .global_batch = kGlobalBatch, .seed = 5});
    for (int s = 0; s < kSteps; ++s) step(trainer, grid, s, out);
  });
  return out;
}
template <class AllReduce = parallel::Flat>
Trained train_tiny(const ProcessGrid& grid, const std::string& schedule, int zero, bool recompute, std::int64_t micro_batch) {
  return train_tiny<AllReduce>(grid, schedule, zero, recompute, micro_batch, tiny(recompute));
}

// The same steps with the model cut into `chunks` chunks per pipeline rank (models::GptChunks),
// under the interleaved 1F1B schedule.
struct TrainedChunks {
  std::vector<double> losses, evals;
  std::unique_ptr<models::GptChunks<float>> model;
};
TrainedChunks train_tiny_interleaved(const ProcessGrid& grid, int chunks, int zero, bool recompute) {
  TrainedChunks out;
  out.model = std::make_unique<models::GptChunks<float>>(tiny(recompute), grid, chunks);
  layers::initialize_all(out.model->parameters(), 1234, &grid);
  const std::int64_t local = kGlobalBatch / grid.dp();  // one sequence per micro-batch: m = local, a multiple of pp
  parallel::with_strategy(parallel::pipeline::Interleaved1F1B{chunks}, zero > 0, [&]<class Strategy>() {
    train::Trainer<models::GptChunks<float>, train::ModelLoss, Strategy, optim::AdamW> trainer(
        *out.model, grid, {.eps = 1e-3, .weight_decay = 0.1}, {.bucket_bytes = 2048, .shard_gradients = zero >= 2, .shard_values = zero == 3, .clip = 1.0},
        {.micro_batches = static_cast<int>(local), .global_batch = kGlobalBatch, .seed = 5, .virtual_stages = chunks});
    for (int s = 0; s < kSteps; ++s) step(trainer, grid, s, out);
  });
  return out;
}

// Each step's loss, the evaluations between steps and the final weights of `run` against the
// sequential run's.
template <class Run>
void check_equals_reference(const Run& run, const Trained& reference, const ProcessGrid& grid) {
  for (int s = 0; s < kSteps; ++s) {
    CAPTURE(s, run.losses[s], reference.losses[s]);
    CHECK(std::abs(run.losses[s] - reference.losses[s]) <= kTolerance * std::abs(reference.losses[s]));
  }
  REQUIRE(run.evals.size() == reference.evals.size());
  for (std::size_t e = 0; e < run.evals.size(); ++e) {
    CAPTURE(e, run.evals[e], reference.evals[e]);
    CHECK(std::abs(run.evals[e] - reference.evals[e]) <= kTolerance * std::abs(reference.evals[e]));
  }
  test::worst_weight_error(*run.model, grid, *reference.model, kTolerance);
}

}  // namespace

TEST_CASE("gpt: every layout of this world equals the sequential run", "[gpt][layout]") {
  const auto world = test::world();
  const int n = world.size();
  const auto self_grid = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  Trained reference = train_tiny(self_grid, "1f1b", false, false, 1);
  REQUIRE(reference.losses.back() < reference.losses.front());  // it trains

  for (int tp : {1, 2, 4})
    for (int pp : {1, 2, 4}) {
      if (n % (tp * pp) != 0) continue;
      const int dp = n / (tp * pp);
      if (kGlobalBatch % dp != 0) continue;
      auto grid = ProcessGrid::create(world, {.tp = tp, .pp = pp});
      const std::vector<std::string> schedules = pp == 1 ? std::vector<std::string>{"1f1b"}
                                                         : std::vector<std::string>{"gpipe", "1f1b", "zb-h1"};
      for (const auto& schedule : schedules)
        for (int zero : {0, 1, 2, 3})
          for (bool recompute : {false, true}) {
            if (zero >= 2 && recompute) continue;  // ZeRO-2 with m = 24 / dp rounds per bucket and step
            // Gradient accumulation: 2 sequences per micro-batch where the batch allows it.
            const std::int64_t micro_batch = (kGlobalBatch / dp) % 2 == 0 && recompute ? 2 : 1;
            CAPTURE(dp, tp, pp, schedule, zero, recompute, micro_batch);
            Trained run = train_tiny(grid, schedule, zero, recompute, micro_batch);
            check_equals_reference(run, reference, grid);
          }
    }
}

TEST_CASE("gpt: a step reports the bytes it sent over the tensor and pipeline axes", "[gpt][layout]") {
  const auto world = test::world();
  const int n = world.size();
  const std::int64_t message = kSeq * tiny(false).dim * static_cast<std::int64_t>(sizeof(float));  // one sequence's (T, C)
  for (const auto [tp, pp] : {std::pair{1, 1}, std::pair{n, 1}, std::pair{1, n}}) {
    if (4 % n != 0) continue;  // the tiny model's 4 heads and 4 blocks split over 1, 2 or 4 ranks
    CAPTURE(tp, pp);
    const auto grid = ProcessGrid::create(world, {.tp = tp, .pp = pp});
    models::Gpt<float> model(tiny(false), grid);
    layers::initialize_all(model.parameters(), 1234, &grid);
    using Strategy = parallel::Parallel<parallel::TensorParallel, parallel::PipelineParallel<parallel::pipeline::OneFOneB>,
                                        parallel::DataParallel<>>;
    train::GptTrainer<Strategy, optim::AdamW> trainer(model, grid, {}, {.bucket_bytes = 2048},
                                                            {.micro_batch = 1, .global_batch = kGlobalBatch, .seed = 5});
    const auto r = trainer.train_step(local_rows(global_batch(0), grid.coord(Axis::data), grid.dp()), 1e-2);
    const std::int64_t m = kGlobalBatch / grid.dp();  // micro-batches of one sequence
    // The pipeline: each micro-batch's activation forward unless last, its gradient back unless first.
    const int stage = grid.coord(Axis::pipeline);
    CHECK(r.pipeline.sent_bytes == m * message * ((stage < pp - 1 ? 1 : 0) + (stage > 0 ? 1 : 0)));
    // The tensor axis: at least the blocks' four all-reduces of a (T, C) per micro-batch (the
    // embedding's and the head's come on top).
    if (tp == 1) CHECK(r.tensor_bytes == 0);
    else CHECK(r.tensor_bytes >= m * 4 * tiny(false).layers * parallel::wire_bytes::allreduce(message / 4, 4, tp));
  }
}

TEST_CASE("gpt: a hierarchical data-parallel all-reduce equals the sequential run", "[gpt][layout]") {
  const auto world = test::world();
  const int n = world.size();
  if (n < 4) return;  // dp 4 as 2 nodes of 2 (4 ranks), or with tp 2 (8 ranks)
  const auto self_grid = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  Trained reference = train_tiny(self_grid, "1f1b", false, false, 1);
  const int tp = n / 4;
  auto grid = ProcessGrid::create(world, {.tp = tp, .pp = 1, .ranks_per_node = 2});
  REQUIRE(grid.dp() == 4);
  for (int zero : {0, 1, 2, 3}) {
    CAPTURE(tp, zero);
    Trained run = train_tiny<parallel::Hierarchical>(grid, "1f1b", zero, false, 1);
    check_equals_reference(run, reference, grid);
  }
}

TEST_CASE("gpt: 2 chunks per pipeline rank under the interleaved schedule equal the sequential run", "[gpt][layout][interleaved]") {
  const auto world = test::world();
  const int n = world.size();
  if (n % 2 != 0) return;  // pp 2 (× tp 2 or dp where the world allows)
  const auto self_grid = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  Trained reference = train_tiny(self_grid, "1f1b", false, false, 1);
  for (int tp : {1, 2}) {
    if (n % (2 * tp) != 0 || kGlobalBatch % (n / (2 * tp)) != 0) continue;
    auto grid = ProcessGrid::create(world, {.tp = tp, .pp = 2});
    for (int zero : {0, 1, 2, 3})
      for (bool recompute : {false, true}) {
        CAPTURE(grid.dp(), tp, zero, recompute);
        TrainedChunks run = train_tiny_interleaved(grid, 2, zero, recompute);
        check_equals_reference(run, reference, grid);
      }
  }
}

TEST_CASE("gpt: uneven pipeline cuts (--decoder-first/last-pipeline-num-layers) equal the sequential run", "[gpt][layout]") {
  const auto world = test::world();
  const int n = world.size();
  const auto self_grid = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  Trained reference = train_tiny(self_grid, "1f1b", false, false, 1);
  struct Cut {
    int pp;
    std::int64_t first, last;
    std::vector<std::int64_t> blocks;  // per stage
  };
  for (const Cut& cut : {Cut{2, 3, 0, {3, 1}}, Cut{2, 0, 1, {3, 1}}, Cut{2, 1, 3, {1, 3}}, Cut{3, 0, 1, {2, 1, 1}},
                         Cut{3, 1, 2, {1, 1, 2}}}) {
    if (n % cut.pp != 0 || kGlobalBatch % (n / cut.pp) != 0) continue;
    auto grid = ProcessGrid::create(world, {.pp = cut.pp});
    for (const std::string schedule : {"1f1b", "zb-h1"})
      for (int zero : {0, 1, 2, 3}) {
        CAPTURE(cut.pp, cut.first, cut.last, grid.dp(), schedule, zero);
        Trained run = train_tiny(grid, schedule, zero, false, 1, tiny(false, cut.first, cut.last));
        const int stage = grid.coord(Axis::pipeline);
        CHECK(run.model->blocks_range().count == cut.blocks[static_cast<std::size_t>(stage)]);
        check_equals_reference(run, reference, grid);
      }
  }
}

TEST_CASE("gpt: the strategy type DataParallel<Zero3> trains as ZeRO-3 and equals the sequential run", "[gpt][layout]") {
  const auto world = test::world();
  if (kGlobalBatch % world.size() != 0) return;
  const auto self_grid = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  const Trained reference = train_tiny(self_grid, "1f1b", false, false, 1);
  const auto grid = ProcessGrid::create(world, {});
  Trained run;
  run.model = std::make_unique<models::Gpt<float>>(tiny(false), grid);
  layers::initialize_all(run.model->parameters(), 1234, &grid);
  {
    using Strategy = Parallel<TensorParallel, PipelineParallel<OneFOneB>, DataParallel<Zero3>>;
    train::GptTrainer<Strategy, optim::AdamW> trainer(*run.model, grid, {.eps = 1e-3, .weight_decay = 0.1},
                                                      {.bucket_bytes = 2048, .clip = 1.0},
                                                      {.micro_batch = 1, .global_batch = kGlobalBatch, .seed = 5});
    CHECK(trainer.optimizer().options().shard_values);
    CHECK(trainer.optimizer().flat().values().data() == nullptr);
    for (int s = 0; s < kSteps; ++s) step(trainer, grid, s, run);
  }
  check_equals_reference(run, reference, grid);
}

TEST_CASE("gpt: uneven pipeline cuts that leave a stage empty, or meet one stage or interleaving, are refused", "[gpt][layout]") {
  const auto world = test::world();
  const auto self_grid = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  CHECK(test::error_of([&] { models::Gpt<float>(tiny(false, 2, 0), self_grid); }).find("need --pp 2 or more") != std::string::npos);
  if (world.size() != 2) return;
  const auto grid = ProcessGrid::create(world, {.pp = 2});
  CHECK(test::error_of([&] { models::Gpt<float>(tiny(false, 4, 0), grid); })
            .find("--decoder-first-pipeline-num-layers 4 and --decoder-last-pipeline-num-layers 0 leave 0 of the model's 4 layers "
                  "for the 1 other stages of --pp 2 (one each at least)") != std::string::npos);
  CHECK(test::error_of([&] { models::Gpt<float>(tiny(false, 1, 2), grid); }).find("leave 1 of the model's 4 layers") != std::string::npos);
  CHECK(test::error_of([&] { models::GptChunks<float>(tiny(false, 1, 0), grid, 2); }).find("evenly") != std::string::npos);
}

TEST_CASE("gpt: chunked models are refused where they cannot run", "[gpt][layout][interleaved]") {
  const auto world = test::world();
  const auto self_grid = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  CHECK(test::error_of([&] { models::GptChunks<float>(tiny(false), self_grid, 2); }).find("needs pipeline parallelism (--pp ≥ 2)") != std::string::npos);
  if (world.size() != 2) return;
  const auto grid = ProcessGrid::create(world, {.pp = 2});
  CHECK(test::error_of([&] { models::GptChunks<float>(tiny(false), grid, 3); }).find("fewer than the 6 virtual pipeline stages") != std::string::npos);
  models::GptChunks<float> model(tiny(false), grid, 2);
  using Strategy = parallel::Parallel<parallel::TensorParallel, parallel::PipelineParallel<parallel::pipeline::Interleaved1F1B>, parallel::DataParallel<>>;
  CHECK(test::error_of([&] {
               train::Trainer<models::GptChunks<float>, train::ModelLoss, Strategy, optim::AdamW> trainer(
                   model, grid, {}, {}, {.micro_batches = 4, .global_batch = 4, .virtual_stages = 1});
             }).find("the model has 2 chunks per pipeline rank") != std::string::npos);
}
