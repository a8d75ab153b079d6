// The LSTM language model (models/lstm_lm.hpp: Embedding → Lstm → Stack<Lstm> → Linear head,
// cross-entropy over the (B·T) next tokens) trained by train::Trainer with no code of its own under
// data parallelism (dp 2) and pipeline parallelism (pp 2, the LSTM layers on either stage; 1F1B,
// and ZB-H1 whose stage 1 runs backward_weight after other micro-batches' backward_input), equal to
// the sequential run: the loss of every step, the evaluation loss after, and every weight.
//
// Tolerance: float32 sums in other orders (micro-batch accumulation, data-parallel reduction):
// relative error ≤ 1e-5 for each loss and each parameter tensor (L2 over the tensor).
#include "test.hpp"

#include <dpml/core/philox.hpp>
#include <dpml/data/token_shards.hpp>
#include <dpml/layers/cross_entropy.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/lstm_lm.hpp>
#include <dpml/optim/sgd.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/trainer.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

using namespace dpml;

namespace {
constexpr double kTolerance = 1e-5;
constexpr int kSteps = 3, kMicroBatches = 3;
constexpr std::int64_t kGlobalBatch = 12, kSeq = 7, kVocab = 24;
const models::LstmLmConfig kConfig{.vocab = kVocab, .embedding = 8, .hidden = 12, .layers = 2};
using Model = models::LstmLm<float>::Network;
using Loss = layers::SoftmaxCrossEntropy<float>;

// Rows [lo, hi) of step s's global batch: random tokens; each target is the sum of the token and
// the one before it (mod V), something an LSTM can learn.
data::TokenBatch batch_rows(int step, std::int64_t lo, std::int64_t hi) {
  data::TokenBatch b{Tensor<std::int32_t>(Shape{hi - lo, kSeq}), Tensor<std::int32_t>(Shape{hi - lo, kSeq})};
  const PhiloxStream rng(5, static_cast<std::uint64_t>(step));
  for (std::int64_t n = lo; n < hi; ++n)
    for (std::int64_t t = 0; t < kSeq; ++t) {
      const auto at = [&](std::int64_t i) {
        return static_cast<std::int32_t>(rng.uniform(static_cast<std::uint64_t>(n * kSeq + i)) * kVocab) % kVocab;
      };
      b.inputs[(n - lo) * kSeq + t] = at(t);
      b.targets[(n - lo) * kSeq + t] = (at(t) + (t > 0 ? at(t - 1) : 0)) % kVocab;
    }
  return b;
}
data::TokenBatch local_batch(int step, const ProcessGrid& grid) {
  const int r = grid.coord(Axis::data), k = grid.dp();
  return batch_rows(step, kGlobalBatch * r / k, kGlobalBatch * (r + 1) / k);
}

struct Run {
  std::vector<double> losses;
  double eval_loss = 0;
  std::map<std::string, std::vector<float>> trained;  // this rank's parameters by name
};

Run run_steps(const ProcessGrid& grid, const std::string& schedule) {
  Model model = models::LstmLm<float>::make(kConfig);
  layers::initialize_all(model.parameters(), 7, &grid);
  Run out;
  parallel::with_strategy(schedule, false, [&]<class Strategy>() {
    train::Trainer<Model, Loss, Strategy, optim::Sgd> trainer(model, grid, {.momentum = 0.9}, {.clip = 1.0},
                                                             {.micro_batches = kMicroBatches, .global_batch = kGlobalBatch});
    for (int s = 0; s < kSteps; ++s) {
      const auto r = trainer.train_step(local_batch(s, grid), 0.5);
      REQUIRE(!r.skipped);
      out.losses.push_back(r.loss);
    }
    out.eval_loss = trainer.evaluate(local_batch(kSteps, grid));
    for (auto* p : trainer.parameters()) out.trained[p->name()] = std::vector<float>(p->value().begin(), p->value().end());
  });
  return out;
}
}  // namespace

TEST_CASE("LSTM language model: dp 2 and pp 2 (1F1B, ZB-H1) equal the sequential run", "[train][lstm]") {
  const auto world = test::world();
  REQUIRE(world.size() == 2);
  const auto self = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  const Run ref = run_steps(self, "1f1b");
  CHECK(ref.losses.back() < ref.losses.front());  // it learns
  CHECK(ref.trained.size() == 9);  // wte; two LSTMs of three; the head weight and bias

  struct Layout {
    int pp;
    std::string schedule;
  };
  for (const Layout l : {Layout{1, "1f1b"}, Layout{2, "1f1b"}, Layout{2, "zb-h1"}}) {
    const auto grid = ProcessGrid::create(world, {.pp = l.pp});
    CAPTURE(grid.dp(), l.pp, l.schedule);
    const Run run = run_steps(grid, l.schedule);
    for (int s = 0; s < kSteps; ++s) {
      CAPTURE(s, run.losses[s], ref.losses[s]);
      CHECK(std::abs(run.losses[s] - ref.losses[s]) <= kTolerance * std::abs(ref.losses[s]));
    }
    CHECK(std::abs(run.eval_loss - ref.eval_loss) <= kTolerance * std::abs(ref.eval_loss));
    for (const auto& [name, values] : run.trained) {
      CAPTURE(name);
      REQUIRE(ref.trained.count(name) == 1);
      CHECK(test::rel_error(values, ref.trained.at(name)) <= kTolerance);
    }
    if (l.pp == 2) {  // the two LSTM layers train on different stages
      const bool first = grid.coord(Axis::pipeline) == 0;
      CHECK(run.trained.count("1.lstm.weight_ih") == (first ? 1u : 0u));
      CHECK(run.trained.count("2.layers.0.lstm.weight_hh") == (first ? 0u : 1u));
    } else {
      CHECK(run.trained.size() == ref.trained.size());
    }
  }
}
