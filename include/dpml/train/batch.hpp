#pragma once
// What the trainer reads from a batch: train::BatchTraits<B>, one specialisation per batch type.
//
//   inputs(b)        (n, …)  the first pipeline stage's input, n = this data rank's samples
//   targets(b)       (n, …)  what the loss compares the output with (labels (n), tokens (n, T))
//   global_rows(b)   samples of the whole step over all data ranks, or 0 when the batch does not
//                    know (the trainer's TrainOptions::global_batch then says)
//
// The trainer cuts a batch into micro-batches along the first dimension (rows [n·i/m, n·(i+1)/m)
// of both views), so the only assumption is that dimension 0 counts samples. The loss divides by
// the step's target elements, global_rows × (elements of targets per row): samples for labels,
// tokens for sequences, so every layout sums to the same mean — or, where only some target
// elements count (a masked LM: the others are −1), by the optional
//   loss_elements(b) the target elements that count over the whole step (all data ranks)
//
// Images in another element type or layout than the loader's float NCHW (a GPU model's bf16 NHWC)
// are an ImageBatch<T>: the loader's batch converted on the host, which the trainer then uploads
// as it is (train::ClassifierTrainer makes one per step where its model needs it).
//
// A batch already in the model's memory (a GPU data pipeline's, decoded and augmented on the device;
// a benchmark's fixed batch) is a ResidentBatch<I, Target, Space>: the trainer reads its views where
// they are, without a copy, so a step's input costs no host-to-device transfer.
//
// A batch type without a specialisation fails TrainBatch<B> (the trainer's static_assert names
// it); specialise BatchTraits for a type of your own beside it.

#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/data/loader.hpp"
#include "dpml/data/masked_lm.hpp"
#include "dpml/data/token_shards.hpp"
#include "dpml/kernels/image.hpp"

#include <algorithm>
#include <concepts>
#include <cstdint>

namespace dpml::train {

template <class B>
struct BatchTraits;  // no definition: a type without its specialisation is not a TrainBatch

// Images and labels (data::Loader): the batch carries the step's global size.
template <>
struct BatchTraits<data::Batch> {
  static TensorView<const float> inputs(const data::Batch& b) { return b.images.cview(); }          // (n, C, H, W)
  static TensorView<const std::int32_t> targets(const data::Batch& b) { return b.labels.cview(); }  // (n)
  static std::int64_t global_rows(const data::Batch& b) { return b.global_size; }
};

// A data::Batch in element type T and an image layout, on the host; labels and the global size are
// the source batch's (which must outlive this batch's use).
template <class T>
class ImageBatch {
 public:
  // From `b`: its images (n, C, H, W) float rounded to T and laid out in `layout`.
  void assign(const data::Batch& b, kernels::ImageLayout layout) {
    const Shape& s = b.images.shape();
    DPML_REQUIRE(s.rank() == 4, "ImageBatch: images " << s.str() << " are not (n, C, H, W)");
    const kernels::ImageDims d{s[0], s[1], s[2], s[3]};
    const Shape shape = layout == kernels::ImageLayout::nchw ? s : Shape{d.N, d.H, d.W, d.C};
    if (converted_.shape() != s) converted_ = Tensor<T>(s);
    if (images_.shape() != shape) images_ = Tensor<T>(shape);
    std::transform(b.images.begin(), b.images.end(), converted_.begin(), [](float v) { return static_cast<T>(v); });
    kernels::to_layout(kernels::ImageLayout::nchw, layout, converted_.data(), images_.data(), d);
    labels_ = b.labels.cview();
    global_size_ = b.global_size;
  }

  TensorView<const T> images() const { return images_.cview(); }                // (n, C, H, W) or (n, H, W, C)
  TensorView<const std::int32_t> labels() const { return labels_; }             // (n)
  std::int64_t global_size() const noexcept { return global_size_; }

 private:
  Tensor<T> converted_, images_;  // NCHW in T; in the layout
  TensorView<const std::int32_t> labels_;
  std::int64_t global_size_ = 0;
};

template <class T>
struct BatchTraits<ImageBatch<T>> {
  static TensorView<const T> inputs(const ImageBatch<T>& b) { return b.images(); }
  static TensorView<const std::int32_t> targets(const ImageBatch<T>& b) { return b.labels(); }
  static std::int64_t global_rows(const ImageBatch<T>& b) { return b.global_size(); }
};

// Views of a batch in `Space`'s memory (the model's), which outlive the step that reads them.
template <class I, class Target, class Space>
struct ResidentBatch {
  TensorView<const I, Space> inputs;        // (n, …) as the model's first stage reads it
  TensorView<const Target, Space> targets;  // (n, …)
  std::int64_t global_rows = 0;             // samples of the step over all data ranks (0: TrainOptions::global_batch)
};

template <class I, class Target, class Space>
struct BatchTraits<ResidentBatch<I, Target, Space>> {
  static TensorView<const I, Space> inputs(const ResidentBatch<I, Target, Space>& b) { return b.inputs; }
  static TensorView<const Target, Space> targets(const ResidentBatch<I, Target, Space>& b) { return b.targets; }
  static std::int64_t global_rows(const ResidentBatch<I, Target, Space>& b) { return b.global_rows; }
};

// Token windows and their next tokens (data::TokenWindows): the global batch comes from the trainer.
template <>
struct BatchTraits<data::TokenBatch> {
  static TensorView<const std::int32_t> inputs(const data::TokenBatch& b) { return b.inputs.cview(); }    // (n, T)
  static TensorView<const std::int32_t> targets(const data::TokenBatch& b) { return b.targets.cview(); }  // (n, T)
  static std::int64_t global_rows(const data::TokenBatch&) { return 0; }
};

// Masked token windows (data::MaskedLmWindows): the batch carries the step's global size and its
// masked positions over all data ranks, the loss's divisor.
template <>
struct BatchTraits<data::MaskedLmBatch> {
  static TensorView<const std::int32_t> inputs(const data::MaskedLmBatch& b) { return b.inputs.cview(); }    // (n, T)
  static TensorView<const std::int32_t> targets(const data::MaskedLmBatch& b) { return b.targets.cview(); }  // (n, T)
  static std::int64_t global_rows(const data::MaskedLmBatch& b) { return b.global_rows; }
  static std::int64_t loss_elements(const data::MaskedLmBatch& b) { return b.global_masked; }
};

template <class B>
concept TrainBatch = requires(const B& b) {
  BatchTraits<B>::inputs(b).slice(0, 0, 0);
  BatchTraits<B>::targets(b).slice(0, 0, 0);
  { BatchTraits<B>::global_rows(b) } -> std::convertible_to<std::int64_t>;
};

}  // namespace dpml::train
