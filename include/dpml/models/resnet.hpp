#pragma once
// A ResNet-style CNN for small images (28×28×1 Fashion-MNIST by default), after He et al. 2016's
// CIFAR networks: a 3×3 stem, three stages of basic blocks at widths w, 2w, 4w (the second and
// third start with a stride-2 block whose shortcut is a 1×1 projection), global average pooling
// and a linear classifier. Depth (blocks per stage) and width are run-time choices; the structure
// is a type. One definition for every element type and memory space (ResNet<float> on the host,
// ResNet<bf16, CudaSpace> on a GPU), built from layers and models::ResNetBlock (resnet_block.hpp)
// with the fused GPU ResNet's options: BatchNorm with its ReLU (and a block's last one with the
// shortcut's add), no input gradient for the stem convolution, the backward of the blocks and the
// stem in scratch shared by all of them.
//
//   (N, 1, 28, 28) → stem (N, w, 28, 28) → stage 1 (N, w, 28, 28) → stage 2 (N, 2w, 14, 14)
//                  → stage 3 (N, 4w, 7, 7) → pool (N, 4w) → linear (N, classes)
//
// Parameters in order: stem conv, stem BN, per block conv1, bn1, conv2, bn2 [, downsample.0,
// downsample.1], fc weight and bias; named "<child index>.<torchvision's name>" ("1.layer1.0.conv1.weight").
// Synchronised BatchNorm: as models::BottleneckResNet (bottleneck_resnet.hpp), through `data_comm`.

#include "dpml/core/error.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/linear.hpp"
#include "dpml/layers/pool.hpp"
#include "dpml/layers/sequential.hpp"
#include "dpml/layers/stack.hpp"
#include "dpml/models/resnet_block.hpp"
#include "dpml/parallel/tensor.hpp"

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

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>,
          class ConvPolicy = typename kernels::Ops<Space>::DefaultConvPolicy>
struct ResNet {
  using Stem = ResNetStem<T, Space, Comm, ConvPolicy>;
  using Block = ResNetBlock<T, Space, Comm, ConvPolicy>;
  using Stage = layers::Stack<Block>;
  using Network =
      layers::Sequential<Stem, Stage, Stage, Stage, layers::GlobalAvgPool<T, Space>, layers::Linear<T, Space>>;

  static Network make(const ResNetConfig& c, const Comm* data_comm = nullptr) {
    const std::int64_t w = c.width;
    DPML_REQUIRE_EVERYWHERE(w >= 1 && c.blocks_per_stage >= 1, "ResNet: width " << w << " and blocks per stage "
                                                                               << c.blocks_per_stage << " must be ≥ 1");
    const ResNetStemOptions stem{.in = c.in_channels, .out = w, .kernel = 3, .sync_batch_norm = c.sync_batch_norm};
    return Network(Stem(stem, data_comm), stage(1, w, w, 1, c, data_comm), stage(2, w, 2 * w, 2, c, data_comm),
                   stage(3, 2 * w, 4 * w, 2, c, data_comm), layers::GlobalAvgPool<T, Space>(),
                   layers::Linear<T, Space>(4 * w, c.classes, {.name = "fc"}));
  }

 private:
  // Stage k: blocks_per_stage basic blocks, in → out channels, the first with stride s.
  static Stage stage(int k, std::int64_t in, std::int64_t out, std::int64_t s, const ResNetConfig& c,
                     const Comm* data_comm) {
    std::vector<Block> blocks;
    for (std::int64_t i = 0; i < c.blocks_per_stage; ++i)
      blocks.emplace_back(ResNetBlockOptions::basic(i == 0 ? in : out, out, i == 0 ? s : 1, c.sync_batch_norm),
                          data_comm);
    return Stage(std::move(blocks), "layer" + std::to_string(k));
  }
};

}  // namespace dpml::models
