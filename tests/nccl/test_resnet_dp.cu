// Data-parallel ResNet on GPUs (models/cuda/resnet.hpp + parallel/cuda/gradient_sync.hpp), one GPU
// per rank (NCCL; or all ranks on one GPU through comm::Staged, see nccl_fixture.hpp), against a lone model on each rank's GPU that sees no other rank. Tiny configuration
// (width 8, blocks {1, 2, 1, 1}: projected blocks and a plain one, whose gradients are released
// layer by layer; 32×32 images, per-rank batch 4, 10 classes), weights from init_random (the same
// seed on every rank), SGD with momentum; buckets of 4 KiB, so that the model (140k gradients) is
// cut into about 140, most of them all-reduced while the backward still runs: a bucket released
// before its gradients were final would be averaged from stale values, then overwritten by this
// rank's own.
//
//   equal batches   every rank on the same batch: the average of equal fp32 gradients is exact
//                   (ncclAvg of K = 2 equal values), so 3 steps give the lone model's master
//                   weights bit for bit
//   own batches     every rank on its own batch: after 3 steps the replicas' master weights are
//                   bit-identical to each other and differ from the lone model's (which saw one
//                   rank's data only); both convolution policies
//   gradients       one step on the ranks' own batches: the flat gradient buffer is the mean of
//                   the lone models' gradients within 1e-5 of their largest magnitude, with small
//                   buckets and with one bucket (all-reduced at finish())
//
// The comparisons with the lone model's values (equal batches, gradients) run ImplicitGemmConv
// only: its kernels are deterministic (split-K summed in a fixed order), while cuDNN's engines,
// chosen by its heuristics, need not be, and its bf16 weight gradients would turn a last-bit
// difference into a bf16 rounding one.
#include "resnet_fixture.hpp"

#include <dpml/comm/nccl.hpp>
#include <dpml/models/bottleneck_resnet.hpp>
#include <dpml/models/cuda/resnet.hpp>
#include <dpml/optim/sgd.hpp>
#include <dpml/parallel/cuda/gradient_sync.hpp>
#if DPML_HAS_CUDNN
#include <dpml/kernels/cuda/conv/cudnn.hpp>
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

using namespace dpml;
using namespace dpml::test::resnet;

namespace {

constexpr std::size_t kSmallBuckets = 4 << 10;  // bytes

using OwnConv = kernels::cuda::ImplicitGemmConv<>;
#if DPML_HAS_CUDNN
using ConvPolicies = std::tuple<OwnConv, kernels::cuda::CudnnConv>;
#else
using ConvPolicies = std::tuple<OwnConv>;
#endif

template <class Conv>
using ResNet = models::cuda::ResNet<Conv>;

// A model whose gradients are averaged over the world in buckets of `bucket_bytes`.
template <class Conv, class Comm>
struct DataParallelResNet {
  ResNet<Conv> model;
  parallel::cuda::GradientSync<float, float, Comm> sync;
  explicit DataParallelResNet(std::size_t bucket_bytes)
      : model(config(), kBatch, kImage),
        sync(Comm::from(test::world()), model.gradients(), static_cast<std::size_t>(model.flat_size()),
             model.stream(), {.bucket_bytes = bucket_bytes}) {
    model.init_random(kSeed);
    model.set_gradient_sync(&sync);
  }
};

// A model of its own on this rank's GPU, initialised as the data-parallel ones.
template <class Conv>
struct LoneResNet {
  ResNet<Conv> model;
  LoneResNet() : model(config(), kBatch, kImage) { model.init_random(kSeed); }
};

// The flat gradient buffer of the last forward_backward (padding included); synchronises.
template <class Conv>
std::vector<float> flat_gradients(ResNet<Conv>& m) {
  std::vector<float> g(static_cast<std::size_t>(m.flat_size()));
  DPML_CHECK_CUDA(cudaStreamSynchronize(m.stream()));
  DPML_CHECK_CUDA(cudaMemcpy(g.data(), m.gradients(), g.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return g;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}


}  // namespace

TEST_CASE("GPU data parallel ResNet: equal batches on every rank give the lone model's weights bit for bit",
          "[nccl][resnet]") {
  test::with_gpu_comm([]<class Comm>(std::type_identity<Comm>) {
    DataParallelResNet<OwnConv, Comm> dp(kSmallBuckets);
    LoneResNet<OwnConv> lone;
    const Batch batch(kBatch, 3);  // the same on every rank
    for (int s = 1; s <= 3; ++s) {
      CAPTURE(s);
      CHECK(train_step(dp.model, batch) == train_step(lone.model, batch));
    }
    CHECK(dp.sync.bucket_count() > 4);
    CHECK(bitwise_equal(flatten(weights(dp.model)), flatten(weights(lone.model))));
  });
}

TEMPLATE_LIST_TEST_CASE("GPU data parallel ResNet: ranks on their own batches keep bit-identical replicas",
                        "[nccl][resnet]", ConvPolicies) {
  test::with_gpu_comm([]<class Comm>(std::type_identity<Comm>) {
    DataParallelResNet<TestType, Comm> dp(kSmallBuckets);
    LoneResNet<TestType> lone;
    const Batch batch(kBatch, 100 + static_cast<std::uint64_t>(test::world().rank()));
    for (int s = 1; s <= 3; ++s) {
      CAPTURE(s);
      CHECK(std::isfinite(train_step(dp.model, batch)));
      train_step(lone.model, batch);
    }
    const auto replica = flatten(weights(dp.model));
    CHECK(test::same_on_every_rank(replica));
    CHECK_FALSE(bitwise_equal(replica, flatten(weights(lone.model))));  // the other ranks' batches count
  });
}

TEST_CASE("GPU data parallel ResNet: the gradients are the mean of the ranks' lone gradients", "[nccl][resnet]") {
  test::with_gpu_comm([]<class Comm>(std::type_identity<Comm>) {
    const auto world = test::world();
    const Batch batch(kBatch, 200 + static_cast<std::uint64_t>(world.rank()));
    LoneResNet<OwnConv> lone;
    lone.model.upload_batch(batch.images, batch.labels);
    lone.model.forward_backward();
    const auto own = flat_gradients(lone.model);
    const std::size_t n = own.size(), K = static_cast<std::size_t>(world.size());
    std::vector<float> every(K * n);  // (ranks, n)
    world.allgather(own.data(), every.data(), n);
    std::vector<double> mean(n, 0.0);
    double largest = 0;
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t r = 0; r < K; ++r) mean[i] += every[r * n + i];
      mean[i] /= static_cast<double>(K);
      largest = std::max(largest, std::abs(mean[i]));
    }
    REQUIRE(largest > 0);

    for (std::size_t bucket_bytes : {kSmallBuckets, parallel::cuda::GradientSyncOptions{}.bucket_bytes}) {
      CAPTURE(bucket_bytes);
      DataParallelResNet<OwnConv, Comm> dp(bucket_bytes);
      dp.model.upload_batch(batch.images, batch.labels);
      dp.model.forward_backward();
      const auto got = flat_gradients(dp.model);
      std::size_t off = 0;
      double worst = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double err = std::abs(static_cast<double>(got[i]) - mean[i]);
        if (!(err <= 1e-5 * largest)) ++off;  // NaN counts
        worst = std::max(worst, err);
      }
      CAPTURE(dp.sync.bucket_count(), off, worst, largest);
      CHECK(off == 0);
      CHECK(test::same_on_every_rank(got));
    }
  });
}
