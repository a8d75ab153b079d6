#pragma once
// Token + position embedding, vocabulary-parallel over the tensor axis (Megatron-LM).
//
//   y[b, t] = wte[tokens[b, t]] + wpe[t]          tokens (B, T) int32 → y (B, T, C)
//
// The token table wte is split by rows: the vocabulary is padded up to V_pad, a multiple of
// tp · pad_multiple (pad_multiple = 64 or 128 gives GEMM-friendly shards for the tied LM head),
// and tensor rank k holds rows [k · V_pad/tp, (k + 1) · V_pad/tp). Each rank looks up the tokens
// that fall in its shard (zero rows for the others); reduce_from sums the shards, so exactly one
// rank contributes each row and the sum is exact: the output equals tp = 1 bit for bit. The
// position table wpe is replicated and added after the sum. Padding rows (V ≤ row < V_pad) are
// initialised like the others but never looked up (the tied head's GEMM forms their logits, then
// masks them) and never receive a gradient; a token outside [0, V) is an Error. Both tables start from N(0, 0.02²) (GPT-2), drawn by global index
// (layers/init.hpp), so the real rows are the same whatever V_pad and tp are. A model whose own
// layers know the order of the tokens (a recurrent one: layers/lstm.hpp) leaves the position
// table out (EmbeddingOptions::positions = false): y[b, t] = wte[tokens[b, t]], parameters wte only.
//
// The token ids get no gradient: backward_input returns an empty view. backward_weight adds
// the gradients into this rank's rows of wte (deterministic on both spaces: in token order on the
// host, a sorted scatter on a GPU, kernels/{host,cuda}/embedding.hpp) and into wpe. The LM head
// tied to wte (layers/vocab_parallel_cross_entropy.hpp) adds its gradient into the same wte.grad().
//
// Any space, through kernels::Ops<Space>'s embedding family; the tensor axis' communicator is Comm
// (comm::Mpi on the host, comm::Nccl on a GPU by default). Token range check (Ops::IdCheck,
// kernels/host/id_check.hpp): on the host a bad token throws in forward; on a GPU it is found by a
// kernel, with no host synchronisation, and thrown at a later forward once that kernel's result has
// arrived, or by check_tokens() (which waits for it).

#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/parallel/tensor.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace dpml::layers {

// Which rows of the padded vocabulary one tensor rank holds.
struct VocabPartition {
  std::int64_t vocab = 0;   // V: real tokens
  std::int64_t padded = 0;  // V_pad: multiple of tp · pad_multiple
  std::int64_t begin = 0;   // this rank's rows [begin, end) of the padded table
  std::int64_t end = 0;
  std::int64_t local() const noexcept { return end - begin; }
  // Rows of this shard that are real tokens: [begin, valid_end).
  std::int64_t valid_end() const noexcept { return std::clamp(vocab, begin, end); }
  std::int64_t valid() const noexcept { return valid_end() - begin; }

  static VocabPartition make(std::int64_t vocab, int tp, int tp_rank, std::int64_t pad_multiple = 1) {
    DPML_REQUIRE_EVERYWHERE(vocab > 0 && pad_multiple > 0, "vocabulary size " << vocab << " and pad multiple "
                                                                              << pad_multiple << " must be positive");
    const std::int64_t unit = pad_multiple * tp;
    VocabPartition p;
    p.vocab = vocab;
    p.padded = (vocab + unit - 1) / unit * unit;
    p.begin = p.padded / tp * tp_rank;
    p.end = p.begin + p.padded / tp;
    return p;
  }
};

struct EmbeddingOptions {
  std::int64_t vocab = 0;         // V
  std::int64_t max_seq = 0;       // rows of the position table
  std::int64_t dim = 0;           // C
  std::int64_t pad_multiple = 1;  // V_pad is a multiple of tp · pad_multiple
  std::string token_name = "wte";
  std::string position_name = "wpe";
  double init_std = 0.02;
  bool positions = true;          // false: no position table (max_seq unused)
};

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>>
class Embedding {
  using Ops = kernels::Ops<Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const std::int32_t, Space>;  // (B, T) token ids
  using Output = TensorView<const T, Space>;            // (B, T, C)

  explicit Embedding(const EmbeddingOptions& o, const parallel::TensorRegion<Comm>& region = {})
      : opts_(o), region_(region), part_(VocabPartition::make(o.vocab, region.size(), region.rank(), o.pad_multiple)),
        wte_(o.token_name + ".weight", Shape{part_.local(), o.dim}, Init::normal(0.0, o.init_std), Sharding::split(0)),
        wpe_(o.positions ? Param<T, Space>(o.position_name + ".weight", Shape{o.max_seq, o.dim}, Init::normal(0.0, o.init_std))
                         : Param<T, Space>()),
        check_(kernels::IdRange{"Embedding " + wte_.name(), "token", "the vocabulary"}) {}

  Output forward(Context<Space>& ctx, Input tokens) {
    DPML_REQUIRE(tokens.rank() == 2 && tokens.is_contiguous(),
                 "Embedding " << wte_.name() << ": tokens must be (B, T), got " << tokens.shape().str());
    const std::int64_t B = tokens.size(0), Tn = tokens.size(1), C = opts_.dim;
    DPML_REQUIRE(!opts_.positions || Tn <= opts_.max_seq, "Embedding " << wpe_.name() << ": sequence length " << Tn
                                                   << " exceeds the position table's " << opts_.max_seq << " rows");
    check_.scan(ctx.dev(), tokens.data(), tokens.numel(), opts_.vocab);
    Saved& s = slots_.slot(ctx);
    s.tokens = tokens;
    auto y = ensure(s.y, Shape{B, Tn, C});
    Ops::embedding_token_forward(ctx.dev(), tokens.data(), wte_.value().data(), y.data(), B * Tn, C, part_.begin,
                                 part_.end);
    region_.reduce_from_forward(y);
    if (opts_.positions) Ops::embedding_position_forward(ctx.dev(), wpe_.value().data(), y.data(), B, Tn, C);
    return y;
  }

  // Token ids have no gradient.
  Input backward_input(Context<Space>&, Output) { return Input(nullptr, Shape{0}); }

  // reduce_from's backward is the identity: every rank adds dy into its own rows.
  void backward_weight(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    const std::int64_t B = s.tokens.size(0), Tn = s.tokens.size(1), C = opts_.dim;
    DPML_REQUIRE(dy.shape() == (Shape{B, Tn, C}), "Embedding " << wte_.name() << ": dy " << dy.shape().str()
                                                               << " is not (B, T, C) = " << s.y.shape().str());
    wte_.take_grad_zero();  // it adds: a tied LM head's GEMM after it must add too (ParamBase)
    Ops::embedding_token_backward(ctx.dev(), s.tokens.data(), dy.data(), wte_.grad().data(), B * Tn, C, part_.begin,
                                  part_.end, opts_.vocab);
    if (opts_.positions) Ops::embedding_position_backward(ctx.dev(), dy.data(), wpe_.grad().data(), B, Tn, C);
  }

  // wte (V_pad / tp, C), then wpe (max_seq, C) unless positions = false.
  std::vector<Param<T, Space>*> parameters() {
    if (opts_.positions) return {&wte_, &wpe_};
    return {&wte_};
  }

  // Throws if a token of any forward so far lay outside the vocabulary; on a GPU it waits for the
  // last forward's check (the host has checked already).
  void check_tokens() { check_.raise_if_bad(); }

  // The tied LM head reads and adds into these.
  Param<T, Space>& token_weight() noexcept { return wte_; }  // (V_pad / tp, C)
  const VocabPartition& partition() const noexcept { return part_; }
  const parallel::TensorRegion<Comm>& region() const noexcept { return region_; }

 private:
  struct Saved {
    Input tokens;         // (B, T), the caller's buffer
    Tensor<T, Space> y;   // (B, T, C)
  };

  EmbeddingOptions opts_;
  parallel::TensorRegion<Comm> region_;
  VocabPartition part_;
  Param<T, Space> wte_, wpe_;
  typename Ops::IdCheck check_;
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
