// bench_kernels: each device kernel family at GPT-2 124M's training shapes (B = 16, T = 1024,
// C = 768, H = 12, V = 50304, 124.5M parameters), bf16 activations. For every kernel it prints one
// JSON object — {"bench":"kernels","kernel":..,"ms":..,"gb_per_s":..,"tflops":..,"floor_ms":..} —
// where floor_ms = max(bytes / 3.0 TB/s, FLOPs / 797 TFLOP/s) (the H100 ceilings measured in
// shared/TOOLCHAIN.md), then a Markdown table for bench/kernels/README.md.
//
//   bench_kernels [--iters N]
//
// Flags (train::Args; --help lists them with defaults and ranges, and needs no GPU): --iters, the
// timed runs per kernel (≥ 1), after two untimed ones. A bad flag exits 1 naming it.
#include "../support/fill.cuh"
#include "../support/train_timing.cuh"

#include <dpml/core/cuda_space.hpp>
#include <dpml/kernels/cuda/attention.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/kernels/cuda/cross_entropy.hpp>
#include <dpml/kernels/cuda/elementwise.hpp>
#include <dpml/kernels/cuda/embedding.hpp>
#include <dpml/kernels/cuda/grad_norm.hpp>
#include <dpml/kernels/cuda/layer_norm.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/optim/optimizer.hpp>
#include <dpml/train/args.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <span>
#include <string>
#include <vector>

using namespace dpml;
namespace kc = dpml::kernels::cuda;

namespace {

constexpr double kBandwidth = 3.0e12;  // bytes/s, H100 device copy
constexpr double kTensorPeak = 797e12;  // FLOP/s, H100 bf16 GEMM through cuBLAS

template <class T>
T* device(std::int64_t n, std::uint32_t seed, float lo = -1.f, float hi = 1.f) {
  T* p = nullptr;
  DPML_CHECK_CUDA(cudaMalloc(&p, static_cast<std::size_t>(n) * sizeof(T)));
  dpml::bench::fill_uniform(p, n, seed, lo, hi);
  return p;
}

struct Row {
  std::string kernel;
  double ms, bytes, flops;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    int iters = 20;
    train::Args args("bench_kernels",
                     "Each device kernel family at GPT-2 124M's training shapes (B = 16, T = 1024, C = 768, H = 12,\n"
                     "V = 50304), bf16 activations: one JSON line per kernel (ms, GB/s, TFLOP/s, floor_ms = the time at\n"
                     "the H100's bandwidth or tensor peak), then a Markdown table. One GPU.");
    args.flag("--iters", iters, "timed runs per kernel, after two untimed ones (ms is their mean)", train::at_least(1));
    if (!args.parse(argc, argv)) return 0;  // --help: printed, before any CUDA call
    if (cuda_device_count() == 0) {
      std::fprintf(stderr, "bench_kernels: no CUDA device\n");
      return 1;
    }
    constexpr std::int64_t B = 16, Tn = 1024, C = 768, H = 12, D = 64, V = 50304, V_real = 50257, N = B * Tn;
    constexpr std::int64_t P = 124475904;  // GPT-2 124M parameters with the padded vocabulary
    cudaStream_t s;
    DPML_CHECK_CUDA(cudaStreamCreate(&s));
    std::vector<Row> rows;
    // f's work on stream `on` (default s).
    auto time = [&](std::string name, double bytes, double flops, const std::function<void()>& f, cudaStream_t on = nullptr) {
      f();
      f();
      const double ms = dpml::bench::ms_per_step(iters, on ? on : s, f);
      const double floor_ms = std::max(bytes / kBandwidth, flops / kTensorPeak) * 1e3;
      std::printf("{\"bench\":\"kernels\",\"kernel\":\"%s\",\"ms\":%.4f,\"gb_per_s\":%.1f,\"tflops\":%.2f,"
                  "\"floor_ms\":%.4f}\n",
                  name.c_str(), ms, bytes / (ms * 1e-3) / 1e9, flops / (ms * 1e-3) / 1e12, floor_ms);
      std::fflush(stdout);
      rows.push_back({std::move(name), ms, bytes, flops});
    };

    // LayerNorm (N, C)
    auto* x = device<bf16>(N * C, 1);
    auto* y = device<bf16>(N * C, 2);
    auto* dy = device<bf16>(N * C, 3);
    auto* w = device<bf16>(C, 4, 0.5f, 1.5f);
    auto* bias = device<bf16>(C, 5);
    auto* dw = device<bf16>(C, 6);
    auto* db = device<bf16>(C, 7);
    auto* mean = device<float>(N, 8);
    auto* rstd = device<float>(N, 9, 0.5f, 1.f);
    auto* scratch = device<float>(std::max(kc::layer_norm_weight_scratch(N, C), kc::column_sums_scratch(N, 4 * C, 1)), 10);
    const double act = static_cast<double>(N * C) * 2;  // bytes of one (N, C) bf16 tensor
    time("layer_norm_forward", 2 * act, 8.0 * N * C,
         [&] { kc::layer_norm_forward(x, w, bias, y, mean, rstd, N, C, 1e-5f, s); });
    time("layer_norm_backward_input", 3 * act, 12.0 * N * C,
         [&] { kc::layer_norm_backward_input(dy, x, w, mean, rstd, y, N, C, s); });
    time("layer_norm_backward_weight", 2 * act, 4.0 * N * C,
         [&] { kc::layer_norm_backward_weight(dy, x, mean, rstd, dw, db, scratch, N, C, s); });
    time("residual_add (N, C)", 3 * act, 1.0 * N * C, [&] { kc::add(x, dy, y, N * C, s); });

    // GELU and bias gradient on (N, 4C)
    auto* h4 = device<bf16>(N * 4 * C, 11, -3.f, 3.f);
    auto* g4 = device<bf16>(N * 4 * C, 12);
    auto* o4 = device<bf16>(N * 4 * C, 13);
    auto* db4 = device<bf16>(4 * C, 14);
    time("gelu_forward (N, 4C)", 8 * act, 20.0 * N * 4 * C, [&] { kc::gelu_forward(h4, o4, N * 4 * C, s); });
    time("gelu_backward (N, 4C)", 12 * act, 30.0 * N * 4 * C, [&] { kc::gelu_backward(h4, g4, o4, N * 4 * C, s); });
    time("bias_grad_rows (N, 4C)", 4 * act, 1.0 * N * 4 * C,
         [&] { kc::bias_grad_rows(g4, db4, scratch, N, 4 * C, s); });

    // Embedding
    auto* tokens = device<std::int32_t>(N, 15, 0.f, static_cast<float>(V_real) - 1.f);
    auto* wte = device<bf16>(V * C, 16);
    auto* wpe = device<bf16>(Tn * C, 17);
    auto* dwte = device<bf16>(V * C, 18);
    auto* dwpe = device<bf16>(Tn * C, 19);
    const std::size_t ews = kc::embedding_backward_workspace(N, V);
    void* ew = nullptr;
    DPML_CHECK_CUDA(cudaMalloc(&ew, ews));
    time("embedding_forward (token + position)", 4 * act, 1.0 * N * C, [&] {
      kc::embedding_token_forward(tokens, wte, y, N, C, 0, V, s);
      kc::embedding_position_forward(wpe, y, B, Tn, C, s);
    });
    time("embedding_backward (token sort + runs, position)", 4 * act, 2.0 * N * C, [&] {
      kc::embedding_token_backward(tokens, dy, dwte, N, C, 0, V, V, ew, ews, s);
      kc::embedding_position_backward(dy, dwpe, B, Tn, C, s);
    });

    // Cross-entropy over (N, V) bf16 logits
    auto* logits = device<bf16>(N * V, 20, -4.f, 4.f);
    auto* targets = device<std::int32_t>(N, 21, 0.f, static_cast<float>(V_real) - 1.f);
    auto* losses = device<float>(N, 22);
    // The row is read once (into shared memory) and the gradient written once: 2 · N · V · 2 bytes.
    time("softmax_cross_entropy (N, V)", 2.0 * N * V * 2, 4.0 * N * V,
         [&] { kc::softmax_cross_entropy(logits, targets, losses, 1.f / N, N, V, V_real, s); });
    DPML_CHECK_CUDA(cudaFree(logits));

    // The library's optimizer path over the flat buffer: the global norm of the gradients
    // (GradNormOps, one range) and the clipping scale, then optim::Optimizer<AdamW, bf16, CudaSpace>
    // (bf16 values and gradients, fp32 master weights and moments: the generic update kernel).
    {
      kernels::Device<CudaSpace> dev;
      auto* values = device<bf16>(P, 23);
      auto* grad = device<bf16>(P, 24, -1e-3f, 1e-3f);
      double* sq = device<double>(1, 28);
      float* coef = device<float>(1, 29);
      std::int64_t* range = nullptr;  // begin {0}, then before {0, P}: one range, the whole buffer
      const std::int64_t bounds[3] = {0, 0, P};
      DPML_CHECK_CUDA(cudaMalloc(&range, sizeof bounds));
      DPML_CHECK_CUDA(cudaMemcpy(range, bounds, sizeof bounds, cudaMemcpyHostToDevice));
      time("grad norm + clip scale (124.5M bf16)", 2.0 * P, 2.0 * P, [&] {
        kc::GradNormOps::sum_squares(dev, grad, range, range + 1, 1, P, sq);
        kc::GradNormOps::clip_scale(dev, sq, coef, 1.0);
      }, dev.stream());
      optim::Optimizer<optim::AdamW, bf16, CudaSpace> adamw(
          {{"flat", std::span<bf16>(values, static_cast<std::size_t>(P)), std::span<const bf16>(grad, static_cast<std::size_t>(P))}},
          optim::AdamWOptions{0.9, 0.95, 1e-8, 0.1}, dev);
      // Reads master, m, v (fp32) and the gradient (bf16), writes master, m, v and the value: 28 B each.
      time("optimizer step: AdamW (124.5M, bf16 values and grads, fp32 master)", 28.0 * P, 12.0 * P,
           [&] { adamw.step(6e-4, coef); }, dev.stream());
    }

    // Attention, one layer: (B, T, H, 3, D)
    auto* qkv = device<bf16>(N * 3 * C, 30);
    auto* att = device<bf16>(N * C, 31);
    auto* datt = device<bf16>(N * C, 32);
    auto* dqkv = device<bf16>(N * 3 * C, 33);
    auto* lse = device<float>(B * H * Tn, 34);
    auto* delta = device<float>(B * H * Tn, 35);
    const double attn_flops = 2.0 * B * H * Tn * Tn * D;  // causal forward: 2 GEMMs over half of T²
    const double attn_bytes = 5 * act;                    // qkv in, out
    time("attention_forward tensor cores", attn_bytes, attn_flops, [&] {
      kc::attention_forward<bf16, kc::attention::TensorCore>(qkv, att, lse, B, Tn, H, D, s);
    });
    time("attention_backward tensor cores", 2 * attn_bytes + 4 * act, 2.5 * attn_flops, [&] {
      kc::attention_backward<bf16, kc::attention::TensorCore>(datt, qkv, att, lse, delta, dqkv, B, Tn, H, D, s);
    });
    // The same width in half as many heads of twice the size (GPT 1.3B's and 6.7B's head dim 128)
    time("attention_forward tensor cores, head dim 128", attn_bytes, attn_flops, [&] {
      kc::attention_forward<bf16, kc::attention::TensorCore>(qkv, att, lse, B, Tn, H / 2, 2 * D, s);
    });
    time("attention_backward tensor cores, head dim 128", 2 * attn_bytes + 4 * act, 2.5 * attn_flops, [&] {
      kc::attention_backward<bf16, kc::attention::TensorCore>(datt, qkv, att, lse, delta, dqkv, B, Tn, H / 2, 2 * D, s);
    });
    time("attention_forward SIMT", attn_bytes, attn_flops,
         [&] { kc::attention_forward<bf16, kc::attention::Simt>(qkv, att, lse, B, Tn, H, D, s); });
    time("attention_backward SIMT", 2 * attn_bytes + 4 * act, 2.5 * attn_flops, [&] {
      kc::attention_backward<bf16, kc::attention::Simt>(datt, qkv, att, lse, delta, dqkv, B, Tn, H, D, s);
    });

    std::printf("\n| kernel | ms | GB/s | TFLOP/s | floor ms | floor / ms |\n|---|---|---|---|---|---|\n");
    for (const auto& r : rows) {
      const double floor_ms = std::max(r.bytes / kBandwidth, r.flops / kTensorPeak) * 1e3;
      std::printf("| %s | %.4f | %.0f | %.2f | %.4f | %.0f%% |\n", r.kernel.c_str(), r.ms, r.bytes / (r.ms * 1e-3) / 1e9,
                  r.flops / (r.ms * 1e-3) / 1e12, floor_ms, 100.0 * floor_ms / r.ms);
    }
    DPML_CHECK_CUDA(cudaDeviceSynchronize());
    return 0;
  } catch (const Error& e) {  // a bad flag (Scope::everywhere): its message alone
    std::fprintf(stderr, "bench_kernels: %s\n", e.scope() == Scope::everywhere ? e.message().c_str() : e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 1;
  }
}
