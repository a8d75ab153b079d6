// Loader: over two epochs and several rank counts, the batches equal direct reading (sampler slice
// → ImageDataset::gather); an exception on the worker reaches the consumer at the batch it
// concerns, after the earlier batches; abandoning an epoch midway is safe.
#include "test.hpp"

#include <dpml/data/loader.hpp>

#include <cstdint>
#include <stdexcept>
#include <vector>

using namespace dpml;

namespace {

data::ImageDataset small_dataset(std::int64_t n, int h, int w) {
  auto gen = test::rng(41);
  data::IdxArray images{"mem-images", {n, h, w}, std::vector<std::uint8_t>(static_cast<std::size_t>(n * h * w))};
  data::IdxArray labels{"mem-labels", {n}, std::vector<std::uint8_t>(static_cast<std::size_t>(n))};
  for (auto& p : images.bytes) p = static_cast<std::uint8_t>(gen() % 256);
  for (auto& l : labels.bytes) l = static_cast<std::uint8_t>(gen() % 10);
  return data::ImageDataset(images, labels);
}

// An ImageSource whose gather fails on one sample.
struct Failing {
  const data::ImageDataset& inner;
  std::int64_t bad;
  std::int64_t size() const { return inner.size(); }
  int height() const { return inner.height(); }
  int width() const { return inner.width(); }
  void gather(std::span<const std::int64_t> idx, const data::ImageTransform& t, std::int64_t epoch, float* x, std::int32_t* y) const {
    for (auto i : idx)
      if (i == bad) throw std::runtime_error("sample " + std::to_string(i) + " is unreadable");
    inner.gather(idx, t, epoch, x, y);
  }
};

}  // namespace

TEST_CASE("loader: the same batches as direct reading", "[data][loader]") {
  const auto ds = small_dataset(50, 7, 6);
  const data::ImageTransform t{.mean = 0.3f, .std = 0.4f, .pad = 2, .flip = true, .seed = 3};
  for (int ranks : {1, 3}) {
    for (int r = 0; r < ranks; ++r) {
      CAPTURE(ranks, r);
      const data::SamplerOptions o{.global_batch = 8, .seed = 11, .drop_last = false};
      data::Loader loader(ds, data::DistributedSampler(ds.size(), o, r, ranks), t);
      data::DistributedSampler direct(ds.size(), o, r, ranks);
      for (std::int64_t epoch : {0, 1}) {
        loader.start_epoch(epoch);
        direct.set_epoch(epoch);
        std::int64_t b = 0;
        while (const data::Batch* batch = loader.next()) {
          const auto idx = direct.local_batch(b);
          const auto n = static_cast<std::int64_t>(idx.size());
          std::vector<float> x(static_cast<std::size_t>(n * 7 * 6));
          std::vector<std::int32_t> y(static_cast<std::size_t>(n));
          ds.gather(idx, t, epoch, x.data(), y.data());
          CHECK(batch->epoch == epoch);
          CHECK(batch->index == b);
          CHECK(batch->global_size == (b < 6 ? 8 : 2));
          REQUIRE(batch->images.shape() == Shape{n, 1, 7, 6});
          CHECK(std::vector<float>(batch->images.begin(), batch->images.end()) == x);
          CHECK(std::vector<std::int32_t>(batch->labels.begin(), batch->labels.end()) == y);
          ++b;
        }
        CHECK(b == 7);  // 6 full global batches of 8 and one of 2
        CHECK(loader.next() == nullptr);
      }
    }
  }
}

TEST_CASE("loader: a worker exception reaches the consumer at its batch", "[data][loader]") {
  const auto ds = small_dataset(40, 4, 4);
  const data::SamplerOptions o{.global_batch = 4, .shuffle = false};
  const Failing failing{ds, 21};  // in batch 5
  data::Loader<Failing> loader(failing, data::DistributedSampler(ds.size(), o), {});
  for (int attempt = 0; attempt < 2; ++attempt) {  // and again after a restart
    loader.start_epoch(0);
    for (int b = 0; b < 5; ++b) {
      const data::Batch* batch = loader.next();
      REQUIRE(batch != nullptr);
      CHECK(batch->index == b);
    }
    CHECK_THROWS_WITH(loader.next(), "sample 21 is unreadable");
    CHECK_THROWS_WITH(loader.next(), "sample 21 is unreadable");  // stays failed
  }
}

TEST_CASE("loader: abandoning an epoch midway and destruction with a batch pending", "[data][loader]") {
  const auto ds = small_dataset(64, 5, 5);
  data::Loader loader(ds, data::DistributedSampler(ds.size(), {.global_batch = 4, .seed = 1}), {});
  CHECK_THROWS_AS(loader.next(), Error);  // before start_epoch
  loader.start_epoch(0);
  REQUIRE(loader.next() != nullptr);
  loader.start_epoch(1);  // the worker of epoch 0 is stopped
  int batches = 0;
  while (loader.next()) ++batches;
  CHECK(batches == 16);
  loader.start_epoch(2);  // destroyed with the worker waiting for a free buffer
}
