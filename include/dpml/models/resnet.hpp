#pragma once
// A ResNet-style CNN for small images (28×28×1 Fashion-MNIST by default), after He et al. 2016's
// CIFAR networks: a 3×3 stem, three stages of basic blocks at widths w, 2w, 4w (the second and
// third start with a stride-2 block whose shortcut is a 1×1 projection), global average pooling
// and a linear classifier. Depth (blocks per stage) and width are run-time choices; the structure
// is a type, built from the generic containers (Sequential, Residual, Stack).
//
//   (N, 1, 28, 28) → stem (N, w, 28, 28) → stage 1 (N, w, 28, 28) → stage 2 (N, 2w, 14, 14)
//                  → stage 3 (N, 4w, 7, 7) → pool (N, 4w) → linear (N, classes)

#include "dpml/layers/activation.hpp"
#include "dpml/layers/batch_norm.hpp"
#include "dpml/layers/conv2d.hpp"
#include "dpml/layers/flatten.hpp"
#include "dpml/layers/linear.hpp"
#include "dpml/layers/pool.hpp"
#include "dpml/layers/residual.hpp"
#include "dpml/layers/sequential.hpp"
#include "dpml/layers/stack.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dpml::models {

struct ResNetConfig {
  std::int64_t in_channels = 1;
  std::int64_t width = 16;           // w: channels of the first stage
  std::int64_t blocks_per_stage = 1;
  std::int64_t classes = 10;
  bool sync_batch_norm = false;      // batch statistics over the whole data-parallel batch
};

template <class T = float>
struct ResNet {
  using Conv = layers::Conv2d<T>;
  using BN = layers::BatchNorm2d<T>;
  using ReLU = layers::ReLU<T>;
  using Body = layers::Sequential<Conv, BN, ReLU, Conv, BN>;
  // x + body(x), then ReLU.
  using Block = layers::Sequential<layers::Residual<Body>, ReLU>;
  // projection(x) + body(x) with stride 2, then ReLU.
  using DownBlock = layers::Sequential<layers::Residual<Body, layers::Sequential<Conv, BN>>, ReLU>;
  using Stage = layers::Sequential<DownBlock, layers::Stack<Block>>;
  using Network = layers::Sequential<Conv, BN, ReLU, layers::Stack<Block>, Stage, Stage, layers::GlobalAvgPool<T>,
                                     layers::Flatten<T>, layers::Linear<T>>;

  static Network make(const ResNetConfig& c) {
    const std::int64_t w = c.width;
    DPML_REQUIRE_EVERYWHERE(w >= 1 && c.blocks_per_stage >= 1, "ResNet: width " << w << " and blocks per stage "
                                                                               << c.blocks_per_stage << " must be ≥ 1");
    return Network(conv(c.in_channels, w, 3, 1, "conv"), bn(w, c), ReLU(), blocks(w, c.blocks_per_stage, c),
                   stage(w, 2 * w, c), stage(2 * w, 4 * w, c), layers::GlobalAvgPool<T>(), layers::Flatten<T>(),
                   layers::Linear<T>(4 * w, c.classes, {.name = "fc"}));
  }

 private:
  static Conv conv(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, const char* name) {
    return Conv(in, out, k, {.stride = stride, .padding = k / 2, .bias = false, .name = name});
  }
  static BN bn(std::int64_t c, const ResNetConfig& cfg) { return BN(c, {.sync = cfg.sync_batch_norm}); }
  static Body body(std::int64_t in, std::int64_t out, std::int64_t stride, const ResNetConfig& c) {
    return Body(conv(in, out, 3, stride, "conv1"), bn(out, c), ReLU(), conv(out, out, 3, 1, "conv2"), bn(out, c));
  }
  static layers::Stack<Block> blocks(std::int64_t w, std::int64_t count, const ResNetConfig& c) {
    std::vector<Block> v;
    for (std::int64_t i = 0; i < count; ++i) v.emplace_back(layers::Residual<Body>(body(w, w, 1, c)), ReLU());
    return layers::Stack<Block>(std::move(v), "blocks");
  }
  static Stage stage(std::int64_t in, std::int64_t out, const ResNetConfig& c) {
    DownBlock down(layers::Residual<Body, layers::Sequential<Conv, BN>>(
                       body(in, out, 2, c), layers::Sequential<Conv, BN>(conv(in, out, 1, 2, "proj"), bn(out, c))),
                   ReLU());
    return Stage(std::move(down), blocks(out, c.blocks_per_stage - 1, c));
  }
};

}  // namespace dpml::models
