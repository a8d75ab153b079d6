#pragma once
// Loader: this rank's batches of an epoch, each prepared on a background thread while the
// previous one is in use (double buffering).
//
// Two Batch buffers alternate. The worker fills batch b into buffer b mod 2 as soon as the
// consumer has released batch b − 2 (by asking for batch b − 1), so at most one batch is
// prepared ahead and nothing is copied. An exception on the worker (a bad sample, a transform
// error) is stored and rethrown by next() at the batch it concerns; the batches before it are
// delivered normally. The worker only reads the dataset and writes the buffers: it makes no MPI
// call, so the main thread keeps MPI to itself (MPI_THREAD_SERIALIZED).
//
//   Loader loader(dataset, DistributedSampler(dataset.size(), {.global_batch = 256, .seed = 1}, dp_rank, dp_size),
//                 {.mean = kFashionMnistMean, .std = kFashionMnistStd, .pad = 2, .flip = true, .seed = 1});
//   for (std::int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.start_epoch(epoch);
//     while (const Batch* batch = loader.next()) { ... batch->images, batch->labels ... }
//   }

#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/data/image.hpp"
#include "dpml/data/sampler.hpp"

#include <array>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <utility>

namespace dpml::data {

// What the loader reads from: an image dataset (ImageDataset, or a user's type with these members).
template <class D>
concept ImageSource = requires(const D& d, std::span<const std::int64_t> indices, const ImageTransform& t, std::int64_t epoch,
                               float* images, std::int32_t* labels) {
  { d.size() } -> std::convertible_to<std::int64_t>;
  { d.height() } -> std::convertible_to<int>;
  { d.width() } -> std::convertible_to<int>;
  d.gather(indices, t, epoch, images, labels);
};

struct Batch {
  std::int64_t epoch = 0;
  std::int64_t index = 0;        // global batch number within the epoch (the step)
  std::int64_t global_size = 0;  // samples of this step over all data-parallel ranks: the loss divisor
  Tensor<float> images;          // (n, 1, H, W), normalised
  Tensor<std::int32_t> labels;   // (n)
  std::int64_t size() const noexcept { return labels.numel(); }
};

template <ImageSource D = ImageDataset>
class Loader {
 public:
  // `data` must outlive the loader.
  Loader(const D& data, DistributedSampler sampler, ImageTransform transform)
      : data_(data), sampler_(std::move(sampler)), transform_(transform) {
    DPML_REQUIRE(sampler_.dataset_size() == static_cast<std::int64_t>(data.size()),
                 "sampler covers " << sampler_.dataset_size() << " samples, the dataset holds " << data.size());
  }
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;
  ~Loader() { stop(); }

  // Starts preparing `epoch` (reshuffled by the sampler); abandons the current epoch if any.
  void start_epoch(std::int64_t epoch) {
    stop();
    sampler_.set_epoch(epoch);
    produced_ = handed_ = released_ = 0;
    error_ = nullptr;
    stopping_ = false;
    worker_ = std::thread([this] { produce(); });
  }

  // The next batch of this rank, valid until the following call; nullptr after the last one.
  const Batch* next() {
    std::unique_lock lock(mutex_);
    DPML_REQUIRE(worker_.joinable(), "Loader::next() called before start_epoch()");
    released_ = handed_;  // the batch handed out last is no longer read
    cv_.notify_all();
    if (handed_ == sampler_.batches_per_epoch()) return nullptr;
    cv_.wait(lock, [&] { return produced_ > handed_ || error_; });
    if (produced_ <= handed_) std::rethrow_exception(error_);
    return &buffers_[static_cast<std::size_t>(handed_++ % 2)];
  }

  std::int64_t batches_per_epoch() const noexcept { return sampler_.batches_per_epoch(); }
  const DistributedSampler& sampler() const noexcept { return sampler_; }

 private:
  void produce() {
    for (std::int64_t b = 0; b < sampler_.batches_per_epoch(); ++b) {
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || b < released_ + 2; });
        if (stopping_) return;
      }
      try {
        fill(buffers_[static_cast<std::size_t>(b % 2)], b);
      } catch (...) {
        std::lock_guard lock(mutex_);
        error_ = std::current_exception();
        cv_.notify_all();
        return;
      }
      std::lock_guard lock(mutex_);
      produced_ = b + 1;
      cv_.notify_all();
    }
  }

  void fill(Batch& batch, std::int64_t b) const {
    const auto indices = sampler_.local_batch(b);
    const auto n = static_cast<std::int64_t>(indices.size());
    batch.epoch = sampler_.epoch();
    batch.index = b;
    batch.global_size = static_cast<std::int64_t>(sampler_.global_batch(b).size());
    batch.images.resize(Shape{n, 1, data_.height(), data_.width()});
    batch.labels.resize(Shape{n});
    data_.gather(indices, transform_, sampler_.epoch(), batch.images.data(), batch.labels.data());
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  const D& data_;
  DistributedSampler sampler_;
  ImageTransform transform_;
  std::array<Batch, 2> buffers_;
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable cv_;
  // Guarded by mutex_: batches finished by the worker, handed to and released by the consumer.
  std::int64_t produced_ = 0, handed_ = 0, released_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
};

}  // namespace dpml::data
