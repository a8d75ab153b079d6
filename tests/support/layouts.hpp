#pragma once
// Layout tests' weight comparison: every parameter a rank holds (its tensor-parallel shard, its
// pipeline stage's) against the sequential model's parameter of the same name, element by element
// at the same global index (rows past the sequential tensor — a padded vocabulary's — skipped).
// Checks each tensor's relative L2 error against `tolerance` (CAPTUREing the name) and returns the
// worst. Used by tests/gpt and tests/bert.
#include "test.hpp"

#include <dpml/core/tensor.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/parallel/grid.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>

namespace dpml::test {

template <class Model, class Reference>
double worst_weight_error(Model& model, const ProcessGrid& grid, Reference& reference, double tolerance) {
  std::map<std::string, std::remove_reference_t<decltype(reference.parameters().front())>> ref;
  for (auto* p : reference.parameters()) ref[p->name()] = p;
  double worst = 0;
  for (auto* p : model.parameters()) {
    auto it = ref.find(p->name());
    REQUIRE(it != ref.end());
    const auto g = layers::global_slice(*p, &grid);
    const Shape rshape = it->second->shape(), rstrides = contiguous_strides(rshape), lshape = p->shape();
    double num = 0, den = 0;
    std::int64_t idx[kMaxRank] = {};
    for (std::int64_t flat = 0; flat < p->numel(); ++flat) {
      bool inside = true;
      std::int64_t r = 0;
      for (int d = 0; d < lshape.rank(); ++d) {
        const std::int64_t gi = idx[d] + (d == g.dim ? g.offset : 0);
        inside &= gi < rshape[d];
        r += gi * rstrides[d];
      }
      if (inside) {
        const double a = p->value()[flat], b = it->second->value()[r];
        num += (a - b) * (a - b);
        den += b * b;
      }
      for (int d = lshape.rank() - 1; d >= 0; --d) {
        if (++idx[d] < lshape[d]) break;
        idx[d] = 0;
      }
    }
    const double e = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
    worst = std::max(worst, e);
    CAPTURE(p->name(), e);
    CHECK(e <= tolerance);
  }
  return worst;
}

}  // namespace dpml::test
