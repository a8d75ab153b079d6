// train/flops.hpp: model FLOPs against hand counts written out here (a small GPT, a small CNN, a
// small ResNet, an MLP), against published figures (GPT-2 124M's parameter count, ResNet-50's
// 4.09 GMACs at 224 px), each CNN walk against the weights of the model make() builds; the bf16
// peaks against NVIDIA's datasheet figures by the names CUDA reports; MFU's arithmetic.
#include "test.hpp"

#include <dpml/models/bottleneck_resnet.hpp>
#include <dpml/models/gpt.hpp>
#include <dpml/models/mlp.hpp>
#include <dpml/models/resnet.hpp>
#include <dpml/train/flops.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using namespace dpml;

namespace {

// Elements of the multiplying weights of a built model: convolution (Cout, Cin, k, k) and linear
// (out, in) weights — every parameter of rank ≥ 2 (biases and norms are rank 1).
template <class Net>
double matrix_weights(Net& net) {
  double n = 0;
  for (const auto* p : net.parameters())
    if (p->shape().rank() >= 2) n += static_cast<double>(p->numel());
  return n;
}

}  // namespace

TEST_CASE("GPT: training FLOPs per token are 6·N + 12·L·T·C, N every parameter counted by hand", "[train][flops]") {
  const models::GptConfig c{.vocab = 50, .max_seq = 16, .layers = 3, .heads = 2, .dim = 8};
  const double V = 50, Tmax = 16, L = 3, C = 8, T = 12;  // trained on 12 of the 16 positions
  // Every tensor of GPT-2: wte, wpe; per block ln_1 (w, b), c_attn (w, b), attn.c_proj (w, b),
  // ln_2 (w, b), c_fc (w, b), mlp.c_proj (w, b); ln_f (w, b).
  const double block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
  const double N = V * C + Tmax * C + L * block + 2 * C;
  // Per token and block, QKᵀ: T keys of C (all heads together) multiply-adds; AV: the same.
  const double attention = L * (2 * T * C + 2 * T * C);
  CHECK(train::gpt_forward_flops_per_token(c, 12) == 2 * N + attention);
  CHECK(train::training_flops(train::gpt_forward_flops_per_token(c, 12)) == 6 * N + 3 * attention);
  CHECK(test::message_of([&] { (void)train::gpt_forward_flops_per_token(c, 0); }).find("sequence length 0") != std::string::npos);
}

TEST_CASE("GPT-2 124M: the parameter count GPT-2 publishes and bench/gpt_train's FLOPs per token", "[train][flops]") {
  const models::GptConfig gpt2{.vocab = 50257, .max_seq = 1024, .layers = 12, .heads = 12, .dim = 768};
  const double N = 124'439'808;  // GPT-2 small with its 1024 positions, the tied head counted once
  CHECK(static_cast<double>(gpt2.parameter_count()) == N);
  CHECK(train::training_flops(train::gpt_forward_flops_per_token(gpt2, 1024)) == 6 * N + 12.0 * 12 * 1024 * 768);
}

TEST_CASE("CnnFlops: a small CNN counted by hand, convolution by convolution", "[train][flops]") {
  // (2, 9, 9) → 3×3 conv, padding 1, to 4 → (4, 9, 9) → 3×3 max pool, stride 2 → (4, 4, 4)
  // → 3×3 grouped conv (2 groups), stride 1, to 6 → (6, 2, 2) → 1×1 conv, stride 2, to 8 → (8, 1, 1)
  // → linear to 10
  train::CnnFlops f({2, 9, 9});
  f.conv(4, 3, 1, 1).pool(3, 2).conv(6, 3, 1, 0, 2).conv(8, 1, 2).linear(10);
  const double conv1 = 2.0 * (3 * 3 * 2) * 4 * 9 * 9;
  const double conv2 = 2.0 * (3 * 3 * 4 / 2) * 6 * 2 * 2;
  const double conv3 = 2.0 * (1 * 1 * 6) * 8 * 1 * 1;
  const double fc = 2.0 * 8 * 10;
  CHECK(f.forward_flops() == conv1 + conv2 + conv3 + fc);
  CHECK(f.weights() == 3 * 3 * 2 * 4 + 3 * 3 * 2 * 6 + 6 * 8 + 8 * 10);
  CHECK(f.shape() == train::ImageShape{10, 1, 1});

  train::CnnFlops g({3, 4, 4});
  train::CnnFlops shortcut = g.branch();
  g.conv(5, 3, 2, 1);  // (5, 2, 2)
  CHECK(test::message_of([&] { (void)train::CnnFlops(g).join(shortcut); }).find("the branch ends in (3, 4, 4)") != std::string::npos);
  g.join(shortcut.conv(5, 1, 2));
  CHECK(g.forward_flops() == 2.0 * 27 * 5 * 4 + 2.0 * 3 * 5 * 4);
  CHECK(test::message_of([&] { (void)train::CnnFlops({1, 2, 2}).conv(1, 5); }).find("smaller than the kernel 5") != std::string::npos);
  CHECK(test::message_of([&] { (void)train::CnnFlops({3, 2, 2}).conv(4, 1, 1, 0, 2); }).find("groups 2") != std::string::npos);
}

TEST_CASE("ResNet (Fashion-MNIST's CNN): hand count, and the walk meets the built model's weights", "[train][flops]") {
  // 8×8 images, 1 channel, width 2, one block per stage, 3 classes.
  const models::ResNetConfig c{.in_channels = 1, .width = 2, .blocks_per_stage = 1, .classes = 3};
  const auto conv = [](double k, double cin, double cout, double hw) { return 2 * k * k * cin * cout * hw * hw; };
  const double stem = conv(3, 1, 2, 8);
  const double stage1 = conv(3, 2, 2, 8) + conv(3, 2, 2, 8);                     // no projection
  const double stage2 = conv(3, 2, 4, 4) + conv(3, 4, 4, 4) + conv(1, 2, 4, 4);  // stride 2, 1×1 projection
  const double stage3 = conv(3, 4, 8, 2) + conv(3, 8, 8, 2) + conv(1, 4, 8, 2);
  const double fc = 2.0 * 8 * 3;
  CHECK(train::resnet_forward_flops_per_image(c, 8, 8) == stem + stage1 + stage2 + stage3 + fc);

  for (const models::ResNetConfig& m : {c, models::ResNetConfig{.width = 4, .blocks_per_stage = 3},
                                        models::ResNetConfig{.in_channels = 3, .width = 5, .blocks_per_stage = 2, .classes = 7}}) {
    auto net = models::ResNet<float>::make(m);
    const train::CnnFlops f = train::resnet_flops(m, 28, 28);
    CAPTURE(m.in_channels, m.width, m.blocks_per_stage, m.classes);
    CHECK(f.weights() == matrix_weights(net));
    CHECK(f.shape() == train::ImageShape{m.classes, 1, 1});
  }
}

TEST_CASE("ResNet-50: torchvision's 4.09 GMACs at 224 px; bottleneck walks meet the built models' weights", "[train][flops]") {
  const double forward = train::bottleneck_resnet_forward_flops_per_image({}, 224);
  CAPTURE(forward);
  CHECK(std::abs(forward / (2 * 4.09e9) - 1) < 0.005);  // torchvision's table: 4.09 "GFLOPS", multiply-adds
  for (const models::BottleneckResNetConfig& m :
       {models::BottleneckResNetConfig{.width = 4, .blocks = {1, 2, 1, 1}, .classes = 5},
        models::BottleneckResNetConfig{.in_channels = 1, .width = 2, .blocks = {3, 4, 6, 3}, .classes = 10}}) {
    auto net = models::BottleneckResNet<float>::make(m);
    const train::CnnFlops f = train::bottleneck_resnet_flops(m, 64);
    CAPTURE(m.width, m.in_channels);
    CHECK(f.weights() == matrix_weights(net));
  }
}

TEST_CASE("MLP: 2·in·out per linear layer", "[train][flops]") {
  const models::MlpConfig c{.inputs = 784, .hidden = 256, .depth = 3, .classes = 10};
  CHECK(train::mlp_forward_flops_per_sample(c) == 2.0 * (784 * 256 + 2 * 256 * 256 + 256 * 10));
  auto net = models::Mlp<float>::make(c);
  CHECK(train::mlp_flops(c).weights() == matrix_weights(net));
}

TEST_CASE("bf16 peaks by the names CUDA reports: NVIDIA's datasheet figures (sparse / 2)", "[train][flops]") {
  struct Case {
    const char* name;
    double datasheet_sparse;  // "BF16 Tensor Core" TFLOPS with sparsity
  };
  for (const Case& c : {Case{"NVIDIA H100 80GB HBM3", 1979}, Case{"NVIDIA H100 PCIe", 1513}, Case{"NVIDIA H100 NVL", 1671},
                        Case{"NVIDIA H200", 1979}, Case{"NVIDIA H200 NVL", 1671}, Case{"NVIDIA GH200 480GB", 1979},
                        Case{"NVIDIA A100-SXM4-80GB", 624}, Case{"NVIDIA A100-PCIE-40GB", 624},
                        Case{"NVIDIA A100 80GB PCIe", 624}, Case{"NVIDIA A10", 250}, Case{"NVIDIA A30", 330},
                        Case{"NVIDIA A40", 299.4}, Case{"NVIDIA L40S", 733}, Case{"NVIDIA L40", 362.1},
                        Case{"NVIDIA L4", 242}, Case{"nvidia h100 80gb hbm3", 1979}, Case{"NVIDIA B200", 4500}}) {
    CAPTURE(c.name);
    CHECK(std::abs(train::peak_bf16_tflops(c.name) / (c.datasheet_sparse / 2) - 1) < 0.015);
  }
  for (const char* unknown : {"", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090", "NVIDIA A10G", "NVIDIA H1000"}) {
    CAPTURE(unknown);
    CHECK(std::isnan(train::peak_bf16_tflops(unknown)));
  }
  for (const train::GpuPeak& p : train::kGpuPeaks) {  // no entry hidden behind another
    CAPTURE(p.name);
    CHECK(train::peak_bf16_tflops("NVIDIA " + std::string(p.name)) == p.bf16_tflops);
  }
}

TEST_CASE("MFU: model FLOPs per second over the GPUs' peak; NaN without a peak or a time", "[train][flops]") {
  CHECK(train::mfu(4e15, 2.0, 4000.0) == 0.5);  // 2 PFLOP/s of 4 PFLOP/s
  // GPT-2 124M at 464k tokens/s on one H100 SXM: 6N + 12·L·T·C FLOPs per token over 989.4 TFLOP/s.
  const double per_token = 6 * 124'439'808.0 + 12.0 * 12 * 1024 * 768;
  CHECK(std::abs(train::mfu(per_token * 16 * 1024, 16 * 1024 / 464e3, 989.4) - per_token * 464e3 / 989.4e12) < 1e-12);
  CHECK(std::isnan(train::mfu(1e12, 1.0, std::nan(""))));
  CHECK(std::isnan(train::mfu(1e12, 0.0, 1000.0)));
  CHECK(std::isnan(train::mfu(1e12, 1.0, 0.0)));
}
