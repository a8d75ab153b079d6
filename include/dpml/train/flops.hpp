#pragma once
// Model FLOPs of a training step, the bf16 peak of a GPU by its name, and MFU (model FLOPs
// utilisation: the FLOPs the model needs per second over what the GPUs could do).
//
// Counting, the convention of bench/gpt_train and bench/resnet_train (so MFU here compares with
// bench/RESULTS.md):
//   - a multiply-add is 2 FLOPs; only matrix products count — Linear (2·in·out per row), Conv2d
//     (2·k_h·k_w·C_in/groups·C_out·H_out·W_out per image) and attention's QKᵀ and AV. BatchNorm,
//     LayerNorm, pooling, activations, softmax, biases, the loss and the optimizer are a few
//     operations per activation or parameter, against 2·k²·C_in (a convolution) or 2·in (a
//     linear layer) per output: a few % in the smallest CNNs, under 1 % at GPT-2 or ResNet-50
//     sizes; left out.
//   - a training step is 3 × the forward: the forward, the input gradient and the weight
//     gradient are one product of the same size each (training_flops). The network's first
//     convolution computes no input gradient, but counts 3× as well, as the bench counts it
//     (ResNet-50 at 224 px: +1 % of the step).
//   - model FLOPs, not hardware FLOPs: recomputation (--recompute-granularity)
//     and the vocabulary's padding to GEMM tiles add work that is not counted.
//   - GPT, per token (Kaplan et al. 2020; PaLM's appendix B): forward 2·N + 4·L·T·C, training
//     6·N + 12·L·T·C. N = GptConfig::parameter_count(), all parameters, unpadded, with the tied
//     token embedding counted once (it is the LM head's product): as in bench/gpt_train, it also
//     holds the position embedding, the LayerNorms and the biases, which multiply nothing (0.7 %
//     of N at GPT-2 124M). 4·L·T·C: per block and token, QKᵀ and AV are T·C multiply-adds each
//     over all heads. The causal mask makes half of them unnecessary (flash attention skips those
//     tiles), but the term is NOT halved — PaLM's convention, and the bench's.
//   - ViT, per image: vit_forward_flops_per_image, its linears and attention token by token.
//   - CNNs are counted layer by layer as the image's shape flows through them (CnnFlops), one
//     function per model of models/: each walks the layers its model's make() builds, and a test
//     holds the walk to the built model's weights. (Free functions over the configurations rather
//     than a flops() member on every layer: Conv2d and the blocks keep their geometry private,
//     and a count from the configuration needs no model — any rank, any pipeline stage, before
//     anything is allocated.)
//
// Peaks: bf16 dense tensor-core TFLOP/s per GPU from NVIDIA's datasheets (which print the
// figures with 2:4 sparsity; dense is half), looked up by the name CUDA reports
// (cudaDeviceProp::name); an unknown GPU, or a CPU run, has no peak (NaN) and so no MFU.
//
//   const double flops = train::training_flops(train::gpt_forward_flops_per_token(cfg, T)) * B_global * T;
//   const double peak = train::device_peak_bf16_tflops(rank == 0) * gpus;  // CUDA translation units; host: NaN
//   const double u = train::mfu(flops, step_seconds, peak);                  // NaN where peak is
// (gpus: the GPUs of the run — the world with one rank per GPU, fewer where ranks share them.)

#include "dpml/core/error.hpp"
#include "dpml/models/bottleneck_resnet.hpp"
#include "dpml/models/gpt.hpp"
#include "dpml/models/mlp.hpp"
#include "dpml/models/resnet.hpp"
#include "dpml/models/resnet_block.hpp"
#include "dpml/models/vit.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#if defined(DPML_WITH_CUDA)
#include "dpml/core/cuda_error.hpp"

#include <cuda_runtime.h>

#include <atomic>
#include <iostream>
#endif

namespace dpml::train {

// The FLOPs of a training step from its forward's: forward, input gradient, weight gradient.
inline constexpr double training_flops(double forward_flops) noexcept { return 3.0 * forward_flops; }

// ---------------------------------------------------------------------------------------- GPT

// Forward FLOPs per token of a GPT trained on sequences of seq_len tokens (T ≤ config.max_seq):
// 2·N + 4·L·T·C (top of the file). The whole model's, whatever the layout: divide by the GPUs.
inline double gpt_forward_flops_per_token(const models::GptConfig& c, std::int64_t seq_len) {
  DPML_REQUIRE(seq_len >= 1, "gpt_forward_flops_per_token: sequence length " << seq_len << " must be ≥ 1");
  const double N = static_cast<double>(c.parameter_count());
  return 2.0 * N + 4.0 * static_cast<double>(c.layers) * static_cast<double>(seq_len) * static_cast<double>(c.dim);
}

// ---------------------------------------------------------------------------------------- CNNs

// An image's shape between layers (channels, height, width), whatever the space's layout.
struct ImageShape {
  std::int64_t channels = 0, height = 0, width = 0;
  bool operator==(const ImageShape&) const = default;
};

// Forward FLOPs of one image through a CNN, counted layer by layer as its shape flows through.
// weights() counts the multiplying weights met (convolution and linear weight elements): a test
// compares it with a built model's parameters, which holds a model's walk to its structure.
class CnnFlops {
 public:
  explicit CnnFlops(ImageShape input) : shape_(input) {
    DPML_REQUIRE(input.channels >= 1 && input.height >= 1 && input.width >= 1,
                 "CnnFlops: image (" << input.channels << ", " << input.height << ", " << input.width
                                     << ") must have every dimension ≥ 1");
  }

  // A kernel × kernel convolution to `out` channels (stride, zero padding, groups):
  // 2·k²·C_in/groups·C_out·H_out·W_out; the shape becomes (out, H_out, W_out).
  CnnFlops& conv(std::int64_t out, std::int64_t kernel, std::int64_t stride = 1, std::int64_t padding = 0,
                 std::int64_t groups = 1) {
    DPML_REQUIRE(out >= 1 && kernel >= 1 && stride >= 1 && padding >= 0 && groups >= 1 && shape_.channels % groups == 0 &&
                     out % groups == 0,
                 "CnnFlops::conv: " << shape_.channels << " → " << out << " channels, kernel " << kernel << ", stride "
                                    << stride << ", padding " << padding << ", groups " << groups);
    const std::int64_t h = window(shape_.height, kernel, stride, padding), w = window(shape_.width, kernel, stride, padding);
    const double per_output = static_cast<double>(kernel * kernel * (shape_.channels / groups));  // multiply-adds
    flops_ += 2.0 * per_output * static_cast<double>(out * h * w);
    weights_ += per_output * static_cast<double>(out);
    shape_ = {out, h, w};
    return *this;
  }
  // A kernel × kernel pooling window (max or average): no FLOPs counted, the shape shrinks.
  CnnFlops& pool(std::int64_t kernel, std::int64_t stride, std::int64_t padding = 0) {
    DPML_REQUIRE(kernel >= 1 && stride >= 1 && padding >= 0,
                 "CnnFlops::pool: kernel " << kernel << ", stride " << stride << ", padding " << padding);
    shape_ = {shape_.channels, window(shape_.height, kernel, stride, padding), window(shape_.width, kernel, stride, padding)};
    return *this;
  }
  // Global average pooling: (C, 1, 1).
  CnnFlops& global_pool() {
    shape_ = {shape_.channels, 1, 1};
    return *this;
  }
  // A linear layer on the flattened C·H·W features to `out`: 2·in·out; the shape becomes (out, 1, 1).
  CnnFlops& linear(std::int64_t out) {
    DPML_REQUIRE(out >= 1, "CnnFlops::linear: " << out << " outputs");
    const double in = static_cast<double>(shape_.channels * shape_.height * shape_.width);
    flops_ += 2.0 * in * static_cast<double>(out);
    weights_ += in * static_cast<double>(out);
    shape_ = {out, 1, 1};
    return *this;
  }
  // A branch from the current shape (a shortcut): a walk with the same input and nothing counted.
  CnnFlops branch() const {
    CnnFlops b = *this;
    b.flops_ = b.weights_ = 0;
    return b;
  }
  // Adds the branch's count to this walk's; the branch ends in this walk's shape (a residual sum).
  CnnFlops& join(const CnnFlops& b) {
    DPML_REQUIRE(b.shape_ == shape_, "CnnFlops::join: the branch ends in (" << b.shape_.channels << ", " << b.shape_.height
                                                                            << ", " << b.shape_.width << "), the main path in ("
                                                                            << shape_.channels << ", " << shape_.height << ", "
                                                                            << shape_.width << ")");
    flops_ += b.flops_;
    weights_ += b.weights_;
    return *this;
  }

  double forward_flops() const noexcept { return flops_; }
  double weights() const noexcept { return weights_; }
  const ImageShape& shape() const noexcept { return shape_; }

 private:
  // Output positions of a sliding window along one dimension.
  static std::int64_t window(std::int64_t n, std::int64_t kernel, std::int64_t stride, std::int64_t padding) {
    DPML_REQUIRE(n + 2 * padding >= kernel, "CnnFlops: a dimension of " << n << " (padding " << padding
                                                                        << ") is smaller than the kernel " << kernel);
    return (n + 2 * padding - kernel) / stride + 1;
  }

  ImageShape shape_;
  double flops_ = 0, weights_ = 0;
};

// models::ResNetStem and models::ResNetBlock (resnet_block.hpp): convolutions with padding k/2;
// a block's 1×1 projection shortcut where it changes the channels or the resolution.
inline void resnet_stem_flops(CnnFlops& f, const models::ResNetStemOptions& o) {
  f.conv(o.out, o.kernel, o.stride, o.kernel / 2);
  if (o.pool) f.pool(3, 2, 1);
}
inline void resnet_block_flops(CnnFlops& f, const models::ResNetBlockOptions& o) {
  CnnFlops shortcut = f.branch();
  std::int64_t stride = 1;
  for (const models::ConvUnit& u : o.units) {
    f.conv(u.channels, u.kernel, u.stride, u.kernel / 2);
    stride *= u.stride;
  }
  if (f.shape().channels != o.in || stride != 1) f.join(shortcut.conv(f.shape().channels, 1, stride));
}

// models::ResNet (resnet.hpp; the Fashion-MNIST CNN) on height × width images: forward FLOPs per
// image, in a CnnFlops (weights() for the test).
inline CnnFlops resnet_flops(const models::ResNetConfig& c, std::int64_t height, std::int64_t width) {
  CnnFlops f({c.in_channels, height, width});
  resnet_stem_flops(f, {.in = c.in_channels, .out = c.width, .kernel = 3});
  const std::int64_t stride[3] = {1, 2, 2};
  for (int k = 0; k < 3; ++k)
    for (std::int64_t i = 0; i < c.blocks_per_stage; ++i)
      resnet_block_flops(f, models::ResNetBlockOptions::basic(f.shape().channels, c.width << k, i == 0 ? stride[k] : 1));
  f.global_pool().linear(c.classes);
  return f;
}
inline double resnet_forward_flops_per_image(const models::ResNetConfig& c, std::int64_t height, std::int64_t width) {
  return resnet_flops(c, height, width).forward_flops();
}

// models::BottleneckResNet (bottleneck_resnet.hpp; ResNet-50 by default) on size × size images.
inline CnnFlops bottleneck_resnet_flops(const models::BottleneckResNetConfig& c, std::int64_t size) {
  CnnFlops f({c.in_channels, size, size});
  resnet_stem_flops(f, {.in = c.in_channels, .out = c.width, .kernel = 7, .stride = 2, .pool = true});
  for (int k = 0; k < 4; ++k)
    for (std::int64_t i = 0; i < c.blocks[static_cast<std::size_t>(k)]; ++i)
      resnet_block_flops(f, models::ResNetBlockOptions::bottleneck(f.shape().channels, c.width << k,
                                                                   i == 0 && k > 0 ? 2 : 1));
  f.global_pool().linear(c.classes);
  return f;
}
inline double bottleneck_resnet_forward_flops_per_image(const models::BottleneckResNetConfig& c, std::int64_t size) {
  return bottleneck_resnet_flops(c, size).forward_flops();
}

// models::Mlp (mlp.hpp): forward FLOPs per sample.
inline CnnFlops mlp_flops(const models::MlpConfig& c) {
  CnnFlops f({c.inputs, 1, 1});
  for (std::int64_t i = 0; i < c.depth; ++i) f.linear(c.hidden);
  f.linear(c.classes);
  return f;
}
inline double mlp_forward_flops_per_sample(const models::MlpConfig& c) { return mlp_flops(c).forward_flops(); }

// models::Vit (vit.hpp): forward FLOPs per image. L = 1 + T tokens after the class token: the patch
// embedding 2·T·(Cin·P²)·C; per block and token 2·(3C² + C² + 2·C·hidden) in its linears and
// 4·L·C in QKᵀ and AV; the head 2·C·classes (on the class token only).
inline double vit_forward_flops_per_image(const models::VitConfig& c) {
  const double T = static_cast<double>(c.tokens()), L = 1 + T, C = static_cast<double>(c.dim);
  const double hidden = static_cast<double>(c.mlp_hidden > 0 ? c.mlp_hidden : 4 * c.dim);
  const double block = L * (2 * (4 * C * C + 2 * C * hidden) + 4 * L * C);
  return 2 * T * static_cast<double>(c.channels * c.patch * c.patch) * C + static_cast<double>(c.layers) * block +
         2 * C * static_cast<double>(c.classes);
}

// ------------------------------------------------------------------------------- peaks and MFU

// A GPU's bf16 dense tensor-core peak. `name`: words of cudaDeviceProp::name.
struct GpuPeak {
  std::string_view name;
  double bf16_tflops;
};

// NVIDIA's datasheets give "BF16 Tensor Core" TFLOP/s with 2:4 sparsity (*); dense is half.
inline constexpr GpuPeak kGpuPeaks[] = {
    {"B200", 2250.0},      // HGX B200 datasheet: FP16/BF16 36 PFLOPS* for 8 GPUs → 4.5 PFLOPS* per GPU
    {"H200", 989.4},       // H200 datasheet (SXM): 1,979 TFLOPS*; the H100 SXM's tensor cores and clocks
    {"H200 NVL", 835.5},   // H200 datasheet (NVL): 1,671 TFLOPS*
    {"GH200", 989.4},      // GH200 datasheet: FP16/BF16 1,979 TFLOPS*
    {"H100", 989.4},       // H100 datasheet (SXM5, "NVIDIA H100 80GB HBM3"): 1,979 TFLOPS*; whitepaper: 989.4 dense
    {"H100 PCIe", 756.0},  // H100 datasheet (PCIe): 1,513 TFLOPS*; whitepaper: 756 dense
    {"H100 NVL", 835.5},   // H100 datasheet (NVL): 1,671 TFLOPS*
    {"A100", 312.0},       // A100 datasheet (SXM4 and PCIe, 40 and 80 GB): 312 | 624*
    {"A30", 165.0},        // A30 datasheet: 165 | 330*
    {"A40", 149.7},        // A40 datasheet: 149.7 | 299.4*
    {"A10", 125.0},        // A10 datasheet: 125 | 250*
    {"L40S", 362.05},      // L40S datasheet: 362.05 | 733*
    {"L40", 181.05},       // L40 datasheet: 181.05 | 362.1*
    {"L4", 121.0},         // L4 datasheet: 242 TFLOPS*
};

namespace detail {
inline bool is_word_char(char c) noexcept { return std::isalnum(static_cast<unsigned char>(c)) != 0; }
// Whether `key` occurs in `text` as whole words (no letter or digit on either side), ignoring case.
inline bool contains_words(std::string_view text, std::string_view key) noexcept {
  const auto same = [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
  };
  for (std::size_t at = 0; at + key.size() <= text.size(); ++at) {
    if (!std::equal(key.begin(), key.end(), text.begin() + static_cast<std::ptrdiff_t>(at), same)) continue;
    const bool left = at == 0 || !is_word_char(text[at - 1]);
    const bool right = at + key.size() == text.size() || !is_word_char(text[at + key.size()]);
    if (left && right) return true;
  }
  return false;
}
}  // namespace detail

// The bf16 dense TFLOP/s of the GPU named `device_name` (cudaDeviceProp::name, e.g. "NVIDIA H100
// 80GB HBM3"): the longest name in kGpuPeaks found in it as whole words, ignoring case ("H100
// PCIe" before "H100"; "A10" is not in "A100" nor "A10G", "H200" not in "GH200"); NaN when none is.
inline double peak_bf16_tflops(std::string_view device_name) noexcept {
  const GpuPeak* best = nullptr;
  for (const GpuPeak& p : kGpuPeaks)
    if (detail::contains_words(device_name, p.name) && (!best || p.name.size() > best->name.size())) best = &p;
  return best ? best->bf16_tflops : std::numeric_limits<double>::quiet_NaN();
}

// Model FLOPs utilisation of a step, a fraction (0.45: 45 %): flops_per_step / seconds over the
// peak of all the GPUs that ran it (peak_tflops_total = per-GPU peak × GPUs). NaN when the peak
// is unknown (NaN) or the time is not positive.
inline double mfu(double flops_per_step, double seconds, double peak_tflops_total) noexcept {
  if (!(seconds > 0) || !(peak_tflops_total > 0)) return std::numeric_limits<double>::quiet_NaN();
  return flops_per_step / seconds / (peak_tflops_total * 1e12);
}

#if defined(DPML_WITH_CUDA)
// The peak of CUDA device `device` (the current one by default), by its name. An unknown GPU
// gives NaN, and where `say_unknown` a line on stderr naming it, once per process (pass
// rank == 0 to hear it once per run).
inline double device_peak_bf16_tflops(bool say_unknown = true, int device = -1) {
  if (device < 0) DPML_CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  DPML_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  const double peak = peak_bf16_tflops(prop.name);
  static std::atomic<bool> said{false};
  if (std::isnan(peak) && say_unknown && !said.exchange(true))
    std::cerr << "dpml: no bf16 peak known for GPU '" << prop.name
              << "' (train/flops.hpp, kGpuPeaks): MFU is not reported\n";
  return peak;
}
#endif

}  // namespace dpml::train
