// Composition as types: Sequential and Residual grad-checked as whole models, a layer defined
// here (outside include/dpml) plugged into them, every parameter reported ready exactly once (also
// when a fused child reports its own inside backward_input), micro-batch slots (forward mb0,
// forward mb1, backward mb0, backward mb1 = one after the other), and the bottleneck ResNet
// (ResNet-50) built from them.
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

// The bottleneck ResNets of models/bottleneck_resnet.hpp: the parameter counts torchvision gives
// for resnet50 and resnet101, the output shape, and a whole small network (every block kind:
// projected stride-2 and plain bottlenecks, the 7×7 stem and the max pool) against central
// differences in float64, BatchNorm in training mode. The step is h = 1e-7, not the default 1e-5:
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

  auto gen = test::rng(34);
  auto net = models::BottleneckResNet<double>::make({.in_channels = 2, .width = 2, .blocks = {2, 1, 2, 1}, .classes = 3});
  layers::initialize_all(net.parameters(), 5, nullptr);
  Ctx ctx;
  auto x = test::random_tensor<double>(Shape{2, 2, 64, 64}, gen);
  CHECK(net.forward(ctx, x.cview()).shape() == Shape{2, 3});
  test::finite_difference_check(net, ctx, x, gen, 1e-6, 1e-7);
}
