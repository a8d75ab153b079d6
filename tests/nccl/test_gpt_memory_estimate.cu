// models::estimate_gpt_memory (models/gpt_memory.hpp) against the device memory the composed GPT
// really takes: on each layout this world allows (one GPU; at 2 ranks dp 2, tp 2 and pp 2 under
// ZB-H1 with 4 micro-batches), the device memory this rank took from before its Device to after the
// first training step (cudaMemGetInfo, as bench/gpt_train's gpt_train_memory phases), the largest
// over the world, within 10 % of the estimate's largest rank. A GPT-2-like model of 4 blocks
// (C 768, 12 heads, V 50257, T 1024, 8 sequences per data rank), large enough that activations and
// state, not the allocator's rounding, decide. One GPU per rank (the estimate's NCCL constants are
// for that); skipped where ranks would share one.
#include "nccl_fixture.hpp"

#include <dpml/core/cuda_error.hpp>
#include <dpml/data/token_shards.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/gpt.hpp>
#include <dpml/models/gpt_memory.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/parallel/device_grid.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/gpt_trainer.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

using namespace dpml;

namespace {

constexpr std::int64_t kSeq = 1024, kBatch = 8;  // sequences per data rank and step

double free_bytes() {
  std::size_t free = 0, total = 0;
  DPML_CHECK_CUDA(cudaMemGetInfo(&free, &total));
  return static_cast<double>(free);
}

// Device bytes this rank took for set-up and one step (the largest over the world), and the estimate.
std::pair<double, double> measure(const comm::Mpi& world, int tp, int pp, const std::string& schedule, std::int64_t micro) {
  const auto grid = ProcessGrid::create(world, {.tp = tp, .pp = pp});
  models::GptConfig c{.vocab = 50257, .max_seq = kSeq, .layers = 4, .heads = 12, .dim = 768,
                      .pad_multiple = std::max(1, 128 / tp), .recompute_gelu = true};
  const double before = free_bytes();
  double took = 0;
  {
    kernels::Device<CudaSpace> dev;
    const parallel::DeviceGrid<comm::Nccl> comms(grid, dev);
    models::Gpt<bf16, CudaSpace> model(c, comms);
    layers::initialize_all(model.parameters(), 1, &grid);
    parallel::with_strategy(schedule, false, [&]<class Strategy>() {
      train::GptTrainer<Strategy, optim::AdamW, bf16, CudaSpace, comm::Nccl> trainer(
          model, comms, dev, {}, {.clip = 1.0}, {.micro_batch = micro, .global_batch = kBatch * grid.dp(), .seed = 3});
      data::TokenBatch b{Tensor<std::int32_t>(Shape{kBatch, kSeq}), Tensor<std::int32_t>(Shape{kBatch, kSeq})};
      for (std::int64_t i = 0; i < kBatch * kSeq; ++i) b.inputs[i] = static_cast<std::int32_t>((i * 31) % c.vocab), b.targets[i] = static_cast<std::int32_t>((i * 17) % c.vocab);
      (void)trainer.train_step(b, 1e-4);
      dev.synchronize();
      took = before - free_bytes();
    });
  }
  const auto e = models::estimate_gpt_memory(
      c, {.tp = tp, .pp = pp, .dp = grid.dp(), .micro_batch = micro, .micro_batches = static_cast<int>(kBatch / micro), .schedule = schedule},
      models::GptMemoryTerms::gpu());
  return {world.allreduce(took, comm::ReduceOp::max), e.largest().total()};
}

}  // namespace

TEST_CASE("estimate_gpt_memory: within 10 % of the device memory after the first step", "[gpu][gpt][memory]") {
  test::gpu_per_rank();
  const auto world = test::world();
  struct Layout {
    int tp, pp;
    const char* schedule;
    std::int64_t micro;
  };
  REQUIRE(world.size() <= 2);  // 12 heads and 4 blocks: tp and pp up to 2 here
  std::vector<Layout> layouts{{1, 1, "1f1b", kBatch}};  // one GPU, or dp 2
  if (world.size() == 2) layouts.push_back({2, 1, "1f1b", kBatch}), layouts.push_back({1, 2, "zb-h1", kBatch / 4});
  for (const Layout& l : layouts) {
    const auto [measured, estimated] = measure(world, l.tp, l.pp, l.schedule, l.micro);
    CAPTURE(world.size(), l.tp, l.pp, l.schedule, measured / (1 << 30), estimated / (1 << 30));
    CHECK(estimated > 0.9 * measured);
    CHECK(estimated < 1.1 * measured);
  }
}
