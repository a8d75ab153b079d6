// ZeRO-1 for the GPU GPT (parallel/cuda/distributed_optimizer.hpp): K data-parallel ranks, each
// holding the fp32 master weights and AdamW moments of its 1/K of the flat buffer, against plain
// data parallelism (GradientSync, every rank holding all of them) and against a lone model.
// gpt_fixture.hpp's tiny GPT with max_seq = 33 (wpe 33 rows): the flat buffer, 110400 elements,
// is not a multiple of 64·K, so the replicated remainder (the first 64 elements: wpe) is in play;
// 8 KiB buckets cut it into some 27 buckets, each split between the ranks.
//
//   same as data parallel  ranks on their own batches, 10 AdamW steps with clipping, ZeRO-1 and
//                          plain data parallelism side by side: per step the losses and gradient
//                          norms, after the steps every weight tensor. With NCCL the two runs agree
//                          bit for bit: with K = 2 the reduce-scatter and the all-reduce reduce
//                          every element with one addition of the same two (ncclAvg-scaled)
//                          values; only the norm's summation order differs (per shard, then over
//                          ranks, against one CUB pass), which moves the float clip coefficient by
//                          at most one ulp (6e-8) in the rarest of cases. Bound: 1e-6 relative
//                          (losses, norms) and 1e-6 of the distance each tensor travelled
//                          (weights). Any other communicator (comm::Staged reduces on the host) may
//                          round the bf16 average of its reduce-scatter differently from its
//                          all-reduce: one bf16 ulp (2^-8) in a gradient moves that element's AdamW
//                          step by under 2^-8 of itself, so the bound there is 1e-2. A wrong shard,
//                          scale, norm or a missing all-gather moves weights by the order of the
//                          distance travelled.
//   batch slices           test_gpt_dp's comparison with one GPU on the whole batch (losses within
//                          2e-2, weights within a tenth of the distance travelled); gradients are
//                          not compared: after ZeRO-1's reduce-scatter only each rank's shards hold
//                          the average
//   state bytes            the optimizer state on each rank is 12 bytes × (its shards + the
//                          remainder): at least 1/K of the full state, at most 64·K elements more,
//                          summed over the ranks the full state plus K−1 copies of the remainder,
//                          and the model's device bytes shrink by the difference
//   state of a tensor      read_state (a collective) of master, exp_avg and exp_avg_sq for every
//                          tensor after 3 steps: plain data parallelism's values (bound as above);
//                          then each rank writes rank-specific values to a tensor spanning several
//                          buckets and reads back every rank's values (each element from its
//                          owner, so the tensor does span the shards of all ranks), and the
//                          same values written everywhere read back exactly
//   fp16 loss scaling      Fp16 models, every rank on the same batch, against a lone Fp16 model on
//                          it; a first loss scale of 2^24 overflows (dlogit ≈ S/N = 2^17 > 65504),
//                          so the first steps are skipped and halve the scale, then training goes
//                          on (2^16 does not overflow here, test_gpt_step). Per step: the same
//                          skip decision and loss scale, losses and norms within 1e-3 relative;
//                          after 16 steps the weights within 1e-3 of the distance travelled. The
//                          average of K equal gradients is exact (ncclAvg halves exactly) but for
//                          fp16 subnormals (scaled |g| < 2^-13), whose halving may drop a bit worth
//                          1e-12 unscaled, far below AdamW's eps: the two runs agree to rounding.
#include "gpt_fixture.hpp"

#include <dpml/comm/nccl.hpp>
#include <dpml/models/cuda/gpt.hpp>
#include <dpml/parallel/cuda/distributed_optimizer.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

using namespace dpml;
using namespace dpml::test::gpt;

namespace {

constexpr std::int64_t kMaxSeq = kSeq + 1;  // 64 more elements: a remainder of 64 for K = 2 and 4

// Runs a case with comm::Nccl, one GPU per rank, or with comm::Staged on a shared GPU where the
// node has fewer GPUs than ranks (test::with_gpu_comm).
template <class Case>
void on_gpus(Case&& run) {
  test::with_gpu_comm(run);
}

// How close ZeRO-1 stays to plain data parallelism on the same batches (see the header).
template <class Comm>
constexpr double kSameTol = std::is_same_v<Comm, comm::Nccl> ? 1e-6 : 1e-2;

// A model whose optimizer is sharded over the world, attached before init_random: the model never
// holds the full optimizer state.
template <class Comm>
struct ZeroGpt {
  Gpt model;
  parallel::cuda::DistributedOptimizer<bf16, Comm> zero;
  explicit ZeroGpt(models::cuda::TiedGradSync tied = models::cuda::TiedGradSync::automatic)
      : model(config(kMaxSeq), kBatch, kSeq),
        zero(Comm::from(test::world()), model.weights(), model.gradients(),
             static_cast<std::size_t>(model.parameter_count()), model.stream(), {.bucket_bytes = kBucketBytes}) {
    model.set_distributed_optimizer(&zero, tied);
    model.init_random(11);
  }
};

// Every tensor of `got` within tol × (its distance in `ref` from `from`, or its norm in `ref`).
void check_close(const std::map<std::string, std::vector<float>>& got, const std::map<std::string, std::vector<float>>& ref,
                 const std::map<std::string, std::vector<float>>* from, double tol) {
  for (const auto& [name, want] : ref) {
    const double scale = from ? l2(want, from->at(name)) : l2(want);
    CAPTURE(name, scale);
    CHECK(l2(got.at(name), want) <= tol * scale + 1e-30);
  }
}

template <class Comm>
void same_as_data_parallel(std::type_identity<Comm>, models::cuda::TiedGradSync tied) {
  DataParallelGpt<bf16, Comm> dp(config(kMaxSeq), tied);
  ZeroGpt<Comm> zero(tied);
  CHECK(zero.zero.bucket_count() > 4);
  CHECK(zero.zero.remainder() > 0);
  const auto initial = weights(dp.model);
  const Batch batch(kBatch, 100 + static_cast<std::uint64_t>(test::world().rank()));
  for (std::int64_t s = 1; s <= 10; ++s) {
    const double dp_loss = train_step(dp.model, batch, s), zero_loss = train_step(zero.model, batch, s);
    const double dp_norm = dp.model.grad_norm(), zero_norm = zero.model.grad_norm();
    CAPTURE(s, dp_loss, zero_loss, dp_norm, zero_norm);
    CHECK(std::abs(zero_loss - dp_loss) <= kSameTol<Comm> * std::abs(dp_loss));
    CHECK(std::abs(zero_norm - dp_norm) <= kSameTol<Comm> * dp_norm);
  }
  check_close(weights(zero.model), weights(dp.model), &initial, kSameTol<Comm>);
}

template <class Comm>
void batch_slices(std::type_identity<Comm>) {
  for (const auto tied : kTiedGradSyncs) {
    CAPTURE(static_cast<int>(tied));
    ZeroGpt<Comm> zero(tied);
    check_batch_slices(zero.model, config(kMaxSeq), /*gradients=*/false);
  }
}

template <class Comm>
void state_bytes(std::type_identity<Comm>) {
  const auto world = test::world();
  const auto K = static_cast<std::size_t>(world.size());
  DataParallelGpt<bf16, Comm> dp(config(kMaxSeq));
  ZeroGpt<Comm> zero;
  const auto n = static_cast<std::size_t>(zero.model.parameter_count());
  const std::size_t full = dp.model.optimizer_state_bytes(), mine = zero.model.optimizer_state_bytes();
  const std::size_t remainder = zero.zero.remainder();
  CAPTURE(n, K, full, mine, remainder);
  CHECK(full == 12 * n);
  CHECK(mine == zero.zero.state_bytes());
  CHECK(mine >= full / K);
  CHECK(mine <= 12 * (n / K + 64 * K));
  CHECK(world.allreduce(static_cast<std::uint64_t>(mine), comm::ReduceOp::sum) == 12 * (n + (K - 1) * remainder));
  CHECK(dp.model.device_bytes() - zero.model.device_bytes() == full - mine);
}

template <class Comm>
void state_of_a_tensor(std::type_identity<Comm>) {
  const auto world = test::world();
  DataParallelGpt<bf16, Comm> dp(config(kMaxSeq));
  ZeroGpt<Comm> zero;
  const Batch batch(kBatch, 200 + static_cast<std::uint64_t>(world.rank()));
  for (std::int64_t s = 1; s <= 3; ++s) {
    train_step(dp.model, batch, s);
    train_step(zero.model, batch, s);
  }
  for (State which : {State::master, State::exp_avg, State::exp_avg_sq}) {
    CAPTURE(static_cast<int>(which));
    check_close(states(zero.model, which), states(dp.model, which), nullptr, kSameTol<Comm>);
  }

  // Rank r writes i + r·n to element i of a tensor of four buckets: each element reads back as
  // its owner's value.
  const std::string name = "h.0.mlp.c_fc.weight";  // (4C, C): 16384 elements
  const std::size_t n = zero.model.gradient(name).size();
  const auto K = world.size();
  auto value = [n](std::size_t i, int rank) { return static_cast<float>(i + static_cast<std::size_t>(rank) * n); };
  std::vector<float> written(n), got(n);
  for (std::size_t i = 0; i < n; ++i) written[i] = value(i, world.rank());
  zero.model.write_state(State::exp_avg, name, written);
  zero.model.read_state(State::exp_avg, name, got);
  std::set<int> owners;
  std::size_t strays = 0;  // elements whose value no rank wrote
  for (std::size_t i = 0; i < n; ++i) {
    const int owner = static_cast<int>((static_cast<double>(got[i]) - static_cast<double>(i)) / static_cast<double>(n));
    if (owner >= 0 && owner < K && got[i] == value(i, owner)) owners.insert(owner);
    else ++strays;
  }
  CHECK(strays == 0);
  CHECK(static_cast<int>(owners.size()) == K);
  // The same values on every rank read back exactly.
  for (std::size_t i = 0; i < n; ++i) written[i] = value(i, 0);
  zero.model.write_state(State::exp_avg, name, written);
  zero.model.read_state(State::exp_avg, name, got);
  CHECK(got == written);
}

template <class Comm>
void fp16_loss_scaling(std::type_identity<Comm>) {
  using Fp16Gpt = models::cuda::Gpt<models::cuda::Fp16>;
  auto cfg = config(kMaxSeq);
  cfg.loss_scale.initial = 0x1p24;
  Fp16Gpt model(cfg, kBatch, kSeq), lone(cfg, kBatch, kSeq);
  parallel::cuda::DistributedOptimizer<kernels::cuda::f16, Comm> zero(
      Comm::from(test::world()), model.weights(), model.gradients(), static_cast<std::size_t>(model.parameter_count()),
      model.stream(), {.bucket_bytes = kBucketBytes});
  model.set_distributed_optimizer(&zero);
  model.init_random(11);
  lone.init_random(11);
  const auto initial = weights(lone);
  const Batch batch(kBatch, 5);  // the same on every rank
  constexpr int kSteps = 16;
  int skipped = 0;
  for (std::int64_t s = 1, step = 1; s <= kSteps; ++s) {
    const double scale = model.loss_scale();
    const double loss = train_step(model, batch, step), lone_loss = train_step(lone, batch, step);
    const double norm = model.finish_step(), lone_norm = lone.finish_step();
    CAPTURE(s, scale, loss, lone_loss, norm, lone_norm);
    CHECK(model.loss_scale() == lone.loss_scale());
    CHECK(std::isfinite(norm) == std::isfinite(lone_norm));
    CHECK(std::abs(loss - lone_loss) <= 1e-3 * std::abs(lone_loss));
    if (std::isfinite(lone_norm)) {
      ++step;
      CHECK(std::abs(norm - lone_norm) <= 1e-3 * lone_norm);
    } else {
      ++skipped;
    }
  }
  CAPTURE(skipped);
  CHECK(skipped >= 1);
  CHECK(kSteps - skipped >= 4);
  check_close(weights(model), weights(lone), &initial, 1e-3);
}

}  // namespace

TEST_CASE("GPU ZeRO-1 GPT: ranks on their own batches train as plain data parallelism", "[nccl][gpt][zero]") {
  on_gpus([](auto comm) {
    for (const auto tied : kTiedGradSyncs) {
      CAPTURE(static_cast<int>(tied));
      same_as_data_parallel(comm, tied);
    }
  });
}

TEST_CASE("GPU ZeRO-1 GPT: slices of a batch on the ranks equal one GPU on the whole batch", "[nccl][gpt][zero]") {
  on_gpus([](auto comm) { batch_slices(comm); });
}

TEST_CASE("GPU ZeRO-1 GPT: each rank holds its 1/K of the optimizer state", "[nccl][gpt][zero]") {
  on_gpus([](auto comm) { state_bytes(comm); });
}

TEST_CASE("GPU ZeRO-1 GPT: read_state gathers a tensor from its owners", "[nccl][gpt][zero]") {
  on_gpus([](auto comm) { state_of_a_tensor(comm); });
}

TEST_CASE("GPU ZeRO-1 GPT: fp16 loss scaling skips the same steps as one GPU", "[nccl][gpt][zero]") {
  on_gpus([](auto comm) { fp16_loss_scaling(comm); });
}
