#pragma once
// Vision-transformer token kernels, device (the maths of kernels/host/vision.hpp), with images in
// the GPU's channels-last layout (kernels/image.hpp):
//
//   patchify     x (N, H, W, Cin) NHWC → y (N, T, Cin·P·P), T = (H/P)·(W/P) patches in row-major
//                order, each patch's features in (c, py, px) order — the host's token layout, so a
//                patch-embedding weight (C, Cin·P·P) means the same on both spaces. A permutation:
//                one thread per image element, the backward its inverse.
//   class token  y[n, 0] = cls + pos[0],  y[n, 1 + t] = x[n, t] + pos[1 + t]     x (N, T, C)
//                dx[n, t] = dy[n, 1 + t],  dcls += Σ_n dy[n, 0],  dpos += Σ_n dy[n]
//
// The weight gradient sums over the batch in sample order, one thread per (t, c), in fp32 from the
// gradient's old value: deterministic, and in fp32 the host loop's exact sequence of additions.
// VisionOps at the end is Ops<CudaSpace>'s vision family.

#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/device.hpp"

#include <cuda_runtime.h>

#include <cstdint>

namespace dpml::kernels::cuda {

namespace detail::vision {

// image[n, r, j, c] (NHWC) ↔ tokens[n, t, k]: Forward copies image → tokens, else tokens → image.
template <class T, bool Forward>
__global__ void patch_kernel(const T* __restrict__ src, T* __restrict__ dst, std::int64_t N, int Cin, int H, int W, int P) {
  const std::int64_t total = N * H * W * Cin, tokens = static_cast<std::int64_t>(H / P) * (W / P);
  const int w = W / P, K = Cin * P * P;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t rest = i;
    const int c = static_cast<int>(rest % Cin);
    rest /= Cin;
    const int j = static_cast<int>(rest % W);
    rest /= W;
    const int r = static_cast<int>(rest % H);
    const std::int64_t n = rest / H;
    const std::int64_t token = (n * tokens + (r / P) * w + j / P) * K + (c * P + r % P) * P + j % P;
    if constexpr (Forward) dst[token] = src[i];
    else dst[i] = src[token];
  }
}

template <class T>
__global__ void class_token_forward_kernel(const T* __restrict__ x, const T* __restrict__ cls, const T* __restrict__ pos,
                                           T* __restrict__ y, std::int64_t N, std::int64_t Tn, int C) {
  const std::int64_t rows = 1 + Tn, total = N * rows * C;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % C);
    const std::int64_t row = i / C, t = row % rows, n = row / rows;
    const float v = t == 0 ? load_f(cls[c]) : load_f(x[(n * Tn + t - 1) * C + c]);
    y[i] = from_f<T>(v + load_f(pos[t * C + c]));
  }
}

template <class T>
__global__ void class_token_backward_input_kernel(const T* __restrict__ dy, T* __restrict__ dx, std::int64_t N,
                                                  std::int64_t Tn, int C) {
  const std::int64_t total = N * Tn * C;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t per = Tn * C, n = i / per;
    dx[i] = dy[n * (per + C) + C + i % per];
  }
}

// dpos[i] += Σ_n dy[n, i] over i < (1 + T)·C; the first C threads also dcls[i] += Σ_n dy[n, 0, i].
template <class T>
__global__ void class_token_backward_weight_kernel(const T* __restrict__ dy, T* __restrict__ dcls, T* __restrict__ dpos,
                                                   std::int64_t N, std::int64_t Tn, int C) {
  const std::int64_t per = (1 + Tn) * C;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < per;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float pos = load_f(dpos[i]), cls = i < C ? load_f(dcls[i]) : 0.f;
    for (std::int64_t n = 0; n < N; ++n) {
      const float g = load_f(dy[n * per + i]);
      pos += g;
      cls += g;
    }
    dpos[i] = from_f<T>(pos);
    if (i < C) dcls[i] = from_f<T>(cls);
  }
}

constexpr int kThreads = 256;

}  // namespace detail::vision

// Ops<CudaSpace>'s vision-token family (kernels/ops.hpp).
struct VisionOps {
  using Dev = Device<CudaSpace>;
  // x (N, H, W, Cin) → y (N, (H/P)·(W/P), Cin·P·P)
  template <class T>
  static void patchify(Dev& dev, const T* x, T* y, std::int64_t N, std::int64_t Cin, std::int64_t H, std::int64_t W,
                       std::int64_t P) {
    launch_patch<T, true>(dev, x, y, N, Cin, H, W, P);
  }
  // dy (N, (H/P)·(W/P), Cin·P·P) → dx (N, H, W, Cin), overwritten
  template <class T>
  static void unpatchify(Dev& dev, const T* dy, T* dx, std::int64_t N, std::int64_t Cin, std::int64_t H, std::int64_t W,
                         std::int64_t P) {
    launch_patch<T, false>(dev, dy, dx, N, Cin, H, W, P);
  }
  // x (N, T, C), cls (C), pos (1 + T, C) → y (N, 1 + T, C)
  template <class T>
  static void class_token_forward(Dev& dev, const T* x, const T* cls, const T* pos, T* y, std::int64_t N, std::int64_t Tn,
                                  std::int64_t C) {
    using detail::vision::kThreads;
    if (N == 0) return;
    detail::vision::class_token_forward_kernel<<<grid_for(N * (1 + Tn) * C, kThreads), kThreads, 0, dev.stream()>>>(
        x, cls, pos, y, N, Tn, static_cast<int>(C));
    DPML_CHECK_LAUNCH();
  }
  // dy (N, 1 + T, C) → dx (N, T, C), overwritten
  template <class T>
  static void class_token_backward_input(Dev& dev, const T* dy, T* dx, std::int64_t N, std::int64_t Tn, std::int64_t C) {
    using detail::vision::kThreads;
    if (N * Tn == 0) return;
    detail::vision::class_token_backward_input_kernel<<<grid_for(N * Tn * C, kThreads), kThreads, 0, dev.stream()>>>(
        dy, dx, N, Tn, static_cast<int>(C));
    DPML_CHECK_LAUNCH();
  }
  // dcls (C) += Σ_n dy[n, 0], dpos (1 + T, C) += Σ_n dy[n]
  template <class T>
  static void class_token_backward_weight(Dev& dev, const T* dy, T* dcls, T* dpos, std::int64_t N, std::int64_t Tn,
                                          std::int64_t C) {
    using detail::vision::kThreads;
    detail::vision::class_token_backward_weight_kernel<<<grid_for((1 + Tn) * C, kThreads), kThreads, 0, dev.stream()>>>(
        dy, dcls, dpos, N, Tn, static_cast<int>(C));
    DPML_CHECK_LAUNCH();
  }

 private:
  template <class T, bool Forward>
  static void launch_patch(Dev& dev, const T* src, T* dst, std::int64_t N, std::int64_t Cin, std::int64_t H, std::int64_t W,
                           std::int64_t P) {
    using detail::vision::kThreads;
    if (N * Cin * H * W == 0) return;
    detail::vision::patch_kernel<T, Forward><<<grid_for(N * Cin * H * W, kThreads), kThreads, 0, dev.stream()>>>(
        src, dst, N, static_cast<int>(Cin), static_cast<int>(H), static_cast<int>(W), static_cast<int>(P));
    DPML_CHECK_LAUNCH();
  }
};

}  // namespace dpml::kernels::cuda
