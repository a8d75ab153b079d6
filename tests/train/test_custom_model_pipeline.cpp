// A user's own model under pipeline parallelism, with no adapter code: a Sequential of dpml layers
// and a layer written here (Swish with a learnable slope), tensor parallel inside (a column- and
// a row-parallel linear), trained by train::Trainer under every (dp, tp, pp = 2) layout this
// world allows, every schedule, with and without ZeRO-1, cut where the library balances the
// parameters and where the user says, equals its sequential run: the loss of every step, the
// evaluation loss after, and every weight after kSteps steps. A Stack of blocks is cut the same
// way. The sequential run itself equals a loop written here by hand (forward, loss, backward,
// plain SGD), and a checkpoint saved under the largest layout loads into the sequential model
// with the sequential run's weights (names are global in every layout).
//
// Tolerance: float32 arithmetic summed in different orders (tensor-parallel partial sums,
// micro-batch accumulation, bucketed reductions): relative error ≤ 1e-5 for each loss and each
// parameter tensor (L2 over the tensor); the hand loop ≤ 1e-6.
#include "test.hpp"

#include <dpml/core/philox.hpp>
#include <dpml/data/loader.hpp>
#include <dpml/layers/activation.hpp>
#include <dpml/layers/cross_entropy.hpp>
#include <dpml/layers/flatten.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/layers/linear.hpp>
#include <dpml/layers/parallel_linear.hpp>
#include <dpml/layers/sequential.hpp>
#include <dpml/layers/stack.hpp>
#include <dpml/optim/sgd.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/checkpointing.hpp>
#include <dpml/train/trainer.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>

using namespace dpml;

namespace {
constexpr double kTolerance = 1e-5;
constexpr int kSteps = 4;
constexpr std::int64_t kGlobalBatch = 24, kFeatures = 20, kClasses = 5;
constexpr int kMicroBatches = 5;  // uneven micro-batches: 12 rows → 2 2 2 3 3

// The user's layer: y = x · σ(β x), β (C) learnable, one per feature.
class Swish {
 public:
  using value_type = float;
  using space = HostSpace;
  using Input = TensorView<const float>;   // (N, C)
  using Output = TensorView<const float>;  // (N, C)

  explicit Swish(std::int64_t features) : beta_("swish.beta", Shape{features}, Init::constant(1.0)) {}

  Output forward(layers::Context<HostSpace>& ctx, Input x) {
    Saved& s = saved_.slot(ctx);
    s.x = x;
    auto y = layers::ensure(s.y, x.shape());
    const std::int64_t C = x.size(1);
    for (std::int64_t i = 0; i < x.numel(); ++i) y.data()[i] = x.data()[i] * sigmoid(beta_.value()[i % C] * x.data()[i]);
    return y;
  }
  Input backward_input(layers::Context<HostSpace>& ctx, Output dy) {
    Saved& s = saved_.slot(ctx);
    auto dx = layers::ensure(s.dx, dy.shape());
    const std::int64_t C = dy.size(1);
    for (std::int64_t i = 0; i < dy.numel(); ++i) {
      const float b = beta_.value()[i % C], x = s.x.data()[i], g = sigmoid(b * x);
      dx.data()[i] = dy.data()[i] * (g + b * x * g * (1 - g));
    }
    return dx;
  }
  void backward_weight(layers::Context<HostSpace>& ctx, Output dy) {
    const Saved& s = saved_.slot(ctx);
    const std::int64_t C = dy.size(1);
    for (std::int64_t i = 0; i < dy.numel(); ++i) {
      const float b = beta_.value()[i % C], x = s.x.data()[i], g = sigmoid(b * x);
      beta_.grad()[i % C] += dy.data()[i] * x * x * g * (1 - g);
    }
  }
  std::vector<Param<float>*> parameters() { return {&beta_}; }

 private:
  struct Saved {
    TensorView<const float> x;
    Tensor<float> y, dx;
  };
  static float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }
  Param<float> beta_;
  layers::Slots<Saved> saved_;
};

using Net = layers::Sequential<layers::Flatten<float>, layers::ColumnParallelLinear<float>, layers::ReLU<float>,
                               layers::RowParallelLinear<float>, Swish, layers::Linear<float>>;
using Block = layers::Sequential<layers::Linear<float>, layers::ReLU<float>>;
using Blocks = layers::Stack<Block>;
using Loss = layers::SoftmaxCrossEntropy<float>;

Net make_net(const parallel::TensorRegion<comm::Mpi>& region) {
  return Net(layers::Flatten<float>(), layers::ColumnParallelLinear<float>(kFeatures, 24, {.name = "fc1"}, region),
             layers::ReLU<float>(), layers::RowParallelLinear<float>(24, 16, {.name = "fc2"}, region), Swish(16),
             layers::Linear<float>(16, kClasses, {.name = "out"}));
}
Blocks make_blocks() {
  std::vector<Block> blocks;
  for (int i = 0; i < 4; ++i)
    blocks.emplace_back(layers::Linear<float>(kFeatures, kFeatures, {.name = "fc"}), layers::ReLU<float>());
  return Blocks(std::move(blocks), "block");
}

// Rows [lo, hi) of step s's global batch: random images (N, 1, 4, 5); the label is the column
// (of 5) with the largest sum, a function the model can learn.
data::Batch batch_rows(int step, std::int64_t lo, std::int64_t hi) {
  data::Batch b;
  b.global_size = kGlobalBatch;
  b.images = Tensor<float>(Shape{hi - lo, 1, 4, 5});
  b.labels = Tensor<std::int32_t>(Shape{hi - lo});
  const PhiloxStream rng(11, static_cast<std::uint64_t>(step));
  for (std::int64_t n = lo; n < hi; ++n) {
    double column[kClasses] = {};
    for (std::int64_t i = 0; i < kFeatures; ++i) {
      const float v = rng.normal(static_cast<std::uint64_t>(n * kFeatures + i));
      b.images[(n - lo) * kFeatures + i] = v;
      column[i % kClasses] += v;
    }
    b.labels[n - lo] = static_cast<std::int32_t>(std::max_element(column, column + kClasses) - column);
  }
  return b;
}
data::Batch local_batch(int step, const ProcessGrid& grid) {
  const int r = grid.coord(Axis::data), k = grid.dp();
  return batch_rows(step, kGlobalBatch * r / k, kGlobalBatch * (r + 1) / k);
}

const optim::SgdOptions kSgd{.momentum = 0.9, .weight_decay = 1e-3};
constexpr double kLr = 0.1;

struct Run {
  std::vector<double> losses;
  double eval_loss = 0;
};

// kSteps steps of `model` on `grid` (initialised from seed 7 by name), then the evaluation loss
// on step kSteps's batch. `body(trainer)` runs after (e.g. a checkpoint).
// `virtual_stages`: the model chunks per rank of the interleaved schedule.
template <class Model, class Body = void (*)(void*)>
Run run_steps(Model& model, const ProcessGrid& grid, const std::string& schedule, bool zero, int micro_batches,
          parallel::pipeline::Partition partition, Body&& after = nullptr, int virtual_stages = 1) {
  layers::initialize_all(model.parameters(), 7, &grid);
  Run out;
  parallel::with_strategy(schedule, zero, [&]<class Strategy>() {
    train::Trainer<Model, Loss, Strategy, optim::Sgd> trainer(
        model, grid, kSgd, {.bucket_bytes = 256, .clip = 2.0},
        {.micro_batches = micro_batches, .partition = partition, .virtual_stages = virtual_stages});
    for (int s = 0; s < kSteps; ++s) {
      const auto r = trainer.train_step(local_batch(s, grid), kLr);
      REQUIRE(!r.skipped);
      out.losses.push_back(r.loss);
    }
    out.eval_loss = trainer.evaluate(local_batch(kSteps, grid));
    if constexpr (!std::is_same_v<std::decay_t<Body>, void (*)(void*)>) after(trainer);
  });
  return out;
}

std::map<std::string, Param<float>*> by_name(std::vector<Param<float>*> params) {
  std::map<std::string, Param<float>*> out;
  for (auto* p : params) out[p->name()] = p;
  return out;
}

// This rank's trained parameters against the sequential model, block by block (global index).
void compare_weights(const std::vector<Param<float>*>& trained, const ProcessGrid& grid, std::vector<Param<float>*> reference) {
  const auto ref = by_name(std::move(reference));
  for (const auto* p : trained) {
    const auto it = ref.find(p->name());
    REQUIRE(it != ref.end());
    const auto g = layers::global_slice(*p, &grid);
    TensorView<const float> whole = it->second->value();
    if (g.dim >= 0) whole = whole.slice(g.dim, g.offset, g.offset + p->shape()[g.dim]);
    std::vector<float> a(p->value().begin(), p->value().end()), b;
    for (std::int64_t i = 0; i < whole.numel(); ++i) {  // `whole` is a strided block: walk it by index
      std::int64_t idx[kMaxRank] = {}, rest = i;
      for (int d = whole.rank() - 1; d >= 0; --d) idx[d] = rest % whole.size(d), rest /= whole.size(d);
      std::int64_t off = 0;
      for (int d = 0; d < whole.rank(); ++d) off += idx[d] * whole.strides()[d];
      b.push_back(whole.data()[off]);
    }
    const double e = test::rel_error(a, b);
    CAPTURE(p->name(), e);
    CHECK(e <= kTolerance);
  }
}

void compare_losses(const Run& run, const Run& reference) {
  for (int s = 0; s < kSteps; ++s) {
    CAPTURE(s, run.losses[s], reference.losses[s]);
    CHECK(std::abs(run.losses[s] - reference.losses[s]) <= kTolerance * std::abs(reference.losses[s]));
  }
  CAPTURE(run.eval_loss, reference.eval_loss);
  CHECK(std::abs(run.eval_loss - reference.eval_loss) <= kTolerance * std::abs(reference.eval_loss));
}

struct TpPp {
  int tp, pp;
};
// The layouts of this world with pp = 2 (or, on 1 rank, pp = 1).
std::vector<TpPp> layouts(int n) {
  std::vector<TpPp> out;
  for (int tp : {1, 2})
    for (int pp : {1, 2})
      if (n % (tp * pp) == 0 && (pp == 2 || n == 1) && kGlobalBatch % (n / (tp * pp)) == 0) out.push_back({tp, pp});
  return out;
}

std::string temp_dir(const comm::Mpi& world) {
  std::int64_t id = world.rank() == 0 ? ::getpid() : 0;
  world.broadcast(&id, 1, 0);
  return (std::filesystem::temp_directory_path() / ("dpml-custom-pipeline-" + std::to_string(id))).string();
}
}  // namespace

TEST_CASE("partition: balanced by parameters, or at the user's split points", "[train][pipeline]") {
  using parallel::pipeline::Partition;
  using parallel::pipeline::partition;
  const std::vector<std::int64_t> w{0, 504, 0, 400, 16, 85};  // the Net above, tp = 1
  const std::vector<bool> cut{false, true, true, true, true, true};
  auto firsts = [](const std::vector<parallel::pipeline::StageBlocks>& stages) {
    std::vector<std::int64_t> f;
    for (const auto& s : stages) f.push_back(s.first);
    return f;
  };
  CHECK(firsts(partition(w, cut, 1)) == std::vector<std::int64_t>{0});
  CHECK(firsts(partition(w, cut, 2)) == std::vector<std::int64_t>{0, 2});  // 504 | 501: ReLU goes with the lighter side
  CHECK(firsts(partition(w, cut, 3)) == std::vector<std::int64_t>{0, 1, 2});  // 0 | 504 | 501 (504 | 400 | 101 has 2 layers beside 504)
  CHECK(firsts(partition(w, cut, 6)) == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5});
  CHECK(firsts(partition(w, cut, 2, Partition::at({4}))) == std::vector<std::int64_t>{0, 4});
  CHECK(partition(w, cut, 2, Partition::at({4}))[1].count == 2);
  CHECK(firsts(partition({1, 1, 1, 1, 1, 1, 1, 1}, std::vector<bool>(8, true), 3)) == std::vector<std::int64_t>{0, 2, 5});  // earliest cuts
  CHECK(test::error_of([&] { partition(w, cut, 7); }).find("6 layers cannot make 7 stages") != std::string::npos);
  CHECK(test::error_of([&] { partition(w, {false, true, false, false, false, false}, 2, Partition::at({3})); }).find("no stage may begin at layer 3") != std::string::npos);
  CHECK(test::error_of([&] { partition(w, cut, 3, Partition::at({4})); }).find("1 split points for 3 stages") != std::string::npos);
  CHECK(test::error_of([&] { partition(w, cut, 2, Partition::at({6})); }).find("stage 0 would hold layers [0, 6) of 6, none left") != std::string::npos);
}

TEST_CASE("custom model: the trainer's sequential run equals a hand-written loop", "[train][pipeline]") {
  const auto self = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  Net reference = make_net({});
  const Run run = run_steps(reference, self, "1f1b", false, 1, {});

  Net net = make_net({});
  layers::initialize_all(net.parameters(), 7, &self);
  Loss loss;
  layers::Context<HostSpace> ctx;
  ctx.global_batch = kGlobalBatch;
  std::map<std::string, std::vector<float>> velocity;
  for (int s = 0; s < kSteps; ++s) {
    for (auto* p : net.parameters()) layers::zero_grad(*p);
    const auto b = batch_rows(s, 0, kGlobalBatch);
    auto logits = net.forward(ctx, b.images.cview());
    loss.forward(ctx, logits, b.labels.cview());
    const double l = loss.take_loss();
    auto dlogits = loss.backward(ctx);
    net.backward_input(ctx, dlogits);
    net.backward_weight(ctx, dlogits);
    double norm = 0;
    for (auto* p : net.parameters())
      for (float g : p->grad()) norm += double(g) * g;
    const double coef = std::min(1.0, 2.0 / (std::sqrt(norm) + 1e-6));
    for (auto* p : net.parameters()) {  // torch.optim.SGD: g += wd·w; v = μv + g; w −= lr·v
      auto& v = velocity[p->name()];
      v.resize(static_cast<std::size_t>(p->numel()), 0.0f);
      for (std::int64_t i = 0; i < p->numel(); ++i) {
        const float g = static_cast<float>(p->grad()[i] * coef) + static_cast<float>(kSgd.weight_decay) * p->value()[i];
        v[static_cast<std::size_t>(i)] = static_cast<float>(kSgd.momentum) * v[static_cast<std::size_t>(i)] + g;
        p->value()[i] -= static_cast<float>(kLr) * v[static_cast<std::size_t>(i)];
      }
    }
    CAPTURE(s, l, run.losses[s]);
    CHECK(std::abs(l - run.losses[s]) <= 1e-6 * std::abs(l));
  }
  const auto ref = by_name(reference.parameters());
  Net initial = make_net({});
  layers::initialize_all(initial.parameters(), 7, &self);
  for (auto* p : net.parameters()) {
    const double e = test::rel_error(p->value(), ref.at(p->name())->value());
    CAPTURE(p->name(), e);
    CHECK(e <= 1e-6);
    CHECK(test::rel_error(p->value(), by_name(initial.parameters()).at(p->name())->value()) > 1e-3);  // the steps moved it
  }
}

TEST_CASE("custom model: every pipeline layout of this world equals the sequential run", "[train][pipeline]") {
  using parallel::pipeline::Partition;
  const auto world = test::world();
  const auto self = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  Net reference = make_net({});
  const Run ref = run_steps(reference, self, "1f1b", false, kMicroBatches, {});

  for (const TpPp l : layouts(world.size())) {
    const auto grid = ProcessGrid::create(world, {.tp = l.tp, .pp = l.pp});
    const parallel::TensorRegion<comm::Mpi> region(&grid.comm(Axis::tensor));
    for (const std::string schedule : {"gpipe", "1f1b", "zb-h1"})
      for (bool zero : {false, true})
        for (const auto& split : l.pp > 1 ? std::vector{Partition::balanced(), Partition::at({4})} : std::vector{Partition::balanced()}) {
          CAPTURE(grid.dp(), l.tp, l.pp, schedule, zero, split.starts);
          Net net = make_net(region);
          std::vector<Param<float>*> trained;
          const Run run = run_steps(net, grid, schedule, zero, kMicroBatches, split,
                                [&](auto& trainer) { trained = trainer.parameters(); });
          compare_losses(run, ref);
          compare_weights(trained, grid, reference.parameters());
          if (l.pp > 1) CHECK(trained.size() < net.parameters().size());  // only this stage's layers train
        }
  }
}

TEST_CASE("custom model: a Stack cut into pipeline stages equals the sequential run", "[train][pipeline]") {
  const auto world = test::world();
  const auto self = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  // The blocks take (N, 20): the images as rows.
  struct Rows {
    static data::Batch of(data::Batch b) {
      Tensor<float> rows(Shape{b.images.size(0), kFeatures});
      std::copy(b.images.begin(), b.images.end(), rows.begin());
      b.images = std::move(rows);
      return b;
    }
  };
  auto run_blocks = [&](const ProcessGrid& grid, const std::string& schedule) {
    Blocks blocks = make_blocks();
    layers::initialize_all(blocks.parameters(), 3, &grid);
    Run out;
    std::vector<std::vector<float>> values;
    parallel::with_strategy(schedule, false, [&]<class Strategy>() {
      train::Trainer<Blocks, Loss, Strategy, optim::Sgd> trainer(blocks, grid, kSgd, {}, {.micro_batches = 3});
      for (int s = 0; s < kSteps; ++s) out.losses.push_back(trainer.train_step(Rows::of(local_batch(s, grid)), kLr).loss);
      CHECK(trainer.stage().links().count == 4 / grid.pp());
    });
    return std::pair(out, std::move(blocks));
  };
  auto [ref, reference] = run_blocks(self, "1f1b");
  for (const TpPp l : layouts(world.size())) {
    if (l.tp != 1) continue;
    const auto grid = ProcessGrid::create(world, {.pp = l.pp});
    for (const std::string schedule : {"1f1b", "zb-h1"}) {
      CAPTURE(grid.dp(), l.pp, schedule);
      auto [run, blocks] = run_blocks(grid, schedule);
      for (int s = 0; s < kSteps; ++s) {
        CAPTURE(s);
        CHECK(std::abs(run.losses[s] - ref.losses[s]) <= kTolerance * std::abs(ref.losses[s]));
      }
      std::vector<Param<float>*> mine;
      const auto range = parallel::pipeline::StageBlocks::of(4, grid.pp(), grid.coord(Axis::pipeline));
      for (auto* p : blocks.parameters()) {
        const int index = std::stoi(p->name().substr(6));  // "block.<i>.…"
        if (index >= range.first && index < range.first + range.count) mine.push_back(p);
      }
      compare_weights(mine, grid, reference.parameters());
    }
  }
}

TEST_CASE("custom model: interleaved 1F1B (pp 2 × v 2 chunks, × dp) equals the sequential run and resumes under 1F1B",
          "[train][pipeline][interleaved]") {
  using parallel::pipeline::Partition;
  const auto world = test::world();
  if (world.size() % 2 != 0) return;
  constexpr int kInterleavedMicroBatches = 4;  // a multiple of pp (Megatron's condition)
  const auto self = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  Net reference = make_net({});
  const Run ref = run_steps(reference, self, "1f1b", false, kInterleavedMicroBatches, {});
  const auto grid = ProcessGrid::create(world, {.pp = 2});
  const std::string dir = temp_dir(world);
  // The 6 links as 4 virtual stages: rank 0 holds virtual stages 0 and 2, rank 1 stages 1 and 3.
  for (const auto& split : {Partition::balanced(), Partition::at({1, 2, 4})}) {
    CAPTURE(grid.dp(), split.starts);
    Net net = make_net({});
    std::vector<Param<float>*> trained;
    std::vector<std::int64_t> firsts;
    const Run run = run_steps(
        net, grid, "interleaved", false, kInterleavedMicroBatches, split,
        [&](auto& trainer) {
          trained = trainer.parameters();
          for (int c = 0; c < trainer.chunks(); ++c) firsts.push_back(trainer.chunk(c).links().first);
          train::Checkpointer ckpt(trainer, dir, {.keep_last = 1});
          ckpt.save_async({.step = kSteps});
          ckpt.wait();
        },
        2);
    compare_losses(run, ref);
    compare_weights(trained, grid, reference.parameters());
    REQUIRE(firsts.size() == 2);
    if (!split.starts.empty())  // chunk c of rank r: virtual stage 2c + r
      CHECK(firsts == (grid.coord(Axis::pipeline) == 0 ? std::vector<std::int64_t>{0, 2} : std::vector<std::int64_t>{1, 4}));
  }
  // The last checkpoint (global names) resumes under plain 1F1B on the same ranks.
  Net resumed = make_net({});
  parallel::with_strategy(OneFOneB{}, false, [&]<class Strategy>() {
    train::Trainer<Net, Loss, Strategy, optim::Sgd> trainer(resumed, grid, kSgd, {}, {.micro_batches = kInterleavedMicroBatches});
    CHECK(train::load_checkpoint(trainer, dir + "/step-" + std::to_string(kSteps)).step == kSteps);
    compare_weights(trainer.parameters(), grid, reference.parameters());
  });
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
  // Bad input refused on every rank, naming the flag: chunks without the interleaved schedule,
  // micro-batches not a multiple of pp, more virtual stages than layers.
  auto refusal = [&](const std::string& schedule, int micro_batches, int v) {
    Net net = make_net({});
    return test::error_of([&] { (void)run_steps(net, grid, schedule, false, micro_batches, {}, [](auto&) {}, v); });
  };
  CHECK(refusal("1f1b", 4, 2).find("--num-virtual-stages-per-pipeline-rank 2 needs --schedule interleaved") != std::string::npos);
  CHECK(refusal("interleaved", 3, 2).find("multiple of --pp 2") != std::string::npos);
  CHECK(refusal("interleaved", 4, 4).find("4 × --pp 2 = 8 virtual stages, but the model has 6 layers") != std::string::npos);
}

TEST_CASE("custom model: a checkpoint of the largest layout loads into the sequential model", "[train][pipeline]") {
  const auto world = test::world();
  const auto self = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  Net reference = make_net({});
  (void)run_steps(reference, self, "1f1b", false, kMicroBatches, {});

  const TpPp l = layouts(world.size()).back();
  const auto grid = ProcessGrid::create(world, {.tp = l.tp, .pp = l.pp});
  const parallel::TensorRegion<comm::Mpi> region(&grid.comm(Axis::tensor));
  const std::string dir = temp_dir(world);
  Net net = make_net(region);
  (void)run_steps(net, grid, "zb-h1", true, kMicroBatches, {}, [&](auto& trainer) {
    train::Checkpointer ckpt(trainer, dir, {.keep_last = 1});
    ckpt.save_async({.step = kSteps});
    ckpt.wait();
  });

  Net loaded = make_net({});
  parallel::with_strategy(OneFOneB{}, false, [&]<class Strategy>() {
    train::Trainer<Net, Loss, Strategy, optim::Sgd> trainer(loaded, self, kSgd, {}, {.micro_batches = 1});
    const auto pos = train::load_checkpoint(trainer, dir + "/step-" + std::to_string(kSteps));
    CHECK(pos.step == kSteps);
    CHECK(trainer.optimizer().optimizer().step_count() == kSteps);
  });
  const auto ref = by_name(reference.parameters());
  for (auto* p : loaded.parameters()) {
    const double e = test::rel_error(p->value(), ref.at(p->name())->value());
    CAPTURE(p->name(), e);
    CHECK(e <= kTolerance);
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}
