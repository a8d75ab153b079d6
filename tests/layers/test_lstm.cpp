// layers::Lstm: forward against a float64 reference written here with plain loops (PyTorch's
// nn.LSTM equations, batch first, zero initial states), both backward halves against central
// finite differences (grad_check.hpp), sequence lengths that are multiples of nothing (1, 7, 13),
// micro-batch slots kept apart with backward_weight run after the other slot's backward_input (as
// zero-bubble schedules do), names and initialisation (PyTorch's bounds, the forget-gate bias).
#include "grad_check.hpp"
#include "test.hpp"

#include <dpml/layers/init.hpp>
#include <dpml/layers/lstm.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using namespace dpml;
using Ctx = layers::Context<HostSpace>;

namespace {

// y (B, T, H) of one LSTM layer: x (B, T, I), W_ih (4H, I), W_hh (4H, H), b (4H), gates i, f, g, o.
std::vector<double> reference(const Tensor<double>& x, layers::Lstm<double>& lstm) {
  const auto p = lstm.parameters();
  const auto Wih = p[0]->value(), Whh = p[1]->value(), bias = p[2]->value();
  const std::int64_t B = x.size(0), Tn = x.size(1), I = x.size(2), H = lstm.hidden_size();
  const auto sigmoid = [](double z) { return 1 / (1 + std::exp(-z)); };
  std::vector<double> y(static_cast<std::size_t>(B * Tn * H));
  for (std::int64_t b = 0; b < B; ++b) {
    std::vector<double> h(static_cast<std::size_t>(H), 0.0), c(static_cast<std::size_t>(H), 0.0);
    for (std::int64_t t = 0; t < Tn; ++t) {
      std::vector<double> a(static_cast<std::size_t>(4 * H));
      for (std::int64_t r = 0; r < 4 * H; ++r) {
        double s = bias[r];
        for (std::int64_t i = 0; i < I; ++i) s += Wih(r, i) * x[(b * Tn + t) * I + i];
        for (std::int64_t j = 0; j < H; ++j) s += Whh(r, j) * h[static_cast<std::size_t>(j)];
        a[static_cast<std::size_t>(r)] = s;
      }
      for (std::int64_t j = 0; j < H; ++j) {
        const auto at = [&](std::int64_t gate) { return a[static_cast<std::size_t>(gate * H + j)]; };
        const double ig = sigmoid(at(0)), fg = sigmoid(at(1)), gg = std::tanh(at(2)), og = sigmoid(at(3));
        auto& cj = c[static_cast<std::size_t>(j)];
        cj = fg * cj + ig * gg;
        h[static_cast<std::size_t>(j)] = og * std::tanh(cj);
        y[static_cast<std::size_t>((b * Tn + t) * H + j)] = h[static_cast<std::size_t>(j)];
      }
    }
  }
  return y;
}

}  // namespace

TEST_CASE("Lstm: names, PyTorch's init bounds, the forget-gate bias option", "[layers][lstm]") {
  layers::Lstm<double> plain(5, 4, {.name = "rnn"});
  layers::initialize_all(plain.parameters(), 7, nullptr);
  const auto p = plain.parameters();
  REQUIRE(p.size() == 3);
  CHECK(p[0]->name() == "rnn.weight_ih");
  CHECK(p[1]->name() == "rnn.weight_hh");
  CHECK(p[2]->name() == "rnn.bias");
  CHECK(p[0]->shape() == Shape{16, 5});
  CHECK(p[1]->shape() == Shape{16, 4});
  CHECK(p[2]->shape() == Shape{16});
  for (auto* q : p)
    for (double v : q->value()) CHECK(std::abs(v) <= 0.5);  // 1/√H
  CHECK(p[2]->value()[4] != p[2]->value()[5]);

  layers::Lstm<double> forget(5, 4, {.name = "rnn", .forget_bias = 1.0});
  layers::initialize_all(forget.parameters(), 7, nullptr);
  const auto b = forget.parameters()[2]->value();
  for (std::int64_t r = 0; r < 16; ++r) {
    CAPTURE(r);
    if (r >= 4 && r < 8) CHECK(b[r] == 1.0);  // the forget quarter
    else CHECK(b[r] == p[2]->value()[r]);     // the rest drawn as without the option
  }
  CHECK(test::rel_error(forget.parameters()[0]->value(), p[0]->value()) == 0.0);
}

TEST_CASE("Lstm: forward against the float64 reference; both backward halves against finite differences",
          "[layers][lstm]") {
  auto gen = test::rng(3);
  for (const std::int64_t steps : {1, 7, 13}) {
    CAPTURE(steps);
    layers::Lstm<double> lstm(5, 4);
    test::randomise_parameters(lstm, gen);
    Ctx ctx;
    auto x = test::random_tensor<double>(Shape{3, steps, 5}, gen);
    const auto y = lstm.forward(ctx, x.cview());
    REQUIRE(y.shape() == Shape{3, steps, 4});
    CHECK(test::rel_error(y, reference(x, lstm)) < 1e-13);
    test::finite_difference_check(lstm, ctx, x, gen);
  }
}

TEST_CASE("Lstm: micro-batch slots are kept apart; backward_weight may follow another slot's backward_input",
          "[layers][lstm]") {
  auto gen = test::rng(5);
  layers::Lstm<double> lstm(3, 6), alone(3, 6);
  test::randomise_parameters(lstm, gen);
  for (std::size_t i = 0; i < 3; ++i) copy(alone.parameters()[i]->value(), TensorView<const double>(lstm.parameters()[i]->value()));
  // Two micro-batches of other shapes: (2, 5, 3) and (4, 3, 3).
  auto x0 = test::random_tensor<double>(Shape{2, 5, 3}, gen), x1 = test::random_tensor<double>(Shape{4, 3, 3}, gen);
  auto r0 = test::random_tensor<double>(Shape{2, 5, 6}, gen), r1 = test::random_tensor<double>(Shape{4, 3, 6}, gen);

  // Each micro-batch alone, in slot 0: its output, dx and weight gradient.
  struct One {
    std::vector<double> y, dx, grads;
  };
  auto run_alone = [&](const Tensor<double>& x, const Tensor<double>& r) {
    Ctx ctx;
    for (auto* p : alone.parameters()) layers::zero_grad(*p);
    One o;
    const auto y = alone.forward(ctx, x.cview());
    o.y.assign(y.begin(), y.end());
    const auto dx = alone.backward_input(ctx, r.cview());
    o.dx.assign(dx.begin(), dx.end());
    alone.backward_weight(ctx, r.cview());
    for (auto* p : alone.parameters()) o.grads.insert(o.grads.end(), p->grad().begin(), p->grad().end());
    return o;
  };
  const One a0 = run_alone(x0, r0), a1 = run_alone(x1, r1);

  // Interleaved as ZB-H1 runs them: F0 F1 B0 B1 W0 W1, into one gradient.
  for (auto* p : lstm.parameters()) layers::zero_grad(*p);
  Ctx c0, c1;
  c1.micro_batch = 1;
  const auto y0 = lstm.forward(c0, x0.cview());
  const auto y1 = lstm.forward(c1, x1.cview());
  const auto dx0 = lstm.backward_input(c0, r0.cview());
  const auto dx1 = lstm.backward_input(c1, r1.cview());
  lstm.backward_weight(c0, r0.cview());
  lstm.backward_weight(c1, r1.cview());
  CHECK(test::rel_error(y0, a0.y) < 1e-15);
  CHECK(test::rel_error(y1, a1.y) < 1e-15);
  CHECK(test::rel_error(dx0, a0.dx) < 1e-15);
  CHECK(test::rel_error(dx1, a1.dx) < 1e-15);
  std::vector<double> both, sum;
  for (auto* p : lstm.parameters()) both.insert(both.end(), p->grad().begin(), p->grad().end());
  for (std::size_t i = 0; i < a0.grads.size(); ++i) sum.push_back(a0.grads[i] + a1.grads[i]);
  CHECK(test::rel_error(both, sum) < 1e-14);
}

TEST_CASE("Lstm: a wrong input or gradient, or backward before forward, is refused naming the layer", "[layers][lstm]") {
  layers::Lstm<float> lstm(5, 4, {.name = "rnn"});
  Ctx ctx;
  CHECK(test::error_of([&] { lstm.forward(ctx, TensorView<const float>(nullptr, Shape{2, 3, 4})); })
            .find("Lstm rnn: input (2, 3, 4) is not (B, T, 5)") != std::string::npos);
  CHECK(test::error_of([&] { lstm.backward_input(ctx, TensorView<const float>(nullptr, Shape{2, 3, 4})); })
            .find("Lstm rnn: backward before forward for micro-batch 0") != std::string::npos);
  Tensor<float> x(Shape{2, 3, 5}, 0.5f), dy(Shape{2, 4, 4});
  (void)lstm.forward(ctx, x.cview());
  CHECK(test::error_of([&] { lstm.backward_input(ctx, dy.cview()); })
            .find("Lstm rnn: dy (2, 4, 4) is not the output's (2, 3, 4)") != std::string::npos);
  CHECK(test::error_of([] { layers::Lstm<float>(0, 4, {.name = "rnn"}); })
            .find("Lstm rnn: sizes input=0, hidden=4 must be positive") != std::string::npos);
}
