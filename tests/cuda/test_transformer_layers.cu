// The transformer layers on CudaSpace against the same layers on the host in float64
// (layer_check.hpp), in bf16 and fp32 (every kernel here takes fp32; the attention through its
// SIMT kernels), at B = 2 and T = 70 (not a multiple of the attention's 64-row tiles), C = 96 with 3
// heads of 32, C = 128 with 2 heads of 64 or 1 of 128:
//   column- and row-parallel linears (tp = 1), the row-parallel residual join, also in place
//   attention (causal and bidirectional) and MLP (with and without the GELU recompute), each with
//   its residual join
//   TransformerBlock and a Stack of two (block i − 1 reads block i's input gradient from the shared
//   ring), with the weight gradients formed inside backward_input or deferred to backward_weight
//   (ctx.deferred_weight_gradients), with activation recomputation and the GELU recompute — over
//   two micro-batches in flight at once (both forwards, then the backwards), every parameter
//   reported ready once per micro-batch
//   and the memory a block keeps: per block and micro-batch what the fused GPT keeps (12·B·T·C
//   elements with the GELU recompute, 16 without; 11 more for a deferred weight gradient), and not
//   one byte more per block in a backward whose weight gradients follow at once.
//
// Tolerances (relative L2 against float64): kLayerTol (1e-2 bf16, 1e-4 fp32) for the linears. The
// composite layers chain several bf16 roundings of ≤ 2^-9 each (LayerNorm, qkv, the attention's
// probabilities and output, the residual stream, the GELU), and a few gradients are sums that
// nearly cancel (the key bias's is zero in exact arithmetic: softmax ignores a shift): 3e-2 for
// attention, MLP, block and stack (the fused GPT's step test allows 5e-2 for a whole model); fp32
// 1e-4.
#include "layer_check.hpp"

#include <dpml/layers/attention.hpp>
#include <dpml/layers/mlp.hpp>
#include <dpml/layers/parallel_linear.hpp>
#include <dpml/layers/stack.hpp>
#include <dpml/layers/transformer_block.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

using namespace dpml;
using namespace dpml::layers;

namespace {

template <class T>
constexpr double tol(double bf16_tol) {
  return std::is_same_v<T, float> ? 1e-4 : bf16_tol;
}

template <class T>
Tensor<double> random_rounded(Shape shape, std::mt19937_64& gen) {
  auto t = test::random_tensor<double>(shape, gen);
  test::round_to<T>(t);
  return t;
}

template <class V>
std::vector<double> values(const V& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Two micro-batches through the host and the device layer: both forwards, then each
// backward_input (followed at once by its backward_weight unless deferred), then the deferred
// backward_weights; outputs, input gradients (each read before the next backward) and every
// parameter gradient (of both micro-batches) compared. A container must report each of its
// parameters once per micro-batch.
template <class T, class HostL, class DevL>
void check_two_micro_batches(test::DeviceLayerCheck<T>& check, HostL& host, DevL& dev, Shape shape, bool deferred,
                             double tolerance) {
  check.copy_parameters(host, dev);
  auto& hctx = check.host_context();
  auto& dctx = check.device_context();
  hctx.deferred_weight_gradients = dctx.deferred_weight_gradients = deferred;
  std::map<const ParamBase*, int> reports;
  dctx.on_grad_ready = [&](std::span<ParamBase* const> ps) {
    for (const ParamBase* p : ps) ++reports[p];
  };
  std::vector<Tensor<double>> g;
  std::vector<Tensor<double>> x;
  std::vector<Tensor<T, CudaSpace>> xd, gd;
  for (int mb = 0; mb < 2; ++mb) {
    CAPTURE(mb);
    hctx.micro_batch = dctx.micro_batch = mb;
    x.push_back(random_rounded<T>(shape, check.gen()));
    xd.push_back(test::upload_as<T>(x.back()));
    const auto y = host.forward(hctx, x.back().cview());
    const auto yd = dev.forward(dctx, xd.back().cview());
    CHECK(test::rel_l2(test::download_doubles(yd), values(y)) < tolerance);
    g.push_back(random_rounded<T>(y.shape(), check.gen()));
    gd.push_back(test::upload_as<T>(g.back()));
  }
  for (int mb = 0; mb < 2; ++mb) {
    CAPTURE(mb);
    hctx.micro_batch = dctx.micro_batch = mb;
    const auto dx = host.backward_input(hctx, g[mb].cview());
    const auto dxd = dev.backward_input(dctx, gd[mb].cview());
    CHECK(test::rel_l2(test::download_doubles(dxd), values(dx)) < tolerance);
    if (!deferred) {
      host.backward_weight(hctx, g[mb].cview());
      dev.backward_weight(dctx, gd[mb].cview());
    }
  }
  for (int mb = 0; deferred && mb < 2; ++mb) {
    hctx.micro_batch = dctx.micro_batch = mb;
    host.backward_weight(hctx, g[mb].cview());
    dev.backward_weight(dctx, gd[mb].cview());
  }
  check.compare_gradients(host, dev, tolerance);
  if constexpr (Container<DevL>) {
    for (const auto* p : dev.parameters()) {
      CAPTURE(p->name());
      CHECK(reports[p] == 2);
    }
  }
  dctx.on_grad_ready = nullptr;
  hctx.micro_batch = dctx.micro_batch = 0;
}

// forward(ctx, x, residual) = residual + forward(ctx, x), host against device.
template <class T, class HostL, class DevL>
void check_residual_join(test::DeviceLayerCheck<T>& check, HostL& host, DevL& dev, Shape shape, double tolerance) {
  check.copy_parameters(host, dev);
  const auto x = random_rounded<T>(shape, check.gen()), res = random_rounded<T>(shape, check.gen());
  const auto xd = test::upload_as<T>(x), resd = test::upload_as<T>(res);
  const auto want = values(host.forward(check.host_context(), x.cview(), res.cview()));
  CHECK(test::rel_l2(test::download_doubles(dev.forward(check.device_context(), xd.cview(), resd.cview())), want) <
        tolerance);
  const auto plain = host.forward(check.host_context(), x.cview());  // and it is what it says
  for (std::int64_t i = 0; i < plain.numel(); ++i)
    CHECK(want[static_cast<std::size_t>(i)] == test::Approx(plain[i] + res[i]).margin(1e-12));
}

struct Dims {
  std::int64_t C, H;  // head dim C / H
};
constexpr Dims kDims[] = {{96, 3}, {128, 2}, {128, 1}};  // head dims 32, 64, 128
constexpr std::int64_t kB = 2, kT = 70;

}  // namespace

TEMPLATE_TEST_CASE("Column- and row-parallel linears on the GPU (tp = 1) equal the float64 host layers",
                   "[cuda][layers][transformer]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(31);
  for (bool gather : {false, true}) {  // gather_output is the identity at tp = 1
    CAPTURE(gather);
    ColumnParallelLinear<double> host(45, 72, {.gather_output = gather, .name = "col"});
    ColumnParallelLinear<T, CudaSpace> dev(45, 72, {.gather_output = gather, .name = "col"});
    check.run(host, dev, Shape{kB, 35, 45}, test::kLayerTol<T>);
  }
  RowParallelLinear<double> host(72, 45, {.name = "row"});
  RowParallelLinear<T, CudaSpace> dev(72, 45, {.name = "row"});
  check.run(host, dev, Shape{kB, 35, 72}, test::kLayerTol<T>);

  // The residual join, and in place: the residual's own buffer receives the sum.
  check.copy_parameters(host, dev);
  const auto x = random_rounded<T>(Shape{kB, 35, 72}, check.gen()), res = random_rounded<T>(Shape{kB, 35, 45}, check.gen());
  const auto xd = test::upload_as<T>(x);
  auto resd = test::upload_as<T>(res);
  const auto want = values(host.forward(check.host_context(), x.cview(), res.cview()));
  CHECK(test::rel_l2(test::download_doubles(dev.forward(check.device_context(), xd.cview(), resd.cview())), want) <
        test::kLayerTol<T>);
  const auto in_place = dev.forward(check.device_context(), xd.cview(), resd.cview(), resd.view());
  CHECK(in_place.data() == resd.data());
  CHECK(test::rel_l2(test::download_doubles(resd.cview()), want) < test::kLayerTol<T>);
}

TEMPLATE_TEST_CASE("CausalSelfAttention on the GPU equals the float64 host layer (head dims 32, 64, 128)",
                   "[cuda][layers][transformer][attention]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(32);
  for (const auto [C, H] : kDims) {
    CAPTURE(C, H);
    CausalSelfAttention<double> host(C, H, "attn");
    CausalSelfAttention<T, CudaSpace> dev(C, H, "attn");
    check_two_micro_batches(check, host, dev, Shape{kB, kT, C}, false, tol<T>(3e-2));
    check_residual_join(check, host, dev, Shape{kB, kT, C}, tol<T>(3e-2));
  }
}

TEST_CASE("CausalSelfAttention on the GPU refuses a head dimension its kernels lack, at construction",
          "[cuda][layers][transformer][attention]") {
  CHECK(test::message_of([] { CausalSelfAttention<bf16, CudaSpace> a(64, 4, "attn"); }) ==
        "attention attn: head dimension 16 (64 / 4 heads) is not one this space's attention kernels take (32, 64 or 128)");
  CHECK(test::message_of([] { CausalSelfAttention<double> a(64, 4, "attn"); }).empty());  // the host takes any
}

TEMPLATE_TEST_CASE("BidirectionalSelfAttention and its TransformerBlock on the GPU equal the float64 host layers",
                   "[cuda][layers][transformer][attention]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(36);
  for (const auto [C, H] : kDims) {
    CAPTURE(C, H);
    BidirectionalSelfAttention<double> host(C, H, "attn");
    BidirectionalSelfAttention<T, CudaSpace> dev(C, H, "attn");
    check_two_micro_batches(check, host, dev, Shape{kB, kT, C}, false, tol<T>(3e-2));
    check_residual_join(check, host, dev, Shape{kB, kT, C}, tol<T>(3e-2));
  }
  for (bool deferred : {false, true}) {
    CAPTURE(deferred);
    using Block = TransformerBlock<T, CudaSpace, parallel::default_comm_t<CudaSpace>, attention::Bidirectional>;
    TransformerBlock<double, HostSpace, parallel::default_comm_t<HostSpace>, attention::Bidirectional> host({.dim = 96, .heads = 3, .name = "h.0"});
    Block dev({.dim = 96, .heads = 3, .name = "h.0"});
    check_two_micro_batches(check, host, dev, Shape{kB, kT, 96}, deferred, tol<T>(3e-2));
  }
}

TEST_CASE("BidirectionalSelfAttention on the GPU refuses a key-padding mask: the flash kernels take none yet",
          "[cuda][layers][transformer][attention]") {
  test::DeviceLayerCheck<bf16> check(37);
  BidirectionalSelfAttention<bf16, CudaSpace> dev(64, 2, "attn");
  const Tensor<bf16, CudaSpace> x = test::upload_as<bf16>(test::random_tensor<double>(Shape{2, 8, 64}, check.gen()));
  const std::int64_t valid[] = {8, 5};
  const auto keys = KeyPadding::lengths(valid, 8);
  CHECK(test::message_of([&] { (void)dev.forward(check.device_context(), x.cview(), keys); })
            .starts_with("attention on the GPU: a key-padding mask has no kernel yet"));
}

TEMPLATE_TEST_CASE("Mlp on the GPU, with and without the GELU recompute, equals the float64 host Mlp",
                   "[cuda][layers][transformer][mlp]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(33);
  for (bool recompute_gelu : {false, true})
    for (bool deferred : {false, true}) {  // deferred: both forwards before either weight gradient
      CAPTURE(recompute_gelu, deferred);
      Mlp<double> host(MlpOptions{.dim = 96, .hidden = 200, .name = "mlp"});
      Mlp<T, CudaSpace> dev(MlpOptions{.dim = 96, .hidden = 200, .name = "mlp", .recompute_gelu = recompute_gelu});
      check_two_micro_batches(check, host, dev, Shape{kB, kT, 96}, deferred, tol<T>(3e-2));
      check_residual_join(check, host, dev, Shape{kB, kT, 96}, tol<T>(3e-2));
    }
}

TEMPLATE_TEST_CASE("TransformerBlock on the GPU equals the float64 host block: weight gradients at once or "
                   "deferred, recomputation, GELU recompute", "[cuda][layers][transformer][block]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(34);
  for (const auto [C, H] : {kDims[0], kDims[1]})
    for (bool deferred : {false, true})
      for (bool recompute : {false, true})
        for (bool recompute_gelu : {false, true}) {
          CAPTURE(C, H, deferred, recompute, recompute_gelu);
          const BlockOptions o{.dim = C, .heads = H, .recompute = recompute, .recompute_gelu = recompute_gelu,
                               .name = "h.0"};
          TransformerBlock<double> host({.dim = C, .heads = H, .name = "h.0"});
          TransformerBlock<T, CudaSpace> dev(o);
          check_two_micro_batches(check, host, dev, Shape{kB, kT, C}, deferred, tol<T>(3e-2));
        }
}

TEMPLATE_TEST_CASE("A Stack of two TransformerBlocks on the GPU equals the float64 host stack (the shared ring of "
                   "input gradients)", "[cuda][layers][transformer][block]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(35);
  for (bool deferred : {false, true}) {
    CAPTURE(deferred);
    std::vector<TransformerBlock<double>> hb;
    std::vector<TransformerBlock<T, CudaSpace>> db;
    for (int i = 0; i < 2; ++i) {
      hb.emplace_back(BlockOptions{.dim = 96, .heads = 3});
      db.emplace_back(BlockOptions{.dim = 96, .heads = 3, .recompute_gelu = true});
    }
    Stack<TransformerBlock<double>> host(std::move(hb), "h");
    Stack<TransformerBlock<T, CudaSpace>> dev(std::move(db), "h");
    check_two_micro_batches(check, host, dev, Shape{kB, kT, 96}, deferred, tol<T>(3e-2));
  }
}

TEST_CASE("TransformerBlock on the GPU keeps per micro-batch what the fused GPT keeps, and its backward nothing per "
          "block", "[cuda][layers][transformer][block][memory]") {
  using T = bf16;
  const std::int64_t B = 8, Tn = 512, C = 512, H = 8, n = B * Tn * C;
  const double MiB = 1 << 20;
  auto gen = test::rng(36);
  for (bool recompute_gelu : {true, false})
    for (bool deferred : {false, true}) {
      CAPTURE(recompute_gelu, deferred);
      kernels::Device<CudaSpace> device;
      Context<CudaSpace> ctx;
      ctx.device = &device;
      ctx.deferred_weight_gradients = deferred;
      std::vector<TransformerBlock<T, CudaSpace>> blocks;
      for (int i = 0; i < 3; ++i)
        blocks.emplace_back(BlockOptions{.dim = C, .heads = H, .recompute_gelu = recompute_gelu, .name = "h." + std::to_string(i)});
      for (auto& b : blocks) initialize_all(b.parameters(), 1, nullptr);
      auto free_bytes = [&] {
        device.synchronize();
        std::size_t free = 0, total = 0;
        DPML_CHECK_CUDA(cudaMemGetInfo(&free, &total));
        return static_cast<double>(free);
      };
      const auto x = test::upload_as<T>(test::random_tensor<double>(Shape{B, Tn, C}, gen));
      const auto dy = test::upload_as<T>(test::random_tensor<double>(Shape{B, Tn, C}, gen));
      // Block 0 also makes what all blocks share (GEMM workspace, scratch, the GELU buffer).
      auto h = blocks[0].forward(ctx, x.cview());
      const double before = free_bytes();
      h = blocks[2].forward(ctx, blocks[1].forward(ctx, h));
      const double per_block = (before - free_bytes()) / 2;
      const double kept = static_cast<double>((recompute_gelu ? 12 : 16) * n) * sizeof(T) +
                          static_cast<double>(4 * B * Tn + B * H * Tn) * sizeof(float);  // + LN statistics, lse
      CAPTURE(per_block / MiB, kept / MiB);
      CHECK(per_block >= 0.99 * kept);  // the measure sees the allocations
      CHECK(per_block <= kept + 2 * MiB);  // + allocation granularity (small buffers share 2 MiB pages)

      // Block 2's backward makes the shared scratch; the others' add nothing (deferred: what W reads).
      auto d = blocks[2].backward_input(ctx, dy.cview());
      const double after_first = free_bytes();
      d = blocks[0].backward_input(ctx, blocks[1].backward_input(ctx, d));
      const double per_backward = (after_first - free_bytes()) / 2;
      CAPTURE(per_backward / MiB);
      if (deferred) {
        CHECK(per_backward >= 0.99 * static_cast<double>(11 * n * sizeof(T)));
        CHECK(per_backward <= static_cast<double>(11 * n * sizeof(T)) + 1 * MiB);
      } else {
        CHECK(per_backward <= 0.5 * MiB);
      }
      for (int i = 2; i >= 0; --i) blocks[static_cast<std::size_t>(i)].backward_weight(ctx, dy.cview());
    }
}
