// ImageTransform: normalisation against a float64 reference; random crop and flip equal to one of
// the (2·pad + 1)² · 2 candidate windows computed in float64, reproducible from (seed, epoch,
// sample) alone (so independent of which rank, or which batch, reads the sample), covering every
// offset and both flips.
#include "test.hpp"

#include <dpml/data/image.hpp>

#include <cmath>
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

using namespace dpml;

namespace {

constexpr int H = 6, W = 5;

std::vector<std::uint8_t> random_pixels(std::uint64_t salt, std::size_t n) {
  auto gen = test::rng(salt);
  std::vector<std::uint8_t> p(n);
  for (auto& x : p) x = static_cast<std::uint8_t>(gen() % 256);
  return p;
}

// float64 reference: window at offset (dy, dx) of the zero-padded image, optionally mirrored.
std::vector<double> reference(const std::uint8_t* src, int dy, int dx, bool mirror, double mean, double sd) {
  std::vector<double> out(H * W);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      const int sy = y + dy, sx = (mirror ? W - 1 - x : x) + dx;
      const double p = (sy >= 0 && sy < H && sx >= 0 && sx < W) ? src[sy * W + sx] : 0.0;
      out[static_cast<std::size_t>(y * W + x)] = (p / 255.0 - mean) / sd;
    }
  return out;
}

double max_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

}  // namespace

TEST_CASE("image transform: normalisation", "[data][image]") {
  const auto src = random_pixels(31, H * W);
  const data::ImageTransform t{.mean = data::kFashionMnistMean, .std = data::kFashionMnistStd};
  std::vector<float> out(H * W);
  t.apply(src.data(), out.data(), H, W, 0, 0);
  CHECK(max_diff(out, reference(src.data(), 0, 0, false, 0.2860, 0.3530)) < 1e-5);
  CHECK(out[0] == test::Approx((src[0] / 255.0 - 0.2860) / 0.3530).epsilon(1e-5));
}

TEST_CASE("image transform: random crop with padding and flip", "[data][image]") {
  const int pad = 2, samples = 400;
  const auto pixels = random_pixels(32, static_cast<std::size_t>(samples) * H * W);
  const data::ImageTransform t{.mean = 0.5f, .std = 0.25f, .pad = pad, .flip = true, .seed = 7};
  std::set<std::tuple<int, int, bool>> seen;
  int differs_next_epoch = 0;
  std::vector<float> out(H * W), again(H * W), next_epoch(H * W);
  for (int s = 0; s < samples; ++s) {
    const std::uint8_t* src = pixels.data() + static_cast<std::size_t>(s) * H * W;
    t.apply(src, out.data(), H, W, 3, s);
    // Exactly the float64 window of one choice (the first match; distinct pixels make it unique).
    bool found = false;
    for (int dy = -pad; dy <= pad && !found; ++dy)
      for (int dx = -pad; dx <= pad && !found; ++dx)
        for (bool mirror : {false, true})
          if (!found && max_diff(out, reference(src, dy, dx, mirror, 0.5, 0.25)) < 1e-5) {
            found = true;
            seen.insert({dy, dx, mirror});
          }
    CAPTURE(s);
    CHECK(found);
    t.apply(src, again.data(), H, W, 3, s);
    CHECK(again == out);  // a pure function of (seed, epoch, sample)
    t.apply(src, next_epoch.data(), H, W, 4, s);
    differs_next_epoch += next_epoch != out;
  }
  CHECK(seen.size() == 5u * 5u * 2u);           // every offset and both flips occur
  CHECK(differs_next_epoch > samples * 8 / 10);  // a new epoch draws anew (same choice: 1/50)
}

TEST_CASE("image dataset: gather transforms by global index, whatever the batch", "[data][image]") {
  const std::int64_t n = 10;
  data::IdxArray images{"mem-images", {n, H, W}, random_pixels(33, static_cast<std::size_t>(n) * H * W)};
  data::IdxArray labels{"mem-labels", {n}, random_pixels(34, static_cast<std::size_t>(n))};
  const data::ImageDataset ds(images, labels);
  const data::ImageTransform t{.mean = 0.3f, .std = 0.3f, .pad = 1, .flip = true, .seed = 5};
  const std::vector<std::int64_t> both{9, 4}, one{4};
  std::vector<float> x2(2 * H * W), x1(H * W);
  std::vector<std::int32_t> y2(2), y1(1);
  ds.gather(both, t, 1, x2.data(), y2.data());
  ds.gather(one, t, 1, x1.data(), y1.data());
  CHECK(std::vector<float>(x2.begin() + H * W, x2.end()) == x1);  // sample 4, read in either batch
  CHECK(y2[0] == labels.bytes[9]);
  CHECK(y1[0] == labels.bytes[4]);
  const std::vector<std::int64_t> bad{10};
  CHECK_THROWS_AS(ds.gather(bad, t, 1, x1.data(), y1.data()), Error);
}
