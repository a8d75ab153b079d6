#pragma once
// What the multi-GPU ResNet tests share (test_resnet_dp, test_resnet_syncbn): a tiny bottleneck
// ResNet (width 8, blocks {1, 2, 1, 1}: projected blocks and a plain one; 32×32 images, 10 classes,
// batch 4 per rank), batches of random images, one SGD step, and the master weights per tensor in
// the host layout (through a host model of the same shape).
#include "nccl_fixture.hpp"

#include <dpml/models/bottleneck_resnet.hpp>
#include <dpml/models/cuda/resnet.hpp>
#include <dpml/optim/sgd.hpp>

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace dpml::test::resnet {

inline constexpr std::int64_t kBatch = 4, kImage = 32, kClasses = 10;  // kBatch: per rank
inline constexpr std::array<std::int64_t, 4> kBlocks{1, 2, 1, 1};
inline constexpr std::uint64_t kSeed = 1337;  // init_random, the same on every rank
inline constexpr double kLr = 0.05;
inline const optim::SgdOptions kSgd{.momentum = 0.9, .weight_decay = 1e-4};

inline models::cuda::ResNetCudaConfig config() {
  return {.in_channels = 3, .width = 8, .blocks = kBlocks, .classes = kClasses};
}

// Images (N, 3, S, S) NCHW, normal, and labels in [0, classes); `salt` picks them.
struct Batch {
  std::vector<float> images;
  std::vector<std::int32_t> labels;
  Batch(std::int64_t n, std::uint64_t salt)
      : images(static_cast<std::size_t>(n * 3 * kImage * kImage)), labels(static_cast<std::size_t>(n)) {
    auto gen = rng(salt);
    std::normal_distribution<float> normal;
    for (auto& v : images) v = normal(gen);
    for (auto& l : labels) l = static_cast<std::int32_t>(gen() % kClasses);
  }
  // Images [first, first + n) of another batch.
  Batch(const Batch& whole, std::int64_t first, std::int64_t n) {
    const std::int64_t per = 3 * kImage * kImage;
    images.assign(whole.images.begin() + first * per, whole.images.begin() + (first + n) * per);
    labels.assign(whole.labels.begin() + first, whole.labels.begin() + first + n);
  }
};

// Model: any models::cuda::ResNet<Conv>.
template <class Model>
double train_step(Model& m, const Batch& b) {
  m.upload_batch(b.images, b.labels);
  m.forward_backward();
  m.update(kLr, kSgd);
  return m.loss();
}

using Named = std::vector<std::pair<std::string, std::vector<float>>>;  // tensors in parameter order

// Master weights in the host layout, by tensor.
template <class Model>
Named weights(const Model& m) {
  auto host = models::BottleneckResNet<float>::make({.in_channels = 3, .width = 8, .blocks = kBlocks, .classes = kClasses});
  m.copy_to(host.parameters());
  Named w;
  for (auto* p : host.parameters()) w.emplace_back(p->name(), std::vector<float>(p->value().data(), p->value().data() + p->numel()));
  return w;
}
inline std::vector<float> flatten(const Named& tensors) {
  std::vector<float> v;
  for (const auto& [name, t] : tensors) v.insert(v.end(), t.begin(), t.end());
  return v;
}

}  // namespace dpml::test::resnet
