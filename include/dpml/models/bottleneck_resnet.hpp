#pragma once
// The ImageNet ResNets with bottleneck blocks (He et al. 2016; torchvision's v1.5, which strides
// the 3×3 convolution): ResNet-50 with the default blocks {3, 4, 6, 3}, ResNet-101 with
// {3, 4, 23, 3}, ResNet-152 with {3, 8, 36, 3}. One definition for every element type and memory
// space — BottleneckResNet<float> on the host (NCHW), BottleneckResNet<bf16, CudaSpace> on a GPU
// (NHWC, cuDNN convolutions by default where DPML_HAS_CUDNN) — built from layers and the
// models::ResNetBlock (resnet_block.hpp).
//
//   (N, 3, S, S) → stem: 7×7/2 conv, BN + ReLU (N, w, S/2, S/2) → 3×3/2 max pool (N, w, S/4, S/4)
//   → stage k = 1..4 ("layer<k>") of blocks[k] bottlenecks at width w·2^(k−1), output 4·w·2^(k−1)
//     channels, stride 2 in the first block of stages 2–4 → global average pool (N, 32w)
//   → linear (N, classes)
//
// Bottleneck: y = relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x))))))) + shortcut(x)) with
// conv1 1×1 (in → m), conv2 3×3 stride s (m → m), conv3 1×1 (m → 4m); the shortcut is x, or a
// 1×1 stride-s projection with BN (the first block of every stage: in ≠ 4m).
//
// What makes the fused GPU model fast and lean, as layer options here (resnet_block.hpp): every
// BatchNorm carries its ReLU, a block's last one also the shortcut's add; the stem convolution
// computes no input gradient (the image needs none); the projection's normalised shortcut and the
// stem's ReLU output (the pool's input) are forward temporaries; the backward of the blocks and the stem works in scratch shared by all of
// them. Parameters in order: stem conv, stem BN (weight, bias), then per block conv1, bn1, conv2,
// bn2, conv3, bn3 [, downsample.0 (conv), downsample.1 (BN)], then fc weight (classes, 32w) and
// bias — torchvision's names under the network's child index ("0.conv1.weight",
// "1.layer1.0.conv1.weight", "6.fc.bias").
//
// Synchronised BatchNorm (sync_batch_norm): statistics over the data axis, through `data_comm`
// (BatchNorm2d's communicator: on the host null takes ctx.grid's MPI data axis; on a GPU a device
// communicator on the model's stream, which must outlive the network).

#include "dpml/core/error.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/linear.hpp"
#include "dpml/layers/pool.hpp"
#include "dpml/layers/sequential.hpp"
#include "dpml/layers/stack.hpp"
#include "dpml/models/resnet_block.hpp"
#include "dpml/parallel/tensor.hpp"

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace dpml::models {

struct BottleneckResNetConfig {
  std::int64_t in_channels = 3;
  std::int64_t width = 64;                       // w: the stem's channels and stage 1's bottleneck width
  std::array<std::int64_t, 4> blocks{3, 4, 6, 3};  // ResNet-50
  std::int64_t classes = 1000;
  bool sync_batch_norm = false;
};

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>,
          class ConvPolicy = typename kernels::Ops<Space>::DefaultConvPolicy>
struct BottleneckResNet {
  using Stem = ResNetStem<T, Space, Comm, ConvPolicy>;
  using Block = ResNetBlock<T, Space, Comm, ConvPolicy>;
  using Stage = layers::Stack<Block>;
  using Network = layers::Sequential<Stem, Stage, Stage, Stage, Stage, layers::GlobalAvgPool<T, Space>,
                                     layers::Linear<T, Space>>;

  static Network make(const BottleneckResNetConfig& c, const Comm* data_comm = nullptr) {
    const std::int64_t w = c.width;
    DPML_REQUIRE_EVERYWHERE(w >= 1 && c.in_channels >= 1 && c.classes >= 1,
                            "BottleneckResNet: width " << w << ", input channels " << c.in_channels << " and classes "
                                                       << c.classes << " must be ≥ 1");
    for (auto b : c.blocks)
      DPML_REQUIRE_EVERYWHERE(b >= 1, "BottleneckResNet: every stage needs at least one block, got " << b);
    const ResNetStemOptions stem{.in = c.in_channels, .out = w, .kernel = 7, .stride = 2, .pool = true,
                                 .sync_batch_norm = c.sync_batch_norm};
    return Network(Stem(stem, data_comm), stage(1, w, w, 1, c, data_comm), stage(2, 4 * w, 2 * w, 2, c, data_comm),
                   stage(3, 8 * w, 4 * w, 2, c, data_comm), stage(4, 16 * w, 8 * w, 2, c, data_comm),
                   layers::GlobalAvgPool<T, Space>(), layers::Linear<T, Space>(32 * w, c.classes, {.name = "fc"}));
  }

 private:
  // Stage k: blocks[k − 1] bottlenecks of width m, in → 4m channels, the first with stride s.
  static Stage stage(int k, std::int64_t in, std::int64_t m, std::int64_t s, const BottleneckResNetConfig& c,
                     const Comm* data_comm) {
    std::vector<Block> blocks;
    for (std::int64_t i = 0; i < c.blocks[static_cast<std::size_t>(k - 1)]; ++i)
      blocks.emplace_back(ResNetBlockOptions::bottleneck(i == 0 ? in : 4 * m, m, i == 0 ? s : 1, c.sync_batch_norm),
                          data_comm);
    return Stage(std::move(blocks), "layer" + std::to_string(k));
  }
};

}  // namespace dpml::models
