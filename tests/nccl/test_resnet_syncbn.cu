// Synchronised BatchNorm in the data-parallel GPU ResNet (models/cuda/resnet.hpp,
// set_batch_norm_sync): K ranks, rank r on images [r·B, (r+1)·B) of a batch of K·B, against a lone
// model on each rank's GPU that trains on the whole batch. Tiny configuration as test_resnet_dp
// (width 8, blocks {1, 2, 1, 1}, 32×32 images, B = 4 per rank, 10 classes): stage 4 is 1×1, so its
// BatchNorms see 4 values per channel on a rank and 8 on the whole batch — per-rank statistics
// differ from the whole batch's by far more than any rounding. Weights from init_random (one seed
// everywhere), SGD with momentum and weight decay. The gradients are averaged by GradientSync
// (4 KiB buckets) where every rank has its own GPU and comm::Nccl; where the ranks share one GPU
// (comm::Staged, test::gpu_comm()) by an all-reduce of the whole buffer at finish().
//
//   equal to one GPU   with sync: the first step's gradients, per tensor, within relative L2
//                      kGradTol = 5e-2 of the lone model's; the mean of the ranks' losses within
//                      1e-2 relative of the lone loss at every step; after 3 steps every weight
//                      tensor within a tenth of the distance it travelled from its initial value,
//                      and every BatchNorm's running mean and variance within kStatTol = 1e-2
//                      (the mean's error relative to the running standard deviation, the
//                      variance's relative L2); the replicas' weights and running statistics equal
//                      bit for bit on every rank (every rank reduces the same sums).
//                      Why these bounds: both sides run the same bf16 kernels on the same images;
//                      they differ by fp32 summation order (the statistics' and the weight
//                      gradients' sums over 2 slices instead of one pass, the statistics' shift:
//                      the running mean instead of row 0), i.e. a few fp32 ulps in the BatchNorm
//                      coefficients, which flip a bf16 rounding in about 1 activation in 10⁴. Even
//                      a rounding of *every* activation and weight moves this network's gradients
//                      by 10–70 % (test_resnet_step's measurement), so a few flipped values are
//                      expected to move them by well under 1 % — 5e-2 leaves room for that
//                      amplification while a wiring error (a local sum where a global one belongs,
//                      dγ all-reduced and then averaged again, a missing all-reduce) errs by 10 %
//                      to 100 % on the tensors of stage 4 and before. The weights use test_gpt_dp's
//                      rule; the running statistics move by 0.1 of each step's batch statistics,
//                      which differ by the same small amounts as the activations.
//   without sync       the same data-parallel run with per-rank statistics must miss the lone
//                      model: its worst gradient tensor beyond kGradTol, its worst running
//                      statistic beyond kStatTol, its worst weight tensor beyond a tenth of its
//                      travel — so the checks above can fail.
//   running statistics set_batch_norm_sync gives every rank rank 0's (after a step on per-rank
//                      statistics they differ).
//   misuse             a communicator on another stream, or batches that differ between the
//                      ranks, are refused with an Error on every rank (no hang).
// The measured worst errors are printed (WARN, rank 0), to see the margins.
#include "nccl_fixture.hpp"

#include <dpml/comm/nccl.hpp>
#include <dpml/comm/staged.hpp>
#include <dpml/models/bottleneck_resnet.hpp>
#include <dpml/models/cuda/resnet.hpp>
#include <dpml/optim/sgd.hpp>
#include <dpml/parallel/cuda/gradient_sync.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using namespace dpml;

namespace {

constexpr std::int64_t kBatch = 4, kImage = 32, kClasses = 10;  // kBatch: per rank
constexpr std::array<std::int64_t, 4> kBlocks{1, 2, 1, 1};
constexpr std::uint64_t kSeed = 1337;
constexpr double kLr = 0.05;
const optim::SgdOptions kSgd{.momentum = 0.9, .weight_decay = 1e-4};
constexpr double kGradTol = 5e-2, kStatTol = 1e-2, kTravelTol = 0.1, kLossTol = 1e-2;

using ResNet = models::cuda::ResNet<>;  // ImplicitGemmConv: deterministic kernels

models::cuda::ResNetCudaConfig config() { return {.in_channels = 3, .width = 8, .blocks = kBlocks, .classes = kClasses}; }

// Images (N, 3, S, S) NCHW, normal, and labels in [0, classes); `salt` picks them.
struct Batch {
  std::vector<float> images;
  std::vector<std::int32_t> labels;
  Batch(std::int64_t n, std::uint64_t salt)
      : images(static_cast<std::size_t>(n * 3 * kImage * kImage)), labels(static_cast<std::size_t>(n)) {
    auto gen = test::rng(salt);
    std::normal_distribution<float> normal;
    for (auto& v : images) v = normal(gen);
    for (auto& l : labels) l = static_cast<std::int32_t>(gen() % kClasses);
  }
  // Images [first, first + n) of another batch.
  Batch(const Batch& whole, std::int64_t first, std::int64_t n) {
    const std::int64_t per = 3 * kImage * kImage;
    images.assign(whole.images.begin() + first * per, whole.images.begin() + (first + n) * per);
    labels.assign(whole.labels.begin() + first, whole.labels.begin() + first + n);
  }
};

// GradientSync's effect without its buckets, on any communicator: the whole flat buffer averaged
// at finish(), on the model's stream (GradientSync itself speaks comm::Nccl only).
template <class Comm>
class AverageAtFinish final : public parallel::cuda::GradientListener {
 public:
  AverageAtFinish(Comm comm, float* grads, std::size_t n) : comm_(std::move(comm)), grads_(grads), n_(n) {}
  void ready(std::size_t) override {}
  void finish() override { comm_.allreduce(grads_, n_, comm::ReduceOp::avg); }

 private:
  Comm comm_;
  float* grads_;
  std::size_t n_;
};

// A data-parallel replica of `batch` images: gradients averaged over the world, BatchNorm
// statistics synchronised through `bn` when sync_bn.
template <class Comm>
struct Replica {
  ResNet model;
  Comm bn;
  std::unique_ptr<parallel::cuda::GradientListener> averaging;
  explicit Replica(bool sync_bn, std::int64_t batch = kBatch)
      : model(config(), batch, kImage), bn(Comm::from(test::world(), model.stream())) {
    model.init_random(kSeed);
    const auto n = static_cast<std::size_t>(model.flat_size());
    if constexpr (std::is_same_v<Comm, comm::Nccl>)
      averaging = std::make_unique<parallel::cuda::GradientSync<float>>(comm::Nccl::from(test::world()), model.gradients(),
                                                                        n, model.stream(),
                                                                        parallel::cuda::GradientSyncOptions{4 << 10});
    else
      averaging = std::make_unique<AverageAtFinish<Comm>>(Comm::from(test::world(), model.stream()), model.gradients(), n);
    model.set_gradient_sync(averaging.get());
    if (sync_bn) model.set_batch_norm_sync(&bn);
  }
};

double train_step(ResNet& m, const Batch& b) {
  m.upload_batch(b.images, b.labels);
  m.forward_backward();
  m.update(kLr, kSgd);
  return m.loss();
}

using Named = std::vector<std::pair<std::string, std::vector<float>>>;  // tensors in parameter order

// Master weights in the host layout (through a host model of the same shape).
Named weights(const ResNet& m) {
  auto host = models::BottleneckResNet<float>::make({.in_channels = 3, .width = 8, .blocks = kBlocks, .classes = kClasses});
  m.copy_to(host.parameters());
  Named w;
  for (auto* p : host.parameters()) w.emplace_back(p->name(), std::vector<float>(p->value().data(), p->value().data() + p->numel()));
  return w;
}
// Gradients of the last forward_backward, host layout.
Named gradients(const ResNet& m) {
  Named g;
  for (std::size_t i = 0; i < m.slots().size(); ++i) g.emplace_back(m.slots()[i].name, m.gradient(i));
  return g;
}
// Per BatchNorm (named by its weight), its running mean (C) and variance (C).
struct Running {
  std::string name;
  std::vector<float> mean, var;
};
std::vector<Running> running(const ResNet& m) {
  const auto all = m.running_statistics();
  std::vector<Running> r;
  std::size_t at = 0;
  for (const auto& s : m.slots()) {
    if (s.k != 0 || s.name.starts_with("fc.") || !s.name.ends_with(".weight")) continue;  // BatchNorm weights only
    const auto C = static_cast<std::ptrdiff_t>(s.host_numel);
    const auto from = all.begin() + static_cast<std::ptrdiff_t>(at);
    r.push_back({s.name, std::vector<float>(from, from + C), std::vector<float>(from + C, from + 2 * C)});
    at += static_cast<std::size_t>(2 * C);
  }
  REQUIRE(at == all.size());
  return r;
}

double l2(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(s);
}
double norm(const std::vector<float>& a) { return l2(a, std::vector<float>(a.size(), 0.f)); }

// Whether `v` holds the same bits on every rank.
bool same_on_every_rank(const std::vector<float>& v) {
  const auto world = test::world();
  std::vector<std::uint32_t> hi(v.size()), lo(v.size());
  std::memcpy(hi.data(), v.data(), v.size() * sizeof(float));
  lo = hi;
  world.allreduce(hi.data(), hi.size(), comm::ReduceOp::max);
  world.allreduce(lo.data(), lo.size(), comm::ReduceOp::min);
  return hi == lo;
}
std::vector<float> flatten(const Named& tensors) {
  std::vector<float> v;
  for (const auto& [name, t] : tensors) v.insert(v.end(), t.begin(), t.end());
  return v;
}

// How far a data-parallel run is from the lone model: the worst tensor of each kind, each error as
// its check measures it.
struct Errors {
  double grad = 0, travel = 0, stat = 0;
};

// The errors of one data-parallel run against the lone one (CHECKed per tensor when `strict`).
Errors compare(const Named& grads, const Named& lone_grads, const Named& w, const Named& lone_w, const Named& initial,
               const std::vector<Running>& stats, const std::vector<Running>& lone_stats, bool strict) {
  Errors e;
  for (std::size_t i = 0; i < lone_grads.size(); ++i) {
    const double err = l2(grads[i].second, lone_grads[i].second) / std::max(norm(lone_grads[i].second), 1e-30);
    e.grad = std::max(e.grad, err);
    if (strict) {
      CAPTURE(lone_grads[i].first, err);
      CHECK(err <= kGradTol);
    }
  }
  for (std::size_t i = 0; i < lone_w.size(); ++i) {
    const double travelled = l2(lone_w[i].second, initial[i].second);
    const double ratio = l2(w[i].second, lone_w[i].second) / std::max(travelled, 1e-30);
    e.travel = std::max(e.travel, ratio);
    if (strict) {
      CAPTURE(lone_w[i].first, travelled, ratio);
      CHECK(ratio <= kTravelTol);
    }
  }
  for (std::size_t i = 0; i < lone_stats.size(); ++i) {
    std::vector<float> std_dev(lone_stats[i].var.size());
    std::transform(lone_stats[i].var.begin(), lone_stats[i].var.end(), std_dev.begin(), [](float v) { return std::sqrt(v); });
    const double mean_err = l2(stats[i].mean, lone_stats[i].mean) / norm(std_dev);
    const double var_err = l2(stats[i].var, lone_stats[i].var) / norm(lone_stats[i].var);
    e.stat = std::max({e.stat, mean_err, var_err});
    if (strict) {
      CAPTURE(lone_stats[i].name, mean_err, var_err);
      CHECK(mean_err <= kStatTol);
      CHECK(var_err <= kStatTol);
    }
  }
  return e;
}

template <class Comm>
void slices_equal_one_gpu() {
  const auto world = test::world();
  const std::int64_t K = world.size();
  const Batch whole(K * kBatch, 42);
  const Batch mine(whole, world.rank() * kBatch, kBatch);
  ResNet lone(config(), K * kBatch, kImage);
  lone.init_random(kSeed);
  Replica<Comm> synced(true), per_rank(false);
  const auto initial = weights(lone);

  Named lone_grads, synced_grads, per_rank_grads;
  for (int s = 1; s <= 3; ++s) {
    const double lone_loss = train_step(lone, whole);
    const double mean_loss = world.allreduce(train_step(synced.model, mine), comm::ReduceOp::sum) / static_cast<double>(K);
    train_step(per_rank.model, mine);
    CAPTURE(s, mean_loss, lone_loss);
    CHECK(std::abs(mean_loss - lone_loss) <= kLossTol * std::abs(lone_loss));
    if (s == 1) {
      lone_grads = gradients(lone);
      synced_grads = gradients(synced.model);
      per_rank_grads = gradients(per_rank.model);
    }
  }
  const auto lone_w = weights(lone);
  const auto lone_stats = running(lone);
  const auto synced_w = weights(synced.model);
  const auto synced_stats = running(synced.model);
  const Errors with = compare(synced_grads, lone_grads, synced_w, lone_w, initial, synced_stats, lone_stats, true);
  const Errors without = compare(per_rank_grads, lone_grads, weights(per_rank.model), lone_w, initial,
                                 running(per_rank.model), lone_stats, false);
  if (world.rank() == 0)
    WARN("worst against one GPU — synced: gradient " << with.grad << ", weights/travel " << with.travel
                                                     << ", running statistics " << with.stat
                                                     << "; per-rank statistics: " << without.grad << ", "
                                                     << without.travel << ", " << without.stat);
  CHECK(same_on_every_rank(flatten(synced_w)));
  CHECK(same_on_every_rank(synced.model.running_statistics()));
  // Per-rank statistics fail the same bounds: the checks above can fail.
  CHECK(without.grad > kGradTol);
  CHECK(without.travel > kTravelTol);
  CHECK(without.stat > kStatTol);
}

template <class Comm>
void running_statistics_from_rank_0() {
  const auto world = test::world();
  Replica<Comm> replica(false);
  train_step(replica.model, Batch(kBatch, 300 + static_cast<std::uint64_t>(world.rank())));  // per-rank statistics
  const auto before = replica.model.running_statistics();
  REQUIRE_FALSE(same_on_every_rank(before));
  std::vector<float> rank0 = before;
  world.broadcast(rank0.data(), rank0.size(), 0);
  replica.model.set_batch_norm_sync(&replica.bn);
  const auto after = replica.model.running_statistics();
  CHECK(std::memcmp(after.data(), rank0.data(), after.size() * sizeof(float)) == 0);
  CHECK(std::isfinite(train_step(replica.model, Batch(kBatch, 400 + static_cast<std::uint64_t>(world.rank())))));
  CHECK(same_on_every_rank(replica.model.running_statistics()));
}

template <class Comm>
void misuse_is_refused() {
  const auto world = test::world();
  {
    Replica<Comm> replica(false);
    Comm elsewhere = Comm::from(world);  // a stream of its own
    CHECK_THROWS_AS(replica.model.set_batch_norm_sync(&elsewhere), Error);
  }
  Replica<Comm> uneven(false, kBatch + 2 * world.rank());  // every rank a different batch
  CHECK_THROWS_AS(uneven.model.set_batch_norm_sync(&uneven.bn), Error);
  uneven.model.set_batch_norm_sync(nullptr);  // per-rank statistics: still trains
  CHECK(std::isfinite(train_step(uneven.model, Batch(kBatch + 2 * world.rank(), 500))));
}

// Each case with comm::Nccl when every rank has a GPU of its own, else comm::Staged on a shared GPU.
template <class F>
void on_every_comm(F&& run) {
  if (test::gpu_comm() == test::GpuComm::nccl) run(std::type_identity<comm::Nccl>{});
  else run(std::type_identity<comm::Staged>{});
}

}  // namespace

TEST_CASE("GPU synchronised BatchNorm: slices of a batch on the ranks train as one GPU on the whole batch",
          "[nccl][resnet][syncbn]") {
  on_every_comm([](auto comm_type) { slices_equal_one_gpu<typename decltype(comm_type)::type>(); });
}

TEST_CASE("GPU synchronised BatchNorm: every rank starts from rank 0's running statistics", "[nccl][resnet][syncbn]") {
  on_every_comm([](auto comm_type) { running_statistics_from_rank_0<typename decltype(comm_type)::type>(); });
}

TEST_CASE("GPU synchronised BatchNorm: a communicator off the model's stream or unequal batches are refused",
          "[nccl][resnet][syncbn]") {
  on_every_comm([](auto comm_type) { misuse_is_refused<typename decltype(comm_type)::type>(); });
}
