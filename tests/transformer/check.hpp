#pragma once
// Helpers of the transformer tests: central finite differences in float64, and the projection
// loss L = Σ y · r that turns any layer output into a scalar (its gradient dL/dy is r).
#include "test.hpp"

#include <dpml/core/tensor.hpp>
#include <dpml/layers/attention.hpp>
#include <dpml/layers/layer.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace dpml::test {

// Central differences of loss() with respect to x[0, n), each element perturbed by ±eps.
template <class Loss>
std::vector<double> numeric_gradient(Loss&& loss, double* x, std::int64_t n, double eps = 1e-5) {
  std::vector<double> g(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const double keep = x[i];
    x[i] = keep + eps;
    const double up = loss();
    x[i] = keep - eps;
    const double down = loss();
    x[i] = keep;
    g[static_cast<std::size_t>(i)] = (up - down) / (2 * eps);
  }
  return g;
}

template <class A>
double dot(const A& y, const Tensor<double>& r) {
  double s = 0;
  for (std::int64_t i = 0; i < r.numel(); ++i) s += y.data()[i] * r[i];
  return s;
}

template <class V>
std::vector<double> to_vector(const V& v) {
  return std::vector<double>(v.begin(), v.end());
}

// A bidirectional layer (attention or block) seen as a plain layer whose forward passes `keys`:
// the form the layout checks (expect_same_as_serial) and gradient checks take.
template <class L>
struct Padded {
  using value_type = typename L::value_type;
  using space = typename L::space;
  using Input = typename L::Input;
  using Output = typename L::Output;
  L& layer;
  layers::KeyPadding keys;
  Output forward(layers::Context<space>& ctx, Input x) { return layer.forward(ctx, x, keys); }
  Input backward_input(layers::Context<space>& ctx, Output dy) { return layer.backward_input(ctx, dy); }
  void backward_weight(layers::Context<space>& ctx, Output dy) { layer.backward_weight(ctx, dy); }
  auto parameters() { return layer.parameters(); }
};

// test::error_of (test.hpp) gives the message; does it mention `part`?
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace dpml::test
