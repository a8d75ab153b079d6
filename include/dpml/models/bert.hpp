#pragma once
// A BERT-style encoder trained as a masked language model (Devlin et al. 2019), pre-LN:
//
//   tokens (B, T), some masked (data/masked_lm.hpp) → wte + wpe (B, T, C) → L pre-LN blocks of
//   bidirectional attention (B, T, C) → ln_f → logits = h · wteᵀ (B, T, V), the head tied to the
//   token embedding → cross-entropy over the masked positions only (targets −1 elsewhere: no loss,
//   no gradient), divided by the masked positions of the whole step
//
// It is models::Gpt's stage model with attention::Bidirectional for its mask policy (gpt.hpp): the
// same embedding (vocabulary-parallel over the tensor axis), blocks (heads and MLP split over the
// tensor axis), pipeline stages (blocks cut into pp contiguous stages; the tied head's copy of wte
// on the last stage, its gradient summed with the first stage's) and head (vocabulary-parallel
// cross-entropy) — written once, so any (dp, tp, pp) layout trains what one process does. What is
// BERT's is the configuration: every query attends to every key, targets < 0 are ignored
// (GptConfig::masked_targets) and evaluation counts the masked tokens predicted right
// (GptConfig::count_hits; take_hits(): the masked-token accuracy's numerator).
//
// Where this differs from the original BERT, and why: pre-LN blocks with a final LayerNorm (GPT-2's,
// stable without warm-up tricks) instead of post-LN with an embedding LayerNorm; the MLM head is
// ln_f then the tied decoder, without BERT's extra dense + GELU + LayerNorm transform and output
// bias; no segment (token-type) embedding and no [CLS]/[SEP]: byte windows of one text have one
// segment and no next-sentence objective. Parameter names are GPT-2's (wte, wpe, h.<i>.…, ln_f).
//
//   models::Bert<float> bert({.layers = 4, .heads = 4, .dim = 128, .max_seq = 128}, grid);
//   train::Trainer<models::Bert<float>, train::ModelLoss, Strategy, optim::AdamW> trainer(bert, grid, …);
//   trainer.train_step(masked.batch(b), lr);     // data::MaskedLmWindows
//
// On CudaSpace (examples/train_bert --device cuda) the flash kernels run it bidirectional; they take
// no key-padding mask, which whole windows of a text do not need.

#include "dpml/comm/mpi.hpp"
#include "dpml/data/masked_lm.hpp"
#include "dpml/kernels/attention_mask.hpp"
#include "dpml/models/gpt.hpp"
#include "dpml/parallel/device_grid.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/parallel/tensor.hpp"

#include <concepts>
#include <cstdint>

namespace dpml::models {

struct BertConfig {
  std::int64_t vocab = data::kMaskedByteVocab;  // V: the 256 bytes and [MASK] (data/masked_lm.hpp)
  std::int64_t max_seq = 128;                   // T_max: rows of the position table
  std::int64_t layers = 4;                      // L
  std::int64_t heads = 4;                       // divides dim; divisible by tp
  std::int64_t dim = 128;                       // C
  std::int64_t pad_multiple = 1;                // V padded to a multiple of tp · pad_multiple
  bool recompute = false;                       // activation recomputation per block
  bool recompute_gelu = false;                  // the MLP's GELU output shared by all blocks, recomputed

  // The stage model's configuration: masked targets, masked-token hits counted in evaluation.
  GptConfig encoder() const {
    return {.vocab = vocab, .max_seq = max_seq, .layers = layers, .heads = heads, .dim = dim, .pad_multiple = pad_multiple,
            .recompute = recompute, .recompute_gelu = recompute_gelu, .masked_targets = true, .count_hits = true};
  }
  std::int64_t parameter_count() const { return encoder().parameter_count(); }
};

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>>
class Bert : public Gpt<T, Space, Comm, attention::Bidirectional> {
  using Base = Gpt<T, Space, Comm, attention::Bidirectional>;

 public:
  // Host: the grid's MPI groups (collective over the pipeline axis when pp > 1).
  Bert(const BertConfig& c, const parallel::ProcessGrid& grid)
    requires std::same_as<Comm, comm::Mpi>
      : Base(c.encoder(), grid) {}
  // Any space: the device communicators of `comms`, which outlive the model.
  template <class DataComm>
  explicit Bert(const BertConfig& c, const parallel::DeviceGrid<Comm, DataComm>& comms) : Base(c.encoder(), comms) {}
};

}  // namespace dpml::models
