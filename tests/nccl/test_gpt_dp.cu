// Data-parallel GPT on GPUs (models/cuda/gpt.hpp + parallel/cuda/gradient_sync.hpp), one GPU per
// rank (NCCL; or all ranks on one GPU through comm::Staged, see nccl_fixture.hpp), against a lone model on each rank's GPU that sees no other rank. Tiny configuration
// (L=2, C=64, H=2, V=67, T=32, per-rank batch 4), weights from init_random (the same seed on every
// rank), AdamW with clipping; buckets of 8 KiB so that the small model is cut into many of them
// and most all-reduces run while the backward is still going.
//
//   equal batches   every rank on the same batch: the average of equal gradients is exact (ncclAvg
//                   of K = 2 equal values), so 3 steps give the lone model's weights bit for bit,
//                   with either wire type
//   own batches     every rank on its own batch: after 3 steps the replicas are bit-identical to
//                   each other and differ from the lone model (which saw one rank's data only)
//   batch slices    rank r on rows [r·B, (r+1)·B) of a batch of K·B, the lone model on all of it:
//                   the first step's gradients within bf16 tolerance (relative L2 ≤ 2e-2 per
//                   tensor: three roundings instead of one), and after 10 steps every loss within
//                   2e-2 relative and every weight tensor's distance to the lone model's within a
//                   tenth of the distance that tensor travelled from its initial value
#include "../cuda/device.hpp"
#include "nccl_fixture.hpp"

#include <dpml/comm/nccl.hpp>
#include <dpml/models/cuda/gpt.hpp>
#include <dpml/parallel/cuda/gradient_sync.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace dpml;
using test::DeviceVec;

namespace {

constexpr std::int64_t kBatch = 4, kSeq = 32, kVocab = 67;
constexpr double kLr = 3e-3, kClip = 1.0;
const optim::AdamWOptions kAdam{.eps = 1e-6, .weight_decay = 0.1};
using Gpt = models::cuda::Gpt<models::cuda::Bf16>;
using State = Gpt::State;

models::cuda::GptCudaConfig config() { return {.vocab = kVocab, .max_seq = kSeq, .layers = 2, .heads = 2, .dim = 64}; }

// A batch of `rows` sequences: inputs random, targets a fixed function of them; `salt` picks it.
struct Batch {
  DeviceVec<std::int32_t> inputs, targets;
  explicit Batch(std::int64_t rows, std::uint64_t salt) : inputs(host(rows, salt, false)), targets(host(rows, salt, true)) {}
  // Rows [first, first + count) of another batch.
  Batch(const Batch& whole, std::int64_t first, std::int64_t count)
      : inputs(slice(whole.inputs.download(), first, count)), targets(slice(whole.targets.download(), first, count)) {}

 private:
  static std::vector<std::int32_t> host(std::int64_t rows, std::uint64_t salt, bool targets) {
    auto gen = test::rng(salt);
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

// A model whose gradients are averaged over the world (Wire: the reduction's type).
template <class Comm, class Wire = bf16>
struct DataParallelGpt {
  Gpt model;
  parallel::cuda::GradientSync<bf16, Wire, Comm> sync;
  DataParallelGpt()
      : model(config(), kBatch, kSeq),
        sync(Comm::from(test::world()), model.gradients(), static_cast<std::size_t>(model.parameter_count()),
             model.stream(), {.bucket_bytes = 8 << 10}) {
    model.init_random(11);
    model.set_gradient_sync(&sync);
  }
};

double train_step(Gpt& m, const Batch& b, std::int64_t step) {
  m.forward_backward(b.inputs.ptr, b.targets.ptr);
  m.update(kLr, step, kAdam, kClip);
  return m.loss();
}

std::map<std::string, std::vector<float>> weights(const Gpt& m) {
  std::map<std::string, std::vector<float>> w;
  for (const auto& name : m.parameter_names()) {
    std::vector<float> v(m.gradient(name).size());
    m.read_state(State::master, name, v);
    w[name] = std::move(v);
  }
  return w;
}

// A 64-bit FNV-1a hash of every weight's bytes: equal on two ranks ⇔ (all but surely) equal weights.
std::uint64_t fingerprint(const std::map<std::string, std::vector<float>>& w) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const auto& [name, v] : w) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
    for (std::size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  }
  return h;
}

bool same_on_every_rank(std::uint64_t v) {
  const auto w = test::world();
  return w.allreduce(v, comm::ReduceOp::max) == w.allreduce(v, comm::ReduceOp::min);
}

double l2(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(s);
}

}  // namespace

TEMPLATE_TEST_CASE("GPU data parallel GPT: equal batches on every rank give the lone model's weights bit for bit",
                   "[nccl][gpt]", bf16, float) {
  test::with_gpu_comm([]<class Comm>(std::type_identity<Comm>) {
    DataParallelGpt<Comm, TestType> dp;
    Gpt lone(config(), kBatch, kSeq);
    lone.init_random(11);
    const Batch batch(kBatch, 3);
    for (std::int64_t s = 1; s <= 3; ++s) {
      CAPTURE(s);
      CHECK(train_step(dp.model, batch, s) == train_step(lone, batch, s));
    }
    CHECK(dp.sync.bucket_count() > 4);
    const auto a = weights(dp.model), b = weights(lone);
    for (const auto& [name, w] : b) {
      CAPTURE(name);
      CHECK(std::memcmp(a.at(name).data(), w.data(), w.size() * sizeof(float)) == 0);
    }
  });
}

TEST_CASE("GPU data parallel GPT: ranks on their own batches keep bit-identical replicas", "[nccl][gpt]") {
  test::with_gpu_comm([]<class Comm>(std::type_identity<Comm>) {
    const int rank = test::world().rank();
    DataParallelGpt<Comm> dp;
    Gpt lone(config(), kBatch, kSeq);
    lone.init_random(11);
    const Batch batch(kBatch, 100 + static_cast<std::uint64_t>(rank));
    for (std::int64_t s = 1; s <= 3; ++s) {
      train_step(dp.model, batch, s);
      train_step(lone, batch, s);
    }
    const std::uint64_t replica = fingerprint(weights(dp.model));
    CHECK(same_on_every_rank(replica));
    CHECK(replica != fingerprint(weights(lone)));  // the other ranks' batches count
  });
}

TEST_CASE("GPU data parallel GPT: slices of a batch on the ranks equal one GPU on the whole batch", "[nccl][gpt]") {
  test::with_gpu_comm([]<class Comm>(std::type_identity<Comm>) {
    const auto world = test::world();
    const std::int64_t K = world.size();
    DataParallelGpt<Comm> dp;
    Gpt lone(config(), K * kBatch, kSeq);
    lone.init_random(11);
    const auto initial = weights(lone);
    const Batch whole(K * kBatch, 42);
    const Batch mine(whole, world.rank() * kBatch, kBatch);

    for (std::int64_t s = 1; s <= 10; ++s) {
      const double mean_loss = world.allreduce(train_step(dp.model, mine, s), comm::ReduceOp::sum) / static_cast<double>(K);
      const double lone_loss = train_step(lone, whole, s);
      CAPTURE(s, mean_loss, lone_loss);
      CHECK(std::abs(mean_loss - lone_loss) <= 2e-2 * std::abs(lone_loss));
      if (s == 1)
        for (const auto& name : lone.parameter_names()) {
          const auto want = lone.gradient(name);
          const double norm = l2(want, std::vector<float>(want.size(), 0.f));
          CAPTURE(name);
          CHECK(l2(dp.model.gradient(name), want) <= 2e-2 * norm + 1e-7);
        }
    }
    const auto got = weights(dp.model), want = weights(lone);
    for (const auto& [name, w] : want) {
      const double travelled = l2(w, initial.at(name));
      CAPTURE(name, travelled);
      CHECK(l2(got.at(name), w) <= 0.1 * travelled);
    }
  });
}
