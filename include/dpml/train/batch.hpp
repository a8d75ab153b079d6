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
// tokens for sequences, so every layout sums to the same mean.
//
// A batch type without a specialisation fails TrainBatch<B> (the trainer's static_assert names
// it); specialise BatchTraits for a type of your own beside it.

#include "dpml/core/tensor.hpp"
#include "dpml/data/loader.hpp"
#include "dpml/data/token_shards.hpp"

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

// Token windows and their next tokens (data::TokenWindows): the global batch comes from the trainer.
template <>
struct BatchTraits<data::TokenBatch> {
  static TensorView<const std::int32_t> inputs(const data::TokenBatch& b) { return b.inputs.cview(); }    // (n, T)
  static TensorView<const std::int32_t> targets(const data::TokenBatch& b) { return b.targets.cview(); }  // (n, T)
  static std::int64_t global_rows(const data::TokenBatch&) { return 0; }
};

template <class B>
concept TrainBatch = requires(const B& b) {
  BatchTraits<B>::inputs(b).slice(0, 0, 0);
  BatchTraits<B>::targets(b).slice(0, 0, 0);
  { BatchTraits<B>::global_rows(b) } -> std::convertible_to<std::int64_t>;
};

}  // namespace dpml::train
