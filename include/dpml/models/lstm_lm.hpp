#pragma once
// A recurrent language model: tokens (B, T) → Embedding (B, T, E), no position table → Lstm
// (B, T, H) → [Lstm (B, T, H)] × (layers − 1) → Linear head (B, T, V): the logits of every next
// token, which layers::SoftmaxCrossEntropy takes with the (B, T) targets as B·T rows. A character
// (byte) model with V = 256 is examples/train_lstm.
//
// Written as models::Mlp is: a Sequential whose children are the library's layers, the first LSTM
// a child of its own and the others a Stack, so that train::Trainer cuts it into pipeline stages
// with no code of the model's (train/layer_stage.hpp cuts a Sequential between its children: with
// pp 2 the first LSTM and the rest fall on either side when balanced by parameters). One
// definition for every element type and space; the LSTM cell has host kernels only so far
// (kernels/cuda/lstm.hpp).

#include "dpml/core/error.hpp"
#include "dpml/layers/embedding.hpp"
#include "dpml/layers/linear.hpp"
#include "dpml/layers/lstm.hpp"
#include "dpml/layers/sequential.hpp"
#include "dpml/layers/stack.hpp"

#include <cstdint>
#include <vector>

namespace dpml::models {

struct LstmLmConfig {
  std::int64_t vocab = 256;        // V
  std::int64_t embedding = 0;      // E (0: hidden)
  std::int64_t hidden = 256;       // H
  std::int64_t layers = 2;         // LSTM layers
  double forget_bias = 1.0;        // each LSTM's forget-gate bias at the start

  std::int64_t embedding_dim() const noexcept { return embedding > 0 ? embedding : hidden; }
  std::int64_t parameter_count() const noexcept {
    const std::int64_t E = embedding_dim(), H = hidden;
    const auto lstm = [H](std::int64_t in) { return 4 * H * (in + H) + 4 * H; };  // weight_ih, weight_hh, bias
    return vocab * E + lstm(E) + (layers - 1) * lstm(H) + H * vocab + vocab;
  }
};

template <class T = float, class Space = HostSpace>
struct LstmLm {
  using Lstm = layers::Lstm<T, Space>;
  using Linear = layers::Linear<T, Space>;
  using Network = layers::Sequential<layers::Embedding<T, Space>, Lstm, layers::Stack<Lstm>, Linear>;

  static Network make(const LstmLmConfig& c) {
    DPML_REQUIRE_EVERYWHERE(c.vocab >= 1 && c.hidden >= 1 && c.layers >= 1 && c.embedding >= 0,
                            "LSTM language model: vocab " << c.vocab << ", hidden " << c.hidden << ", layers " << c.layers
                                                          << " must be ≥ 1 (embedding " << c.embedding << " ≥ 0)");
    const layers::LstmOptions lstm{.name = "lstm", .forget_bias = c.forget_bias};
    std::vector<Lstm> more;
    for (std::int64_t i = 1; i < c.layers; ++i) more.emplace_back(c.hidden, c.hidden, lstm);
    return Network(layers::Embedding<T, Space>({.vocab = c.vocab, .dim = c.embedding_dim(), .positions = false}),
                   Lstm(c.embedding_dim(), c.hidden, lstm), layers::Stack<Lstm>(std::move(more), "layers"),
                   Linear(c.hidden, c.vocab, {.name = "head"}));
  }
};

}  // namespace dpml::models
