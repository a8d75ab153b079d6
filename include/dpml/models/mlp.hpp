#pragma once
// A multi-layer perceptron on flattened images: (N, C, H, W) → Flatten (N, C·H·W) → [Linear →
// ReLU] × depth → Linear (N, classes). The smallest model: a baseline, and the one to read first.
// One definition for every element type and memory space (Mlp<float> on the host, Mlp<bf16,
// CudaSpace> on a GPU). The flattened feature order follows the space's image layout
// (kernels/image.hpp): the same on both for one-channel images (Fashion-MNIST).

#include "dpml/layers/activation.hpp"
#include "dpml/layers/flatten.hpp"
#include "dpml/layers/linear.hpp"
#include "dpml/layers/sequential.hpp"
#include "dpml/layers/stack.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dpml::models {

struct MlpConfig {
  std::int64_t inputs = 28 * 28;
  std::int64_t hidden = 256;
  std::int64_t depth = 2;  // hidden layers
  std::int64_t classes = 10;
};

template <class T = float, class Space = HostSpace>
struct Mlp {
  using Linear = layers::Linear<T, Space>;
  using Hidden = layers::Sequential<Linear, layers::ReLU<T, Space>>;
  using Network = layers::Sequential<layers::Flatten<T, Space>, Hidden, layers::Stack<Hidden>, Linear>;

  static Network make(const MlpConfig& c) {
    DPML_REQUIRE_EVERYWHERE(c.depth >= 1 && c.hidden >= 1, "MLP: depth " << c.depth << " and hidden " << c.hidden
                                                                        << " must be ≥ 1");
    std::vector<Hidden> more;
    for (std::int64_t i = 1; i < c.depth; ++i) more.emplace_back(Linear(c.hidden, c.hidden, {.name = "fc"}), layers::ReLU<T, Space>());
    return Network(layers::Flatten<T, Space>(), Hidden(Linear(c.inputs, c.hidden, {.name = "fc"}), layers::ReLU<T, Space>()),
                   layers::Stack<Hidden>(std::move(more), "hidden"), Linear(c.hidden, c.classes, {.name = "out"}));
  }
};

}  // namespace dpml::models
