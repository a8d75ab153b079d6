#pragma once
// What the multi-GPU GPT tests share (test_gpt_dp, test_gpt_zero, test_gpt_tp): a tiny
// configuration (L=2, C=64, H=2, V=67, T=32, per-rank batch 4), batches of random tokens, a
// data-parallel model (GradientSync in 8 KiB buckets, so the small model is cut into many of them),
// a training step, the master weights per tensor (full tensors: collective for a tensor-parallel
// model), their hash and its agreement over the ranks, and the batch-slices comparison with a lone
// model.
#include "../cuda/device.hpp"
#include "nccl_fixture.hpp"

#include <dpml/comm/nccl.hpp>
#include <dpml/models/cuda/gpt.hpp>
#include <dpml/parallel/cuda/gradient_sync.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dpml::test::gpt {

inline constexpr std::int64_t kBatch = 4, kSeq = 32, kVocab = 67;
inline constexpr double kLr = 3e-3, kClip = 1.0;
inline constexpr std::size_t kBucketBytes = 8 << 10;
inline const optim::AdamWOptions kAdam{.eps = 1e-6, .weight_decay = 0.1};
using Gpt = models::cuda::Gpt<models::cuda::Bf16>;
using State = Gpt::State;

// max_seq: rows of wpe (≥ kSeq); it moves the flat buffer's size by multiples of 64.
inline models::cuda::GptCudaConfig config(std::int64_t max_seq = kSeq) {
  return {.vocab = kVocab, .max_seq = max_seq, .layers = 2, .heads = 2, .dim = 64};
}

// A batch of `rows` sequences: inputs random, targets a fixed function of them; `salt` picks it.
struct Batch {
  DeviceVec<std::int32_t> inputs, targets;
  explicit Batch(std::int64_t rows, std::uint64_t salt) : inputs(host(rows, salt, false)), targets(host(rows, salt, true)) {}
  // Rows [first, first + count) of another batch.
  Batch(const Batch& whole, std::int64_t first, std::int64_t count)
      : inputs(slice(whole.inputs.download(), first, count)), targets(slice(whole.targets.download(), first, count)) {}

 private:
  static std::vector<std::int32_t> host(std::int64_t rows, std::uint64_t salt, bool targets) {
    auto gen = rng(salt);
    std::vector<std::int32_t> v(static_cast<std::size_t>(rows * kSeq));
    for (auto& t : v) {
      const auto in = static_cast<std::int32_t>(gen() % kVocab);
      t = targets ? (in * 7 + 3) % kVocab : in;
    }
    return v;
  }
  static std::vector<std::int32_t> slice(const std::vector<std::int32_t>& v, std::int64_t first, std::int64_t count) {
    return {v.begin() + first * kSeq, v.begin() + (first + count) * kSeq};
  }
};

// Both ways of reducing the tied wte's gradient (Gpt::listen()); at K = 2 the tiny configuration's
// automatic choice is all_reduce (K·B·T = 2·Vp).
inline constexpr models::cuda::TiedGradSync kTiedGradSyncs[] = {models::cuda::TiedGradSync::gather,
                                                                 models::cuda::TiedGradSync::all_reduce};

// A model whose gradients are averaged over the world (Wire: the reduction's type).
template <class Wire = bf16, class Comm = comm::Nccl>
struct DataParallelGpt {
  Gpt model;
  parallel::cuda::GradientSync<bf16, Wire, Comm> sync;
  explicit DataParallelGpt(const models::cuda::GptCudaConfig& cfg = config(),
                           models::cuda::TiedGradSync tied = models::cuda::TiedGradSync::automatic)
      : model(cfg, kBatch, kSeq),
        sync(Comm::from(world()), model.gradients(), static_cast<std::size_t>(model.parameter_count()), model.stream(),
             {.bucket_bytes = kBucketBytes}) {
    model.init_random(11);
    model.set_gradient_sync(&sync, tied);
  }
};

// Model: any models::cuda::Gpt<Precision>.
template <class Model>
double train_step(Model& m, const Batch& b, std::int64_t step) {
  m.forward_backward(b.inputs.ptr, b.targets.ptr);
  m.update(kLr, step, kAdam, kClip);
  return m.loss();
}

// One state of every tensor, by name (collective under ZeRO-1, as read_state).
template <class Model>
std::map<std::string, std::vector<float>> states(const Model& m, State which) {
  std::map<std::string, std::vector<float>> w;
  for (const auto& name : m.parameter_names()) {
    std::vector<float> v(m.gradient(name).size());
    m.read_state(which, name, v);
    w[name] = std::move(v);
  }
  return w;
}
template <class Model>
std::map<std::string, std::vector<float>> weights(const Model& m) {
  return states(m, State::master);
}

inline double l2(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(s);
}
inline double l2(const std::vector<float>& a) { return l2(a, std::vector<float>(a.size(), 0.f)); }

// A 64-bit FNV-1a hash of every weight's bytes: equal on two ranks ⇔ (all but surely) equal weights.
inline std::uint64_t fingerprint(const std::map<std::string, std::vector<float>>& w) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& [name, v] : w) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
    for (std::size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  }
  return h;
}

// v is the same on every rank of `group`.
inline bool same_on_every_rank(std::uint64_t v, const comm::Mpi& group = world()) {
  return group.allreduce(v, comm::ReduceOp::max) == group.allreduce(v, comm::ReduceOp::min);
}

// `distributed` (built with `cfg`, init_random(11), a gradient listener over `data`, the data axis)
// on rows [r·B, (r+1)·B) of a batch of K·B, r its coordinate on `data` and K that axis' size (the
// ranks of a tensor-parallel group share their rows), a lone model on all of it: after 10 steps
// every mean loss within 2e-2 relative and every weight tensor's distance to the lone model's
// within `travel_tol` (a tenth by default) of the distance that tensor travelled from its initial
// value; with `gradients`,
// the first step's gradients per tensor within relative L2 2e-2 (bf16: three roundings instead of
// one). Model: any models::cuda::Gpt<Bf16, Comm>.
template <class Model>
void check_batch_slices(Model& distributed, const models::cuda::GptCudaConfig& cfg, bool gradients,
                        const comm::Mpi& data = world(), double travel_tol = 0.1) {
  const std::int64_t K = data.size();
  Gpt lone(cfg, K * kBatch, kSeq);
  lone.init_random(11);
  const auto initial = weights(lone);
  const Batch whole(K * kBatch, 42);
  const Batch mine(whole, data.rank() * kBatch, kBatch);

  for (std::int64_t s = 1; s <= 10; ++s) {
    const double mean_loss = data.allreduce(train_step(distributed, mine, s), comm::ReduceOp::sum) / static_cast<double>(K);
    const double lone_loss = train_step(lone, whole, s);
    CAPTURE(s, mean_loss, lone_loss);
    CHECK(std::abs(mean_loss - lone_loss) <= 2e-2 * std::abs(lone_loss));
    if (s == 1 && gradients)
      for (const auto& name : lone.parameter_names()) {
        const auto want = lone.gradient(name);
        CAPTURE(name);
        CHECK(l2(distributed.gradient(name), want) <= 2e-2 * l2(want) + 1e-7);
      }
  }
  const auto got = weights(distributed), want = weights(lone);
  for (const auto& [name, v] : want) {
    const double travelled = l2(v, initial.at(name));
    CAPTURE(name, travelled);
    CHECK(l2(got.at(name), v) <= travel_tol * travelled);
  }
}

}  // namespace dpml::test::gpt
