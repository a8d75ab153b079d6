#pragma once
// The ImageNet ResNets with bottleneck blocks (He et al. 2016; torchvision's v1.5, which strides
// the 3×3 convolution): ResNet-50 with the default blocks {3, 4, 6, 3}, ResNet-101 with
// {3, 4, 23, 3}, ResNet-152 with {3, 8, 36, 3}. Host layers in NCHW, built from the generic
// containers like models::ResNet (resnet.hpp); the GPU model (models/cuda/resnet.hpp) has the
// same parameters in the same order and is tested against this one.
//
//   (N, 3, S, S) → stem: 7×7/2 conv, BN, ReLU (N, w, S/2, S/2) → 3×3/2 max pool (N, w, S/4, S/4)
//   → stage k = 1..4 of blocks[k] bottlenecks at width w·2^(k−1), output 4·w·2^(k−1) channels,
//     stride 2 in the first block of stages 2–4 → global average pool (N, 32w) → linear (N, classes)
//
// Bottleneck: y = relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x))))))) + shortcut(x)) with
// conv1 1×1 (in → m), conv2 3×3 stride s (m → m), conv3 1×1 (m → 4m); the shortcut is x, or a
// 1×1 stride-s projection with BN (the first block of every stage: in ≠ 4m). Parameters in
// order: stem conv, stem BN (weight, bias), then per block conv1, bn1, conv2, bn2, conv3, bn3
// [, projection conv, projection BN], then fc weight (classes, 32w) and bias.

#include "dpml/layers/activation.hpp"
#include "dpml/layers/batch_norm.hpp"
#include "dpml/layers/conv2d.hpp"
#include "dpml/layers/flatten.hpp"
#include "dpml/layers/linear.hpp"
#include "dpml/layers/pool.hpp"
#include "dpml/layers/residual.hpp"
#include "dpml/layers/sequential.hpp"
#include "dpml/layers/stack.hpp"

#include <array>
#include <cstdint>
#include <vector>

namespace dpml::models {

struct BottleneckResNetConfig {
  std::int64_t in_channels = 3;
  std::int64_t width = 64;                       // w: the stem's channels and stage 1's bottleneck width
  std::array<std::int64_t, 4> blocks{3, 4, 6, 3};  // ResNet-50
  std::int64_t classes = 1000;
  bool sync_batch_norm = false;
};

template <class T = float>
struct BottleneckResNet {
  using Conv = layers::Conv2d<T>;
  using BN = layers::BatchNorm2d<T>;
  using ReLU = layers::ReLU<T>;
  using Body = layers::Sequential<Conv, BN, ReLU, Conv, BN, ReLU, Conv, BN>;
  using Projection = layers::Sequential<Conv, BN>;
  using Block = layers::Sequential<layers::Residual<Body>, ReLU>;
  using FirstBlock = layers::Sequential<layers::Residual<Body, Projection>, ReLU>;
  using Stage = layers::Sequential<FirstBlock, layers::Stack<Block>>;
  using Network = layers::Sequential<Conv, BN, ReLU, layers::MaxPool2d<T>, Stage, Stage, Stage, Stage,
                                     layers::GlobalAvgPool<T>, layers::Flatten<T>, layers::Linear<T>>;

  static Network make(const BottleneckResNetConfig& c) {
    const std::int64_t w = c.width;
    DPML_REQUIRE_EVERYWHERE(w >= 1 && c.in_channels >= 1 && c.classes >= 1,
                            "BottleneckResNet: width " << w << ", input channels " << c.in_channels << " and classes "
                                                       << c.classes << " must be ≥ 1");
    for (auto b : c.blocks)
      DPML_REQUIRE_EVERYWHERE(b >= 1, "BottleneckResNet: every stage needs at least one block, got " << b);
    return Network(conv(c.in_channels, w, 7, 2, "conv"), bn(w, c), ReLU(), layers::MaxPool2d<T>(3, 2, 1),
                   stage(w, w, 1, c.blocks[0], c), stage(4 * w, 2 * w, 2, c.blocks[1], c),
                   stage(8 * w, 4 * w, 2, c.blocks[2], c), stage(16 * w, 8 * w, 2, c.blocks[3], c),
                   layers::GlobalAvgPool<T>(), layers::Flatten<T>(), layers::Linear<T>(32 * w, c.classes, {.name = "fc"}));
  }

 private:
  static Conv conv(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, const char* name) {
    return Conv(in, out, k, {.stride = stride, .padding = k / 2, .bias = false, .name = name});
  }
  static BN bn(std::int64_t ch, const BottleneckResNetConfig& c) { return BN(ch, {.sync = c.sync_batch_norm}); }
  // in → m → m (stride s) → 4m
  static Body body(std::int64_t in, std::int64_t m, std::int64_t s, const BottleneckResNetConfig& c) {
    return Body(conv(in, m, 1, 1, "conv1"), bn(m, c), ReLU(), conv(m, m, 3, s, "conv2"), bn(m, c), ReLU(),
                conv(m, 4 * m, 1, 1, "conv3"), bn(4 * m, c));
  }
  static Stage stage(std::int64_t in, std::int64_t m, std::int64_t s, std::int64_t count,
                     const BottleneckResNetConfig& c) {
    FirstBlock first(layers::Residual<Body, Projection>(body(in, m, s, c), Projection(conv(in, 4 * m, 1, s, "proj"),
                                                                                       bn(4 * m, c))),
                     ReLU());
    std::vector<Block> rest;
    for (std::int64_t i = 1; i < count; ++i) rest.emplace_back(layers::Residual<Body>(body(4 * m, m, 1, c)), ReLU());
    return Stage(std::move(first), layers::Stack<Block>(std::move(rest), "blocks"));
  }
};

}  // namespace dpml::models
