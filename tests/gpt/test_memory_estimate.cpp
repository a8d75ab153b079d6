// models::estimate_gpt_memory (models/gpt_memory.hpp) against what a host models::Gpt really holds:
//
//   parameters   the estimate's count per stage equals the elements of the tensors a Gpt<float>
//                built on this world's (tp, pp) layouts holds (counted off parameters(), not off
//                the estimator's formula), vocabulary padding and uneven stages included
//   activations  the bytes a forward and backward leave allocated (activations kept per
//                micro-batch, the head, the Device's shared scratch) equal the estimate's
//                activations + buffers, for one and two micro-batches in flight, with and without
//                GELU recompute and full recomputation. Measured by counting the bytes of the
//                64-byte-aligned operator new that HostSpace (and nothing else here) allocates with
//   ZeRO-1       divides the master weights and moments by dp (and adds the gradient shard)
//
// The refusal message of train_gpt (naming the flags) and its --dry-run are tests/gpt/CMakeLists'
// gpt_refuses_too_large and gpt_dry_run_*.
#include "test.hpp"

#include <dpml/layers/init.hpp>
#include <dpml/models/gpt.hpp>
#include <dpml/models/gpt_memory.hpp>
#include <dpml/parallel/data.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

namespace {
// Bytes held through the aligned operator new (HostSpace::allocate: alignment 64). Each block
// carries its size in a 64-byte header, so that the unsized delete knows it.
std::atomic<std::int64_t> g_aligned_bytes{0};
constexpr std::size_t kHeader = 64;
}  // namespace

void* operator new(std::size_t n, std::align_val_t al) {
  const auto a = std::max<std::size_t>(static_cast<std::size_t>(al), kHeader);
  void* raw = std::aligned_alloc(a, (n + kHeader + a - 1) / a * a + a);
  if (!raw) throw std::bad_alloc();
  auto* p = static_cast<unsigned char*>(raw) + a;
  reinterpret_cast<std::size_t*>(p - kHeader)[0] = n;
  reinterpret_cast<std::size_t*>(p - kHeader)[1] = a;
  g_aligned_bytes += static_cast<std::int64_t>(n);
  return p;
}
void operator delete(void* p, std::align_val_t) noexcept {
  if (!p) return;
  auto* q = static_cast<unsigned char*>(p);
  const std::size_t n = reinterpret_cast<std::size_t*>(q - kHeader)[0], a = reinterpret_cast<std::size_t*>(q - kHeader)[1];
  g_aligned_bytes -= static_cast<std::int64_t>(n);
  std::free(q - a);
}
void operator delete(void* p, std::size_t, std::align_val_t al) noexcept { operator delete(p, al); }
void* operator new[](std::size_t n, std::align_val_t al) { return operator new(n, al); }
void operator delete[](void* p, std::align_val_t al) noexcept { operator delete(p, al); }
void operator delete[](void* p, std::size_t, std::align_val_t al) noexcept { operator delete(p, al); }

using namespace dpml;

namespace {
// 67 tokens: padded on every tp; 3 layers: uneven stages at pp 2.
models::GptConfig small(std::int64_t pad = 1) {
  return {.vocab = 67, .max_seq = 8, .layers = 3, .heads = 4, .dim = 16, .pad_multiple = pad};
}
}  // namespace

TEST_CASE("estimate_gpt_memory: each stage's parameters are the elements a Gpt of that layout holds", "[gpt][memory]") {
  const auto world = test::world();
  for (int tp : {1, 2, 4})
    for (int pp : {1, 2})
      for (std::int64_t pad : {1, 8})
        for (std::int64_t last : {0, 2}) {  // 2: an uneven cut, 1 + 2 blocks (the even one is 2 + 1)
          if (world.size() % (tp * pp) != 0 || (last > 0 && pp == 1)) continue;
          const auto grid = ProcessGrid::create(world, {.tp = tp, .pp = pp});
          models::GptConfig c = small(pad);
          c.last_stage_layers = last;
          models::Gpt<float> model(c, grid);
          std::int64_t held = 0;
          for (const auto* p : model.parameters()) held += p->numel();
          const auto e = models::estimate_gpt_memory(c, {.tp = tp, .pp = pp, .dp = grid.dp()}, models::GptMemoryTerms::host());
          const auto& stage = e.stages.at(static_cast<std::size_t>(grid.coord(Axis::pipeline)));
          CAPTURE(tp, pp, pad, last, grid.coord(Axis::pipeline));
          CHECK(stage.parameter_elements == held);
          CHECK(stage.parameters == 4.0 * static_cast<double>(held));
          CHECK(stage.gradients == 4.0 * static_cast<double>(held));
          CHECK(stage.optimizer == 8.0 * static_cast<double>(held));  // float: two moments, no master copy
        }
}

TEST_CASE("estimate_gpt_memory: under the interleaved schedule each rank's parameters are its chunks'", "[gpt][memory]") {
  const auto world = test::world();
  if (world.size() % 2 != 0) return;
  const auto grid = ProcessGrid::create(world, {.pp = 2});
  models::GptConfig c = small(8);
  c.layers = 5;  // 4 virtual stages of 2, 1, 1, 1 blocks: uneven chunks
  models::GptChunks<float> model(c, grid, 2);
  std::int64_t held = 0;
  for (const auto* p : model.parameters()) held += p->numel();
  const auto e = models::estimate_gpt_memory(
      c, {.pp = 2, .dp = grid.dp(), .micro_batches = 4, .schedule = "interleaved", .virtual_stages = 2}, models::GptMemoryTerms::host());
  CAPTURE(grid.coord(Axis::pipeline));
  CHECK(e.stages.at(static_cast<std::size_t>(grid.coord(Axis::pipeline))).parameter_elements == held);
}

TEST_CASE("estimate_gpt_memory: activations and buffers are the bytes a host forward and backward keep", "[gpt][memory]") {
  const auto grid = ProcessGrid::create(comm::Mpi(MPI_COMM_SELF), {});
  constexpr std::int64_t B = 2;
  struct Case {
    bool recompute_gelu, recompute;
    int in_flight;  // micro-batches forwarded before the first backward (GPipe's order)
  };
  for (const Case k : {Case{false, false, 1}, Case{true, false, 1}, Case{false, false, 2}, Case{true, false, 2},
                       Case{false, true, 2}}) {
    models::GptConfig c = small();
    c.recompute_gelu = k.recompute_gelu;
    c.recompute = k.recompute;
    CAPTURE(k.recompute_gelu, k.recompute, k.in_flight);
    models::Gpt<float> model(c, grid);
    layers::initialize_all(model.parameters(), 7, &grid);
    Tensor<std::int32_t> tokens(Shape{B, c.max_seq}), targets(Shape{B, c.max_seq});
    for (std::int64_t i = 0; i < tokens.numel(); ++i) tokens.data()[i] = static_cast<std::int32_t>(i % c.vocab), targets.data()[i] = static_cast<std::int32_t>((3 * i) % c.vocab);
    kernels::Device<HostSpace> dev;  // shared scratch of its own: nothing allocated before
    layers::Context<HostSpace> ctx;
    ctx.device = &dev;
    ctx.global_batch = B * k.in_flight;

    const std::int64_t before = g_aligned_bytes.load();
    for (int mb = 0; mb < k.in_flight; ++mb) {
      ctx.micro_batch = mb;
      model.forward(ctx, tokens.cview(), {}, targets.cview());
    }
    for (int mb = 0; mb < k.in_flight; ++mb) {
      ctx.micro_batch = mb;
      model.backward_input(ctx, {});
      model.backward_weight(ctx);
    }
    (void)model.take_loss();
    const double kept = static_cast<double>(g_aligned_bytes.load() - before);

    const auto e = models::estimate_gpt_memory(
        c, {.micro_batch = B, .micro_batches = k.in_flight, .schedule = "gpipe"}, models::GptMemoryTerms::host());
    const auto& s = e.stages.at(0);
    CHECK(s.in_flight == k.in_flight);
    const double tokens_of_trainer = 2.0 * k.in_flight * B * c.max_seq * 4;  // the trainer's copy of the batch: not made here
    CHECK(kept == s.activations + s.buffers - tokens_of_trainer);
  }
}

TEST_CASE("estimate_gpt_memory: a compression's state is the bytes its compressor holds", "[gpt][memory][compression]") {
  const auto world = test::world();
  if (world.size() < 2) return;  // one data rank: no compressor, nothing counted (checked below)
  for (const int tp : {1, 2})
    for (const int pp : {1, 2}) {
      if (world.size() % (tp * pp) != 0 || world.size() / (tp * pp) < 2) continue;
      const auto grid = ProcessGrid::create(world, {.tp = tp, .pp = pp});
      const models::GptConfig c = small(8);
      models::Gpt<float> model(c, grid);
      FlatParameters<float> flat(model.parameters());  // the host layout: one bucket of 25 MB holds it
      REQUIRE(flat.buckets().size() == 1);
      const auto& data = grid.comm(Axis::data);
      const models::GptLayout layout{.tp = tp, .pp = pp, .dp = grid.dp()};
      const auto stage = [&](const models::GptLayout& l) {
        return models::estimate_gpt_memory(c, l, models::GptMemoryTerms::host()).stages.at(static_cast<std::size_t>(grid.coord(Axis::pipeline)));
      };
      const double plain = stage(layout).gradients;
      // What gradient buckets compressed by Policy with `options` allocate, against the estimate of
      // `compression` with those sizes.
      const auto check = [&]<class Policy>(Policy, const char* compression, parallel::CompressionOptions options) {
        const std::int64_t before = g_aligned_bytes.load();
        parallel::GradientBuckets<float, HostSpace, comm::Mpi, Policy> buckets(flat, &data, parallel::GradReduction::all_reduce, options);
        const double held = static_cast<double>(g_aligned_bytes.load() - before);
        auto l = layout;
        l.compression = compression;
        l.powersgd_rank = options.powersgd_rank;
        l.topk_ratio = options.topk_ratio;
        CAPTURE(tp, pp, compression, options.powersgd_rank, options.topk_ratio);
        CHECK(stage(l).gradients - plain == held);
      };
      // PowerSGD at ranks where every matrix is compressed, where some are not (r(n + m) ≥ n·m:
      // attn.c_proj (16, 8) at rank 8 and tp 2), and where none is.
      for (const int r : {1, 4, 8, 64}) check(PowerSgd{}, "powersgd", {.powersgd_rank = r});
      for (const double ratio : {0.01, 0.3, 1.0}) check(TopK{}, "topk", {.topk_ratio = ratio});
    }
  // One data rank: nothing to compress, nothing counted.
  const models::GptLayout one{.compression = "topk"};
  CHECK(models::estimate_gpt_memory(small(), one, models::GptMemoryTerms::host()).stages.at(0).gradients ==
        models::estimate_gpt_memory(small(), {}, models::GptMemoryTerms::host()).stages.at(0).gradients);
}

TEST_CASE("estimate_gpt_memory: ZeRO-1 divides the optimizer state over the data ranks", "[gpt][memory]") {
  const models::GptConfig c{.vocab = 50257, .max_seq = 1024, .layers = 12, .heads = 12, .dim = 768, .pad_multiple = 128,
                            .recompute_gelu = true};
  const auto terms = models::GptMemoryTerms::gpu();
  const auto plain = models::estimate_gpt_memory(c, {.dp = 4, .micro_batch = 4}, terms).stages.at(0);
  const auto zero = models::estimate_gpt_memory(c, {.dp = 4, .micro_batch = 4, .zero = true}, terms).stages.at(0);
  const double n = static_cast<double>(plain.parameter_elements);
  CHECK(plain.optimizer == 12.0 * n);                // fp32 master and two moments
  CHECK(zero.optimizer == 12.0 * n / 4 + 2.0 * n / 4);  // their shard, and the bf16 gradient shard
  CHECK(zero.parameters == plain.parameters);
  CHECK(zero.gradients == plain.gradients);
  CHECK(zero.activations == plain.activations);
  // ZeRO-Offload: a GPU keeps only the gradient shard of the optimizer column; the host holds the
  // shard's master weights and moments and the mirrors of its bf16 values and gradients (16 bytes
  // a parameter). Host ranks keep all of it in their own column, mirrors (of float) included.
  const auto offloaded = models::estimate_gpt_memory(c, {.dp = 4, .micro_batch = 4, .zero = true, .offload_optimizer = true}, terms);
  CHECK(offloaded.stages.at(0).optimizer == 2.0 * n / 4);
  CHECK(offloaded.stages.at(0).host_optimizer == (12.0 + 2 * 2.0) * n / 4);
  CHECK(offloaded.largest_host_optimizer() == offloaded.stages.at(0).host_optimizer);
  CHECK(offloaded.stages.at(0).parameters == zero.parameters);
  CHECK(zero.host_optimizer == 0);
  const auto host = models::GptMemoryTerms::host();
  const auto host_offloaded = models::estimate_gpt_memory(c, {.dp = 4, .micro_batch = 4, .zero = true, .offload_optimizer = true}, host).stages.at(0);
  CHECK(host_offloaded.optimizer ==
        models::estimate_gpt_memory(c, {.dp = 4, .micro_batch = 4, .zero = true}, host).stages.at(0).optimizer + 2 * 4.0 * n / 4);
  CHECK(host_offloaded.host_optimizer == 0);
  // ZeRO-2: no whole gradient buffer, a pool of bucket slots (one of them holds wte's bucket).
  const auto zero2 = models::estimate_gpt_memory(c, {.dp = 4, .micro_batch = 4, .zero = true, .shard_gradients = true}, terms).stages.at(0);
  CHECK(zero2.optimizer == zero.optimizer);
  CHECK(zero2.gradients < zero.gradients);
  CHECK(zero2.gradients >= 2.0 * 50304 * 768);
  // ZeRO-3: the values too — their shard and a pool of gathered buckets.
  const auto zero3 = models::estimate_gpt_memory(
      c, {.dp = 4, .micro_batch = 4, .zero = true, .shard_gradients = true, .shard_values = true}, terms).stages.at(0);
  CHECK(zero3.gradients == zero2.gradients);
  CHECK(zero3.parameters >= 2.0 * n / 4 + 2.0 * 50304 * 768);
  // The pool (3 gathered buckets and a prefetched one, of 25 MiB and a parameter each, one of them
  // with wte) is 0.8 of 124M's weights, so ZeRO-3 saves weights only on larger models: 1.3B here.
  models::GptConfig large = c;
  large.layers = 24, large.dim = 2048, large.heads = 16, large.max_seq = 2048;
  const auto large_zero = models::estimate_gpt_memory(large, {.dp = 4, .micro_batch = 1, .zero = true}, terms).stages.at(0);
  const auto large_zero3 = models::estimate_gpt_memory(
      large, {.dp = 4, .micro_batch = 1, .zero = true, .shard_gradients = true, .shard_values = true}, terms).stages.at(0);
  CHECK(large_zero3.parameters < 0.5 * large_zero.parameters);
  // Without prefetch the pool holds one bucket fewer.
  const auto large_no_prefetch = models::estimate_gpt_memory(
      large, {.dp = 4, .micro_batch = 1, .zero = true, .shard_gradients = true, .shard_values = true, .prefetch_values = false},
      terms).stages.at(0);
  CHECK(large_no_prefetch.parameters < large_zero3.parameters);
  CHECK(large_no_prefetch.parameters > large_zero3.parameters - 2.0 * (50304.0 * 2048 + (25 << 20) / 2.0));
  // 124M on one GPU, 16 sequences of 1024: what bench/gpt_train measured, 7.10 GiB (within 10 %).
  const auto one = models::estimate_gpt_memory(c, {.micro_batch = 16}, terms).largest().total() / (1 << 30);
  CHECK(one > 7.10 * 0.9);
  CHECK(one < 7.10 * 1.1);
}
