// Composition as types: Sequential and Residual grad-checked as whole models, a layer defined
// here (outside include/dpml) plugged into them, every parameter reported ready exactly once (also
// when a fused child reports its own inside backward_input), micro-batch slots (forward mb0,
// forward mb1, backward mb0, backward mb1 = one after the other), the ResNet block against the same
// block composed of generic containers, and the ResNets (Fashion-MNIST's, ResNet-50) built from them.
#include "grad_check.hpp"
#include "test.hpp"

#include <dpml/layers/activation.hpp>
#include <dpml/layers/batch_norm.hpp>
#include <dpml/layers/conv2d.hpp>
#include <dpml/layers/dropout.hpp>
#include <dpml/layers/flatten.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/layers/linear.hpp>
#include <dpml/layers/pool.hpp>
#include <dpml/layers/residual.hpp>
#include <dpml/layers/sequential.hpp>
#include <dpml/layers/stack.hpp>
#include <dpml/models/bottleneck_resnet.hpp>
#include <dpml/models/resnet.hpp>
#include <dpml/models/resnet_block.hpp>

#include <map>
#include <string>
#include <vector>

using namespace dpml;
using Ctx = layers::Context<HostSpace>;

// A user's layer: y = alpha · x with one learnable scalar. Only the Layer concept is relied on.
template <class T>
class Scale {
 public:
  using value_type = T;
  using space = HostSpace;
  using Input = TensorView<const T>;
  using Output = TensorView<const T>;

  Scale() : alpha_("scale", Shape{1}, layers::Init::constant(1.5)) {}

  Output forward(layers::Context<HostSpace>& ctx, Input x) {
    auto& s = saved_.slot(ctx);
    s.x = x;
    auto y = layers::ensure(s.y, x.shape());
    for (std::int64_t i = 0; i < x.numel(); ++i) y[i] = alpha_.value()[0] * x[i];
    return y;
  }
  Input backward_input(layers::Context<HostSpace>& ctx, Output dy) {
    auto& s = saved_.slot(ctx);
    auto dx = layers::ensure(s.dx, dy.shape());
    for (std::int64_t i = 0; i < dy.numel(); ++i) dx[i] = alpha_.value()[0] * dy[i];
    return dx;
  }
  void backward_weight(layers::Context<HostSpace>& ctx, Output dy) {
    const auto& s = saved_.slot(ctx);
    for (std::int64_t i = 0; i < dy.numel(); ++i) alpha_.grad()[0] += dy[i] * s.x[i];
  }
  std::vector<layers::Param<T>*> parameters() { return {&alpha_}; }

 private:
  struct Saved {
    Input x;
    Tensor<T> y, dx;
  };
  layers::Param<T> alpha_;
  layers::Slots<Saved> saved_;
};
static_assert(layers::Layer<Scale<double>>);

// A fused layer as a transformer block is one: when W follows B at once
// (!ctx.deferred_weight_gradients) it forms its weight gradient inside backward_input and reports
// it there, else in backward_weight. It reports its own parameters, so it is a Container.
template <class T>
class FusedScale {
 public:
  using value_type = T;
  using space = HostSpace;
  using Input = TensorView<const T>;
  using Output = TensorView<const T>;
  static constexpr bool reports_grad_ready = true;

  Output forward(layers::Context<HostSpace>& ctx, Input x) { return inner_.forward(ctx, x); }
  Input backward_input(layers::Context<HostSpace>& ctx, Output dy) {
    auto dx = inner_.backward_input(ctx, dy);
    if (!ctx.deferred_weight_gradients) weight(ctx, dy);
    return dx;
  }
  void backward_weight(layers::Context<HostSpace>& ctx, Output dy) {
    if (ctx.deferred_weight_gradients) weight(ctx, dy);
  }
  std::vector<layers::Param<T>*> parameters() { return inner_.parameters(); }

 private:
  void weight(layers::Context<HostSpace>& ctx, Output dy) {
    inner_.backward_weight(ctx, dy);
    layers::report_grad_ready(ctx, inner_);
  }
  Scale<T> inner_;
};
static_assert(layers::Container<FusedScale<double>>);

namespace {
std::vector<std::string> names(auto& model) {
  std::vector<std::string> n;
  for (auto* p : model.parameters()) n.push_back(p->name());
  return n;
}
}  // namespace

TEST_CASE("Sequential with a user-defined layer: names, forward chain, gradients", "[layers]") {
  auto gen = test::rng(31);
  using layers::Linear, layers::ReLU;
  layers::Sequential<Linear<double>, ReLU<double>, Scale<double>, Linear<double>> model(
      Linear<double>(4, 6, {.name = "fc1"}), ReLU<double>{}, Scale<double>{}, Linear<double>(6, 3, {.name = "fc2"}));
  CHECK(names(model) == std::vector<std::string>{"0.fc1.weight", "0.fc1.bias", "2.scale", "3.fc2.weight", "3.fc2.bias"});
  layers::initialize_all(model.parameters(), 9, nullptr);
  CHECK(model.parameters()[2]->value()[0] == 1.5);

  Ctx ctx;
  auto x = test::random_tensor<double>(Shape{5, 4}, gen);
  // forward equals the children applied one by one
  const auto y = model.forward(ctx, x.cview());
  Ctx other;
  other.micro_batch = 1;
  auto h = model.get<0>().forward(other, x.cview());
  h = model.get<1>().forward(other, h);
  h = model.get<2>().forward(other, h);
  CHECK(test::rel_error(y, model.get<3>().forward(other, h)) == 0.0);

  test::finite_difference_check(model, ctx, x, gen);
}

TEST_CASE("A small CNN as a Sequential: conv, batch norm, relu, pool, flatten, linear", "[layers]") {
  auto gen = test::rng(32);
  using namespace layers;
  Sequential<Conv2d<double>, BatchNorm2d<double>, ReLU<double>, MaxPool2d<double>, Flatten<double>, Linear<double>> cnn(
      Conv2d<double>(2, 3, 3, {.padding = 1}), BatchNorm2d<double>(3), ReLU<double>{}, MaxPool2d<double>(2),
      Flatten<double>{}, Linear<double>(3 * 2 * 2, 4));
  initialize_all(cnn.parameters(), 4, nullptr);
  Ctx ctx;
  auto x = test::random_tensor<double>(Shape{3, 2, 4, 4}, gen);
  CHECK(cnn.forward(ctx, x.cview()).shape() == Shape{3, 4});
  test::finite_difference_check(cnn, ctx, x, gen, 1e-6);
}

TEST_CASE("Residual: y = x + body(x), or with a projection shortcut; gradients", "[layers]") {
  auto gen = test::rng(33);
  using namespace layers;
  Ctx ctx;
  {
    Residual<Linear<double>> res(Linear<double>(5, 5));
    CHECK(names(res) == std::vector<std::string>{"body.linear.weight", "body.linear.bias"});
    initialize_all(res.parameters(), 1, nullptr);
    auto x = test::random_tensor<double>(Shape{3, 5}, gen);
    const auto y = res.forward(ctx, x.cview());
    Ctx other;
    other.micro_batch = 1;
    const auto fx = res.body().forward(other, x.cview());
    std::vector<double> ref;
    for (std::int64_t i = 0; i < x.numel(); ++i) ref.push_back(x[i] + fx[i]);
    CHECK(test::rel_error(y, ref) < 1e-15);
    test::finite_difference_check(res, ctx, x, gen);
  }
  {
    using Body = Sequential<Conv2d<double>, BatchNorm2d<double>, ReLU<double>, Conv2d<double>>;
    using Proj = Conv2d<double>;
    Residual<Body, Proj> block(Body(Conv2d<double>(2, 4, 3, {.stride = 2, .padding = 1}), BatchNorm2d<double>(4),
                                    ReLU<double>{}, Conv2d<double>(4, 4, 3, {.padding = 1})),
                               Proj(2, 4, 1, {.stride = 2, .name = "proj"}));
    CHECK(names(block).front() == "body.0.conv.weight");
    CHECK(names(block).back() == "shortcut.proj.bias");
    initialize_all(block.parameters(), 2, nullptr);
    auto x = test::random_tensor<double>(Shape{2, 2, 4, 4}, gen);
    CHECK(block.forward(ctx, x.cview()).shape() == Shape{2, 4, 2, 2});
    test::finite_difference_check(block, ctx, x, gen, 1e-6);
  }
}

TEST_CASE("Nested containers report every parameter ready exactly once, after its gradient", "[layers]") {
  auto gen = test::rng(34);
  using namespace layers;
  using Block = Residual<Sequential<Linear<double>, ReLU<double>, Linear<double>>>;
  Sequential<Linear<double>, Block, Scale<double>> model(
      Linear<double>(3, 4), Block(Sequential<Linear<double>, ReLU<double>, Linear<double>>(Linear<double>(4, 4), ReLU<double>{}, Linear<double>(4, 4))),
      Scale<double>{});
  initialize_all(model.parameters(), 3, nullptr);
  std::map<std::string, int> reported;
  std::vector<std::string> order;
  Ctx ctx;
  ctx.on_grad_ready = [&](std::span<ParamBase* const> ps) {
    for (auto* base : ps) {
      auto* p = static_cast<Param<double>*>(base);
      ++reported[p->name()];
      order.push_back(p->name());
      double norm = 0;
      for (double g : p->grad()) norm += g * g;
      CHECK(norm > 0);  // the gradient is there when reported
    }
  };
  auto x = test::random_tensor<double>(Shape{2, 3}, gen);
  auto dy = test::random_tensor<double>(Shape{2, 4}, gen);
  model.forward(ctx, x.cview());
  model.backward_input(ctx, dy.cview());
  model.backward_weight(ctx, dy.cview());
  REQUIRE(reported.size() == model.parameters().size());
  for (auto& [name, count] : reported) {
    CAPTURE(name);
    CHECK(count == 1);
  }
  CHECK(order.front() == "2.scale");           // last child first
  CHECK(order.back() == "0.linear.bias");
}

// A child that reports its own parameters inside backward_input (a fused block) is not reported
// again by Sequential, Residual or Stack, with W right after B or deferred.
TEST_CASE("Containers do not report again a child that reports its own parameters", "[layers]") {
  using namespace layers;
  using Body = Sequential<Linear<double>, FusedScale<double>>;
  using Model = Sequential<Linear<double>, Residual<Body>, Stack<FusedScale<double>>>;
  auto make = [] {
    std::vector<FusedScale<double>> blocks(2);
    Model m(Linear<double>(3, 4), Residual<Body>(Body(Linear<double>(4, 4), FusedScale<double>{})),
            Stack<FusedScale<double>>(std::move(blocks), "stack"));
    initialize_all(m.parameters(), 3, nullptr);
    return m;
  };
  auto gen = test::rng(36);
  auto x = test::random_tensor<double>(Shape{2, 3}, gen);
  auto dy = test::random_tensor<double>(Shape{2, 4}, gen);
  std::vector<std::vector<double>> grads[2];
  for (bool deferred : {false, true}) {
    CAPTURE(deferred);
    Model model = make();
    std::map<std::string, int> reported;
    Ctx ctx;
    ctx.deferred_weight_gradients = deferred;
    ctx.on_grad_ready = [&](std::span<ParamBase* const> ps) {
      for (auto* base : ps) {
        auto* p = static_cast<Param<double>*>(base);
        ++reported[p->name()];
        double norm = 0;
        for (double g : p->grad()) norm += g * g;
        CHECK(norm > 0);  // the gradient is there when reported
      }
    };
    model.forward(ctx, x.cview());
    model.backward_input(ctx, dy.cview());
    model.backward_weight(ctx, dy.cview());
    REQUIRE(reported.size() == model.parameters().size());
    for (auto& [name, count] : reported) {
      CAPTURE(name);
      CHECK(count == 1);
    }
    for (auto* p : model.parameters()) grads[deferred].emplace_back(p->grad().begin(), p->grad().end());
  }
  CHECK(grads[0] == grads[1]);
}

TEST_CASE("Micro-batch slots: interleaved forward/backward of two micro-batches equals one after the other", "[layers]") {
  using namespace layers;
  using Model = Sequential<Conv2d<double>, BatchNorm2d<double>, ReLU<double>, Dropout<double>, GlobalAvgPool<double>,
                           Linear<double>>;
  auto make = [] {
    Model m(Conv2d<double>(1, 3, 3, {.padding = 1}), BatchNorm2d<double>(3), ReLU<double>{}, Dropout<double>(0.25, 7),
            GlobalAvgPool<double>{}, Linear<double>(3, 2));
    initialize_all(m.parameters(), 5, nullptr);
    return m;
  };
  auto gen = test::rng(35);
  Tensor<double> x[2] = {test::random_tensor<double>(Shape{3, 1, 5, 5}, gen),
                         test::random_tensor<double>(Shape{4, 1, 5, 5}, gen)};
  Tensor<double> dy[2] = {test::random_tensor<double>(Shape{3, 2}, gen), test::random_tensor<double>(Shape{4, 2}, gen)};
  Ctx ctx;
  ctx.seed = 11;

  Model seq = make(), inter = make();
  std::vector<double> dx_seq[2], dx_inter[2];
  for (int mb = 0; mb < 2; ++mb) {
    ctx.micro_batch = mb;
    seq.forward(ctx, x[mb].cview());
    const auto d = seq.backward_input(ctx, dy[mb].cview());
    dx_seq[mb].assign(d.begin(), d.end());
    seq.backward_weight(ctx, dy[mb].cview());
  }
  for (int mb = 0; mb < 2; ++mb) {
    ctx.micro_batch = mb;
    inter.forward(ctx, x[mb].cview());
  }
  for (int mb = 0; mb < 2; ++mb) {
    ctx.micro_batch = mb;
    const auto d = inter.backward_input(ctx, dy[mb].cview());
    dx_inter[mb].assign(d.begin(), d.end());
  }
  for (int mb = 0; mb < 2; ++mb) {
    ctx.micro_batch = mb;
    inter.backward_weight(ctx, dy[mb].cview());
  }
  for (int mb = 0; mb < 2; ++mb) CHECK(dx_inter[mb] == dx_seq[mb]);
  const auto ps = seq.parameters(), pi = inter.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    CAPTURE(ps[i]->name());
    CHECK(test::rel_error(pi[i]->grad(), ps[i]->grad()) == 0.0);
  }
  CHECK(test::error_of([&] { inter.backward_weight(ctx, dy[1].cview()); }).find("before backward_input for micro-batch 1") !=
        std::string::npos);
}

namespace block_check {
using Grads = std::vector<std::vector<double>>;

Grads grads_of(auto& model) {
  Grads v;
  for (auto* p : model.parameters()) v.emplace_back(p->grad().begin(), p->grad().end());
  return v;
}

// fused's parameters set to random values (BatchNorm's too, away from their init) and copied into
// composed, parameter by parameter in the same order and shapes.
void randomise_and_copy(auto& fused, auto& composed, std::mt19937_64& gen) {
  test::randomise_parameters(fused, gen);
  auto pf = fused.parameters();
  auto pc = composed.parameters();
  REQUIRE(pf.size() == pc.size());
  for (std::size_t i = 0; i < pf.size(); ++i) {
    REQUIRE(pf[i]->shape() == pc[i]->shape());
    copy(pc[i]->value(), TensorView<const double>(pf[i]->value()));
  }
}

struct Run {
  std::vector<double> y, dx;
  Grads grads;
  std::map<std::string, int> reported;
};
// forward, backward_input and backward_weight of `model` on x and dy, from zeroed gradients.
Run run(auto& model, Ctx& ctx, const Tensor<double>& x, const Tensor<double>& dy) {
  Run r;
  for (auto* p : model.parameters()) std::fill(p->grad().begin(), p->grad().end(), 0.0);
  ctx.on_grad_ready = [&r](std::span<ParamBase* const> ps) {
    for (auto* p : ps) ++r.reported[p->name()];
  };
  const auto y = model.forward(ctx, x.cview());
  r.y.assign(y.begin(), y.end());
  const auto dx = model.backward_input(ctx, dy.cview());
  if (dx.data() != nullptr) r.dx.assign(dx.begin(), dx.end());  // (a ring entry: read before the next backward)
  model.backward_weight(ctx, dy.cview());
  r.grads = grads_of(model);
  return r;
}

void check_reported_once(const Run& r, std::size_t params) {
  CHECK(r.reported.size() == params);
  for (const auto& [name, count] : r.reported) {
    CAPTURE(name);
    CHECK(count == 1);
  }
}

// The fused blocks with shared scratch, with deferred weight gradients, and the composition.
void compare(auto& fused, auto& composed, const Tensor<double>& x, const Tensor<double>& dy) {
  Ctx shared_ctx, deferred_ctx, composed_ctx;
  deferred_ctx.deferred_weight_gradients = true;
  const Run a = run(fused, shared_ctx, x, dy);
  const Run b = run(fused, deferred_ctx, x, dy);
  const Run c = run(composed, composed_ctx, x, dy);
  const std::size_t params = fused.parameters().size();
  check_reported_once(a, params);
  check_reported_once(b, params);
  CHECK(a.y == b.y);
  CHECK(a.dx == b.dx);
  CHECK(a.dx.size() == c.dx.size());
  CHECK(a.grads == b.grads);
  CHECK(test::rel_error(a.y, c.y) < 1e-12);
  CHECK(test::rel_error(a.dx, c.dx) < 1e-12);
  REQUIRE(a.grads.size() == c.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    CAPTURE(fused.parameters()[i]->name());
    CHECK(test::rel_error(a.grads[i], c.grads[i]) < 1e-12);
  }
}
}  // namespace block_check

// The ResNet block and stem (models/resnet_block.hpp) against the same layers written with the
// generic containers: relu(Residual<Sequential<conv, BN + ReLU, …, conv, BN>, projection>) —
// basic and bottleneck, with and without a projection — two in a Stack, so that the first block's
// input gradient comes from the second through the shared ring (and its last BatchNorm works in
// place over it); and a stem (conv without input gradient, BN + ReLU, max pool or none) before a
// block. The same outputs, input gradients and parameter gradients (to float64 rounding: the block
// adds the shortcut inside BatchNorm's pass), every parameter reported once, and bit for bit the
// same whether the weight gradients are formed inside backward_input (shared scratch) or in
// backward_weight (deferred: buffers per slot).
TEST_CASE("ResNetBlock and ResNetStem equal their compositions of generic containers; shared and deferred scratch "
          "alike", "[layers]") {
  using namespace layers;
  using Block = models::ResNetBlock<double>;
  using Proj = Sequential<Conv2d<double>, BatchNorm2d<double>>;
  auto conv = [](std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t s) {
    return Conv2d<double>(in, out, k, {.stride = s, .padding = k / 2, .bias = false});
  };
  auto bn = [](std::int64_t c, bool relu) { return BatchNorm2d<double>(c, {.relu = relu}); };
  auto gen = test::rng(37);

  SECTION("basic blocks: stride 2 with a projection, then one without") {
    using Body = Sequential<Conv2d<double>, BatchNorm2d<double>, Conv2d<double>, BatchNorm2d<double>>;
    std::vector<Block> blocks;
    blocks.emplace_back(models::ResNetBlockOptions::basic(3, 5, 2));
    blocks.emplace_back(models::ResNetBlockOptions::basic(5, 5, 1));
    CHECK(blocks[0].projected());
    CHECK(!blocks[1].projected());
    Stack<Block> fused(std::move(blocks), "layer");
    CHECK(names(fused) == std::vector<std::string>{
                              "layer.0.conv1.weight", "layer.0.bn1.weight", "layer.0.bn1.bias", "layer.0.conv2.weight",
                              "layer.0.bn2.weight", "layer.0.bn2.bias", "layer.0.downsample.0.weight",
                              "layer.0.downsample.1.weight", "layer.0.downsample.1.bias", "layer.1.conv1.weight",
                              "layer.1.bn1.weight", "layer.1.bn1.bias", "layer.1.conv2.weight", "layer.1.bn2.weight",
                              "layer.1.bn2.bias"});
    using First = Sequential<Residual<Body, Proj>, ReLU<double>>;
    using Plain = Sequential<Residual<Body>, ReLU<double>>;
    Sequential<First, Plain> composed(
        First(Residual<Body, Proj>(Body(conv(3, 5, 3, 2), bn(5, true), conv(5, 5, 3, 1), bn(5, false)),
                                   Proj(conv(3, 5, 1, 2), bn(5, false))),
              ReLU<double>{}),
        Plain(Residual<Body>(Body(conv(5, 5, 3, 1), bn(5, true), conv(5, 5, 3, 1), bn(5, false))), ReLU<double>{}));
    block_check::randomise_and_copy(fused, composed, gen);
    const auto x = test::random_tensor<double>(Shape{2, 3, 7, 7}, gen);
    const auto dy = test::random_tensor<double>(Shape{2, 5, 4, 4}, gen);
    block_check::compare(fused, composed, x, dy);
  }
  SECTION("bottleneck blocks: width 2 from 3 channels, stride 2 (projected), then 8 → 8") {
    using Body = Sequential<Conv2d<double>, BatchNorm2d<double>, Conv2d<double>, BatchNorm2d<double>, Conv2d<double>,
                            BatchNorm2d<double>>;
    std::vector<Block> blocks;
    blocks.emplace_back(models::ResNetBlockOptions::bottleneck(3, 2, 2));
    blocks.emplace_back(models::ResNetBlockOptions::bottleneck(8, 2, 1));
    Stack<Block> fused(std::move(blocks), "layer");
    using First = Sequential<Residual<Body, Proj>, ReLU<double>>;
    using Plain = Sequential<Residual<Body>, ReLU<double>>;
    Sequential<First, Plain> composed(
        First(Residual<Body, Proj>(Body(conv(3, 2, 1, 1), bn(2, true), conv(2, 2, 3, 2), bn(2, true), conv(2, 8, 1, 1),
                                        bn(8, false)),
                                   Proj(conv(3, 8, 1, 2), bn(8, false))),
              ReLU<double>{}),
        Plain(Residual<Body>(Body(conv(8, 2, 1, 1), bn(2, true), conv(2, 2, 3, 1), bn(2, true), conv(2, 8, 1, 1),
                                  bn(8, false))),
              ReLU<double>{}));
    block_check::randomise_and_copy(fused, composed, gen);
    const auto x = test::random_tensor<double>(Shape{3, 3, 6, 5}, gen);
    const auto dy = test::random_tensor<double>(Shape{3, 8, 3, 3}, gen);
    block_check::compare(fused, composed, x, dy);
  }
  SECTION("a stem (7×7 stride 2, max pool; or 3×3 without) before a bottleneck block") {
    using Body = Sequential<Conv2d<double>, BatchNorm2d<double>, Conv2d<double>, BatchNorm2d<double>, Conv2d<double>,
                            BatchNorm2d<double>>;
    using Stem = models::ResNetStem<double>;
    using First = Sequential<Residual<Body, Proj>, ReLU<double>>;
    auto block = [&] {
      return First(Residual<Body, Proj>(Body(conv(3, 2, 1, 1), bn(2, true), conv(2, 2, 3, 1), bn(2, true),
                                             conv(2, 8, 1, 1), bn(8, false)),
                                        Proj(conv(3, 8, 1, 1), bn(8, false))),
                   ReLU<double>{});
    };
    auto stack = [] {
      std::vector<Block> blocks;
      blocks.emplace_back(models::ResNetBlockOptions::bottleneck(3, 2, 1));
      return Stack<Block>(std::move(blocks), "layer");
    };
    const Conv2dOptions stem_conv{.stride = 2, .padding = 3, .bias = false, .input_gradient = false};
    Sequential<Stem, Stack<Block>> fused(Stem({.in = 2, .out = 3, .kernel = 7, .stride = 2, .pool = true}), stack());
    CHECK(names(fused).front() == "0.conv1.weight");
    CHECK(names(fused)[2] == "0.bn1.bias");
    Sequential<Conv2d<double>, BatchNorm2d<double>, MaxPool2d<double>, First> composed(
        Conv2d<double>(2, 3, 7, stem_conv), bn(3, true), MaxPool2d<double>(3, 2, 1), block());
    block_check::randomise_and_copy(fused, composed, gen);
    const auto x = test::random_tensor<double>(Shape{2, 2, 13, 11}, gen);  // conv (7, 6), pool (4, 3)
    const auto dy = test::random_tensor<double>(Shape{2, 8, 4, 3}, gen);
    block_check::compare(fused, composed, x, dy);

    Sequential<Stem, Stack<Block>> plain(Stem({.in = 2, .out = 3, .kernel = 3}), stack());
    Sequential<Conv2d<double>, BatchNorm2d<double>, First> plain_composed(
        Conv2d<double>(2, 3, 3, {.padding = 1, .bias = false, .input_gradient = false}), bn(3, true), block());
    block_check::randomise_and_copy(plain, plain_composed, gen);
    const auto dy_plain = test::random_tensor<double>(Shape{2, 8, 13, 11}, gen);
    block_check::compare(plain, plain_composed, x, dy_plain);
  }
}

// The bottleneck ResNets of models/bottleneck_resnet.hpp: the parameter counts torchvision gives
// for resnet50, resnet101 and resnet152, the names, the output shape, and a whole small network
// (every block kind: projected stride-2 and plain bottlenecks, the 7×7 stem and the max pool)
// against central differences in float64, BatchNorm in training mode, the weight gradients formed
// in backward_weight (ctx.deferred_weight_gradients: the check zeroes the gradients between the
// two halves). The stem computes no input gradient. The step is h = 1e-7, not the default 1e-5:
// with ~10 ReLU layers after each parameter, a 1e-5 nudge moves some pre-activation across zero in
// a fair share of the evaluations (seen: errors of 0.1–2 % on a few tensors), a 1e-7 one almost
// never, while the float64 rounding of the central difference stays far below the tolerance.
TEST_CASE("BottleneckResNet: torchvision's parameter counts; a small one against finite differences", "[layers]") {
  auto count = [](auto& net) {
    std::int64_t n = 0;
    for (auto* p : net.parameters()) n += p->numel();
    return n;
  };
  auto r50 = models::BottleneckResNet<float>::make({});
  CHECK(count(r50) == 25'557'032);
  auto r101 = models::BottleneckResNet<float>::make({.blocks = {3, 4, 23, 3}});
  CHECK(count(r101) == 44'549'160);
  auto r152 = models::BottleneckResNet<float>::make({.blocks = {3, 8, 36, 3}});
  CHECK(count(r152) == 60'192'808);
  const auto n50 = names(r50);
  CHECK(n50.size() == 161);
  CHECK(n50[0] == "0.conv1.weight");
  CHECK(n50[1] == "0.bn1.weight");
  CHECK(n50[3] == "1.layer1.0.conv1.weight");
  CHECK(n50[12] == "1.layer1.0.downsample.0.weight");
  CHECK(n50[n50.size() - 3] == "4.layer4.2.bn3.bias");
  CHECK(n50.back() == "6.fc.bias");

  auto gen = test::rng(34);
  auto net = models::BottleneckResNet<double>::make({.in_channels = 2, .width = 2, .blocks = {2, 1, 2, 1}, .classes = 3});
  layers::initialize_all(net.parameters(), 5, nullptr);
  Ctx ctx;
  ctx.deferred_weight_gradients = true;
  auto x = test::random_tensor<double>(Shape{2, 2, 64, 64}, gen);
  CHECK(net.forward(ctx, x.cview()).shape() == Shape{2, 3});
  test::finite_difference_check(net, ctx, x, gen, 1e-6, 1e-7);
}

// The Fashion-MNIST ResNet of models/resnet.hpp: its parameter count (the same layers as before
// its blocks were fused), and a small one against central differences (as above).
TEST_CASE("ResNet (basic blocks): parameter count; a small one against finite differences", "[layers]") {
  auto net16 = models::ResNet<float>::make({});
  std::int64_t n = 0;
  for (auto* p : net16.parameters()) n += p->numel();
  CHECK(n == 77'754);
  CHECK(names(net16).back() == "5.fc.bias");

  auto gen = test::rng(38);
  auto net = models::ResNet<double>::make({.width = 2, .blocks_per_stage = 2, .classes = 3});
  layers::initialize_all(net.parameters(), 6, nullptr);
  Ctx ctx;
  ctx.deferred_weight_gradients = true;
  auto x = test::random_tensor<double>(Shape{2, 1, 8, 8}, gen);
  CHECK(net.forward(ctx, x.cview()).shape() == Shape{2, 3});
  test::finite_difference_check(net, ctx, x, gen, 1e-6, 1e-7);
}
