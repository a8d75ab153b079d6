// models::Bert (models/bert.hpp) and its masking (data/masked_lm.hpp):
//   - the 15 % / 80-10-10 rule's fractions within binomial bounds, and the draw a pure function of
//     (seed, sample, position): this launch's data ranks mask their rows as one process does;
//   - the masked loss and the masked-token hits of a tiny model against float64 sums over its
//     logits, where only the masked positions count, divided by their number;
//   - both backward halves against central finite differences in float64;
//   - every (dp, tp, pp) layout of this world (tp 2 and pp 2 on 2 ranks; their products on 4)
//     training the sequential run's losses and weights (float32 SGD, relative error ≤ 1e-5, as
//     tests/vit: only the order of float sums differs), and the same validation loss and hits.
#include "test.hpp"
#include "layouts.hpp"               // worst_weight_error
#include "../transformer/check.hpp"  // numeric_gradient

#include <dpml/data/masked_lm.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/bert.hpp>
#include <dpml/optim/sgd.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/trainer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

using namespace dpml;
using dpml::test::numeric_gradient;

namespace {
// |count − p·n| within 5 standard deviations of a binomial(n, p).
bool binomial(std::int64_t count, std::int64_t n, double p) {
  const double mean = p * static_cast<double>(n), sd = std::sqrt(static_cast<double>(n) * p * (1 - p));
  CAPTURE(count, n, p, mean, sd);
  return std::abs(static_cast<double>(count) - mean) <= 5 * sd;
}
}  // namespace

TEST_CASE("masking: 15 % of positions chosen, then 80 % [MASK], 10 % random, 10 % kept", "[bert]") {
  const data::MaskRule rule;
  std::int64_t n = 0, chosen = 0, masked = 0, random = 0, kept = 0;
  for (std::uint64_t s = 0; s < 1000; ++s)
    for (std::uint64_t t = 0; t < 256; ++t, ++n) {
      const auto d = data::draw_mask(rule, 7, s, t);
      chosen += d.action != data::MaskAction::none;
      masked += d.action == data::MaskAction::mask;
      kept += d.action == data::MaskAction::keep;
      if (d.action == data::MaskAction::random) {
        ++random;
        REQUIRE(d.random_token >= 0);
        REQUIRE(d.random_token < 256);  // a byte, never [MASK]
      }
      const auto again = data::draw_mask(rule, 7, s, t);  // a pure function
      REQUIRE((again.action == d.action && again.random_token == d.random_token));
    }
  CHECK(binomial(chosen, n, 0.15));
  CHECK(binomial(masked, chosen, 0.8));
  CHECK(binomial(random, chosen, 0.1));
  CHECK(binomial(kept, chosen, 0.1));
  std::int64_t differ = 0;  // another seed draws another mask
  for (std::uint64_t t = 0; t < 256; ++t)
    differ += data::draw_mask(rule, 8, 0, t).action != data::draw_mask(rule, 7, 0, t).action;
  CHECK(differ > 0);

  std::vector<std::int32_t> tokens{1, 2, 3, 4, 5, 6, 7, 8}, in(8), out(8);
  const std::int64_t count = data::mask_window(rule, 7, 3, tokens.data(), in.data(), out.data(), 8);
  std::int64_t targets = 0;
  for (int t = 0; t < 8; ++t) {
    const auto d = data::draw_mask(rule, 7, 3, static_cast<std::uint64_t>(t));
    CHECK(out[t] == (d.action == data::MaskAction::none ? -1 : tokens[t]));
    CHECK(in[t] == (d.action == data::MaskAction::mask ? data::kMaskToken : d.action == data::MaskAction::random ? d.random_token : tokens[t]));
    targets += out[t] >= 0;
  }
  CHECK(count == targets);
}

TEST_CASE("masking: every data rank masks its rows as one process does, every epoch anew", "[bert]") {
  const auto world = test::world();
  std::vector<std::uint16_t> text(3000);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<std::uint16_t>((i * 37 + i / 7) % 256);
  const data::WindowOptions wo{.seq_len = 16, .global_batch = 8, .seed = 3};
  data::TokenWindows all(text, wo, 0, 1), mine(text, wo, world.rank(), world.size());
  const data::MaskedLmWindows one(all, {}, 11), ours(mine, {}, 11);
  const std::int64_t first = 8 * world.rank() / world.size();
  std::vector<std::int32_t> epoch0;
  for (std::int64_t epoch : {0, 1}) {
    all.set_epoch(epoch), mine.set_epoch(epoch);
    for (std::int64_t b = 0; b < 3; ++b) {
      CAPTURE(epoch, b);
      const auto g = one.batch(b), l = ours.batch(b);
      CHECK(l.global_masked == g.global_masked);
      CHECK(l.global_rows == 8);
      CHECK(std::count_if(g.targets.begin(), g.targets.end(), [](std::int32_t t) { return t >= 0; }) == g.global_masked);
      CHECK(std::equal(l.inputs.begin(), l.inputs.end(), g.inputs.data() + first * 16));
      CHECK(std::equal(l.targets.begin(), l.targets.end(), g.targets.data() + first * 16));
    }
    // window 0's targets this epoch: another epoch draws another mask for the same window
    std::vector<std::int32_t> w0(16), in(16), tok(16, 1);
    data::mask_window({}, 11, one.sample_of(0), tok.data(), in.data(), w0.data(), 16);
    if (epoch == 0) epoch0 = w0;
    else CHECK(w0 != epoch0);
  }
}

namespace {
const models::BertConfig kTiny{.vocab = 13, .max_seq = 6, .layers = 1, .heads = 2, .dim = 8};

// Tokens (2, 6) and their targets: −1 but at positions 1, 4, 6, 11 (flat).
struct TinyBatch {
  Tensor<std::int32_t> tokens{Shape{2, 6}}, targets{Shape{2, 6}};
  std::int64_t masked = 4;
  TinyBatch() {
    for (std::int64_t i = 0; i < 12; ++i) {
      tokens[i] = static_cast<std::int32_t>((i * 5 + 3) % 13);
      targets[i] = -1;
    }
    for (std::int64_t i : {1, 4, 6, 11}) targets[i] = static_cast<std::int32_t>((i * 3 + 1) % 12);
  }
};
}  // namespace

TEST_CASE("Bert: the masked loss and hits are float64 sums over the masked positions only", "[bert]") {
  const auto grid = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  models::Bert<double> bert(kTiny, grid);
  layers::initialize_all(bert.parameters(), 5, &grid);
  TinyBatch b;
  layers::Context<> ctx;
  ctx.mode = layers::Mode::eval;
  ctx.global_batch = b.masked;
  auto eval = [&] { return bert.forward(ctx, b.tokens.cview(), {}, b.targets.cview()); };
  eval();
  (void)bert.take_loss(), (void)bert.take_hits();
  {  // one masked target made the model's top prediction, so that a hit is counted
    const auto z = bert.head_logits(ctx);
    b.targets[4] = static_cast<std::int32_t>(std::max_element(z.data() + 4 * 13, z.data() + 5 * 13) - (z.data() + 4 * 13));
  }
  eval();
  const double loss = bert.take_loss(), hits = bert.take_hits();
  const auto z = bert.head_logits(ctx);  // (12, 13)
  REQUIRE(z.shape() == (Shape{12, 13}));
  double want = 0, want_hits = 0;
  for (std::int64_t n = 0; n < 12; ++n) {
    const std::int32_t t = b.targets[n];
    if (t < 0) continue;
    const double* row = z.data() + n * 13;
    const double top = *std::max_element(row, row + 13);
    double sum = 0;
    for (int j = 0; j < 13; ++j) sum += std::exp(row[j] - top);
    want += (top + std::log(sum) - row[t]) / static_cast<double>(b.masked);
    want_hits += row[t] == top;
  }
  CHECK(std::abs(loss - want) <= 1e-12 * want);
  CHECK(hits == want_hits);
  CHECK(hits >= 1);
  std::fill(b.targets.begin(), b.targets.end(), -1);  // nothing masked: nothing counts
  eval();
  CHECK(bert.take_loss() == 0.0);
  CHECK(bert.take_hits() == 0.0);
}

TEST_CASE("Bert: both backward halves match finite differences of the masked loss", "[bert]") {
  const auto grid = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  models::Bert<double> bert(kTiny, grid);
  auto params = bert.parameters();
  CHECK(params.front()->name() == "wte.weight");
  CHECK(params.back()->name() == "ln_f.bias");
  layers::initialize_all(params, 9, &grid);
  const TinyBatch b;
  layers::Context<> ctx;
  ctx.global_batch = b.masked;
  bert.forward(ctx, b.tokens.cview(), {}, b.targets.cview());
  bert.backward_input(ctx, {});
  bert.backward_weight(ctx);
  (void)bert.take_loss();
  std::vector<std::vector<double>> grads;
  for (auto* p : params) grads.emplace_back(p->grad().data(), p->grad().data() + p->numel());
  auto loss = [&] {
    ctx.mode = layers::Mode::eval;
    bert.forward(ctx, b.tokens.cview(), {}, b.targets.cview());
    return bert.take_loss();
  };
  for (std::size_t i = 0; i < params.size(); ++i) {
    CAPTURE(params[i]->name());
    CHECK(test::rel_error(grads[i], numeric_gradient(loss, params[i]->value().data(), params[i]->numel())) < 1e-6);
  }
}

namespace {
constexpr std::int64_t kGlobalBatch = 8, kSeq = 8;
constexpr int kSteps = 3;
const models::BertConfig kConfig{.vocab = 21, .max_seq = kSeq, .layers = 2, .heads = 4, .dim = 16};  // 21: padded for tp 2
const data::MaskRule kRule{.mask_token = 20, .random_tokens = 20};

struct Run {
  std::vector<double> losses;
  double validation = 0, hits = 0;
  std::unique_ptr<models::Bert<float>> model;
};

// kSteps of SGD (not AdamW: see tests/vit) on masked windows of a patterned text, two
// micro-batches per rank, then the masked loss and hits of a further batch.
Run train_bert(const ProcessGrid& grid, const std::string& schedule) {
  std::vector<std::uint16_t> text(600);
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<std::uint16_t>((i * 7 + i / 5) % 20);
  data::TokenWindows windows(text, {.seq_len = kSeq, .global_batch = kGlobalBatch, .seed = 1}, grid.coord(Axis::data), grid.dp());
  const data::MaskedLmWindows masked(windows, kRule, 9);
  Run run;
  run.model = std::make_unique<models::Bert<float>>(kConfig, grid);
  layers::initialize_all(run.model->parameters(), 42, &grid);
  parallel::with_strategy(parallel::staged_model_schedule(schedule), false, [&]<class Strategy>() {
    train::Trainer<models::Bert<float>, train::ModelLoss, Strategy, optim::Sgd> trainer(
        *run.model, grid, {.momentum = 0.9, .weight_decay = 0.01}, {.clip = 1.0}, {.micro_batches = 2, .seed = 5});
    for (int s = 0; s < kSteps; ++s) run.losses.push_back(trainer.train_step(masked.batch(s), 0.05).loss);
    run.validation = trainer.evaluate(masked.batch(kSteps));
    run.hits = trainer.sum_over_last_stage(run.model->take_hits());
  });
  return run;
}
}  // namespace

TEST_CASE("Bert under every (dp, tp, pp) layout of this world equals one rank", "[bert][layouts]") {
  const auto world = test::world();
  const int n = world.size();
  Run want = train_bert(ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {}), "1f1b");
  REQUIRE(want.losses.back() < want.losses.front());  // it trains
  // A mean over the masked tokens (the batch's loss_elements), not over all: an untrained model's
  // is about ln V (over every token it would be about 0.15 · ln V).
  CHECK(want.losses.front() > 0.8 * std::log(static_cast<double>(kConfig.vocab)));
  for (int tp : {1, 2})
    for (int pp : {1, 2}) {
      if (n % (tp * pp) != 0 || kGlobalBatch % (n / (tp * pp) * 2) != 0) continue;
      const auto grid = ProcessGrid::create(world, {.tp = tp, .pp = pp});
      for (const std::string schedule : {"1f1b", "zb-h1"}) {
        if (pp == 1 && schedule != "1f1b") continue;
        CAPTURE(grid.dp(), tp, pp, schedule);
        Run got = train_bert(grid, schedule);
        for (int s = 0; s < kSteps; ++s) {
          CAPTURE(s, got.losses[s], want.losses[s]);
          CHECK(std::abs(got.losses[s] - want.losses[s]) <= 1e-5 * std::abs(want.losses[s]));
        }
        CHECK(std::abs(got.validation - want.validation) <= 1e-5 * std::abs(want.validation));
        CHECK(got.hits == want.hits);
        test::worst_weight_error(*got.model, grid, *want.model, 1e-5);
      }
    }
}
