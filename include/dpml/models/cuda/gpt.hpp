#pragma once
// GPT-2 on one GPU, llm.c style, built from dpml's device kernels (kernels/cuda): the same model,
// parameter names and c_attn row layout ((head, {q, k, v}, head_dim)) as the host models::Gpt, so
// the two can be compared parameter by parameter (copy_from / copy_to).
//
// Memory, all allocated at construction for one (B, T) — a step never reaches cudaMalloc:
//   params   one flat bf16 buffer: every tensor at a 64-element-aligned offset (16-byte aligned
//            slices for cuBLASLt and the vector loads), wte padded to Vp = V rounded up to a
//            multiple of 128 that tp divides (the pad rows stay zero: the cross-entropy gives their
//            logits zero gradient)
//   master   fp32 copy of params (AdamW updates it and rounds it into params)
//   grads    bf16, same layout. Why bf16: with one micro-batch per step every gradient is written
//            once (micro-batches accumulate in bf16: one more rounding per micro-batch), the GEMMs
//            and column sums accumulate in fp32 and round once; the LayerNorm/bias-gradient kernels take the activations' type; and the grad
//            norm and AdamW read half the bytes. The tied wte gets two contributions (LM head GEMM
//            first, beta = 0, then the embedding backward adds in bf16).
//   m, v     AdamW moments, fp32; master, m and v are one allocation of their own, made when first
//            written (init_random, copy_from, write_state), and never under ZeRO-1 (below)
//   acts     one buffer for the saved activations of all blocks and the backward scratch; per
//            block x, ln_1, qkv, attention output, r1 = x + attention, ln_2, pre-GELU (16·B·T·C
//            bf16 with the GELU output, 12 with recompute_gelu), plus the (B, T, Vp) logits
//            (Vp / tp under tensor parallelism)
//
// Step: zero_grad → forward_backward(tokens, targets) (loss mean over B·T, dlogits in place) →
// update(lr, step): global grad norm (CUB) → clip coefficient on the device → fused AdamW that
// reads it (a non-finite norm skips the step) → finish_step() (the norm; the loss scale). No host
// synchronisation except loss(), grad_norm() and finish_step().
//
// Pipeline stage (GptStagePlan; models/cuda/gpt_pipeline.hpp runs a schedule over it): the model
// is stage s of p and holds blocks StageBlocks::of(L, p, s) (contiguous; the first L mod p stages
// take one more), stage 0 also wte and wpe, stage p − 1 ln_f and the LM head — with a copy of the
// tied wte (same name, same initial values) when it is not stage 0: GptPipeline sums the two
// gradients before the update, so the copies stay equal, and the gradient norm leaves the copy
// out. Names, copy_from / copy_to and init_random speak of the stage's own tensors, with the
// values a whole model (p = 1) has for them. A micro-batch runs as
//
//   forward_micro_batch     F: embedding (stage 0) or the received input, the blocks, and on the
//                           last stage ln_f, logits, loss and at once the head's backward (so no
//                           logits are kept per micro-batch): d(final hidden) is kept instead
//   backward_input_micro_batch   B: the blocks' input gradients, from the received gradient (or the
//                           head's) to the gradient of the stage input (sent; stage 0: the
//                           embedding's). With weight_grad_sets = 0 (W right after B: GPipe, 1F1B)
//                           the weight gradients too, block by block as the unsplit backward does
//   backward_weight_micro_batch  W (weight_grad_sets > 0, ZB-H1): the weight gradients from the
//                           activations and the output gradients B kept in a weight-gradient set
//
// with its buffers named by Slots: one of `activation_sets` (a block's saved activations, the
// stage output, d output, d input — kept from F to W: the schedule's peak in flight), one of
// `input_sets` (the stage input: from its receive to W) and, for a delayed W, one of
// `weight_grad_sets`. Extra memory of a delayed W, per micro-batch between its B and W: d pre-GELU
// (4C), d qkv (3C), d ln_2, d r1, d ln_1 and d block input (C each) per block: 11·B·T·C elements
// (block 0: 10) — about 11/12 of the micro-batch's block activations. A whole model (p = 1)
// keeps its old buffers: one set, and d output, d input and the output are the backward scratch
// and the final hidden.
//
// Data parallel (parallel/cuda/gradient_sync.hpp): with a GradientListener attached, the backward
// of a step's last micro-batch (its W, where W is delayed) tells it after each block that the
// gradients from that block's first tensor to the end of the flat buffer are final (ln_f and the
// blocks behind it), so their all-reduce overlaps the blocks still to come; wpe goes at the end,
// with finish(), before the norm and the update. The tied wte (first written by the LM head, last
// by the embedding backward) lies at the end of a whole model's buffer: when the data axis is
// small enough (listen()) its all-reduce starts with the backward, covering the head's part, and
// the embedding's part comes from every rank's rows all-gathered and added after finish();
// otherwise it is all-reduced at finish(). A pipeline stage's buffer holds its own tensors in the
// host model's order (wte first), so the same calls serve it.
//
// ZeRO-1 (parallel/cuda/distributed_optimizer.hpp): with a ShardedOptimizer attached instead
// (set_distributed_optimizer), that listener reduce-scatters the buckets, holds this rank's shard of
// master, m and v (the model holds none), and does update()'s norm, clipping, AdamW and the
// all-gather of the weights. read_state (hence copy_to) then gathers from the shards' owners: a
// collective over the data axis, every rank must call it; write_state, copy_from and init_random
// hand every rank the whole tensor and it keeps its shards.
//
// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019), degree tp = the size of the tensor group
// given at construction (none, or a group of one: exactly the single-GPU code path and memory):
//   attention   c_attn column-parallel: tensor rank k holds heads [k·H/tp, (k+1)·H/tp), a contiguous
//               block of c_attn's (head, {q, k, v}, head_dim) rows and of its bias; attention runs
//               on those heads; attn.c_proj row-parallel: the input columns of those heads
//   MLP         c_fc column-parallel (4C/tp rows and bias), GELU local, mlp.c_proj row-parallel
//   forward     each row-parallel product is all-reduced (sum) over the tensor axis on the model's
//               stream; tensor rank 0 alone adds the residual and the (replicated) bias into its
//               partial product, so both count once and cost no extra pass
//   backward    the input gradients of c_attn and c_fc (partial sums over this rank's heads or
//               hidden units) are all-reduced in the input-gradient pass (B), before the LayerNorm
//               backward reads them; the row-parallel layers need none (their output gradient is
//               whole on every rank). A delayed W reads the reduced ones.
//   vocabulary  wte (and the tied LM head) row-parallel (Megatron's vocab-parallel embedding and
//               cross-entropy): tensor rank k holds rows [k·Vp/tp, (k+1)·Vp/tp) of the padded
//               table (Vp divisible by tp). The embedding looks up the tokens in its rows (zeros
//               for the others) and one all-reduce composes the rows; the head computes the
//               logits of its columns only, (B, T, Vp/tp), and the cross-entropy combines the
//               rows' max and Σ exp over the tensor axis (kernels/cuda/cross_entropy.hpp:
//               vocab_parallel_xent_*, two all-reduces of B·T and 2·B·T floats); d ln_f, a
//               partial sum over the rank's columns, is all-reduced. The head's GEMMs, the
//               logits, and wte's gradient and optimizer state are divided by tp
//   replicated  LayerNorms, wpe, ln_f and the c_proj biases: every tensor rank computes them from
//               the same whole activations and output gradients (an all-reduce leaves the same
//               bits on every rank), so their gradients and updates agree on all tensor ranks
//               without communication
//   grad norm   over the full model, each element once: tensor rank 0 sums its whole buffer (a
//               last pipeline stage without its tied copy of wte), the others their shards only
//               (kernels/cuda/grad_norm.hpp: grad_norm_squared_ranges), then one all-reduce (sum)
//               of the device double
//   host I/O    copy_from / write_state / init_random take FULL host tensors and keep this rank's
//               part; copy_to / read_state / gradient return full tensors, gathered over the tensor
//               axis — collectives: every tensor rank calls them for the same tensors in the same
//               order. init_random draws the full model, so every tp starts from the same weights.
//   data axis   a GradientSync over the data axis (ranks of equal tensor coordinate: the same
//               layout) averages each rank's flat buffer as at tp = 1: tp × dp works unchanged.
//   ZeRO-1      a distributed optimizer over the data axis shards each tensor rank's own buffer;
//               its norm counts only what this tensor rank counts (above) and is then summed over
//               the tensor axis (ShardedOptimizer::restrict_norm); read_state gathers the parts.
//   pipeline    a stage is tensor-parallel the same way (GptPipeline passes its tensor group): the
//               messages between stages are whole (B, T, C) activations, equal on the ranks of a
//               tensor group, each sent to the rank of equal tensor coordinate on the next stage.
// Comm is comm::Nccl (one GPU per rank) or a communicator with its interface (comm::Staged).
//
// Per-family timing: with a Profiler attached, each kernel family is bracketed by CUDA events;
// Profiler::collect() synchronises and sums the milliseconds per family.
//
// The activation/scratch block is one cudaMalloc at construction (its layout is fixed, so the
// stream-ordered CudaAllocator has nothing to add here).
//
// Precision (the template argument, precision.hpp): Bf16 (default) or Fp16 — the storage type of
// params, grads and activations; master weights and moments are fp32 in both. Fp16 scales the
// loss gradient by a dynamic loss scale S (the cross-entropy's dloss is S/N), divides it out in
// the update (clip_coefficient's inv_scale), and finish_step() halves S after an overflow (the
// device AdamW has already skipped that step) or doubles it after a clean window.

#include "dpml/comm/mpi.hpp"
#include "dpml/comm/nccl.hpp"
#include "dpml/core/bf16.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/kernels/cuda/adamw.hpp"
#include "dpml/kernels/cuda/attention.hpp"
#include "dpml/kernels/cuda/cross_entropy.hpp"
#include "dpml/kernels/cuda/elementwise.hpp"
#include "dpml/kernels/cuda/embedding.hpp"
#include "dpml/kernels/cuda/gemm/dispatch.hpp"
#include "dpml/kernels/cuda/grad_norm.hpp"
#include "dpml/kernels/cuda/layer_norm.hpp"
#include "dpml/kernels/cuda/reduce.hpp"
#include "dpml/models/cuda/precision.hpp"
#include "dpml/models/cuda/profiler.hpp"
#include "dpml/optim/adamw.hpp"
#include "dpml/parallel/cuda/distributed_optimizer.hpp"
#include "dpml/parallel/cuda/gradient_sync.hpp"
#include "dpml/parallel/pipeline/partition.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dpml::models::cuda {

// How a data-parallel whole model reduces the tied wte's gradient (Gpt::listen()): by gathering
// every rank's token rows where that moves fewer bytes than an all-reduce of wte (automatic), or
// always one way (for comparisons: tests, gpt_train --tied-grad).
enum class TiedGradSync { automatic, gather, all_reduce };

struct GptCudaConfig {
  std::int64_t vocab = 50257;   // V
  std::int64_t max_seq = 1024;  // rows of wpe
  std::int64_t layers = 12;     // L
  std::int64_t heads = 12;      // H
  std::int64_t dim = 768;       // C
  bool recompute_gelu = true;   // one (B, T, 4C) GELU output shared by all blocks, recomputed from
                                // the saved pre-activation in the backward (−1.2 GiB at GPT-2 124M,
                                // B=16, T=1024; one extra element-wise pass per block)
  LossScaleOptions loss_scale;  // the Fp16 policy's dynamic loss scale (unused by Bf16)
  // V rounded up to a multiple of 128 that tp divides (wte's rows are split over the tensor ranks).
  std::int64_t padded_vocab(int tp = 1) const {
    const std::int64_t m = std::lcm<std::int64_t>(128, tp);
    return (vocab + m - 1) / m * m;
  }
  // Parameters of the whole unpadded model (what FLOP counts use), whatever the layout.
  std::int64_t parameter_count() const {
    return vocab * dim + max_seq * dim + layers * (12 * dim * dim + 13 * dim) + 2 * dim;
  }
};

// Where a model sits in a pipeline and how many micro-batches it keeps at once (the defaults: a
// whole model, one micro-batch at a time). GptPipeline reads the counts off the schedule
// (parallel/pipeline/partition.hpp: plan_buffers, weight_follows_input).
struct GptStagePlan {
  int stage = 0, stages = 1;  // this model is pipeline stage `stage` of `stages`
  int activation_sets = 1;    // micro-batches between their F and their W at once
  int input_sets = 1;         // stage inputs held at once (from their receive to W)
  int weight_grad_sets = 0;   // micro-batches between their B and a delayed W (0: each W right after its B)
};

// Kernel families of the per-family time breakdown.
// tp_allreduce: the tensor-parallel all-reduces of the forward and backward (none at tp = 1).
enum class Family { gemm, attention, layer_norm, elementwise, embedding, cross_entropy, optimizer, tp_allreduce, count };
inline constexpr std::array<std::string_view, static_cast<int>(Family::count)> kFamilyNames{
    "gemm", "attention", "layer_norm", "elementwise", "embedding", "cross_entropy", "optimizer", "tp_allreduce"};

using Profiler = KernelProfiler<Family>;

namespace detail {
namespace kc = dpml::kernels::cuda;

// How a tensor is cut over the tensor axis: whole on every rank, or rank k holding the k-th block
// of its rows (column-parallel layers) or of every row's columns (row-parallel layers).
enum class Split { none, rows, cols };


// One tensor of the flat buffers: name, this rank's part (rows, cols; cols = 1 for vectors) at
// offset, and how the full host tensor is made of the parts. The device may pad a tensor's rows
// (wte: Vp rows for the host's V): the padding rows are zero and the host never sees them.
struct Slot {
  std::string name;
  std::int64_t rows = 0, cols = 1, offset = 0;
  std::int64_t full_rows = 0;  // rows of the full host tensor (wte: V)
  Split split = Split::none;
  int parts = 1;               // tensor ranks sharing the tensor out (tp when split, else 1)
  std::int64_t numel() const { return rows * cols; }  // of this rank's part, padding included
  std::int64_t host_numel() const { return full_rows * cols * (split == Split::cols ? parts : 1); }
  // full host tensor (host_numel) → this rank's part (numel; its padding rows zero), `rank` of `parts`
  void keep_part(const float* full, float* part, int rank) const {
    if (split == Split::cols) {
      const std::int64_t full_cols = cols * parts;
      for (std::int64_t r = 0; r < rows; ++r) std::copy_n(full + r * full_cols + rank * cols, cols, part + r * cols);
      return;
    }
    const std::int64_t first = split == Split::rows ? rank * rows : 0;  // of the full tensor's rows
    const std::int64_t count = std::clamp<std::int64_t>(full_rows - first, 0, rows);
    std::copy_n(full + first * cols, count * cols, part);
    std::fill(part + count * cols, part + numel(), 0.f);
  }
  // every rank's part, in tensor-rank order (parts × numel) → the full host tensor
  template <class T>
  void assemble(const T* all_parts, T* full) const {
    if (split != Split::cols) {  // the parts' rows stacked: the padded tensor, whose first rows the host's
      std::copy_n(all_parts, host_numel(), full);
      return;
    }
    const std::int64_t full_cols = cols * parts;
    for (int k = 0; k < parts; ++k)
      for (std::int64_t r = 0; r < rows; ++r)
        std::copy_n(all_parts + k * numel() + r * cols, cols, full + r * full_cols + k * cols);
  }
};

}  // namespace detail

template <class Precision = Bf16, class Comm = comm::Nccl>
class Gpt {
 public:
  using Act = typename Precision::type;  // weights, activations and gradients on the device
  using Split = detail::Split;

  // Offsets (elements into the flat buffers) of one block's tensors.
  struct BlockParams {
    std::int64_t ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  };

  // The buffers of one micro-batch of a pipeline step: indices into the plan's sets; weight_grads
  // −1 when the plan has no weight-gradient sets (W right after B).
  struct Slots {
    int set = 0, input = 0, weight_grads = -1;
  };

  // Tensor parallel over `tensor_group` (tp = its size; read during construction only) when given:
  // collective over the group (its communicator is made on the model's stream), every rank passing
  // the same config. nullptr or a group of one: no tensor parallelism.
  Gpt(const GptCudaConfig& cfg, std::int64_t batch, std::int64_t seq, const GptStagePlan& plan = {},
      const comm::Mpi* tensor_group = nullptr)
      : cfg_(cfg), B_(batch), T_(seq), plan_(checked(plan, cfg)), first_(plan.stage == 0),
        last_(plan.stage == plan.stages - 1), range_(parallel::pipeline::StageBlocks::of(cfg.layers, plan.stages, plan.stage)),
        tp_(tensor_group ? tensor_group->size() : 1), tp_rank_(tensor_group ? tensor_group->rank() : 0) {
    const std::int64_t C = cfg.dim;
    DPML_REQUIRE(C % cfg.heads == 0, "GPT (cuda): dim " << C << " is not divisible by heads " << cfg.heads);
    const std::int64_t D = C / cfg.heads;
    DPML_REQUIRE(D == 32 || D == 64 || D == 128, "GPT (cuda): head dim " << D << " must be 32, 64 or 128 (attention kernels)");
    DPML_REQUIRE(seq >= 1 && seq <= cfg.max_seq, "GPT (cuda): sequence length " << seq << " outside [1, max_seq " << cfg.max_seq << "]");
    DPML_REQUIRE(batch >= 1, "GPT (cuda): batch " << batch << " must be positive");
    // Whole heads per tensor rank; then C = H·D and the MLP's 4C split into equal parts as well.
    DPML_REQUIRE_EVERYWHERE(cfg.heads % tp_ == 0, "GPT (cuda): heads " << cfg.heads << " are not divisible by the "
                                                  << "tensor-parallel degree --tp " << tp_ << " (each tensor rank "
                                                  << "takes whole attention heads)");
    Vp_ = cfg.padded_vocab(tp_);
    Vl_ = Vp_ / tp_;
    // Parameter layout: this stage's tensors in the host model's order, except that a whole model
    // holds wte last, so that the tied LM head's gradient (written first) is a bucket at the
    // buffer's end for a data-parallel reduction (set_gradient_sync).
    const bool whole = first_ && last_;
    auto add_wte = [&] { wte_ = add("wte.weight", Vp_, C, tp_ > 1 ? Split::rows : Split::none, cfg.vocab); };
    if (first_ != last_) add_wte();
    if (first_) wpe_ = add("wpe.weight", cfg.max_seq, C);
    for (std::int64_t l = range_.first; l < range_.first + range_.count; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      BlockParams b{};
      b.ln1_w = add(p + "ln_1.weight", C, 1);
      b.ln1_b = add(p + "ln_1.bias", C, 1);
      b.attn_w = add(p + "attn.c_attn.weight", 3 * C, C, Split::rows);
      b.attn_b = add(p + "attn.c_attn.bias", 3 * C, 1, Split::rows);
      b.proj_w = add(p + "attn.c_proj.weight", C, C, Split::cols);
      b.proj_b = add(p + "attn.c_proj.bias", C, 1);
      b.ln2_w = add(p + "ln_2.weight", C, 1);
      b.ln2_b = add(p + "ln_2.bias", C, 1);
      b.fc_w = add(p + "mlp.c_fc.weight", 4 * C, C, Split::rows);
      b.fc_b = add(p + "mlp.c_fc.bias", 4 * C, 1, Split::rows);
      b.fcproj_w = add(p + "mlp.c_proj.weight", C, 4 * C, Split::cols);
      b.fcproj_b = add(p + "mlp.c_proj.bias", C, 1);
      blocks_.push_back(b);
    }
    if (last_) {
      lnf_w_ = add("ln_f.weight", C, 1);
      lnf_b_ = add("ln_f.bias", C, 1);
    }
    if (whole) add_wte();
    n_params_ = total_;
    norm_begin_ = last_ && !first_ ? detail::align_up(Vl_ * C) : 0;  // the tied copy: stage 0 counts wte
    if (tp_ > 1) norm_ranges_ = counted_ranges();

    DPML_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    carve(nullptr);  // sizes only
    DPML_CHECK_CUDA(cudaMalloc(&memory_, carver_.bytes()));
    DPML_CHECK_CUDA(cudaMemsetAsync(memory_, 0, carver_.bytes(), stream_));
    carve(memory_);
    DPML_CHECK_CUDA(cudaMallocHost(&host_losses_, static_cast<std::size_t>(N()) * sizeof(float)));
    if (tp_ > 1) {
      DPML_CHECK_CUDA(cudaMemcpyAsync(norm_range_begin_, norm_ranges_.begin.data(),
                                      norm_ranges_.begin.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice, stream_));
      DPML_CHECK_CUDA(cudaMemcpyAsync(norm_range_before_, norm_ranges_.before.data(),
                                      norm_ranges_.before.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice, stream_));
      DPML_CHECK_CUDA(cudaStreamSynchronize(stream_));
      tensor_.emplace(Comm::from(*tensor_group, stream_));
    }
  }
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;
  ~Gpt() {
    tensor_.reset();  // before the stream it enqueues on
    cudaFreeHost(host_losses_);
    cudaFree(state_memory_);
    cudaFree(gathered_.memory);
    cudaFree(memory_);
    cudaStreamDestroy(stream_);
  }

  const GptCudaConfig& config() const noexcept { return cfg_; }
  cudaStream_t stream() const noexcept { return stream_; }
  // Elements of this rank's flat buffers, padding included (under tp: its parts of the model).
  std::int64_t parameter_count() const noexcept { return n_params_; }
  // Parameters of the full unpadded tensors this model holds (whatever tp; what FLOP counts use).
  std::int64_t real_parameter_count() const {
    std::int64_t n = 0;
    for (const auto& s : slots_) n += s.host_numel();
    return n;
  }
  int tensor_parallel() const noexcept { return tp_; }   // tp
  int tensor_rank() const noexcept { return tp_rank_; }  // this rank's coordinate on the tensor axis
  // Device bytes of the buffers and the optimizer state this rank holds (its shard under ZeRO-1).
  std::size_t device_bytes() const noexcept { return carver_.bytes() + optimizer_state_bytes(); }
  std::size_t optimizer_state_bytes() const noexcept {
    return zero_ ? zero_->state_bytes() : state_memory_ ? 3 * static_cast<std::size_t>(n_params_) * sizeof(float) : 0;
  }
  void set_profiler(Profiler* p) noexcept { prof_ = p; }
  // Data parallel: the listener sees the gradients as the backward finishes them (nullptr: none).
  void set_gradient_sync(parallel::cuda::GradientListener* sync, TiedGradSync tied = TiedGradSync::automatic) {
    DPML_REQUIRE(!zero_, "GPT (cuda): a distributed optimizer is attached; it is the gradient listener");
    listen(sync, tied);
  }
  // ZeRO-1: `zero` (built on weights(), gradients(), parameter_count(), stream()) takes the
  // gradient sync, the update and the optimizer state; attached once, for good. Attach it before
  // initialising the weights, or the full state already allocated is handed over and freed.
  void set_distributed_optimizer(parallel::cuda::ShardedOptimizer* zero, TiedGradSync tied = TiedGradSync::automatic) {
    DPML_REQUIRE(zero && !zero_ && !sync_, "GPT (cuda): set_distributed_optimizer needs an optimizer, once, and no "
                                           "gradient sync attached before it");
    DPML_REQUIRE(zero->size() == static_cast<std::size_t>(n_params_),
                 "GPT (cuda): the distributed optimizer serves " << zero->size() << " elements, the model has " << n_params_);
    if (state_memory_)
      for (State which : {State::master, State::exp_avg, State::exp_avg_sq})
        zero->write(which, 0, download(state_(which), n_params_));
    DPML_CHECK_CUDA(cudaFree(std::exchange(state_memory_, nullptr)));
    master_ = m_ = v_ = nullptr;
    zero_ = zero;
    listen(zero, tied);
    if (tensor_ || sum_over_stages_)  // the full model's norm: this rank's counted ranges, then Σ over the others
      zero->restrict_norm(counted_ranges(), [this](double* norm_sq) { sum_over_model(norm_sq); });
  }
  // A pipeline stage's links to the other stages, set by GptPipeline at construction (before an
  // optimizer is attached). `tied_pair` (first and last stage: a Comm of the two on this model's
  // stream) sums the two copies of wte's gradient in finish_tied_gradients, before the
  // data-parallel reduction of wte, so that plain data parallelism and ZeRO-1 both average the sum
  // (a sum of averages would need the whole averaged gradient, which ZeRO-1's shards never hold).
  // `sum_over_stages` adds a device double over the pipeline, on this model's stream: the
  // squared gradient norm, after this stage's.
  void link_stages(Comm* tied_pair, std::function<void(double*)> sum_over_stages) {
    DPML_REQUIRE(!zero_ && !sync_, "GPT (cuda): link_stages comes before a gradient sync or optimizer is attached");
    DPML_REQUIRE(!tied_pair || first_ || last_, "GPT (cuda): pipeline stage " << plan_.stage << " holds no wte to tie");
    tied_pair_ = tied_pair;
    sum_over_stages_ = std::move(sum_over_stages);
  }
  // First and last stage, once the step's backward is enqueued and its messages with it (a sum
  // enqueued before the last stage's final send would wait for stage 0, which waits for that
  // send): the two copies of wte's gradient summed over the tied pair, then the data-parallel
  // reduction finished — wte's buckets, held back until now (wte lies first in a stage's buffer).
  void finish_tied_gradients() {
    if (!tied_pair_) return;
    tied_pair_->allreduce(grads_ + wte_, static_cast<std::size_t>(Vl_ * cfg_.dim), comm::ReduceOp::sum);
    if (sync_) sync_->finish();
  }
  // Whether the attached listener's path for the tied wte gradient is the gather (listen() below):
  // false without a listener, on pipeline stages and where wte is all-reduced whole.
  bool gathers_tied_gradient() const noexcept { return gathered_.memory != nullptr; }
  // The flat gradient buffer (parameter_count() elements), for a GradientSync.
  Act* gradients() noexcept { return grads_; }
  // The flat 16-bit working weights (parameter_count() elements), for a distributed optimizer.
  Act* weights() noexcept { return params_; }
  const GptStagePlan& plan() const noexcept { return plan_; }
  bool is_first_stage() const noexcept { return first_; }
  bool is_last_stage() const noexcept { return last_; }

  // The fp32 state a checkpoint holds, per tensor: master weights and AdamW's two moments (named
  // as the host optimizer's state slots, optim::AdamW::state_names).
  using State = parallel::cuda::OptimizerState;

  // Host copies of one full tensor's state (its host rows: wte without the padding rows); zeros
  // before any was written. Synchronous; under ZeRO-1 collective over the data axis, under tp over
  // the tensor axis for a split tensor (gathered): every rank calls it.
  void read_state(State which, const std::string& name, std::span<float> dst) const {
    const auto& s = slot(name);
    check_span(s, dst.size());
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream_));
    if (zero_ && !tensor_) {
      zero_->read(which, static_cast<std::size_t>(s.offset), dst);
    } else if (zero_) {  // this rank's part from its owners over the data axis, then the parts over the tensor axis
      std::vector<float> part(static_cast<std::size_t>(s.numel()));
      zero_->read(which, static_cast<std::size_t>(s.offset), part);
      float* staged = nullptr;
      DPML_CHECK_CUDA(cudaMalloc(&staged, part.size() * sizeof(float)));
      const std::unique_ptr<float, DeviceFree> owned(staged);
      DPML_CHECK_CUDA(cudaMemcpy(staged, part.data(), part.size() * sizeof(float), cudaMemcpyHostToDevice));
      gather_full(staged, s, dst.data());
    } else if (!state_memory_) {
      std::fill(dst.begin(), dst.end(), 0.f);
    } else {
      download_full(state_(which), s, dst.data());
    }
  }
  // From the full tensor, this rank keeps its part. Writing the master weights also rounds them
  // into the 16-bit working copy the forward pass reads.
  void write_state(State which, const std::string& name, std::span<const float> src) {
    const auto& s = slot(name);
    check_span(s, src.size());
    std::vector<float> part(static_cast<std::size_t>(s.numel()));
    s.keep_part(src.data(), part.data(), tp_rank_);
    // On the model's stream: it is non-blocking, and a cudaMemcpy from pageable memory may return
    // before its DMA lands, so a plain cudaMemcpy would race the stream's later reads.
    if (zero_) {
      DPML_CHECK_CUDA(cudaStreamSynchronize(stream_));
      zero_->write(which, static_cast<std::size_t>(s.offset), part);
    } else {
      allocate_state();
      DPML_CHECK_CUDA(cudaMemcpyAsync(state_(which) + s.offset, part.data(), part.size() * sizeof(float),
                                      cudaMemcpyHostToDevice, stream_));
    }
    std::vector<Act> rounded;
    if (which == State::master) {
      rounded = std::vector<Act>(part.begin(), part.end());
      DPML_CHECK_CUDA(cudaMemcpyAsync(params_ + s.offset, rounded.data(), rounded.size() * sizeof(Act),
                                      cudaMemcpyHostToDevice, stream_));
    }
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream_));  // part and rounded go out of scope
  }

  // Fill params and master from full host float tensors of the same names (host
  // models::Gpt<float>'s parameters()), this rank's parts of them; zero the optimizer state. Every
  // device tensor must be found.
  template <class ParamPtr>
  void copy_from(const std::vector<ParamPtr>& host) {
    const auto by_name = index(host);
    upload_parts([&](const detail::Slot& s) -> const float* { return find(by_name, s)->value().data(); });
  }
  // Master weights (fp32) into the full host tensors of the same names (collective under tp).
  template <class ParamPtr>
  void copy_to(const std::vector<ParamPtr>& host) const {
    const auto by_name = index(host);
    for (const auto& s : slots_) {
      const auto p = find(by_name, s);
      read_state(State::master, s.name, std::span<float>(p->value().data(), static_cast<std::size_t>(p->numel())));
    }
  }
  // Random initialisation as GPT-2: N(0, 0.02) weights, zero biases, unit LayerNorm gains
  // (for the benchmark; tests use copy_from). Each weight element takes two draws of one
  // splitmix64 stream that runs over the whole model's tensors in order; splitmix64 is a counter,
  // so a pipeline stage starts each of its tensors where a whole model would be: the same values.
  // Every tensor rank draws the full tensors and keeps its parts: the same model whatever tp.
  void init_random(std::uint64_t seed) {
    std::uint64_t draws = 0;
    auto uniform = [&] {  // splitmix64 → (0, 1)
      std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + 1 + ++draws * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return (static_cast<double>((z ^ (z >> 31)) >> 11) + 0.5) / 9007199254740992.0;
    };
    auto is_ln = [](const detail::Slot& s) { return s.name.find("ln_") != std::string::npos; };
    auto is_bias = [](const detail::Slot& s) { return s.name.ends_with(".bias"); };
    auto drawn = [&](const detail::Slot& s) { return is_ln(s) || is_bias(s) ? 0 : s.host_numel(); };
    std::int64_t per_block = 0;  // elements drawn by one block (all blocks are alike)
    for (const auto& s : slots_)
      if (s.name.starts_with("h." + std::to_string(range_.first) + ".")) per_block += drawn(s);
    const std::int64_t embeddings = (cfg_.vocab + cfg_.max_seq) * cfg_.dim;  // wte, wpe: drawn first
    std::vector<float> full;
    upload_parts([&](const detail::Slot& s) -> const float* {  // called for the slots in order
      // Where the whole model's stream is at the first tensor of wte, wpe and each block.
      if (s.name == "wte.weight") draws = 0;
      else if (s.name == "wpe.weight") draws = 2 * static_cast<std::uint64_t>(cfg_.vocab * cfg_.dim);
      else if (s.name.starts_with("h.") && s.name.ends_with(".ln_1.weight"))
        draws = 2 * static_cast<std::uint64_t>(embeddings + block_index(s.name) * per_block);
      const bool ln = is_ln(s), bias = is_bias(s);
      full.assign(static_cast<std::size_t>(s.host_numel()), 0.f);
      for (float& v : full) {
        if (ln && !bias) v = 1.f;
        else if (!bias) v = static_cast<float>(0.02 * std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()));
      }
      return full.data();
    });
  }

  // Gradient of the named full tensor (host rows only) of the last forward_backward, as float and
  // without the loss scale; synchronises (under tp a split tensor is gathered: collective). Under
  // ZeRO-1 only this rank's shards hold the average.
  std::vector<float> gradient(const std::string& name) const {
    const auto& s = slot(name);
    std::vector<Act> g(static_cast<std::size_t>(s.host_numel()));
    download_full(grads_, s, g.data());
    std::vector<float> out(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) out[i] = static_cast<float>(static_cast<double>(static_cast<float>(g[i])) / step_scale_);
    return out;
  }
  std::vector<std::string> parameter_names() const {
    std::vector<std::string> n;
    for (const auto& s : slots_) n.push_back(s.name);
    return n;
  }

  // Every activation and scratch byte set to 0xFF (NaN in bf16 and fp32), for tests: a kernel
  // that reads what nothing wrote turns the loss or a gradient into NaN.
  void poison_activations() {
    DPML_CHECK_CUDA(cudaMemsetAsync(memory_ + acts_offset_, 0xFF, carver_.bytes() - acts_offset_, stream_));
  }

  // One forward + backward on tokens/targets (B, T) int32 on the device. The first of a step's
  // `micro_batches` (accumulate = false) zeroes the gradients; every one adds the gradient of its
  // mean loss / micro_batches, so that afterwards they hold the gradient of the step's mean loss.
  // A whole model only (a pipeline stage runs the *_micro_batch members, GptPipeline).
  void forward_backward(const std::int32_t* tokens, const std::int32_t* targets, bool accumulate = false,
                        int micro_batches = 1) {
    require_whole_model("forward_backward");
    DPML_REQUIRE(micro_batches >= 1, "GPT (cuda): " << micro_batches << " micro-batches");
    if (!accumulate) begin_step(micro_batches);
    micro_batches_ = micro_batches;
    micro_index_ = accumulate ? micro_index_ + 1 : 0;
    forward_micro_batch(micro_index_, Slots{}, tokens, targets);
    backward_input_micro_batch(micro_index_, Slots{}, tokens);
  }
  // Forward only (validation): loss() afterwards; no gradient is touched.
  void evaluate(const std::int32_t* tokens, const std::int32_t* targets) {
    require_whole_model("evaluate");
    forward(bind(Slots{}), tokens, targets, /*train=*/false);
  }

  // ---- a pipeline stage's step (GptPipeline runs these in its schedule's order) ----------------
  // Zeroes the gradients; the loss gradient of each micro-batch is its mean over B·T / micro_batches.
  void begin_step(int micro_batches) {
    DPML_REQUIRE(micro_batches >= 1, "GPT (cuda): " << micro_batches << " micro-batches");
    step_scale_ = loss_scale();
    zero_grads();
    micro_batches_ = micro_batches;
  }
  // F of micro-batch `mb` (0-based in its step): first stage from tokens (B, T), others from
  // stage_input(s.input); last stage: the loss against targets (B, T) and the head's backward.
  void forward_micro_batch(int mb, Slots s, const std::int32_t* tokens, const std::int32_t* targets) {
    accumulate_ = mb > 0;  // the head's wte gradient: micro-batch 0 writes, the others add
    forward(bind(s), tokens, targets, /*train=*/true);
  }
  // B: from output_gradient(s.set) (received, or the head's) to input_gradient(s.set); with no
  // weight-gradient sets the weight gradients too (stage 0: the embedding's, from tokens (B, T)).
  void backward_input_micro_batch(int mb, Slots s, const std::int32_t* tokens) {
    backward(mb, s, fused_ ? Pass::both : Pass::input, tokens);
  }
  // W: the weight gradients B left for later (nothing when B formed them).
  void backward_weight_micro_batch(int mb, Slots s, const std::int32_t* tokens) {
    if (!fused_) backward(mb, s, Pass::weight, tokens);
  }
  // The message buffers, (B, T, C) each: the stage input (stages > 0 receive it), the stage output
  // (stages < p − 1 send it), the gradient of the output (stages < p − 1 receive it) and of the
  // input (stages > 0 send it).
  Act* stage_input(int input) { return inputs_.at(static_cast<std::size_t>(input)); }
  const Act* stage_output(int set) const { return sets_.at(static_cast<std::size_t>(set)).output; }
  Act* output_gradient(int set) { return sets_.at(static_cast<std::size_t>(set)).output_grad; }
  const Act* input_gradient(int set) const { return sets_.at(static_cast<std::size_t>(set)).input_grad; }
  std::int64_t message_elements() const noexcept { return N() * cfg_.dim; }
  // The per-token losses of the last forward (B·T floats on the device; last stage).
  const float* token_losses() const noexcept { return losses_; }
  // Mean loss of the last forward_backward or evaluate; synchronises.
  double loss() const {
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream_));
    double s = 0;
    for (std::int64_t i = 0; i < N(); ++i) s += host_losses_[i];
    return s / static_cast<double>(N());
  }
  // Global norm → clip → AdamW (step ≥ 1). clip ≤ 0: no clipping. The norm and the clipping are
  // of the unscaled gradients; a non-finite norm (fp16: an overflow) skips the update on the
  // device (AdamW sees a NaN coefficient).
  // Under ZeRO-1 the distributed optimizer does all of it on this rank's shards (every rank calls it).
  void update(double lr, std::int64_t step, const optim::AdamWOptions& opt, double clip) {
    if (zero_) {
      return timed(Family::optimizer, [&] {
        zero_->update(lr, step, opt, clip > 0 ? clip : 1e300, 1.0 / step_scale_, norm_sq_, clip_coef_);
      });
    }
    allocate_state();
    timed(Family::optimizer, [&] {
      // The full model's squared norm, each element once: this rank's part — a last stage leaves
      // out its tied copy of wte, a tensor rank counts its ranges — summed over the others.
      if (!tensor_) {
        detail::kc::grad_norm_squared(grads_ + norm_begin_, n_params_ - norm_begin_, norm_sq_, norm_ws_, norm_ws_bytes_, stream_);
      } else {
        detail::kc::grad_norm_squared_ranges(grads_, norm_range_begin_, norm_range_before_, norm_ranges_.count(),
                                             norm_ranges_.total(), norm_sq_, norm_ws_, norm_ws_bytes_, stream_);
      }
      sum_over_model(norm_sq_);
      detail::kc::clip_coefficient(norm_sq_, clip_coef_, clip > 0 ? clip : 1e300, stream_, 1.0 / step_scale_);
      detail::kc::adamw_update(master_, params_, grads_, m_, v_, n_params_, opt, lr, step, clip_coef_, stream_);
    });
  }
  // Global gradient norm of the last update (before clipping, unscaled; non-finite: the update
  // was skipped); synchronises.
  double grad_norm() const {
    double sq = 0;
    DPML_CHECK_CUDA(cudaMemcpyAsync(&sq, norm_sq_, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream_));
    return std::sqrt(sq) / step_scale_;
  }
  // Once per step after update() (synchronises): grad_norm(); with loss scaling the scale then
  // follows the step's outcome (halved after an overflow, doubled after a clean window).
  double finish_step() {
    const double norm = grad_norm();
    if constexpr (Precision::loss_scaling) scaler_.update(!std::isfinite(norm));
    return norm;
  }
  // The factor of the loss gradient in the next forward_backward (1 without loss scaling).
  double loss_scale() const noexcept {
    if constexpr (Precision::loss_scaling) return scaler_.scale();
    else return 1.0;
  }
  // The dynamic loss scale's state, for checkpoints (Fp16).
  DynamicLossScale& loss_scaler() noexcept { return scaler_; }

 private:
  std::int64_t N() const noexcept { return B_ * T_; }

  static const GptStagePlan& checked(const GptStagePlan& p, const GptCudaConfig& cfg) {
    DPML_REQUIRE(p.stages >= 1 && p.stage >= 0 && p.stage < p.stages,
                 "GPT (cuda): pipeline stage " << p.stage << " of " << p.stages << " stages");
    DPML_REQUIRE(cfg.layers >= p.stages, "GPT (cuda): " << cfg.layers << " layers cannot fill " << p.stages
                                                        << " pipeline stages (--pp): every stage needs a block");
    DPML_REQUIRE(p.activation_sets >= 1 && p.input_sets >= 1 && p.weight_grad_sets >= 0,
                 "GPT (cuda): stage plan with " << p.activation_sets << " activation sets, " << p.input_sets
                                                << " input sets, " << p.weight_grad_sets << " weight-gradient sets");
    return p;
  }
  void require_whole_model(const char* what) const {
    DPML_REQUIRE(first_ && last_, "GPT (cuda): " << what << " runs a whole model; this one is pipeline stage " << plan_.stage
                                                 << " of " << plan_.stages << " (models/cuda/gpt_pipeline.hpp runs a stage)");
  }
  static std::int64_t block_index(const std::string& name) {  // "h.<l>.…" → l
    return std::stoll(name.substr(2, name.find('.', 2) - 2));
  }

  // A tensor of full shape (rows, cols), of which this rank holds its part (`split`); host_rows:
  // rows the host tensor has where the device pads them (wte).
  std::int64_t add(const std::string& name, std::int64_t rows, std::int64_t cols, Split split = Split::none,
                   std::int64_t host_rows = -1) {
    const int parts = split == Split::none ? 1 : tp_;
    const std::int64_t full_rows = host_rows < 0 ? rows : host_rows;
    if (split == Split::rows) rows /= parts;
    if (split == Split::cols) cols /= parts;
    const std::int64_t off = total_;
    slots_.push_back({.name = name, .rows = rows, .cols = cols, .offset = off, .full_rows = full_rows, .split = split,
                      .parts = parts});
    total_ = detail::align_up(off + rows * cols);
    return off;
  }
  // Adds the model's other ranks' parts to the squared norm at norm_sq, on this model's stream: the
  // tensor axis's, then the other stages'.
  void sum_over_model(double* norm_sq) {
    if (tensor_) tensor_->allreduce(norm_sq, 1, comm::ReduceOp::sum);
    if (sum_over_stages_) sum_over_stages_(norm_sq);
  }
  // The ranges of the flat buffer whose squared gradients this rank adds to the global norm (tp > 1):
  // on tensor rank 0 all of it from norm_begin_ (a last stage leaves out its tied copy of wte); on
  // the others their split tensors only, the tied copy's rows left out too (consecutive ones, with
  // the zero padding between them, as one range). Replicated tensors are thus counted once.
  detail::kc::NormRanges counted_ranges() const {
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;  // [first, end)
    if (tp_rank_ == 0) {
      ranges.emplace_back(norm_begin_, n_params_);
    } else {
      bool open = false;  // the last range ends where the previous slot, a counted one, ends
      for (const detail::Slot& s : slots_) {
        const bool counted = s.split != Split::none && s.offset >= norm_begin_;  // not a last stage's tied copy
        if (counted && open) ranges.back().second = s.offset + s.numel();
        else if (counted) ranges.emplace_back(s.offset, s.offset + s.numel());
        open = counted;
      }
    }
    detail::kc::NormRanges r;
    for (const auto& [first, end] : ranges) r.add(first, end - first);
    return r;
  }
  const detail::Slot& slot(const std::string& name) const {
    for (const auto& s : slots_)
      if (s.name == name) return s;
    DPML_REQUIRE(false, "GPT (cuda): no parameter named " << name);
    return slots_.front();
  }
  template <class ParamPtr>
  static std::map<std::string, ParamPtr> index(const std::vector<ParamPtr>& host) {
    std::map<std::string, ParamPtr> m;
    for (ParamPtr p : host) m[p->name()] = p;
    return m;
  }
  template <class ParamPtr>
  static ParamPtr find(const std::map<std::string, ParamPtr>& by_name, const detail::Slot& s) {
    const auto it = by_name.find(s.name);
    DPML_REQUIRE(it != by_name.end(), "GPT (cuda): the host model has no parameter " << s.name);
    const ParamPtr p = it->second;
    DPML_REQUIRE(p->numel() == s.host_numel(), "GPT (cuda): parameter " << s.name << " has " << p->numel()
                                                                       << " elements on the host, " << s.host_numel()
                                                                       << " here");
    return p;
  }
  float* state_(State which) const {
    return which == State::master ? master_ : which == State::exp_avg ? m_ : v_;
  }
  void check_span(const detail::Slot& s, std::size_t n) const {
    DPML_REQUIRE(static_cast<std::int64_t>(n) == s.host_numel(),
                 "GPT (cuda): tensor " << s.name << " has " << s.host_numel() << " elements, the host buffer " << n);
  }
  template <class T>
  std::vector<T> download(const T* src, std::int64_t n) const {
    std::vector<T> h(static_cast<std::size_t>(n));
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream_));
    DPML_CHECK_CUDA(cudaMemcpy(h.data(), src, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // full (host_numel) = slot s of the flat device buffer `flat` (params, grads, master, m or v):
  // this rank's part, or for a split tensor every rank's part gathered over the tensor axis through
  // a temporary device buffer (collective). Synchronises.
  template <class T>
  void download_full(const T* flat, const detail::Slot& s, T* full) const { gather_full(flat + s.offset, s, full); }
  // The full host tensor of slot s from this rank's part at device address `mine`: the tensor
  // ranks' parts gathered when s is split (a collective over the tensor axis), else a copy.
  template <class T>
  void gather_full(const T* mine, const detail::Slot& s, T* full) const {
    const auto part = static_cast<std::size_t>(s.numel());
    if (!tensor_ || s.split == Split::none) {
      DPML_CHECK_CUDA(cudaStreamSynchronize(stream_));
      DPML_CHECK_CUDA(cudaMemcpy(full, mine, static_cast<std::size_t>(s.host_numel()) * sizeof(T), cudaMemcpyDeviceToHost));
      return;
    }
    std::vector<T> parts(part * static_cast<std::size_t>(tp_));  // (tp, part)
    T* gathered = nullptr;
    DPML_CHECK_CUDA(cudaMalloc(&gathered, parts.size() * sizeof(T)));
    const std::unique_ptr<T, DeviceFree> owned(gathered);
    tensor_->allgather(mine, gathered, part);
    DPML_CHECK_CUDA(cudaMemcpyAsync(parts.data(), gathered, parts.size() * sizeof(T), cudaMemcpyDeviceToHost, stream_));
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream_));
    s.assemble(parts.data(), full);
  }
  struct DeviceFree {
    void operator()(void* p) const noexcept { cudaFree(p); }
  };
  // Params and master from full host tensors, full_of(slot) → the slot's host_numel floats (called
  // for the slots in order), of which this rank keeps its part; the optimizer state zeroed.
  template <class FullOf>
  void upload_parts(FullOf&& full_of) {
    std::vector<float> master(static_cast<std::size_t>(n_params_), 0.f);
    for (const auto& s : slots_) s.keep_part(full_of(s), master.data() + s.offset, tp_rank_);
    upload_master(master);
  }
  void upload_master(const std::vector<float>& master) {
    std::vector<Act> p(master.size());
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = Act(master[i]);
    // All on the model's (non-blocking) stream, which does not wait for the legacy default stream.
    DPML_CHECK_CUDA(cudaMemcpyAsync(params_, p.data(), p.size() * sizeof(Act), cudaMemcpyHostToDevice, stream_));
    if (zero_) {
      zero_->reset(master);  // this rank's shards; moments zeroed
    } else {
      allocate_state();
      DPML_CHECK_CUDA(cudaMemcpyAsync(master_, master.data(), master.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
      DPML_CHECK_CUDA(cudaMemsetAsync(m_, 0, 2 * master.size() * sizeof(float), stream_));  // m_, v_ adjacent
    }
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream_));  // the host vectors go out of scope
  }
  // master, m, v (n_params_ each, zeroed) on first need; not under ZeRO-1.
  void allocate_state() {
    if (state_memory_) return;
    const std::size_t n = static_cast<std::size_t>(n_params_);
    DPML_CHECK_CUDA(cudaMalloc(&state_memory_, 3 * n * sizeof(float)));
    DPML_CHECK_CUDA(cudaMemsetAsync(state_memory_, 0, 3 * n * sizeof(float), stream_));
    master_ = state_memory_;
    m_ = master_ + n;
    v_ = m_ + n;
  }

  // Every buffer as a slice of one allocation; base == nullptr only measures. Under tp the
  // attention and MLP activations are this rank's heads and hidden units: Cp = C/tp, Hp = H/tp.
  void carve(char* base) {
    const std::int64_t n = N(), C = cfg_.dim, Cp = C / tp_, Hp = cfg_.heads / tp_;
    carver_.rebase(base);
    params_ = carver_.take<Act>(n_params_);
    grads_ = carver_.take<Act>(n_params_);
    acts_offset_ = carver_.bytes();  // activations and scratch from here on
    dres_ = carver_.take<Act>(n * C);
    dsmall_ = carver_.take<Act>(n * C);
    dbig_ = carver_.take<Act>(n * 4 * Cp);
    delta_ = carver_.take<float>(B_ * Hp * T_);
    if (last_) {
      x_final_ = carver_.take<Act>(n * C);
      lnf_ = carver_.take<Act>(n * C);
      lnf_mean_ = carver_.take<float>(n);
      lnf_rstd_ = carver_.take<float>(n);
      logits_ = carver_.take<Act>(n * Vl_);
      if (tp_ > 1) xent_stats_ = carver_.take<float>(4 * n);
      losses_ = carver_.take<float>(n);
    }
    inputs_.clear();
    for (int i = 0; i < plan_.input_sets; ++i) inputs_.push_back(carver_.take<Act>(n * C));
    // d output stays in the scratch when it is read right after it is made (F then B, nothing in
    // between: one set, W inside B) on the last stage; d input when the embedding's backward reads
    // it inside B on stage 0. So a whole model keeps its old buffers.
    const bool output_grad_in_scratch = last_ && fused_ && plan_.activation_sets == 1;
    Act* shared_gelu = cfg_.recompute_gelu ? carver_.take<Act>(n * 4 * Cp) : nullptr;
    sets_.clear();
    for (int i = 0; i < plan_.activation_sets; ++i) {
      ActivationSet set;
      for (std::int64_t l = 0; l < range_.count; ++l) {
        BlockActs a;
        a.x = l > 0 ? carver_.take<Act>(n * C) : nullptr;  // block 0: the stage input, bound per micro-batch
        a.ln1 = carver_.take<Act>(n * C);
        a.ln1_mean = carver_.take<float>(n);
        a.ln1_rstd = carver_.take<float>(n);
        a.qkv = carver_.take<Act>(n * 3 * Cp);
        a.atty = carver_.take<Act>(n * Cp);
        a.lse = carver_.take<float>(B_ * Hp * T_);
        a.r1 = carver_.take<Act>(n * C);
        a.ln2 = carver_.take<Act>(n * C);
        a.ln2_mean = carver_.take<float>(n);
        a.ln2_rstd = carver_.take<float>(n);
        a.pre = carver_.take<Act>(n * 4 * Cp);
        a.gelu = shared_gelu ? shared_gelu : carver_.take<Act>(n * 4 * Cp);
        set.blocks.push_back(a);
      }
      set.output = last_ ? x_final_ : carver_.take<Act>(n * C);
      set.output_grad = output_grad_in_scratch ? dres_ : carver_.take<Act>(n * C);
      set.input_grad = first_ && fused_ ? dres_ : carver_.take<Act>(n * C);
      sets_.push_back(std::move(set));
    }
    weight_grad_sets_.clear();
    for (int i = 0; i < plan_.weight_grad_sets; ++i) {
      std::vector<BlockGrads> set;
      for (std::int64_t l = 0; l < range_.count; ++l) {
        BlockGrads d{};  // .out and .in are the neighbours' (see grads_of)
        d.pre = carver_.take<Act>(n * 4 * Cp);
        d.ln2 = carver_.take<Act>(n * C);
        d.r1 = carver_.take<Act>(n * C);
        d.qkv = carver_.take<Act>(n * 3 * Cp);
        d.ln1 = carver_.take<Act>(n * C);
        d.in = l > 0 ? carver_.take<Act>(n * C) : nullptr;  // block 0: the set's input gradient
        set.push_back(d);
      }
      weight_grad_sets_.push_back(std::move(set));
    }
    const std::int64_t colsum = std::max({detail::kc::layer_norm_weight_scratch(n, C),
                                          detail::kc::column_sums_scratch(n, 4 * C, 1)});
    colsum_ = carver_.take<float>(colsum);
    if (first_) {
      emb_ws_bytes_ = detail::kc::embedding_backward_workspace(n, cfg_.vocab);
      emb_ws_ = carver_.take<char>(static_cast<std::int64_t>(emb_ws_bytes_));
    }
    norm_ws_bytes_ = tp_ > 1 ? detail::kc::grad_norm_ranges_workspace<Act>(norm_ranges_.total())
                             : std::max(detail::kc::grad_norm_workspace<Act>(n_params_),
                                        detail::kc::grad_norm_workspace<Act>(n_params_ - norm_begin_));
    norm_ws_ = carver_.take<char>(static_cast<std::int64_t>(norm_ws_bytes_));
    if (tp_ > 1) {
      norm_range_begin_ = carver_.take<std::int64_t>(static_cast<std::int64_t>(norm_ranges_.begin.size()));
      norm_range_before_ = carver_.take<std::int64_t>(static_cast<std::int64_t>(norm_ranges_.before.size()));
    }
    norm_sq_ = carver_.take<double>(1);
    clip_coef_ = carver_.take<float>(1);
  }

  template <class F>
  void timed(Family f, F&& run) {
    Profiler::timed(prof_, f, stream_, std::forward<F>(run));
  }

  // y (rows, out) = x (rows, in) · Wᵀ [+ bias] [+ y when residual]; W (out, in) at param offset.
  template <class Epi>
  void linear(const Act* x, std::int64_t w, std::int64_t b, Act* y, std::int64_t in, std::int64_t out,
              bool residual, Act* pre_gelu = nullptr) {
    using detail::kc::Trans;
    detail::kc::GemmArgs<Act> g{.ta = Trans::no, .tb = Trans::yes, .M = N(), .N = out, .K = in, .A = x, .lda = in,
                                 .B = params_ + w, .ldb = in, .C = y, .ldc = out, .alpha = 1.f,
                                 .beta = residual ? 1.f : 0.f, .bias = b >= 0 ? params_ + b : nullptr,
                                 .pre_gelu = pre_gelu};
    timed(Family::gemm, [&] { detail::kc::gemm<Epi>(gemm_, g, stream_); });
  }
  // dx (rows, in) = dy (rows, out) · W.
  void linear_backward_input(const Act* dy, std::int64_t w, Act* dx, std::int64_t in, std::int64_t out) {
    using detail::kc::Trans;
    namespace epi = detail::kc::epilogue;
    timed(Family::gemm, [&] {
      detail::kc::gemm<epi::None>(gemm_, detail::kc::GemmArgs<Act>{.ta = Trans::no, .tb = Trans::no, .M = N(), .N = in,
                                                                    .K = out, .A = dy, .lda = out, .B = params_ + w,
                                                                    .ldb = in, .C = dx, .ldc = in},
                                  stream_);
    });
  }
  // dW (out, in) = dyᵀ · x (micro-batches after the first add); dbias (out) += Σ_rows dy.
  void linear_backward_weight(const Act* dy, const Act* x, std::int64_t w, std::int64_t b, std::int64_t in, std::int64_t out) {
    using detail::kc::Trans;
    namespace epi = detail::kc::epilogue;
    timed(Family::gemm, [&] {
      detail::kc::gemm<epi::None>(gemm_, detail::kc::GemmArgs<Act>{.ta = Trans::yes, .tb = Trans::no, .M = out, .N = in,
                                                                    .K = N(), .A = dy, .lda = out, .B = x, .ldb = in,
                                                                    .C = grads_ + w, .ldc = in, .beta = grad_beta()},
                                  stream_);
    });
    timed(Family::elementwise, [&] { detail::kc::bias_grad_rows(dy, grads_ + b, colsum_, N(), out, stream_); });
  }
  void layer_norm(const Act* x, std::int64_t w, std::int64_t b, Act* y, float* mean, float* rstd) {
    timed(Family::layer_norm, [&] {
      detail::kc::layer_norm_forward(x, params_ + w, params_ + b, y, mean, rstd, N(), cfg_.dim, 1e-5f, stream_);
    });
  }
  // dx = dres + LN_backward(dy) (the residual branch joins in the same kernel; dres null: none).
  void layer_norm_backward_input(const Act* dy, const Act* x, std::int64_t w, const float* mean, const float* rstd,
                                 const Act* dres, Act* dx) {
    timed(Family::layer_norm, [&] {
      detail::kc::layer_norm_backward_input(dy, x, params_ + w, mean, rstd, dx, N(), cfg_.dim, stream_, dres);
    });
  }
  // dw, db accumulate.
  void layer_norm_backward_weight(const Act* dy, const Act* x, std::int64_t w, std::int64_t b, const float* mean,
                                  const float* rstd) {
    timed(Family::layer_norm, [&] {
      detail::kc::layer_norm_backward_weight(dy, x, mean, rstd, grads_ + w, grads_ + b, colsum_, N(), cfg_.dim, stream_);
    });
  }

  void zero_grads() {
    timed(Family::optimizer, [&] {
      DPML_CHECK_CUDA(cudaMemsetAsync(grads_, 0, static_cast<std::size_t>(n_params_) * sizeof(Act), stream_));
    });
  }

  // The tensor-parallel all-reduce (sum) of x (n elements) on the model's stream. Nothing at tp = 1.
  void tensor_all_reduce(Act* x, std::int64_t n) {
    if (tensor_) timed(Family::tp_allreduce, [&] { tensor_->allreduce(x, static_cast<std::size_t>(n), comm::ReduceOp::sum); });
  }
  // The input gradient of a column-parallel linear (c_attn, c_fc): dx (rows, in) = Σ_k dy_k · W_k
  // over the tensor ranks k, each rank's partial product all-reduced (Megatron's copy_to backward).
  void column_parallel_backward_input(const Act* dy, std::int64_t w, Act* dx, std::int64_t in, std::int64_t out_part) {
    linear_backward_input(dy, w, dx, in, out_part);
    tensor_all_reduce(dx, N() * in);
  }
  // A row-parallel linear joined to the residual stream, y (rows, C) = residual + Σ_k x_k · W_kᵀ + b
  // over the tensor ranks k, x_k (rows, in_part) and W_k (C, in_part) rank k's input columns.
  // Tensor rank 0 adds the residual and the (replicated) bias into its partial product, the other
  // ranks contribute theirs alone, and the all-reduce leaves y whole on every rank. At tp = 1: the
  // residual copy and one GEMM with the bias and residual epilogue.
  void row_parallel_residual(const Act* x, const Act* residual, std::int64_t w, std::int64_t b, Act* y,
                             std::int64_t in_part) {
    namespace epi = detail::kc::epilogue;
    const std::int64_t C = cfg_.dim;
    if (tp_rank_ == 0) {
      timed(Family::elementwise, [&] {
        DPML_CHECK_CUDA(cudaMemcpyAsync(y, residual, N() * C * sizeof(Act), cudaMemcpyDeviceToDevice, stream_));
      });
      linear<epi::Bias>(x, w, b, y, in_part, C, true);
    } else {
      linear<epi::None>(x, w, -1, y, in_part, C, false);
    }
    tensor_all_reduce(y, N() * C);
  }

  struct BlockActs {
    Act* x;                                   // (B, T, C) block input (block 0: the stage input)
    Act* ln1;                                 // (B, T, C)
    float *ln1_mean, *ln1_rstd;                // (B·T)
    Act* qkv;                                 // (B, T, H, 3, D)
    Act* atty;                                // (B, T, H, D)
    float* lse;                                // (B, H, T)
    Act* r1;                                  // (B, T, C) x + attention branch
    Act* ln2;                                 // (B, T, C)
    float *ln2_mean, *ln2_rstd;                // (B·T)
    Act* pre;                                 // (B, T, 4C) before GELU
    Act* gelu;                                // (B, T, 4C); shared by all blocks with recompute_gelu
  };  // under tp: qkv (B, T, H/tp, 3, D), atty (B, T, H/tp, D), lse (B, H/tp, T), pre and gelu (B, T, 4C/tp)
  // What one micro-batch keeps from its F to its W.
  struct ActivationSet {
    std::vector<BlockActs> blocks;  // (this stage's blocks)
    Act* output;                    // (B, T, C) the last block's output (last stage: x_final_)
    Act* output_grad;               // (B, T, C) its gradient: received, or from the head
    Act* input_grad;                // (B, T, C) the gradient of the stage input: sent, or the embedding's
  };
  // The gradients of one block's activations: d output → … → d input. In B+W together they are
  // the backward scratch; a delayed W reads them from a weight-gradient set.
  struct BlockGrads {
    Act* out;  // (B, T, C) d block output (read)
    Act* pre;  // (B, T, 4C) d GELU output, then d pre-GELU
    Act* ln2;  // (B, T, C)
    Act* r1;   // (B, T, C)
    Act* qkv;  // (B, T, 3C)
    Act* ln1;  // (B, T, C)
    Act* in;   // (B, T, C) d block input (written)
  };  // under tp: pre (B, T, 4C/tp), qkv (B, T, 3C/tp)
  enum class Pass { input, weight, both };  // B, W, or both interleaved block by block

  ActivationSet& bind(Slots s) {
    DPML_REQUIRE(s.set >= 0 && s.set < plan_.activation_sets && s.input >= 0 && s.input < plan_.input_sets &&
                     (fused_ ? s.weight_grads == -1 : s.weight_grads >= 0 && s.weight_grads < plan_.weight_grad_sets),
                 "GPT (cuda): pipeline stage " << plan_.stage << ": slots (set " << s.set << ", input " << s.input
                                               << ", weight gradients " << s.weight_grads << ") outside its plan ("
                                               << plan_.activation_sets << ", " << plan_.input_sets << ", "
                                               << plan_.weight_grad_sets << ")");
    ActivationSet& a = sets_[static_cast<std::size_t>(s.set)];
    a.blocks.front().x = inputs_[static_cast<std::size_t>(s.input)];
    return a;
  }
  // Block l's (local index) gradient buffers for a micro-batch in activation set `a`.
  BlockGrads grads_of(const ActivationSet& a, Slots s, std::size_t l) const {
    const std::size_t last = a.blocks.size() - 1;
    if (s.weight_grads < 0) {  // B and W at once: the scratch, as the unsplit backward
      return {.out = l == last ? a.output_grad : dres_, .pre = dbig_, .ln2 = dsmall_, .r1 = dres_, .qkv = dbig_,
              .ln1 = dsmall_, .in = l == 0 ? a.input_grad : dres_};
    }
    const auto& set = weight_grad_sets_[static_cast<std::size_t>(s.weight_grads)];
    BlockGrads d = set[l];
    d.out = l == last ? a.output_grad : set[l + 1].in;
    if (l == 0) d.in = a.input_grad;
    return d;
  }

  // The vocabulary ids of this tensor rank's rows of wte: [vocab_begin(), vocab_begin() + Vl_).
  std::int64_t vocab_begin() const noexcept { return tp_rank_ * Vl_; }

  // Under tp each rank looks up the tokens of its rows of wte (zeros for the others), and one
  // all-reduce composes the whole rows (one non-zero term each: exact) before wpe is added.
  void embed(const std::int32_t* tokens, Act* x0) {
    const std::int64_t begin = vocab_begin();
    timed(Family::embedding, [&] {
      detail::kc::embedding_token_forward(tokens, params_ + wte_, x0, N(), cfg_.dim, begin, begin + Vl_, stream_);
    });
    tensor_all_reduce(x0, N() * cfg_.dim);
    timed(Family::embedding, [&] { detail::kc::embedding_position_forward(params_ + wpe_, x0, B_, T_, cfg_.dim, stream_); });
  }
  // wpe's gradient and, with token_rows, this rank's rows of wte's.
  void embedding_backward(const std::int32_t* tokens, const Act* dx0, bool token_rows) {
    timed(Family::embedding, [&] {
      if (token_rows)
        detail::kc::embedding_token_backward(tokens, dx0, grads_ + wte_, N(), cfg_.dim, vocab_begin(),
                                             vocab_begin() + Vl_, cfg_.vocab, emb_ws_, emb_ws_bytes_, stream_);
      detail::kc::embedding_position_backward(dx0, grads_ + wpe_, B_, T_, cfg_.dim, stream_);
    });
  }

  // Attaches the data axis' listener. A whole model whose K ranks' token rows are fewer than twice
  // wte's rows (K·B·T < 2·Vp: GPT-2 124M at B·T = 16384 up to K = 6), or whose `tied` says so,
  // gathers every rank's tokens and embedding-output gradient at the end of the backward —
  // (K − 1)·B·T·C elements received, fewer than the ~2·Vp·C an all-reduce of wte moves — and adds
  // all their rows, averaged, on each rank after finish(). wte's all-reduce then covers only the
  // LM head's contribution, final after the forward, so it runs under the blocks' backward
  // instead of after it. Otherwise wte is all-reduced whole, at finish().
  void listen(parallel::cuda::GradientListener* sync, TiedGradSync tied) {
    sync_ = sync;
    DPML_CHECK_CUDA(cudaFree(std::exchange(gathered_.memory, nullptr)));
    const std::int64_t K = sync ? sync->ranks() : 1;
    const bool fewer_bytes = K * N() < 2 * Vl_;
    if (!(first_ && last_) || K == 1 || tied == TiedGradSync::all_reduce || (tied == TiedGradSync::automatic && !fewer_bytes))
      return;
    gathered_.rows = K * N();
    gathered_.workspace_bytes = detail::kc::embedding_backward_workspace(gathered_.rows, cfg_.vocab);
    detail::Carver carver;  // sizes first (no base), then the same takes over the allocation
    auto carve = [&] {
      gathered_.tokens = carver.take<std::int32_t>(gathered_.rows);
      gathered_.dx = carver.take<Act>(gathered_.rows * cfg_.dim);
      gathered_.workspace = carver.take<char>(static_cast<std::int64_t>(gathered_.workspace_bytes));
    };
    carve();
    DPML_CHECK_CUDA(cudaMalloc(&gathered_.memory, carver.bytes()));
    carver.rebase(static_cast<char*>(gathered_.memory));
    carve();
  }

  // out (B, T, C) = block(a.x), saving what the backward needs in `a`. Under tp the attention runs
  // on this rank's Hp = H/tp heads and the MLP on its 4·Cp = 4C/tp hidden units.
  void forward_block(const BlockParams& p, BlockActs& a, Act* out) {
    namespace epi = detail::kc::epilogue;
    const std::int64_t C = cfg_.dim, Cp = C / tp_, Hp = cfg_.heads / tp_, D = C / cfg_.heads;
    layer_norm(a.x, p.ln1_w, p.ln1_b, a.ln1, a.ln1_mean, a.ln1_rstd);
    linear<epi::Bias>(a.ln1, p.attn_w, p.attn_b, a.qkv, C, 3 * Cp, false);  // column-parallel
    timed(Family::attention, [&] { detail::kc::attention_forward(a.qkv, a.atty, a.lse, B_, T_, Hp, D, stream_); });
    row_parallel_residual(a.atty, a.x, p.proj_w, p.proj_b, a.r1, Cp);
    layer_norm(a.r1, p.ln2_w, p.ln2_b, a.ln2, a.ln2_mean, a.ln2_rstd);
    linear<epi::BiasGelu>(a.ln2, p.fc_w, p.fc_b, a.gelu, C, 4 * Cp, false, a.pre);  // column-parallel
    row_parallel_residual(a.gelu, a.r1, p.fcproj_w, p.fcproj_b, out, 4 * Cp);
  }

  // Block backward, from d.out to d.in (Pass::input), the weight gradients from the saved
  // activations and d's (Pass::weight), or both, each weight gradient right after the input
  // gradient it shares a dy with (Pass::both: the scratch is reused as soon as it may be). Under tp
  // the row-parallel layers' input gradients are this rank's columns (no communication); the
  // column-parallel layers' (d ln2, d ln1) are partial sums, all-reduced in the input pass before
  // the LayerNorm backward (and a delayed W) reads them.
  void backward_block(const BlockParams& p, const BlockActs& a, const BlockGrads& d, Pass pass) {
    const std::int64_t n = N(), C = cfg_.dim, Cp = C / tp_, Hp = cfg_.heads / tp_, D = C / cfg_.heads;
    const bool input = pass != Pass::weight, weight = pass != Pass::input;
    if (weight && cfg_.recompute_gelu)  // the MLP's weight gradient reads the GELU output
      timed(Family::elementwise, [&] { detail::kc::gelu_forward(a.pre, a.gelu, n * 4 * Cp, stream_); });
    if (input) linear_backward_input(d.out, p.fcproj_w, d.pre, 4 * Cp, C);
    if (weight) linear_backward_weight(d.out, a.gelu, p.fcproj_w, p.fcproj_b, 4 * Cp, C);
    if (input) timed(Family::elementwise, [&] { detail::kc::gelu_backward(a.pre, d.pre, d.pre, n * 4 * Cp, stream_); });
    if (input) column_parallel_backward_input(d.pre, p.fc_w, d.ln2, C, 4 * Cp);
    if (weight) linear_backward_weight(d.pre, a.ln2, p.fc_w, p.fc_b, C, 4 * Cp);
    if (input) layer_norm_backward_input(d.ln2, a.r1, p.ln2_w, a.ln2_mean, a.ln2_rstd, d.out, d.r1);  // d r1
    if (weight) layer_norm_backward_weight(d.ln2, a.r1, p.ln2_w, p.ln2_b, a.ln2_mean, a.ln2_rstd);
    if (input) linear_backward_input(d.r1, p.proj_w, dsmall_, Cp, C);  // d attention output (B, T, Cp)
    if (weight) linear_backward_weight(d.r1, a.atty, p.proj_w, p.proj_b, Cp, C);
    if (input)
      timed(Family::attention, [&] {
        detail::kc::attention_backward(dsmall_, a.qkv, a.atty, a.lse, delta_, d.qkv, B_, T_, Hp, D, stream_);
      });
    if (input) column_parallel_backward_input(d.qkv, p.attn_w, d.ln1, C, 3 * Cp);
    if (weight) linear_backward_weight(d.qkv, a.ln1, p.attn_w, p.attn_b, C, 3 * Cp);
    if (input) layer_norm_backward_input(d.ln1, a.x, p.ln1_w, a.ln1_mean, a.ln1_rstd, d.r1, d.in);  // d x
    if (weight) layer_norm_backward_weight(d.ln1, a.x, p.ln1_w, p.ln1_b, a.ln1_mean, a.ln1_rstd);
  }

  // Last stage: ln_f, logits, the loss (targets (B, T); dlogits in place) and, when training, the
  // head's backward: dout (B, T, C) = d x_final, the gradients of wte (tied) and ln_f.
  void head(const std::int32_t* targets, Act* dout, bool train) {
    using detail::kc::Trans;
    namespace epi = detail::kc::epilogue;
    const std::int64_t n = N(), C = cfg_.dim;
    layer_norm(x_final_, lnf_w_, lnf_b_, lnf_, lnf_mean_, lnf_rstd_);
    linear<epi::None>(lnf_, wte_, -1, logits_, C, Vl_, false);
    const auto dloss = static_cast<float>(step_scale_ / (static_cast<double>(n) * micro_batches_));
    if (!tensor_) {
      timed(Family::cross_entropy, [&] {
        detail::kc::softmax_cross_entropy(logits_, targets, losses_, dloss, n, Vp_, cfg_.vocab, stream_);
      });
    } else {  // this rank's columns; the rows' max and Σ exp over the tensor axis (cross_entropy.hpp)
      const std::int64_t begin = vocab_begin();
      timed(Family::cross_entropy, [&] {
        detail::kc::vocab_parallel_xent_stats(logits_, targets, xent_stats_, n, Vl_, begin, cfg_.vocab, stream_);
      });
      timed(Family::tp_allreduce, [&] { tensor_->allreduce(xent_stats_, static_cast<std::size_t>(n), comm::ReduceOp::max); });
      timed(Family::cross_entropy, [&] { detail::kc::vocab_parallel_xent_rescale(xent_stats_, n, stream_); });
      timed(Family::tp_allreduce, [&] { tensor_->allreduce(xent_stats_ + n, static_cast<std::size_t>(2 * n), comm::ReduceOp::sum); });
      timed(Family::cross_entropy, [&] {
        detail::kc::vocab_parallel_xent_finish(logits_, targets, xent_stats_, losses_, dloss, n, Vl_, begin, cfg_.vocab, stream_);
      });
    }
    DPML_CHECK_CUDA(cudaMemcpyAsync(host_losses_, losses_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    if (!train) return;
    // dlnf = dlogits · wte; dwte = dlogitsᵀ · lnf (in a whole model the first writer of the tied
    // gradient; the embedding's backward adds to it). Under tp both over this rank's rows of wte.
    timed(Family::gemm, [&] {
      detail::kc::gemm<epi::None>(gemm_, detail::kc::GemmArgs<Act>{.ta = Trans::no, .tb = Trans::no, .M = n, .N = C,
                                                                    .K = Vl_, .A = logits_, .lda = Vl_,
                                                                    .B = params_ + wte_, .ldb = C, .C = dsmall_, .ldc = C},
                                  stream_);
      detail::kc::gemm<epi::None>(gemm_, detail::kc::GemmArgs<Act>{.ta = Trans::yes, .tb = Trans::no, .M = Vl_, .N = C,
                                                                    .K = n, .A = logits_, .lda = Vl_, .B = lnf_,
                                                                    .ldb = C, .C = grads_ + wte_, .ldc = C,
                                                                    .beta = grad_beta()},
                                  stream_);
    });
    tensor_all_reduce(dsmall_, n * C);  // under tp each rank's columns gave a partial dlnf
    layer_norm_backward_input(dsmall_, x_final_, lnf_w_, lnf_mean_, lnf_rstd_, nullptr, dout);
    layer_norm_backward_weight(dsmall_, x_final_, lnf_w_, lnf_b_, lnf_mean_, lnf_rstd_);
  }

  void forward(ActivationSet& a, const std::int32_t* tokens, const std::int32_t* targets, bool train) {
    if (first_) embed(tokens, a.blocks.front().x);
    for (std::size_t l = 0; l < a.blocks.size(); ++l)
      forward_block(blocks_[l], a.blocks[l], l + 1 < a.blocks.size() ? a.blocks[l + 1].x : a.output);
    if (last_) head(targets, a.output_grad, train);
  }

  // The blocks' backward pass(es) of micro-batch mb; stage 0 ends with the embedding's weight
  // gradients in the pass that forms weight gradients. With a GradientListener, the pass that
  // forms the step's last weight gradients (micro-batch m − 1) tells it after each block that the
  // gradients from that block's first tensor to the end of the flat buffer are final, and at the
  // end that all are.
  void backward(int mb, Slots s, Pass pass, const std::int32_t* tokens) {
    ActivationSet& a = bind(s);
    accumulate_ = mb > 0;
    parallel::cuda::GradientListener* const sync = pass != Pass::input && mb + 1 >= micro_batches_ ? sync_ : nullptr;
    const bool gather = sync && gathered_.memory;
    // A whole model's wte lies last but takes the embedding's contribution last: it is final with
    // ln_f only when that contribution is gathered instead (listen()).
    const auto final_end = static_cast<std::size_t>(first_ && last_ && !gather ? wte_ : n_params_);
    if (sync && last_) sync->ready(static_cast<std::size_t>(lnf_w_), final_end);  // the head's, from forward
    for (std::size_t i = a.blocks.size(); i-- > 0;) {
      backward_block(blocks_[i], a.blocks[i], grads_of(a, s, i), pass);
      if (sync) sync->ready(static_cast<std::size_t>(blocks_[i].ln1_w), final_end);  // block i's first tensor ..
    }
    if (first_ && pass != Pass::input) {
      if (gather) {
        sync->all_gather(tokens, gathered_.tokens, static_cast<std::size_t>(N()) * sizeof(std::int32_t));
        sync->all_gather(a.input_grad, gathered_.dx, static_cast<std::size_t>(N() * cfg_.dim) * sizeof(Act));
      }
      embedding_backward(tokens, a.input_grad, /*token_rows=*/!gather);
    }
    if (sync && !tied_pair_) sync->finish();  // a tied stage's comes after the sum: finish_tied_gradients
    if (gather) {  // every rank's rows, averaged, into the averaged head gradient: the same on every rank
      timed(Family::embedding, [&] {
        detail::kc::embedding_token_backward(gathered_.tokens, gathered_.dx, grads_ + wte_, gathered_.rows, cfg_.dim,
                                             vocab_begin(), vocab_begin() + Vl_, cfg_.vocab, gathered_.workspace,
                                             gathered_.workspace_bytes,
                                             stream_, 1.f / static_cast<float>(sync->ranks()), N());
      });
    }
  }

  GptCudaConfig cfg_;
  std::int64_t B_, T_, Vp_ = 0;
  std::int64_t Vl_ = 0;  // wte's rows on this rank: Vp / tp (vocabulary-parallel under tp)
  GptStagePlan plan_;
  bool first_, last_;                             // pipeline stage 0 / p − 1 (both: a whole model)
  parallel::pipeline::StageBlocks range_;         // the global blocks this stage holds
  int tp_ = 1, tp_rank_ = 0;                      // tensor-parallel degree and this rank's coordinate
  std::optional<Comm> tensor_;                    // over the tensor axis, on stream_; empty at tp = 1
  bool fused_ = plan_.weight_grad_sets == 0;      // B forms the weight gradients (W right after B)
  DynamicLossScale scaler_{cfg_.loss_scale};
  double step_scale_ = 1.0;  // the loss scale of the step's forward_backward calls
  bool accumulate_ = false;  // the running micro-batch adds to the gradients
  int micro_batches_ = 1;    // of the running step
  int micro_index_ = 0;      // the running micro-batch's index in its step
  parallel::cuda::GradientListener* sync_ = nullptr;
  parallel::cuda::ShardedOptimizer* zero_ = nullptr;  // ZeRO-1: also sync_
  Comm* tied_pair_ = nullptr;                          // link_stages: first and last stage
  std::function<void(double*)> sum_over_stages_;       // link_stages: pp > 1
  struct GatheredEmbedding {  // the data axis' token rows (listen()); memory null: not gathered
    void* memory = nullptr;   // one allocation: tokens, dx, workspace
    std::int64_t rows = 0;    // K·B·T
    std::int32_t* tokens = nullptr;  // (K, B, T), rank order
    Act* dx = nullptr;               // (K, B, T, C) embedding-output gradients
    char* workspace = nullptr;
    std::size_t workspace_bytes = 0;
  } gathered_;
  // GEMM-written gradients (weights, the tied LM head) add to what earlier micro-batches wrote;
  // the other gradient kernels always add (to zeroed buffers at a step's first micro-batch).
  float grad_beta() const noexcept { return accumulate_ ? 1.f : 0.f; }
  std::vector<detail::Slot> slots_;
  std::int64_t total_ = 0, n_params_ = 0;
  std::int64_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0;
  std::int64_t norm_begin_ = 0;  // the gradient norm covers [norm_begin_, n_params_)
  std::vector<BlockParams> blocks_;  // (this stage's blocks)

  cudaStream_t stream_ = nullptr;
  detail::kc::GemmContext gemm_;
  Profiler* prof_ = nullptr;
  detail::Carver carver_;
  char* memory_ = nullptr;
  std::size_t acts_offset_ = 0;  // bytes of memory_ before the activations
  float* host_losses_ = nullptr;  // (B·T) pinned

  Act *params_ = nullptr, *grads_ = nullptr;  // (n_params) flat
  float* state_memory_ = nullptr;              // (3, n_params): master, m, v; null until needed, and under ZeRO-1
  float *master_ = nullptr, *m_ = nullptr, *v_ = nullptr;  // (n_params) each, in state_memory_
  std::vector<Act*> inputs_;                               // (input_sets) (B, T, C) stage inputs
  std::vector<ActivationSet> sets_;                        // (activation_sets)
  std::vector<std::vector<BlockGrads>> weight_grad_sets_;  // (weight_grad_sets, blocks) kept for a delayed W
  Act *x_final_ = nullptr, *lnf_ = nullptr;  // (B, T, C) last stage
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr;
  Act* logits_ = nullptr;  // (B, T, Vp / tp), dlogits after the cross-entropy
  float* xent_stats_ = nullptr;  // (4, B·T) under tp: the vocabulary-parallel cross-entropy's
  float* losses_ = nullptr; // (B·T)
  Act *dres_ = nullptr, *dsmall_ = nullptr;  // (B, T, C)
  Act* dbig_ = nullptr;                                        // (B, T, 4C/tp): d gelu / d pre, then d qkv
  float* delta_ = nullptr;                                      // (B, H/tp, T)
  float* colsum_ = nullptr;
  char *emb_ws_ = nullptr, *norm_ws_ = nullptr;
  std::size_t emb_ws_bytes_ = 0, norm_ws_bytes_ = 0;
  detail::kc::NormRanges norm_ranges_;  // tp > 1: what this rank adds to the global norm (host copy)
  std::int64_t *norm_range_begin_ = nullptr, *norm_range_before_ = nullptr;  // tp > 1: norm_ranges_ on the device
  double* norm_sq_ = nullptr;
  float* clip_coef_ = nullptr;
};

}  // namespace dpml::models::cuda
