#pragma once
// finite_difference_check: both backward halves of a float64 layer against central differences.
//
// The loss is a random projection of the output, L = Σ y · r. The analytic gradients come from
// backward_input(r) (dL/dx) and backward_weight(r) (dL/dW, into zeroed gradients); the numeric
// ones perturb each input and each parameter element by ±h and rerun forward. Works for any
// Layer with TensorView<const double> input and output; one that returns an empty input gradient
// (a network whose first convolution has input_gradient = false) is checked on its parameters.
#include "test.hpp"

#include <dpml/layers/layer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace dpml::test {

template <class A, class B>
double grad_error(const A& analytic, const B& numeric) {
  double num = 0, den = 0;
  auto ib = numeric.begin();
  for (auto ia = analytic.begin(); ia != analytic.end(); ++ia, ++ib) {
    num += (*ia - *ib) * (*ia - *ib);
    den += *ib * *ib;
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1.0);
}

template <class L>
void finite_difference_check(L& layer, layers::Context<HostSpace>& ctx, Tensor<double>& x, std::mt19937_64& gen,
                             double tol = 1e-7, double h = 1e-5) {
  const auto y0 = layer.forward(ctx, x.cview());
  const Tensor<double> r = random_tensor<double>(y0.shape(), gen);
  auto loss = [&] {
    const auto y = layer.forward(ctx, x.cview());
    double sum = 0;
    for (std::int64_t i = 0; i < y.numel(); ++i) sum += y[i] * r[i];
    return sum;
  };
  loss();  // the analytic pass sees the same forward as the numeric one

  const auto dx_view = layer.backward_input(ctx, r.cview());
  const bool has_dx = dx_view.data() != nullptr;  // an empty view: no input gradient (a network's stem)
  std::vector<double> dx;
  if (has_dx) dx.assign(dx_view.begin(), dx_view.end());
  for (auto* p : layer.parameters()) std::fill(p->grad().begin(), p->grad().end(), 0.0);
  layer.backward_weight(ctx, r.cview());

  auto numeric = [&](double* v) {
    const double keep = *v;
    *v = keep + h;
    const double plus = loss();
    *v = keep - h;
    const double minus = loss();
    *v = keep;
    return (plus - minus) / (2 * h);
  };
  if (has_dx) {
    std::vector<double> ndx(static_cast<std::size_t>(x.numel()));
    for (std::int64_t i = 0; i < x.numel(); ++i) ndx[static_cast<std::size_t>(i)] = numeric(&x[i]);
    INFO("dL/dx of input " << x.shape().str());
    CHECK(grad_error(dx, ndx) < tol);
  }
  for (auto* p : layer.parameters()) {
    auto v = p->value();
    std::vector<double> num(static_cast<std::size_t>(v.numel()));
    for (std::int64_t i = 0; i < v.numel(); ++i) num[static_cast<std::size_t>(i)] = numeric(&v[i]);
    INFO("dL/d" << p->name() << " " << v.shape().str());
    CHECK(grad_error(p->grad(), num) < tol);
  }
}

// Every parameter set to random values (tests exercise weights away from their init).
template <class L>
void randomise_parameters(L& layer, std::mt19937_64& gen) {
  for (auto* p : layer.parameters()) fill_uniform<double>(p->value().begin(), p->value().end(), gen, -0.5, 0.5);
}

}  // namespace dpml::test
