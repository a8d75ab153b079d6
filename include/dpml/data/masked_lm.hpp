#pragma once
// Masked-LM data (BERT's pre-training objective) over token windows: each position of a window is
// chosen with probability 0.15; a chosen position becomes the [MASK] token 80 % of the time, a
// random token 10 %, and stays itself 10 %; the model is trained to give the original token at the
// chosen positions only (the targets of the others are −1: the loss ignores them).
//
// The draw is a pure function of (seed, sample, position) through Philox — never of the rank, the
// step or the micro-batch — so every layout masks alike, and a rank knows the masks of the whole
// global batch without communication: MaskedLmBatch::global_masked (the masked positions of the
// step over all data ranks) is the loss's divisor (train/batch.hpp), so the loss is the mean over
// the global batch's masked tokens and every layout's gradient is the sequential one.
//
//   draw_mask(rule, seed, sample, position)   one block of Philox(key seed, stream sample) at
//                                             counter `position`: word 0 → chosen (u < 0.15),
//                                             word 1 → mask / random / keep (u < 0.8, < 0.9),
//                                             word 2 → the random token (mod rule.random_tokens)
//   MaskedLmWindows(windows, rule, seed)      a TokenWindows' batches, masked: the sample of a
//                                             window is epoch · windows + its index (dynamic
//                                             masking: another draw every epoch, as RoBERTa's;
//                                             the validation windows, epoch 0, keep theirs)
//
// Vocabulary (byte-level text, examples/train_bert): ids 0–255 are the bytes, 256 is [MASK]
// (kMaskToken): V = 257. No [PAD] (windows are full), no [CLS]/[SEP] (no sentence pairs: no
// next-sentence objective). Over token shards of vocabulary V the mask token is V and the model's
// vocabulary V + 1. Random replacements are drawn from the real tokens [0, V), never [MASK].

#include "dpml/core/error.hpp"
#include "dpml/core/philox.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/data/token_shards.hpp"

#include <cstdint>
#include <span>

namespace dpml::data {

inline constexpr std::int32_t kMaskToken = 256;        // [MASK] after the 256 bytes
inline constexpr std::int64_t kMaskedByteVocab = 257;  // bytes + [MASK]

struct MaskRule {
  double select = 0.15;             // a position is chosen (trained on)
  double mask = 0.8;                // a chosen position becomes [MASK] …
  double random = 0.1;              // … or a random real token (the rest: itself)
  std::int32_t mask_token = kMaskToken;
  std::int64_t random_tokens = 256; // real tokens [0, random_tokens): the random replacements
};

enum class MaskAction : std::uint8_t { none, mask, random, keep };

struct MaskDraw {
  MaskAction action = MaskAction::none;
  std::int32_t random_token = 0;  // the replacement when action is random
};

// The draw of position `position` of sample `sample` (see the top of the file).
inline MaskDraw draw_mask(const MaskRule& r, std::uint64_t seed, std::uint64_t sample, std::uint64_t position) {
  constexpr std::uint64_t kSalt = 0x4d4c4d0000000000ull;  // "MLM": apart from other draws keyed by the seed
  const auto words = PhiloxStream(seed ^ kSalt, sample).block(position);
  if (static_cast<double>(PhiloxStream::uniform_of(words[0])) >= r.select) return {};
  const double u = PhiloxStream::uniform_of(words[1]);
  const auto token = static_cast<std::int32_t>(words[2] % static_cast<std::uint32_t>(r.random_tokens));
  if (u < r.mask) return {MaskAction::mask, 0};
  if (u < r.mask + r.random) return {MaskAction::random, token};
  return {MaskAction::keep, 0};
}

// One window (T) masked: inputs (T) as drawn, targets (T) the original token where chosen, −1
// elsewhere. Returns the chosen positions.
inline std::int64_t mask_window(const MaskRule& r, std::uint64_t seed, std::uint64_t sample, const std::int32_t* tokens,
                                std::int32_t* inputs, std::int32_t* targets, std::int64_t T) {
  std::int64_t chosen = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    const MaskDraw d = draw_mask(r, seed, sample, static_cast<std::uint64_t>(t));
    inputs[t] = d.action == MaskAction::mask ? r.mask_token : d.action == MaskAction::random ? d.random_token : tokens[t];
    targets[t] = d.action == MaskAction::none ? -1 : tokens[t];
    chosen += d.action != MaskAction::none;
  }
  return chosen;
}

struct MaskedLmBatch {
  Tensor<std::int32_t> inputs;     // (n, T) the windows, masked
  Tensor<std::int32_t> targets;    // (n, T) the original token at chosen positions, −1 elsewhere
  std::int64_t global_rows = 0;    // windows of the step over all data ranks
  std::int64_t global_masked = 0;  // chosen positions of the step over all data ranks
};

// A TokenWindows' batches for a masked LM (the windows' first T tokens; their shifted targets are
// not used). Holds a reference: `windows` outlives it, and set_epoch goes to the windows.
class MaskedLmWindows {
 public:
  MaskedLmWindows(TokenWindows& windows, MaskRule rule, std::uint64_t seed) : windows_(&windows), rule_(rule), seed_(seed) {
    DPML_REQUIRE_EVERYWHERE(rule.select > 0 && rule.select <= 1 && rule.mask >= 0 && rule.random >= 0 &&
                                rule.mask + rule.random <= 1 && rule.random_tokens >= 1,
                            "masked LM: selection " << rule.select << " must be in (0, 1], and the [MASK] " << rule.mask
                                                    << " and random " << rule.random << " shares in [0, 1] with a sum ≤ 1");
  }

  std::int64_t batches_per_epoch() const noexcept { return windows_->batches_per_epoch(); }
  void set_epoch(std::int64_t epoch) { windows_->set_epoch(epoch); }

  // This rank's windows of step b of the current epoch, masked.
  MaskedLmBatch batch(std::int64_t b) const { return masked(windows_->batch(b), windows_->sampler().local_batch(b), b); }
  // All ranks' windows of step b (what one process would train on).
  MaskedLmBatch global_batch(std::int64_t b) const {
    return masked(windows_->global_batch(b), windows_->sampler().global_batch(b), b);
  }

  // The sample a window's draws are keyed by.
  std::uint64_t sample_of(std::int64_t window) const noexcept {
    return static_cast<std::uint64_t>(windows_->sampler().epoch() * windows_->windows() + window);
  }

 private:
  MaskedLmBatch masked(const TokenBatch& plain, std::span<const std::int64_t> ids, std::int64_t b) const {
    const std::int64_t n = plain.inputs.size(0), T = plain.inputs.size(1);
    MaskedLmBatch out{Tensor<std::int32_t>(Shape{n, T}), Tensor<std::int32_t>(Shape{n, T})};
    for (std::int64_t i = 0; i < n; ++i)
      mask_window(rule_, seed_, sample_of(ids[static_cast<std::size_t>(i)]), plain.inputs.data() + i * T,
                  out.inputs.data() + i * T, out.targets.data() + i * T, T);
    const auto all = windows_->sampler().global_batch(b);
    out.global_rows = static_cast<std::int64_t>(all.size());
    for (const std::int64_t w : all)
      for (std::int64_t t = 0; t < T; ++t)
        out.global_masked += draw_mask(rule_, seed_, sample_of(w), static_cast<std::uint64_t>(t)).action != MaskAction::none;
    return out;
  }

  TokenWindows* windows_;
  MaskRule rule_;
  std::uint64_t seed_;
};

}  // namespace dpml::data
