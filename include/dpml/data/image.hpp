#pragma once
// Image datasets: uint8 grayscale images with int labels (Fashion-MNIST, MNIST, any IDX pair),
// and the per-sample transform that turns them into normalised floats.
//
// ImageTransform: x = (pixel / 255 − mean) / std, after an optional random crop with padding
// (pad the image by `pad` zero pixels on each side, cut an (H, W) window at a random offset —
// torchvision's RandomCrop(H, padding=pad)) and an optional horizontal flip with probability ½.
// The random choices come from Philox keyed by (seed, epoch, global sample index): a sample is
// transformed identically whatever the number of ranks and whichever rank reads it.
//
// ImageDataset::from_idx(images, labels) reads an IDX pair (data/idx.hpp) and checks that the
// counts agree; fashion_mnist(split, directory) finds the four Fashion-MNIST files (gzipped or
// plain) in /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist) or elsewhere.
// Every rank reads the whole dataset (60k × 28 × 28 bytes = 47 MB), so file errors are raised
// with Scope::everywhere by default.

#include "dpml/core/error.hpp"
#include "dpml/core/philox.hpp"
#include "dpml/data/idx.hpp"

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dpml::data {

inline constexpr float kFashionMnistMean = 0.2860f;  // of pixel / 255 over the training set
inline constexpr float kFashionMnistStd = 0.3530f;
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

namespace detail {
// Philox stream of the augmentation of one epoch (the sampler's shuffle uses other streams).
inline constexpr std::uint64_t augment_stream(std::int64_t epoch) {
  return 0x4155'4700'0000'0000ull ^ static_cast<std::uint64_t>(epoch);
}
}  // namespace detail

struct ImageTransform {
  float mean = 0.0f;  // of pixel / 255
  float std = 1.0f;
  int pad = 0;        // random crop: zero padding on each side (0: no crop)
  bool flip = false;  // random horizontal flip
  std::uint64_t seed = 0;

  // dst (H, W) floats from src (H, W) bytes, for global sample `sample` in `epoch`.
  void apply(const std::uint8_t* src, float* dst, int H, int W, std::int64_t epoch, std::int64_t sample) const {
    DPML_REQUIRE(std > 0.0f, "image normalisation std " << std << " must be positive");
    DPML_REQUIRE(pad >= 0 && pad < H && pad < W, "random-crop padding " << pad << " for " << H << "x" << W << " images");
    // One Philox block per sample: word 0 → dy, word 1 → dx, word 2 → flip.
    const auto r = PhiloxStream(seed, detail::augment_stream(epoch)).block(static_cast<std::uint64_t>(sample));
    const int dy = pad > 0 ? static_cast<int>(r[0] % static_cast<std::uint32_t>(2 * pad + 1)) - pad : 0;
    const int dx = pad > 0 ? static_cast<int>(r[1] % static_cast<std::uint32_t>(2 * pad + 1)) - pad : 0;
    const bool mirror = flip && (r[2] & 1u);
    const float scale = 1.0f / (255.0f * std), shift = -mean / std;
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < W; ++x) {
        const int sy = y + dy, sx = (mirror ? W - 1 - x : x) + dx;
        const bool inside = sy >= 0 && sy < H && sx >= 0 && sx < W;
        const float pixel = inside ? static_cast<float>(src[sy * W + sx]) : 0.0f;
        dst[y * W + x] = pixel * scale + shift;
      }
  }
};

class ImageDataset {
 public:
  // images: (N, H, W) uint8; labels: (N) uint8.
  ImageDataset(IdxArray images, IdxArray labels, Scope scope = Scope::everywhere)
      : images_(std::move(images)), labels_(std::move(labels)) {
    if (images_.dims.size() != 3) throw Error("IDX file '" + images_.path + "' does not hold images (N, H, W)", scope);
    if (labels_.dims.size() != 1) throw Error("IDX file '" + labels_.path + "' does not hold labels (N)", scope);
    if (images_.count() != labels_.count())
      throw Error("image and label counts differ: '" + images_.path + "' holds " + std::to_string(images_.count()) + " images, '" +
                      labels_.path + "' " + std::to_string(labels_.count()) + " labels",
                  scope);
  }
  static ImageDataset from_idx(const std::string& images_path, const std::string& labels_path, Scope scope = Scope::everywhere) {
    IdxArray images = read_idx(images_path, 3, scope);  // images first: errors name files in a fixed order
    return ImageDataset(std::move(images), read_idx(labels_path, 1, scope), scope);
  }

  std::int64_t size() const noexcept { return images_.count(); }
  int height() const noexcept { return static_cast<int>(images_.dims[1]); }
  int width() const noexcept { return static_cast<int>(images_.dims[2]); }
  const std::uint8_t* image(std::int64_t i) const noexcept { return images_.bytes.data() + i * height() * width(); }
  std::int32_t label(std::int64_t i) const noexcept { return labels_.bytes[static_cast<std::size_t>(i)]; }
  const std::string& images_path() const noexcept { return images_.path; }

  // The samples `indices` (global indices), transformed: images (n, 1, H, W), labels (n).
  void gather(std::span<const std::int64_t> indices, const ImageTransform& t, std::int64_t epoch, float* images,
              std::int32_t* labels) const {
    const std::int64_t hw = std::int64_t{height()} * width();
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const std::int64_t i = indices[k];
      DPML_REQUIRE(i >= 0 && i < size(), "sample " << i << " out of " << size() << " in '" << images_.path << "'");
      t.apply(image(i), images + static_cast<std::int64_t>(k) * hw, height(), width(), epoch, i);
      labels[k] = label(i);
    }
  }

 private:
  IdxArray images_, labels_;
};

enum class Split { train, test };

// Fashion-MNIST's train (60000) or test (10000) split from `directory`; each file may be gzipped
// ("…-ubyte.gz", as Debian ships them) or plain ("…-ubyte").
inline ImageDataset fashion_mnist(Split split, const std::string& directory = kFashionMnistDir, Scope scope = Scope::everywhere) {
  const std::string prefix = split == Split::train ? "train" : "t10k";
  auto find = [&](const std::string& name) {
    const std::filesystem::path plain = std::filesystem::path(directory) / name;
    std::filesystem::path gz = plain;
    gz += ".gz";
    std::error_code ec;
    if (std::filesystem::exists(gz, ec)) return gz.string();
    if (std::filesystem::exists(plain, ec)) return plain.string();
    throw Error("Fashion-MNIST file '" + gz.string() + "' does not exist (nor '" + plain.string() +
                    "'): install dataset-fashion-mnist or point the data directory elsewhere",
                scope);
  };
  const std::string images = find(prefix + "-images-idx3-ubyte");
  return ImageDataset::from_idx(images, find(prefix + "-labels-idx1-ubyte"), scope);
}

}  // namespace dpml::data
