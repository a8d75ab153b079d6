#pragma once
// Attention mask policies: which keys a query may attend to. One tag per policy, read by the
// attention layer (layers/attention.hpp) and by each space's attention family, which says through
// Ops<Space>::attention_mask_supported(Mask{}) whether it has a kernel for it (the host and the
// GPU have both; a space without one refuses at the layer's construction instead of silently
// running another mask). The GPU's flash kernels take no key-padding mask yet: a forward given one
// there is refused.
//
//   attention::Causal          query i attends to keys j ≤ i                  (a decoder: GPT)
//   attention::Bidirectional   every query attends to every valid key         (an encoder: ViT)
//                              keys (B, T), host bytes, 1 = valid, 0 = padded: a padded key gets
//                              probability 0 in every row; null: every key is valid
//
// A padded query still gets an output (its attention over the valid keys), as in BERT: what the
// model reads from padded positions is the caller's business.

#include <cstdint>

namespace dpml::attention {

struct Causal {
  static constexpr const char* name = "causal";
};

struct Bidirectional {
  static constexpr const char* name = "bidirectional";
  const std::uint8_t* keys = nullptr;  // (B, T) 1 = valid key; null: all valid
};

}  // namespace dpml::attention
