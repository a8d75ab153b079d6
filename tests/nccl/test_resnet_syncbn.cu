// Synchronised BatchNorm in the data-parallel GPU ResNet (models/cuda/resnet.hpp,
// set_batch_norm_sync): K ranks, rank r on images [r·B, (r+1)·B) of a batch of K·B, against a lone
// model on each rank's GPU that trains on the whole batch. Tiny configuration as test_resnet_dp
// (width 8, blocks {1, 2, 1, 1}, 32×32 images, B = 4 per rank, 10 classes): stage 4 is 1×1, so its
// BatchNorms see 4 values per channel on a rank and 8 on the whole batch — per-rank statistics
// differ from the whole batch's by far more than any rounding. Weights from init_random (one seed
// everywhere), SGD with momentum and weight decay. The gradients are averaged by GradientSync
// (4 KiB buckets) over comm::Nccl where every rank has its own GPU, over comm::Staged where the
// ranks share one (test::with_gpu_comm).
//
//   equal batches      every rank on the same batch with sync: the totals are K times each
//                      rank's sums over K times its rows, so statistics, coefficients and dγ, dβ
//                      (averaged over equal values) are those of one model synchronised over
//                      itself alone (a communicator of one rank), and 3 SGD steps give its losses,
//                      master weights and running means bit for bit (not the running variances:
//                      their unbiasing factor M/(M−1) sees K times the rows). This catches a wrong count or
//                      scale (a local sum beside the global count, dγ summed and then averaged
//                      again), not a missing all-reduce: equal batches hide that.
//   slices             rank r on images [r·B, (r+1)·B) of a batch of K·B: one step with sync
//                      must land far closer to a lone model on the whole batch than the same run
//                      with per-rank statistics — the first step's worst relative gradient error
//                      under a quarter, the worst running-statistic error under a tenth of the
//                      per-rank run's. Not a fixed tolerance: this tiny network (stage 4 is 1×1,
//                      so its BatchNorms see 4 values per channel on a rank) moves its gradients by
//                      10–70 % when every activation is rounded once more (test_resnet_step), so
//                      two correct runs that only sum in another order already differ by up to
//                      ~40 % on a few tensors (measured on an H100: worst 0.42 with sync against
//                      3.4 per rank; after 3 steps the weights drift apart chaotically either way).
//                      The BatchNorm arithmetic itself is checked against float64 on two slices
//                      in test_cuda_conv.
//   running statistics set_batch_norm_sync gives every rank rank 0's (after a step on per-rank
//                      statistics they differ).
//   misuse             a communicator on another stream, or batches that differ between the
//                      ranks, are refused with an Error on every rank (no hang).
// The measured worst errors are printed (WARN, rank 0), to see the margins.
#include "resnet_fixture.hpp"

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
using namespace dpml::test::resnet;

namespace {

using ResNet = models::cuda::ResNet<>;  // ImplicitGemmConv: deterministic kernels

// A data-parallel replica of `batch` images: gradients averaged over the world, BatchNorm
// statistics synchronised through `bn` when sync_bn.
template <class Comm>
struct Replica {
  ResNet model;
  Comm bn;
  parallel::cuda::GradientSync<float, float, Comm> averaging;
  explicit Replica(bool sync_bn, std::int64_t batch = kBatch)
      : model(config(), batch, kImage),
        bn(Comm::from(test::world(), model.stream())),
        averaging(Comm::from(test::world()), model.gradients(), static_cast<std::size_t>(model.flat_size()),
                  model.stream(), {.bucket_bytes = 4 << 10}) {
    model.init_random(kSeed);
    model.set_gradient_sync(&averaging);
    if (sync_bn) model.set_batch_norm_sync(&bn);
  }
};

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


// How far a data-parallel run is from the lone model: the worst tensor of each kind (relative L2
// per gradient tensor; per BatchNorm, the running mean's error relative to the running standard
// deviation and the running variance's relative L2).
struct Errors {
  double grad = 0, stat = 0;
};
Errors compare(const Named& grads, const Named& lone_grads, const std::vector<Running>& stats,
               const std::vector<Running>& lone_stats) {
  Errors e;
  for (std::size_t i = 0; i < lone_grads.size(); ++i)
    e.grad = std::max(e.grad, l2(grads[i].second, lone_grads[i].second) / std::max(norm(lone_grads[i].second), 1e-30));
  for (std::size_t i = 0; i < lone_stats.size(); ++i) {
    std::vector<float> std_dev(lone_stats[i].var.size());
    std::transform(lone_stats[i].var.begin(), lone_stats[i].var.end(), std_dev.begin(), [](float v) { return std::sqrt(v); });
    e.stat = std::max({e.stat, l2(stats[i].mean, lone_stats[i].mean) / norm(std_dev),
                       l2(stats[i].var, lone_stats[i].var) / norm(lone_stats[i].var)});
  }
  return e;
}

template <class Comm>
void equal_batches_match_one_model() {
  const auto world = test::world();
  const Batch batch(kBatch, 7);  // the same on every rank
  Replica<Comm> synced(true);
  ResNet alone(config(), kBatch, kImage);
  alone.init_random(kSeed);
  const comm::Mpi self(MPI_COMM_SELF);
  Comm only_me = Comm::from(self, alone.stream());
  alone.set_batch_norm_sync(&only_me);
  for (int s = 1; s <= 3; ++s) {
    CAPTURE(s);
    CHECK(train_step(synced.model, batch) == train_step(alone, batch));
  }
  CHECK(flatten(weights(synced.model)) == flatten(weights(alone)));
  const auto stats = running(synced.model), alone_stats = running(alone);
  for (std::size_t i = 0; i < stats.size(); ++i) {
    CAPTURE(stats[i].name);
    CHECK(stats[i].mean == alone_stats[i].mean);
  }
}

template <class Comm>
void slices_closer_to_one_gpu() {
  const auto world = test::world();
  const std::int64_t K = world.size();
  const Batch whole(K * kBatch, 42);
  const Batch mine(whole, world.rank() * kBatch, kBatch);
  ResNet lone(config(), K * kBatch, kImage);
  lone.init_random(kSeed);
  Replica<Comm> synced(true), per_rank(false);
  train_step(lone, whole);
  train_step(synced.model, mine);
  train_step(per_rank.model, mine);
  const auto lone_grads = gradients(lone);
  const auto lone_stats = running(lone);
  const Errors with = compare(gradients(synced.model), lone_grads, running(synced.model), lone_stats);
  const Errors without = compare(gradients(per_rank.model), lone_grads, running(per_rank.model), lone_stats);
  CAPTURE(with.grad, without.grad, with.stat, without.stat);
  if (world.rank() == 0)
    WARN("worst against one GPU after one step — gradient: " << with.grad << " synchronised, " << without.grad
                                                             << " per rank; running statistics: " << with.stat << ", "
                                                             << without.stat);
  CHECK(with.grad < 0.25 * without.grad);
  CHECK(with.stat < 0.1 * without.stat);
  CHECK(test::same_on_every_rank(synced.model.running_statistics()));
}

template <class Comm>
void running_statistics_from_rank_0() {
  const auto world = test::world();
  Replica<Comm> replica(false);
  train_step(replica.model, Batch(kBatch, 300 + static_cast<std::uint64_t>(world.rank())));  // per-rank statistics
  const auto before = replica.model.running_statistics();
  REQUIRE_FALSE(test::same_on_every_rank(before));
  std::vector<float> rank0 = before;
  world.broadcast(rank0.data(), rank0.size(), 0);
  replica.model.set_batch_norm_sync(&replica.bn);
  const auto after = replica.model.running_statistics();
  CHECK(std::memcmp(after.data(), rank0.data(), after.size() * sizeof(float)) == 0);
  CHECK(std::isfinite(train_step(replica.model, Batch(kBatch, 400 + static_cast<std::uint64_t>(world.rank())))));
  CHECK(test::same_on_every_rank(replica.model.running_statistics()));
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

}  // namespace

TEST_CASE("GPU synchronised BatchNorm: equal batches on the ranks train as one model bit for bit",
          "[nccl][resnet][syncbn]") {
  test::with_gpu_comm([]<class Comm>(std::type_identity<Comm>) { equal_batches_match_one_model<Comm>(); });
}

TEST_CASE("GPU synchronised BatchNorm: slices of a batch on the ranks come far closer to one GPU on the whole batch",
          "[nccl][resnet][syncbn]") {
  test::with_gpu_comm([]<class Comm>(std::type_identity<Comm>) { slices_closer_to_one_gpu<Comm>(); });
}

TEST_CASE("GPU synchronised BatchNorm: every rank starts from rank 0's running statistics", "[nccl][resnet][syncbn]") {
  test::with_gpu_comm([]<class Comm>(std::type_identity<Comm>) { running_statistics_from_rank_0<Comm>(); });
}

TEST_CASE("GPU synchronised BatchNorm: a communicator off the model's stream or unequal batches are refused",
          "[nccl][resnet][syncbn]") {
  test::with_gpu_comm([]<class Comm>(std::type_identity<Comm>) { misuse_is_refused<Comm>(); });
}
