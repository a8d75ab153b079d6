#pragma once
// GPT-2 on one GPU, llm.c style, built from dpml's device kernels (kernels/cuda): the same model,
// parameter names and c_attn row layout ((head, {q, k, v}, head_dim)) as the host models::Gpt, so
// the two can be compared parameter by parameter (copy_from / copy_to).
//
// Memory, all allocated at construction for one (B, T) — a step never reaches cudaMalloc:
//   params   one flat bf16 buffer: every tensor at a 64-element-aligned offset (16-byte aligned
//            slices for cuBLASLt and the vector loads), wte padded to Vp = V rounded up to 128 rows
//            (the pad rows stay zero: the cross-entropy gives their logits zero gradient)
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
//
// Step: zero_grad → forward_backward(tokens, targets) (loss mean over B·T, dlogits in place) →
// update(lr, step): global grad norm (CUB) → clip coefficient on the device → fused AdamW that
// reads it (a non-finite norm skips the step) → finish_step() (the norm; the loss scale). No host
// synchronisation except loss(), grad_norm() and finish_step().
//
// Data parallel (parallel/cuda/gradient_sync.hpp): with a GradientListener attached, the backward
// of a step's last micro-batch tells it after each block that the gradients from that block's first
// tensor to the end of the flat buffer are final (ln_f and the blocks behind it), so their
// all-reduce overlaps the blocks still to come; the tied wte (first written by the LM head, last by
// the embedding backward) and wpe go at the end, with finish(), before the norm and the update.
//
// ZeRO-1 (parallel/cuda/distributed_optimizer.hpp): with a ShardedOptimizer attached instead
// (set_distributed_optimizer), that listener reduce-scatters the buckets, holds this rank's shard of
// master, m and v (the model holds none), and does update()'s norm, clipping, AdamW and the
// all-gather of the weights. read_state (hence copy_to) then gathers from the shards' owners: a
// collective over the data axis, every rank must call it; write_state, copy_from and init_random
// hand every rank the whole tensor and it keeps its shards.
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

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <cstdint>
#include <map>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dpml::models::cuda {

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
  std::int64_t padded_vocab() const { return (vocab + 127) / 128 * 128; }
};

// Kernel families of the per-family time breakdown.
enum class Family { gemm, attention, layer_norm, elementwise, embedding, cross_entropy, optimizer, count };
inline constexpr std::array<std::string_view, static_cast<int>(Family::count)> kFamilyNames{
    "gemm", "attention", "layer_norm", "elementwise", "embedding", "cross_entropy", "optimizer"};

using Profiler = KernelProfiler<Family>;

namespace detail {
namespace kc = dpml::kernels::cuda;

// One tensor of the flat buffers: name, host shape (rows, cols; cols = 1 for vectors), offset.
struct Slot {
  std::string name;
  std::int64_t rows = 0, cols = 1, offset = 0;
  std::int64_t host_rows = 0;  // rows the host tensor has (wte: V, the device pads to Vp)
  std::int64_t numel() const { return rows * cols; }
};

}  // namespace detail

template <class Precision = Bf16>
class Gpt {
 public:
  using Act = typename Precision::type;  // weights, activations and gradients on the device

  // Offsets (elements into the flat buffers) of one block's tensors.
  struct BlockParams {
    std::int64_t ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  };

  Gpt(const GptCudaConfig& cfg, std::int64_t batch, std::int64_t seq) : cfg_(cfg), B_(batch), T_(seq) {
    const std::int64_t C = cfg.dim, L = cfg.layers;
    DPML_REQUIRE(C % cfg.heads == 0, "GPT (cuda): dim " << C << " is not divisible by heads " << cfg.heads);
    const std::int64_t D = C / cfg.heads;
    DPML_REQUIRE(D == 32 || D == 64 || D == 128, "GPT (cuda): head dim " << D << " must be 32, 64 or 128 (attention kernels)");
    DPML_REQUIRE(seq >= 1 && seq <= cfg.max_seq, "GPT (cuda): sequence length " << seq << " outside [1, max_seq " << cfg.max_seq << "]");
    DPML_REQUIRE(batch >= 1, "GPT (cuda): batch " << batch << " must be positive");
    Vp_ = cfg.padded_vocab();
    // Parameter layout, in the host model's order.
    wte_ = add("wte.weight", Vp_, C, cfg.vocab);
    wpe_ = add("wpe.weight", cfg.max_seq, C);
    for (std::int64_t l = 0; l < L; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      BlockParams b{};
      b.ln1_w = add(p + "ln_1.weight", C, 1);
      b.ln1_b = add(p + "ln_1.bias", C, 1);
      b.attn_w = add(p + "attn.c_attn.weight", 3 * C, C);
      b.attn_b = add(p + "attn.c_attn.bias", 3 * C, 1);
      b.proj_w = add(p + "attn.c_proj.weight", C, C);
      b.proj_b = add(p + "attn.c_proj.bias", C, 1);
      b.ln2_w = add(p + "ln_2.weight", C, 1);
      b.ln2_b = add(p + "ln_2.bias", C, 1);
      b.fc_w = add(p + "mlp.c_fc.weight", 4 * C, C);
      b.fc_b = add(p + "mlp.c_fc.bias", 4 * C, 1);
      b.fcproj_w = add(p + "mlp.c_proj.weight", C, 4 * C);
      b.fcproj_b = add(p + "mlp.c_proj.bias", C, 1);
      blocks_.push_back(b);
    }
    lnf_w_ = add("ln_f.weight", C, 1);
    lnf_b_ = add("ln_f.bias", C, 1);
    n_params_ = total_;

    DPML_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    carve(nullptr);  // sizes only
    DPML_CHECK_CUDA(cudaMalloc(&memory_, carver_.bytes()));
    DPML_CHECK_CUDA(cudaMemsetAsync(memory_, 0, carver_.bytes(), stream_));
    carve(memory_);
    DPML_CHECK_CUDA(cudaMallocHost(&host_losses_, static_cast<std::size_t>(N()) * sizeof(float)));
  }
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;
  ~Gpt() {
    cudaFreeHost(host_losses_);
    cudaFree(state_memory_);
    cudaFree(memory_);
    cudaStreamDestroy(stream_);
  }

  const GptCudaConfig& config() const noexcept { return cfg_; }
  cudaStream_t stream() const noexcept { return stream_; }
  std::int64_t parameter_count() const noexcept { return n_params_; }  // flat elements incl. padding
  // Parameters of the unpadded model (what FLOP counts use).
  std::int64_t real_parameter_count() const {
    std::int64_t n = 0;
    for (const auto& s : slots_) n += s.host_rows * s.cols;
    return n;
  }
  // Device bytes of the buffers and the optimizer state this rank holds (its shard under ZeRO-1).
  std::size_t device_bytes() const noexcept { return carver_.bytes() + optimizer_state_bytes(); }
  std::size_t optimizer_state_bytes() const noexcept {
    return zero_ ? zero_->state_bytes() : state_memory_ ? 3 * static_cast<std::size_t>(n_params_) * sizeof(float) : 0;
  }
  void set_profiler(Profiler* p) noexcept { prof_ = p; }
  // Data parallel: the listener sees the gradients as the backward finishes them (nullptr: none).
  void set_gradient_sync(parallel::cuda::GradientListener* sync) {
    DPML_REQUIRE(!zero_, "GPT (cuda): a distributed optimizer is attached; it is the gradient listener");
    sync_ = sync;
  }
  // ZeRO-1: `zero` (built on weights(), gradients(), parameter_count(), stream()) takes the
  // gradient sync, the update and the optimizer state; attached once, for good. Attach it before
  // initialising the weights, or the full state already allocated is handed over and freed.
  void set_distributed_optimizer(parallel::cuda::ShardedOptimizer* zero) {
    DPML_REQUIRE(zero && !zero_ && !sync_, "GPT (cuda): set_distributed_optimizer needs an optimizer, once, and no "
                                           "gradient sync attached before it");
    DPML_REQUIRE(zero->size() == static_cast<std::size_t>(n_params_),
                 "GPT (cuda): the distributed optimizer serves " << zero->size() << " elements, the model has " << n_params_);
    if (state_memory_)
      for (State which : {State::master, State::exp_avg, State::exp_avg_sq})
        zero->write(which, 0, download(state_(which), n_params_));
    DPML_CHECK_CUDA(cudaFree(std::exchange(state_memory_, nullptr)));
    master_ = m_ = v_ = nullptr;
    sync_ = zero_ = zero;
  }
  // The flat gradient buffer (parameter_count() elements), for a GradientSync.
  Act* gradients() noexcept { return grads_; }
  // The flat 16-bit working weights (parameter_count() elements), for a distributed optimizer.
  Act* weights() noexcept { return params_; }

  // The fp32 state a checkpoint holds, per tensor: master weights and AdamW's two moments (named
  // as the host optimizer's state slots, optim::AdamW::state_names).
  using State = parallel::cuda::OptimizerState;

  // Host copies of one tensor's state (its host rows: wte without the padding rows); zeros before
  // any was written. Synchronous; under ZeRO-1 collective over the data axis (every rank calls it).
  void read_state(State which, const std::string& name, std::span<float> dst) const {
    const auto& s = slot(name);
    check_span(s, dst.size());
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream_));
    if (zero_)
      zero_->read(which, static_cast<std::size_t>(s.offset), dst);
    else if (!state_memory_)
      std::fill(dst.begin(), dst.end(), 0.f);
    else
      DPML_CHECK_CUDA(cudaMemcpy(dst.data(), state_(which) + s.offset, dst.size() * sizeof(float), cudaMemcpyDeviceToHost));
  }
  // Writing the master weights also rounds them into the 16-bit working copy the forward pass reads.
  void write_state(State which, const std::string& name, std::span<const float> src) {
    const auto& s = slot(name);
    check_span(s, src.size());
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream_));
    if (zero_) {
      zero_->write(which, static_cast<std::size_t>(s.offset), src);
    } else {
      allocate_state();
      DPML_CHECK_CUDA(cudaMemcpy(state_(which) + s.offset, src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    if (which == State::master) {
      std::vector<Act> rounded(src.begin(), src.end());
      DPML_CHECK_CUDA(cudaMemcpy(params_ + s.offset, rounded.data(), rounded.size() * sizeof(Act), cudaMemcpyHostToDevice));
    }
  }

  // Fill params and master from host float tensors of the same names (host models::Gpt<float>'s
  // parameters()); zero the optimizer state. Every device tensor must be found.
  template <class ParamPtr>
  void copy_from(const std::vector<ParamPtr>& host) {
    const auto by_name = index(host);
    std::vector<float> master(static_cast<std::size_t>(n_params_), 0.f);
    for (const auto& s : slots_) {
      const auto* p = find(by_name, s);
      std::copy_n(p->value().data(), s.host_rows * s.cols, master.begin() + s.offset);
    }
    upload_master(master);
  }
  // Master weights (fp32) into the host tensors of the same names.
  template <class ParamPtr>
  void copy_to(const std::vector<ParamPtr>& host) const {
    const auto by_name = index(host);
    for (const auto& s : slots_) {
      const auto p = find(by_name, s);
      read_state(State::master, s.name, std::span<float>(p->value().data(), static_cast<std::size_t>(p->numel())));
    }
  }
  // Random initialisation as GPT-2: N(0, 0.02) weights, zero biases, unit LayerNorm gains
  // (for the benchmark; tests use copy_from).
  void init_random(std::uint64_t seed) {
    std::vector<float> master(static_cast<std::size_t>(n_params_), 0.f);
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    auto uniform = [&] {  // splitmix64 → (0, 1)
      x += 0x9E3779B97F4A7C15ull;
      std::uint64_t z = x;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return (static_cast<double>((z ^ (z >> 31)) >> 11) + 0.5) / 9007199254740992.0;
    };
    for (const auto& s : slots_) {
      const bool ln = s.name.find("ln_") != std::string::npos;
      const bool bias = s.name.ends_with(".bias");
      for (std::int64_t i = 0; i < s.host_rows * s.cols; ++i) {
        float v = 0.f;
        if (ln && !bias) v = 1.f;
        else if (!bias) v = static_cast<float>(0.02 * std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()));
        master[static_cast<std::size_t>(s.offset + i)] = v;
      }
    }
    upload_master(master);
  }

  // Gradient of the named tensor (host rows only) of the last forward_backward, as float and
  // without the loss scale; synchronises. Under ZeRO-1 only this rank's shards hold the average.
  std::vector<float> gradient(const std::string& name) const {
    const auto& s = slot(name);
    const std::vector<Act> g = download(grads_ + s.offset, s.host_rows * s.cols);
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
  void forward_backward(const std::int32_t* tokens, const std::int32_t* targets, bool accumulate = false,
                        int micro_batches = 1) {
    DPML_REQUIRE(micro_batches >= 1, "GPT (cuda): " << micro_batches << " micro-batches");
    if (!accumulate) {
      step_scale_ = loss_scale();
      zero_grads();
    }
    accumulate_ = accumulate;
    micro_batches_ = micro_batches;
    micro_index_ = accumulate ? micro_index_ + 1 : 0;
    forward(tokens, targets);
    backward(tokens);
  }
  // Forward only (validation): loss() afterwards; no gradient is touched.
  void evaluate(const std::int32_t* tokens, const std::int32_t* targets) { forward(tokens, targets); }
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
    const double max_norm = clip > 0 ? clip : 1e300, inv_scale = 1.0 / step_scale_;
    if (zero_) return timed(Family::optimizer, [&] { zero_->update(lr, step, opt, max_norm, inv_scale, norm_sq_, clip_coef_); });
    allocate_state();
    timed(Family::optimizer, [&] {
      detail::kc::grad_norm_squared(grads_, n_params_, norm_sq_, norm_ws_, norm_ws_bytes_, stream_);
      detail::kc::clip_coefficient(norm_sq_, clip_coef_, max_norm, stream_, inv_scale);
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

  std::int64_t add(const std::string& name, std::int64_t rows, std::int64_t cols, std::int64_t host_rows = -1) {
    const std::int64_t off = total_;
    slots_.push_back({name, rows, cols, off, host_rows < 0 ? rows : host_rows});
    total_ = detail::align_up(off + rows * cols);
    return off;
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
    DPML_REQUIRE(p->numel() == s.host_rows * s.cols, "GPT (cuda): parameter " << s.name << " has " << p->numel()
                                                                              << " elements on the host, "
                                                                              << s.host_rows * s.cols << " here");
    return p;
  }
  float* state_(State which) const {
    return which == State::master ? master_ : which == State::exp_avg ? m_ : v_;
  }
  void check_span(const detail::Slot& s, std::size_t n) const {
    DPML_REQUIRE(static_cast<std::int64_t>(n) == s.host_rows * s.cols,
                 "GPT (cuda): tensor " << s.name << " has " << s.host_rows * s.cols << " elements, the host buffer " << n);
  }
  template <class T>
  std::vector<T> download(const T* src, std::int64_t n) const {
    std::vector<T> h(static_cast<std::size_t>(n));
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream_));
    DPML_CHECK_CUDA(cudaMemcpy(h.data(), src, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
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

  // Every buffer as a slice of one allocation; base == nullptr only measures.
  void carve(char* base) {
    const std::int64_t n = N(), C = cfg_.dim, L = cfg_.layers, H = cfg_.heads;
    carver_.rebase(base);
    params_ = carver_.take<Act>(n_params_);
    grads_ = carver_.take<Act>(n_params_);
    acts_offset_ = carver_.bytes();  // activations and scratch from here on
    acts_.clear();
    Act* shared_gelu = cfg_.recompute_gelu ? carver_.take<Act>(n * 4 * C) : nullptr;
    for (std::int64_t l = 0; l < L; ++l) {
      BlockActs a;
      a.x = carver_.take<Act>(n * C);
      a.ln1 = carver_.take<Act>(n * C);
      a.ln1_mean = carver_.take<float>(n);
      a.ln1_rstd = carver_.take<float>(n);
      a.qkv = carver_.take<Act>(n * 3 * C);
      a.atty = carver_.take<Act>(n * C);
      a.lse = carver_.take<float>(B_ * H * T_);
      a.r1 = carver_.take<Act>(n * C);
      a.ln2 = carver_.take<Act>(n * C);
      a.ln2_mean = carver_.take<float>(n);
      a.ln2_rstd = carver_.take<float>(n);
      a.pre = carver_.take<Act>(n * 4 * C);
      a.gelu = shared_gelu ? shared_gelu : carver_.take<Act>(n * 4 * C);
      acts_.push_back(a);
    }
    x_final_ = carver_.take<Act>(n * C);
    lnf_ = carver_.take<Act>(n * C);
    lnf_mean_ = carver_.take<float>(n);
    lnf_rstd_ = carver_.take<float>(n);
    logits_ = carver_.take<Act>(n * Vp_);
    losses_ = carver_.take<float>(n);
    dres_ = carver_.take<Act>(n * C);
    dtmp_ = carver_.take<Act>(n * C);
    dsmall_ = carver_.take<Act>(n * C);
    dbig_ = carver_.take<Act>(n * 4 * C);
    delta_ = carver_.take<float>(B_ * H * T_);
    const std::int64_t colsum = std::max({detail::kc::layer_norm_weight_scratch(n, C),
                                          detail::kc::column_sums_scratch(n, 4 * C, 1)});
    colsum_ = carver_.take<float>(colsum);
    emb_ws_bytes_ = detail::kc::embedding_backward_workspace(n, cfg_.vocab);
    emb_ws_ = carver_.take<char>(static_cast<std::int64_t>(emb_ws_bytes_));
    norm_ws_bytes_ = detail::kc::grad_norm_workspace<Act>(n_params_);
    norm_ws_ = carver_.take<char>(static_cast<std::int64_t>(norm_ws_bytes_));
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
  // dx (rows, in) = dy (rows, out) · W; dW (out, in) = dyᵀ · x; dbias (out) = Σ_rows dy.
  void linear_backward(const Act* dy, const Act* x, std::int64_t w, std::int64_t b, Act* dx, std::int64_t in,
                       std::int64_t out) {
    using detail::kc::Trans;
    namespace epi = detail::kc::epilogue;
    timed(Family::gemm, [&] {
      detail::kc::gemm<epi::None>(gemm_, detail::kc::GemmArgs<Act>{.ta = Trans::no, .tb = Trans::no, .M = N(), .N = in,
                                                                    .K = out, .A = dy, .lda = out, .B = params_ + w,
                                                                    .ldb = in, .C = dx, .ldc = in},
                                  stream_);
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
  // dx = dres + LN_backward(dy) (the residual branch joins); dw, db accumulate.
  void layer_norm_backward(const Act* dy, const Act* x, std::int64_t w, std::int64_t b, const float* mean,
                           const float* rstd, const Act* dres, Act* dx) {
    timed(Family::layer_norm, [&] {
      detail::kc::layer_norm_backward_input(dy, x, params_ + w, mean, rstd, dtmp_, N(), cfg_.dim, stream_);
      detail::kc::layer_norm_backward_weight(dy, x, mean, rstd, grads_ + w, grads_ + b, colsum_, N(), cfg_.dim, stream_);
    });
    timed(Family::elementwise, [&] {
      if (dres) detail::kc::add(dres, dtmp_, dx, N() * cfg_.dim, stream_);
      else DPML_CHECK_CUDA(cudaMemcpyAsync(dx, dtmp_, N() * cfg_.dim * sizeof(Act), cudaMemcpyDeviceToDevice, stream_));
    });
  }

  void zero_grads() {
    timed(Family::optimizer, [&] {
      DPML_CHECK_CUDA(cudaMemsetAsync(grads_, 0, static_cast<std::size_t>(n_params_) * sizeof(Act), stream_));
    });
  }

  void forward(const std::int32_t* tokens, const std::int32_t* targets) {
    namespace epi = detail::kc::epilogue;
    const std::int64_t n = N(), C = cfg_.dim, H = cfg_.heads;
    Act* x0 = acts_[0].x;
    timed(Family::embedding, [&] {
      detail::kc::embedding_token_forward(tokens, params_ + wte_, x0, n, C, 0, cfg_.vocab, stream_);
      detail::kc::embedding_position_forward(params_ + wpe_, x0, B_, T_, C, stream_);
    });
    for (std::size_t l = 0; l < acts_.size(); ++l) {
      const BlockParams& p = blocks_[l];
      BlockActs& a = acts_[l];
      Act* out = l + 1 < acts_.size() ? acts_[l + 1].x : x_final_;
      layer_norm(a.x, p.ln1_w, p.ln1_b, a.ln1, a.ln1_mean, a.ln1_rstd);
      linear<epi::Bias>(a.ln1, p.attn_w, p.attn_b, a.qkv, C, 3 * C, false);
      timed(Family::attention, [&] { detail::kc::attention_forward(a.qkv, a.atty, a.lse, B_, T_, H, C / H, stream_); });
      timed(Family::elementwise, [&] {
        DPML_CHECK_CUDA(cudaMemcpyAsync(a.r1, a.x, n * C * sizeof(Act), cudaMemcpyDeviceToDevice, stream_));
      });
      linear<epi::Bias>(a.atty, p.proj_w, p.proj_b, a.r1, C, C, true);
      layer_norm(a.r1, p.ln2_w, p.ln2_b, a.ln2, a.ln2_mean, a.ln2_rstd);
      linear<epi::BiasGelu>(a.ln2, p.fc_w, p.fc_b, a.gelu, C, 4 * C, false, a.pre);
      timed(Family::elementwise, [&] {
        DPML_CHECK_CUDA(cudaMemcpyAsync(out, a.r1, n * C * sizeof(Act), cudaMemcpyDeviceToDevice, stream_));
      });
      linear<epi::Bias>(a.gelu, p.fcproj_w, p.fcproj_b, out, 4 * C, C, true);
    }
    layer_norm(x_final_, lnf_w_, lnf_b_, lnf_, lnf_mean_, lnf_rstd_);
    linear<epi::None>(lnf_, wte_, -1, logits_, C, Vp_, false);
    timed(Family::cross_entropy, [&] {
      detail::kc::softmax_cross_entropy(logits_, targets, losses_,
                                        static_cast<float>(step_scale_ / (static_cast<double>(n) * micro_batches_)), n, Vp_, cfg_.vocab,
                                        stream_);
    });
    DPML_CHECK_CUDA(cudaMemcpyAsync(host_losses_, losses_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }

  void backward(const std::int32_t* tokens) {
    using detail::kc::Trans;
    namespace epi = detail::kc::epilogue;
    const std::int64_t n = N(), C = cfg_.dim, H = cfg_.heads;
    parallel::cuda::GradientListener* const sync = micro_index_ + 1 >= micro_batches_ ? sync_ : nullptr;
    // LM head: dlnf = dlogits · wte; dwte = dlogitsᵀ · lnf (first writer of the tied gradient).
    timed(Family::gemm, [&] {
      detail::kc::gemm<epi::None>(gemm_, detail::kc::GemmArgs<Act>{.ta = Trans::no, .tb = Trans::no, .M = n, .N = C,
                                                                    .K = Vp_, .A = logits_, .lda = Vp_,
                                                                    .B = params_ + wte_, .ldb = C, .C = dsmall_, .ldc = C},
                                  stream_);
      detail::kc::gemm<epi::None>(gemm_, detail::kc::GemmArgs<Act>{.ta = Trans::yes, .tb = Trans::no, .M = Vp_, .N = C,
                                                                    .K = n, .A = logits_, .lda = Vp_, .B = lnf_,
                                                                    .ldb = C, .C = grads_ + wte_, .ldc = C,
                                                                    .beta = grad_beta()},
                                  stream_);
    });
    layer_norm_backward(dsmall_, x_final_, lnf_w_, lnf_b_, lnf_mean_, lnf_rstd_, nullptr, dres_);
    for (std::size_t i = acts_.size(); i-- > 0;) {
      const BlockParams& p = blocks_[i];
      BlockActs& a = acts_[i];
      // dres_ holds d(block output); the MLP branch first.
      if (cfg_.recompute_gelu)
        timed(Family::elementwise, [&] { detail::kc::gelu_forward(a.pre, a.gelu, n * 4 * C, stream_); });
      linear_backward(dres_, a.gelu, p.fcproj_w, p.fcproj_b, dbig_, 4 * C, C);
      timed(Family::elementwise, [&] { detail::kc::gelu_backward(a.pre, dbig_, dbig_, n * 4 * C, stream_); });
      linear_backward(dbig_, a.ln2, p.fc_w, p.fc_b, dsmall_, C, 4 * C);
      layer_norm_backward(dsmall_, a.r1, p.ln2_w, p.ln2_b, a.ln2_mean, a.ln2_rstd, dres_, dres_);  // dres_ = d r1
      linear_backward(dres_, a.atty, p.proj_w, p.proj_b, dsmall_, C, C);
      timed(Family::attention, [&] {
        detail::kc::attention_backward(dsmall_, a.qkv, a.atty, a.lse, delta_, dbig_, B_, T_, H, C / H, stream_);
      });
      linear_backward(dbig_, a.ln1, p.attn_w, p.attn_b, dsmall_, C, 3 * C);
      layer_norm_backward(dsmall_, a.x, p.ln1_w, p.ln1_b, a.ln1_mean, a.ln1_rstd, dres_, dres_);  // dres_ = d x
      if (sync) sync->ready(static_cast<std::size_t>(p.ln1_w));  // block i's first tensor .. ln_f
    }
    timed(Family::embedding, [&] {
      detail::kc::embedding_token_backward(tokens, dres_, grads_ + wte_, n, C, 0, cfg_.vocab, cfg_.vocab, emb_ws_,
                                           emb_ws_bytes_, stream_);
      detail::kc::embedding_position_backward(dres_, grads_ + wpe_, B_, T_, C, stream_);
    });
    if (sync) sync->finish();
  }

  struct BlockActs {
    Act* x;                                   // (B, T, C) block input
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
  };

  GptCudaConfig cfg_;
  std::int64_t B_, T_, Vp_ = 0;
  DynamicLossScale scaler_{cfg_.loss_scale};
  double step_scale_ = 1.0;  // the loss scale of the step's forward_backward calls
  bool accumulate_ = false;  // the running micro-batch adds to the gradients
  int micro_batches_ = 1;    // of the running step
  int micro_index_ = 0;      // the running micro-batch's index in its step
  parallel::cuda::GradientListener* sync_ = nullptr;
  parallel::cuda::ShardedOptimizer* zero_ = nullptr;  // ZeRO-1: also sync_
  // GEMM-written gradients (weights, the tied LM head) add to what earlier micro-batches wrote;
  // the other gradient kernels always add (to zeroed buffers at a step's first micro-batch).
  float grad_beta() const noexcept { return accumulate_ ? 1.f : 0.f; }
  std::vector<detail::Slot> slots_;
  std::int64_t total_ = 0, n_params_ = 0;
  std::int64_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0;
  std::vector<BlockParams> blocks_;

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
  std::vector<BlockActs> acts_;
  Act *x_final_ = nullptr, *lnf_ = nullptr;  // (B, T, C)
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr;
  Act* logits_ = nullptr;  // (B, T, Vp), dlogits after the cross-entropy
  float* losses_ = nullptr; // (B·T)
  Act *dres_ = nullptr, *dtmp_ = nullptr, *dsmall_ = nullptr;  // (B, T, C)
  Act* dbig_ = nullptr;                                        // (B, T, 4C): d gelu / d pre, then d qkv
  float* delta_ = nullptr;                                      // (B, H, T)
  float* colsum_ = nullptr;
  char *emb_ws_ = nullptr, *norm_ws_ = nullptr;
  std::size_t emb_ws_bytes_ = 0, norm_ws_bytes_ = 0;
  double* norm_sq_ = nullptr;
  float* clip_coef_ = nullptr;
};

}  // namespace dpml::models::cuda
