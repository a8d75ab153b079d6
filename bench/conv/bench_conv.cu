// bench_conv: dpml's three Conv2d passes (include/dpml/kernels/cuda/conv/conv2d.hpp: implicit GEMM
// on mma.sync, NHWC bf16) on every distinct convolution of ResNet-50 — torchvision's v1.5, stride
// on the bottleneck's 3×3, 224 px input, batch 256 unless --batch says otherwise — so that we can
// compare them with cuDNN (bench/reference/torch_conv.py, same shapes, same labels) and choose the
// ConvPolicy that trains ResNet-50.
//
//   bench_conv [--batch N] [--iters N] [--warmup N] [--policy default|all]
//
// Flags (train::Args; --help lists them with defaults and ranges, and needs no GPU; a bad value
// exits 1 naming the flag): --batch images per step (≥ 1, default 256), --iters timed runs per
// shape, pass and policy (≥ 1, default 20), --warmup untimed runs before them (≥ 0, default 5),
// --policy default (DefaultConvPolicy only) or all.
//
// For each shape and pass — fwd (y = conv(x, w)), dgrad (dx), wgrad (dw, fp32, beta = 0; the split-K
// reduction kernel included) — and each policy it prints one JSON object
//   {"bench":"conv","shape":..,"pass":..,"policy":..,"ms":..,"tflops":..,"count":..,"batch":..,
//    "default":..,"rel_err_vs_default":..}
// with FLOPs = 2·N·Ho·Wo·Cout·kh·kw·Cin per pass, then a Markdown table (shape, count, ms and TFLOP/s
// per pass) and the network's convolution time per training step, Σ count × (fwd + dgrad + wgrad)
// (the stem has no dgrad: nothing upstream needs it). `--policy all` adds a few other tile shapes
// (kPolicies below) and the total when each shape and pass takes its fastest policy.
//
// Self-checking: every output is poisoned (all bytes 0xFF: NaN) before its policy's runs; after
// timing, the program exits 1 if any output element is not finite, or if another policy's output
// differs from the default policy's by more than 1e-2 relative L2 (inputs are the same; only the
// summation order differs). Correctness against float64 is tests/cuda/test_conv.cu's job.
#include "../support/fill.cuh"

#include <dpml/core/cuda_space.hpp>
#include <dpml/core/tensor.hpp>
#include <dpml/kernels/cuda/conv/conv2d.hpp>
#include <dpml/train/args.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace kc = dpml::kernels::cuda;
namespace kh = dpml::kernels::host;
using dpml::bf16;
using dpml::CudaSpace;

namespace {

// ---- ResNet-50 v1.5's convolutions (torchvision resnet50, 224×224 input) ----
// Every convolution is square, padded by k/2, bias-free (a BatchNorm follows). A bottleneck block is
// 1×1 reduce → 3×3 (stride 2 in the first block of stages 2–4) → 1×1 expand (×4 channels), and the
// first block of each stage adds a 1×1 projection of its input (stride 1 in stage 1, 2 after). 53
// convolutions in all, 23 distinct shapes. Stage 1's projection (64→256, 1×1, stride 1, 56²) has
// the expand's shape, so the two share a row.
//
// The stem reads RGB, Cin = 3; our input is padded to Cin = 8 (zero channels) so that every load is
// a 16-byte cp.async instead of the scalar fallback. Both benchmarks time the padded shape (FLOPs
// count Cin = 8), which is the work the stem does in a dpml ResNet-50.
struct ConvLayer {
  const char* label;  // "<stage> <role> <kernel>[/stride] <Cin>-><Cout> @<input H = W>"
  int count;          // how many of the 53 convolutions have this shape
  int H, Cin, Cout, k, stride;
};
constexpr ConvLayer kResNet50[] = {
    {"stem 7x7/2 8->64 @224", 1, 224, 8, 64, 7, 2},
    // stage 1 (conv2_x): 3 blocks, width 64, 56×56
    {"s1 reduce 1x1 64->64 @56", 1, 56, 64, 64, 1, 1},  // block 1 reads the max pool's 64 channels
    {"s1 reduce 1x1 256->64 @56", 2, 56, 256, 64, 1, 1},
    {"s1 3x3 64->64 @56", 3, 56, 64, 64, 3, 1},
    {"s1 expand+proj 1x1 64->256 @56", 4, 56, 64, 256, 1, 1},  // 3 expands + block 1's projection
    // stage 2 (conv3_x): 4 blocks, width 128, 56×56 → 28×28
    {"s2 reduce 1x1 256->128 @56", 1, 56, 256, 128, 1, 1},
    {"s2 3x3/2 128->128 @56", 1, 56, 128, 128, 3, 2},
    {"s2 reduce 1x1 512->128 @28", 3, 28, 512, 128, 1, 1},
    {"s2 3x3 128->128 @28", 3, 28, 128, 128, 3, 1},
    {"s2 expand 1x1 128->512 @28", 4, 28, 128, 512, 1, 1},
    {"s2 proj 1x1/2 256->512 @56", 1, 56, 256, 512, 1, 2},
    // stage 3 (conv4_x): 6 blocks, width 256, 28×28 → 14×14
    {"s3 reduce 1x1 512->256 @28", 1, 28, 512, 256, 1, 1},
    {"s3 3x3/2 256->256 @28", 1, 28, 256, 256, 3, 2},
    {"s3 reduce 1x1 1024->256 @14", 5, 14, 1024, 256, 1, 1},
    {"s3 3x3 256->256 @14", 5, 14, 256, 256, 3, 1},
    {"s3 expand 1x1 256->1024 @14", 6, 14, 256, 1024, 1, 1},
    {"s3 proj 1x1/2 512->1024 @28", 1, 28, 512, 1024, 1, 2},
    // stage 4 (conv5_x): 3 blocks, width 512, 14×14 → 7×7
    {"s4 reduce 1x1 1024->512 @14", 1, 14, 1024, 512, 1, 1},
    {"s4 3x3/2 512->512 @14", 1, 14, 512, 512, 3, 2},
    {"s4 reduce 1x1 2048->512 @7", 2, 7, 2048, 512, 1, 1},
    {"s4 3x3 512->512 @7", 2, 7, 512, 512, 3, 1},
    {"s4 expand 1x1 512->2048 @7", 3, 7, 512, 2048, 1, 1},
    {"s4 proj 1x1/2 1024->2048 @14", 1, 14, 1024, 2048, 1, 2},
};

bool is_stem(const ConvLayer& l) { return &l == &kResNet50[0]; }

kc::Conv2dShape shape_of(const ConvLayer& l, std::int64_t batch) {
  return {batch, l.Cout, kh::ConvGeometry{l.Cin, l.H, l.H, l.k, l.k, l.stride, l.k / 2}};
}

// ---- passes and their operands ----

enum Pass { kFwd, kDgrad, kWgrad, kPasses };
constexpr const char* kPassName[kPasses] = {"fwd", "dgrad", "wgrad"};

// One shape's tensors, NHWC. Inputs: x (N, H, W, Cin), w (Cout, kh, kw, Cin), dy (N, Ho, Wo, Cout).
// Outputs: y (N, Ho, Wo, Cout), dx (N, H, W, Cin) bf16; dw (Cout, kh·kw·Cin) fp32; the *_ref copies
// hold the default policy's outputs (allocated only when other policies are compared with it).
struct Operands {
  dpml::Tensor<bf16, CudaSpace> x, w, dy, y, dx, y_ref, dx_ref;
  dpml::Tensor<float, CudaSpace> dw, dw_ref, scratch;  // scratch: the split-K partials of wgrad
};

// A pass's output as the checks see it: `got` and its reference copy, n elements, fp32 or bf16.
struct Output {
  void* got;
  void* ref;
  std::int64_t n;
  bool fp32;
  std::size_t bytes() const { return static_cast<std::size_t>(n) * (fp32 ? sizeof(float) : sizeof(bf16)); }
};
Output output_of(Pass p, Operands& o) {
  switch (p) {
    case kFwd: return {o.y.data(), o.y_ref.data(), o.y.numel(), false};
    case kDgrad: return {o.dx.data(), o.dx_ref.data(), o.dx.numel(), false};
    default: return {o.dw.data(), o.dw_ref.data(), o.dw.numel(), true};
  }
}

// ---- policies: the default and, for --policy all, a few other tile shapes ----

using RunPass = void (*)(Operands&, const kc::Conv2dShape&, cudaStream_t);
struct Policy {
  std::string name;  // "BMxBNxBK wWMxWN sSTAGES"
  bool is_default;
  std::int64_t (*scratch)(const kc::Conv2dShape&);
  RunPass run[kPasses];
};

template <class P>
Policy policy() {
  using T = typename P::Tile;
  using W = typename P::Warp;
  return {std::to_string(T::M) + "x" + std::to_string(T::N) + "x" + std::to_string(T::K) + " w" +
              std::to_string(W::M) + "x" + std::to_string(W::N) + " s" + std::to_string(P::stages),
          std::is_same_v<P, kc::DefaultConvPolicy>,
          [](const kc::Conv2dShape& s) { return kc::conv2d_weight_scratch<P>(s); },
          {[](Operands& o, const kc::Conv2dShape& s, cudaStream_t st) {
             kc::conv2d_forward<P>(o.x.data(), o.w.data(), nullptr, o.y.data(), s, st);
           },
           [](Operands& o, const kc::Conv2dShape& s, cudaStream_t st) {
             kc::conv2d_backward_input<P>(o.dy.data(), o.w.data(), o.dx.data(), s, st);
           },
           [](Operands& o, const kc::Conv2dShape& s, cudaStream_t st) {
             kc::conv2d_backward_weight<P>(o.dy.data(), o.x.data(), o.dw.data(), 0.f, o.scratch.data(),
                                           o.scratch.numel(), s, st);
           }}};
}

// The default first (the others are compared with it). Kept to three others: each policy
// instantiates eight kernels. Bigger tiles for the wide late stages, a deeper BK for the 1×1s
// (K = Cin ≥ 64), smaller tiles for the 64-channel stage 1 and the 7×7 maps (few blocks at 128²).
std::vector<Policy> make_policies(bool all) {
  std::vector<Policy> p{policy<kc::DefaultConvPolicy>()};
  if (!all) return p;
  for (Policy q : {policy<kc::ConvPolicy<kc::TileShape<128, 128, 32>, kc::WarpTile<64, 64>, 4>>(),
                   policy<kc::ConvPolicy<kc::TileShape<128, 128, 64>, kc::WarpTile<64, 64>, 3>>(),
                   policy<kc::ConvPolicy<kc::TileShape<64, 64, 32>, kc::WarpTile<32, 32>, 4>>()})
    if (q.name != p.front().name) p.push_back(q);  // DefaultConvPolicy may be retuned to one of them
  return p;
}

// ---- device helpers ----

void fill(dpml::Tensor<bf16, CudaSpace>& t, std::uint32_t seed, float scale, cudaStream_t stream) {
  dpml::bench::fill_uniform(t.data(), t.numel(), seed, -scale, scale, stream);
}

// Σ (got − ref)², Σ ref² and the number of non-finite elements of got; ref == nullptr: the count only.
struct Agreement {
  double diff2, ref2;
  unsigned long long nonfinite;
};
template <class T>
__global__ void agree_kernel(const T* got, const T* ref, std::int64_t n, Agreement* out) {
  double d2 = 0, r2 = 0;
  unsigned long long bad = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = dpml::to_float(got[i]);
    bad += isfinite(g) ? 0 : 1;
    if (ref != nullptr) {
      const double r = dpml::to_float(ref[i]), d = g - r;
      d2 += d * d;
      r2 += r * r;
    }
  }
  for (int off = 16; off > 0; off /= 2) {
    d2 += __shfl_down_sync(0xffffffffu, d2, off);
    r2 += __shfl_down_sync(0xffffffffu, r2, off);
    bad += __shfl_down_sync(0xffffffffu, bad, off);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&out->diff2, d2);
    atomicAdd(&out->ref2, r2);
    atomicAdd(&out->nonfinite, bad);
  }
}
// Waits for the stream (the benchmark's only host synchronisation besides the timing events).
Agreement agree(const Output& o, bool with_ref, Agreement* dev, cudaStream_t stream) {
  DPML_CHECK_CUDA(cudaMemsetAsync(dev, 0, sizeof(Agreement), stream));
  const unsigned blocks = kc::grid_for(o.n, 256, 4096);
  if (o.fp32)
    agree_kernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(o.got),
                                             with_ref ? static_cast<const float*>(o.ref) : nullptr, o.n, dev);
  else
    agree_kernel<<<blocks, 256, 0, stream>>>(static_cast<const bf16*>(o.got),
                                             with_ref ? static_cast<const bf16*>(o.ref) : nullptr, o.n, dev);
  DPML_CHECK_LAUNCH();
  Agreement a{};
  DPML_CHECK_CUDA(cudaMemcpyAsync(&a, dev, sizeof a, cudaMemcpyDeviceToHost, stream));
  DPML_CHECK_CUDA(cudaStreamSynchronize(stream));
  return a;
}

struct Options {
  std::int64_t batch = 256;
  int iters = 20, warmup = 5;
  bool all = false;
};

// Parses argv into o (a bad flag throws, Scope::everywhere); false after --help.
bool parse(int argc, char** argv, Options& o) {
  std::string policy = "default";
  dpml::train::Args args("bench_conv",
                         "ResNet-50 v1.5 (224 px) convolutions: dpml's Conv2d fwd, dgrad and wgrad (implicit GEMM, NHWC\n"
                         "bf16) per distinct shape, one JSON line per shape, pass and policy, then a Markdown table and\n"
                         "the network's convolution time per training step. Exits 1 if an output is not finite or\n"
                         "(--policy all) differs from the default policy's by more than 1e-2 relative L2. One GPU.");
  args.flag("--batch", o.batch, "images per step", dpml::train::at_least(1))
      .flag("--iters", o.iters, "timed runs per shape, pass and policy", dpml::train::at_least(1))
      .flag("--warmup", o.warmup, "untimed runs before them", dpml::train::at_least(0))
      .flag("--policy", policy, "default: DefaultConvPolicy only | all: also the other tile shapes");
  if (!args.parse(argc, argv)) return false;
  DPML_REQUIRE_EVERYWHERE(policy == "default" || policy == "all", "--policy " << policy << " is not default or all");
  o.all = policy == "all";
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options opt;
    if (!parse(argc, argv, opt)) return 0;  // --help: printed, before any CUDA call
    if (dpml::cuda_device_count() == 0) {
      std::fprintf(stderr, "bench_conv: no CUDA device\n");
      return 1;
    }
    const std::vector<Policy> policies = make_policies(opt.all);
    const bool compare = policies.size() > 1;
    cudaDeviceProp prop{};
    DPML_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("# bench_conv: %s | ResNet-50 v1.5 @224, batch %lld | %d warmup + %d timed runs | %zu policies\n",
                prop.name, static_cast<long long>(opt.batch), opt.warmup, opt.iters, policies.size());

    cudaStream_t stream;
    DPML_CHECK_CUDA(cudaStreamCreate(&stream));
    cudaEvent_t t0, t1;
    DPML_CHECK_CUDA(cudaEventCreate(&t0));
    DPML_CHECK_CUDA(cudaEventCreate(&t1));
    dpml::Tensor<Agreement, CudaSpace> agreement(dpml::Shape{1});

    constexpr std::size_t kLayers = std::size(kResNet50);
    constexpr double kNone = std::numeric_limits<double>::quiet_NaN();  // the stem's dgrad
    // ms[layer][policy][pass]
    std::vector<std::vector<std::vector<double>>> ms(
        kLayers, std::vector<std::vector<double>>(policies.size(), std::vector<double>(kPasses, kNone)));
    std::vector<double> flops(kLayers);
    int failures = 0;

    for (std::size_t li = 0; li < kLayers; ++li) {
      const ConvLayer& L = kResNet50[li];
      const kc::Conv2dShape s = shape_of(L, opt.batch);
      const std::int64_t N = s.N, H = L.H, Ho = s.out_h();
      flops[li] = 2.0 * static_cast<double>(s.pixels()) * static_cast<double>(s.Cout) * static_cast<double>(s.taps());
      std::int64_t scratch = 0;
      for (const Policy& p : policies) scratch = std::max(scratch, p.scratch(s));

      Operands o{.x = dpml::Tensor<bf16, CudaSpace>(dpml::Shape{N, H, H, L.Cin}),
                 .w = dpml::Tensor<bf16, CudaSpace>(dpml::Shape{L.Cout, L.k, L.k, L.Cin}),
                 .dy = dpml::Tensor<bf16, CudaSpace>(dpml::Shape{N, Ho, Ho, L.Cout}),
                 .y = dpml::Tensor<bf16, CudaSpace>(dpml::Shape{N, Ho, Ho, L.Cout}),
                 .dx = dpml::Tensor<bf16, CudaSpace>(dpml::Shape{N, H, H, L.Cin}),
                 .dw = dpml::Tensor<float, CudaSpace>(dpml::Shape{L.Cout, s.taps()}),
                 .scratch = dpml::Tensor<float, CudaSpace>(dpml::Shape{scratch})};
      if (compare) {
        o.y_ref = dpml::Tensor<bf16, CudaSpace>(o.y.shape());
        o.dx_ref = dpml::Tensor<bf16, CudaSpace>(o.dx.shape());
        o.dw_ref = dpml::Tensor<float, CudaSpace>(o.dw.shape());
      }
      fill(o.x, 1, 1.f, stream);
      fill(o.w, 2, 1.f / std::sqrt(static_cast<float>(s.taps())), stream);  // keeps y near x's scale
      fill(o.dy, 3, 1.f, stream);

      for (int pass = 0; pass < kPasses; ++pass) {
        if (pass == kDgrad && is_stem(L)) continue;
        for (std::size_t pi = 0; pi < policies.size(); ++pi) {
          const Policy& p = policies[pi];
          const Output out = output_of(static_cast<Pass>(pass), o);
          DPML_CHECK_CUDA(cudaMemsetAsync(out.got, 0xFF, out.bytes(), stream));  // NaN until written
          for (int i = 0; i < opt.warmup; ++i) p.run[pass](o, s, stream);
          DPML_CHECK_CUDA(cudaEventRecord(t0, stream));
          for (int i = 0; i < opt.iters; ++i) p.run[pass](o, s, stream);
          DPML_CHECK_CUDA(cudaEventRecord(t1, stream));
          DPML_CHECK_CUDA(cudaEventSynchronize(t1));
          float elapsed = 0;
          DPML_CHECK_CUDA(cudaEventElapsedTime(&elapsed, t0, t1));
          const double t = elapsed / opt.iters, tflops = flops[li] / (t * 1e-3) / 1e12;
          ms[li][pi][pass] = t;

          const bool vs_default = compare && pi > 0;
          const Agreement a = agree(out, vs_default, agreement.data(), stream);
          const double rel = vs_default ? std::sqrt(a.diff2 / std::max(a.ref2, 1e-300)) : 0.0;
          if (compare && pi == 0)
            DPML_CHECK_CUDA(cudaMemcpyAsync(out.ref, out.got, out.bytes(), cudaMemcpyDeviceToDevice, stream));
          if (a.nonfinite > 0 || !(rel <= 1e-2)) {
            std::fprintf(stderr, "bench_conv: %s %s, policy %s: %llu non-finite of %lld outputs, rel err %.3e vs default\n",
                         L.label, kPassName[pass], p.name.c_str(), a.nonfinite, static_cast<long long>(out.n), rel);
            failures += 1;
          }
          std::printf("{\"bench\":\"conv\",\"shape\":\"%s\",\"pass\":\"%s\",\"policy\":\"%s\",\"ms\":%.4f,"
                      "\"tflops\":%.1f,\"count\":%d,\"batch\":%lld,\"default\":%s,\"rel_err_vs_default\":%.2e}\n",
                      L.label, kPassName[pass], p.name.c_str(), t, tflops, L.count, static_cast<long long>(N),
                      p.is_default ? "true" : "false", rel);
          std::fflush(stdout);
        }
      }
    }

    // ---- the table and the network totals ----
    auto cell = [](double v, const char* fmt) {
      if (std::isnan(v)) std::printf(" - |");
      else std::printf(fmt, v);
    };
    std::printf("\n| shape | count | policy | fwd ms | fwd TFLOP/s | dgrad ms | dgrad TFLOP/s | wgrad ms | wgrad TFLOP/s "
                "| count × step ms |\n|---|---|---|---|---|---|---|---|---|---|\n");
    std::vector<double> total(policies.size(), 0.0);
    double best_total = 0;
    for (std::size_t li = 0; li < kLayers; ++li) {
      const ConvLayer& L = kResNet50[li];
      for (std::size_t pi = 0; pi < policies.size(); ++pi) {
        std::printf("| %s | %d | %s |", L.label, L.count, policies[pi].name.c_str());
        double step = 0;
        for (int pass = 0; pass < kPasses; ++pass) {
          const double t = ms[li][pi][pass];
          cell(t, " %.3f |");
          cell(flops[li] / (t * 1e-3) / 1e12, " %.1f |");
          if (!std::isnan(t)) step += t;
        }
        std::printf(" %.2f |\n", L.count * step);
        total[pi] += L.count * step;
      }
      for (int pass = 0; pass < kPasses; ++pass) {
        double best = std::numeric_limits<double>::infinity();
        for (std::size_t pi = 0; pi < policies.size(); ++pi)
          if (!std::isnan(ms[li][pi][pass])) best = std::min(best, ms[li][pi][pass]);
        if (std::isfinite(best)) best_total += L.count * best;
      }
    }
    std::printf("\nResNet-50 convolutions per training step (batch %lld, Σ count × (fwd + dgrad + wgrad), stem "
                "without dgrad):\n",
                static_cast<long long>(opt.batch));
    for (std::size_t pi = 0; pi < policies.size(); ++pi)
      std::printf("  %-24s %9.2f ms%s\n", policies[pi].name.c_str(), total[pi],
                  policies[pi].is_default ? "  (DefaultConvPolicy)" : "");
    if (compare) std::printf("  %-24s %9.2f ms\n", "best per shape and pass", best_total);
    return failures == 0 ? 0 : 1;
  } catch (const dpml::Error& e) {  // a bad flag (Scope::everywhere): its message alone
    std::fprintf(stderr, "bench_conv: %s\n", e.scope() == dpml::Scope::everywhere ? e.message().c_str() : e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_conv: %s\n", e.what());
    return 1;
  }
}
