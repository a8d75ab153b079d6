// Data-parallel GPT on GPUs (models/cuda/gpt.hpp + parallel/cuda/gradient_sync.hpp), one GPU per
// rank (NCCL, and on 2 GPUs also comm::CopyEngine; or all ranks on one GPU through comm::Staged,
// see nccl_fixture.hpp), against a lone model on each rank's GPU that sees no other rank. Tiny configuration
// (L=2, C=64, H=2, V=67, T=32, per-rank batch 4), weights from init_random (the same seed on every
// rank), AdamW with clipping; buckets of 8 KiB so that the small model is cut into many of them
// and most all-reduces run while the backward is still going. The tied wte's gradient both ways
// (Gpt::listen(): every rank's token rows gathered, or wte all-reduced whole) in the equal-batches
// and batch-slices cases; the gathered rows' sum is formed per rank, so equal batches stay exact.
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
#include "gpt_fixture.hpp"

#include <dpml/comm/nccl.hpp>
#include <dpml/comm/nccl_copy_engine.hpp>
#include <dpml/models/cuda/gpt.hpp>
#include <dpml/parallel/cuda/gradient_sync.hpp>

#include <cstdint>
#include <cstring>
#include <map>
#include <type_traits>
#include <string>
#include <vector>

using namespace dpml;
using namespace dpml::test::gpt;

namespace {
// The data axis' communicators on this machine: test::with_gpu_comm's choice, and on two GPUs also
// comm::CopyEngine (the buckets all-reduced on the copy engines).
template <class Body>
void with_data_parallel_comms(Body&& body) {
  test::with_gpu_comm(body);
  if (test::gpu_comm() == test::GpuComm::nccl && test::world().size() == 2) body(std::type_identity<comm::CopyEngine>{});
}
}  // namespace

TEMPLATE_TEST_CASE("GPU data parallel GPT: equal batches on every rank give the lone model's weights bit for bit",
                   "[nccl][gpt]", bf16, float) {
  with_data_parallel_comms([]<class Comm>(std::type_identity<Comm>) {
    for (const auto tied : kTiedGradSyncs) {
      CAPTURE(static_cast<int>(tied));
      DataParallelGpt<TestType, Comm> dp(config(), tied);
      Gpt lone(config(), kBatch, kSeq);
      lone.init_random(11);
      CHECK(dp.model.gathers_tied_gradient() == (tied == models::cuda::TiedGradSync::gather));  // the path asked for
      CHECK_FALSE(lone.gathers_tied_gradient());                                                  // no listener
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
    }
  });
}

TEST_CASE("GPU data parallel GPT: ranks on their own batches keep bit-identical replicas", "[nccl][gpt]") {
  with_data_parallel_comms([]<class Comm>(std::type_identity<Comm>) {
    const int rank = test::world().rank();
    DataParallelGpt<bf16, Comm> dp(config(), models::cuda::TiedGradSync::gather);  // replicas equal: a deterministic gather
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
  with_data_parallel_comms([]<class Comm>(std::type_identity<Comm>) {
    for (const auto tied : kTiedGradSyncs) {
      CAPTURE(static_cast<int>(tied));
      DataParallelGpt<bf16, Comm> dp(config(), tied);
      check_batch_slices(dp.model, config(), /*gradients=*/true);
    }
  });
}
