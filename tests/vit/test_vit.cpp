// models::Vit (models/vit.hpp) and its token layers (layers/vision.hpp): patches in the documented
// order, both backward halves of a tiny ViT against central finite differences in float64, and
// the library's trainer under data parallel (dp = world) and tensor parallel (tp 2) giving the
// losses and weights of one rank (float32, relative error ≤ 1e-5: only the order of float sums
// differs).
#include "test.hpp"
#include "../transformer/check.hpp"  // numeric_gradient

#include <dpml/data/loader.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/vit.hpp>
#include <dpml/optim/sgd.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/classifier.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace dpml;
using dpml::test::numeric_gradient;

namespace {
double dot(TensorView<const double> y, const Tensor<double>& r) {
  double s = 0;
  for (std::int64_t i = 0; i < r.numel(); ++i) s += y.data()[i] * r[i];
  return s;
}
}  // namespace

TEST_CASE("PatchTokens: patches row-major, features (c, py, px); backward is the inverse permutation", "[vit]") {
  const std::int64_t N = 2, Cin = 2, H = 4, W = 6, P = 2;
  Tensor<double> x({N, Cin, H, W});
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = static_cast<double>(i);
  layers::PatchTokens<double> patches(P);
  layers::Context<> ctx;
  const auto y = patches.forward(ctx, x.cview());
  REQUIRE(y.shape() == Shape{N, 6, Cin * P * P});
  // image 1, patch (1, 2) = token 5, channel 1, pixel (1, 0) in the patch: x(1, 1, 3, 4)
  CHECK(y.data()[(1 * 6 + 5) * 8 + (1 * 2 + 1) * 2 + 0] == x(1, 1, 3, 4));
  const auto dx = patches.backward_input(ctx, y);
  CHECK(std::equal(dx.data(), dx.data() + dx.numel(), x.data()));
}

TEST_CASE("Vit: global parameter names; both backward halves match finite differences", "[vit]") {
  const models::VitConfig c{.image = 4, .channels = 2, .patch = 2, .dim = 8, .layers = 2, .heads = 2, .classes = 3};
  auto model = models::Vit<double>::make(c);
  auto params = model.parameters();
  CHECK(params[0]->name() == "1.patch_embed.weight");
  CHECK(params[2]->name() == "2.embed.cls");
  CHECK(params[3]->name() == "2.embed.pos");
  CHECK(params[4]->name() == "3.blocks.0.ln_1.weight");
  CHECK(params[params.size() - 3]->name() == "5.ln_f.bias");
  CHECK(params.back()->name() == "6.head.bias");
  std::int64_t n = 0;
  for (auto* p : params) n += p->numel();
  CHECK(n == c.parameter_count());
  layers::initialize_all(params, 3, nullptr);
  auto gen = test::rng(31);
  auto x = test::random_tensor<double>({3, 2, 4, 4}, gen);
  auto r = test::random_tensor<double>({3, 3}, gen);
  layers::Context<> ctx;
  model.forward(ctx, x.cview());
  const auto dx = model.backward_input(ctx, r.cview());
  const std::vector<double> dxv(dx.data(), dx.data() + dx.numel());
  model.backward_weight(ctx, r.cview());
  auto loss = [&] { return dot(model.forward(ctx, x.cview()), r); };
  CHECK(test::rel_error(dxv, numeric_gradient(loss, x.data(), x.numel())) < 1e-7);
  for (auto* p : params) {
    CAPTURE(p->name());
    CHECK(test::rel_error(p->grad(), numeric_gradient(loss, p->value().data(), p->numel())) < 1e-7);
  }
}

namespace {
constexpr std::int64_t kGlobalBatch = 8;
constexpr int kSteps = 3;
const models::VitConfig kConfig{.image = 8, .patch = 4, .dim = 16, .layers = 2, .heads = 4, .classes = 4};

// Rows [lo, hi) of the global batch of `step`: random images, labels a function of the image.
data::Batch batch_rows(int step, std::int64_t lo, std::int64_t hi) {
  data::Batch b;
  b.global_size = kGlobalBatch;
  b.images = Tensor<float>(Shape{hi - lo, 1, 8, 8});
  b.labels = Tensor<std::int32_t>(Shape{hi - lo});
  const PhiloxStream rng(9, static_cast<std::uint64_t>(step));
  for (std::int64_t n = lo; n < hi; ++n) {
    double left = 0;
    for (std::int64_t i = 0; i < 64; ++i) {
      const float v = rng.normal(static_cast<std::uint64_t>(n * 64 + i));
      b.images[(n - lo) * 64 + i] = v;
      left += i % 8 < 4 ? v : -v;
    }
    b.labels[n - lo] = (left > 0 ? 2 : 0) + static_cast<std::int32_t>(n % 2);
  }
  return b;
}

// kSteps of SGD on `grid` (not AdamW: the key bias of c_attn gets a gradient of 0 up to
// rounding — softmax ignores a shift shared by all keys — which AdamW would scale to full steps) (tp from the grid): the losses, and the model for its weights.
struct Run {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;  // each parameter's global tensor (tp shards gathered)
  std::vector<std::string> names;
};
Run train_vit(const ProcessGrid& grid) {
  const parallel::TensorRegion<comm::Mpi> region(&grid.comm(Axis::tensor));
  auto model = models::Vit<float>::make(kConfig, region);
  layers::initialize_all(model.parameters(), 42, &grid);
  Run run;
  train::ClassifierTrainer<decltype(model), optim::Sgd> trainer(model, grid, {.momentum = 0.9, .weight_decay = 0.01}, {.clip = 1.0}, {});
  const int r = grid.coord(Axis::data), k = grid.dp();
  for (int s = 0; s < kSteps; ++s)
    run.losses.push_back(trainer.train_step(batch_rows(s, kGlobalBatch * r / k, kGlobalBatch * (r + 1) / k), 0.05).loss);
  for (auto* p : model.parameters()) {
    run.names.push_back(p->name());
    const auto v = p->value();
    std::vector<float> local(v.data(), v.data() + v.numel());
    if (p->sharding().is_replicated() || grid.tp() == 1) {
      run.weights.push_back(local);
      continue;
    }
    std::int64_t outer = 1;  // (outer, chunk) locally; the tensor ranks' chunks side by side
    for (int d = 0; d < p->sharding().dim; ++d) outer *= v.size(d);
    std::vector<float> full(local.size() * static_cast<std::size_t>(grid.tp()));
    region.gather_last_dim(TensorView<const float>(local.data(), Shape{outer, v.numel() / outer}),
                           TensorView<float>(full.data(), Shape{outer, v.numel() / outer * grid.tp()}));
    run.weights.push_back(full);
  }
  return run;
}

void compare(const Run& got, const Run& want) {
  for (int s = 0; s < kSteps; ++s) {
    CAPTURE(s, got.losses[s], want.losses[s]);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= 1e-5 * std::abs(want.losses[s]));
  }
  REQUIRE(got.weights.size() == want.weights.size());
  for (std::size_t i = 0; i < want.weights.size(); ++i) {
    CAPTURE(i, want.names[i]);
    CHECK(test::rel_error(got.weights[i], want.weights[i]) <= 1e-5);
  }
}
}  // namespace

TEST_CASE("Vit under data parallel (dp = world) and tensor parallel (tp 2) equals one rank", "[vit][layouts]") {
  const auto world = test::world();
  const Run want = train_vit(ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {}));
  {
    INFO("dp " << world.size());
    compare(train_vit(ProcessGrid::create(world, {})), want);
  }
  if (world.size() % 2 == 0) {
    INFO("tp 2");
    compare(train_vit(ProcessGrid::create(world, {.tp = 2})), want);
  }
}
