#pragma once
// Vision-transformer token kernels, host: images to patch tokens, and the class token with the
// position embeddings (layers/vision.hpp; Dosovitskiy et al. 2021, "An image is worth 16x16 words").
//
//   patchify     x (N, Cin, H, W) NCHW → y (N, T, Cin·P·P), T = (H/P)·(W/P) patches in row-major
//                order, each patch's features in (c, py, px) order — a Conv2d weight (C, Cin, P, P)
//                read as a Linear weight (C, Cin·P·P). A pure permutation: its backward is the
//                inverse permutation of dy.
//   class token  y[n, 0] = cls + pos[0],  y[n, 1 + t] = x[n, t] + pos[1 + t]     x (N, T, C)
//                dx[n, t] = dy[n, 1 + t],  dcls += Σ_n dy[n, 0],  dpos += Σ_n dy[n]
//
// VisionOps at the end is Ops<HostSpace>'s family; kernels/cuda/vision.hpp is the GPU's, on NHWC
// images.

#include "dpml/kernels/device.hpp"

#include <algorithm>
#include <cstdint>

namespace dpml::kernels::host {

// The permutation both directions walk: f(image index, patch-token index) for every element of
// x (N, Cin, H, W), with the token side (N, (H/P)·(W/P), Cin·P·P); H and W multiples of P.
template <class F>
void for_each_patch_element(std::int64_t N, std::int64_t Cin, std::int64_t H, std::int64_t W, std::int64_t P, F&& f) {
  const std::int64_t w = W / P, tokens = (H / P) * w, K = Cin * P * P;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < Cin; ++c)
      for (std::int64_t i = 0; i < H; ++i)
        for (std::int64_t j = 0; j < W; ++j) {
          const std::int64_t t = (i / P) * w + j / P, k = (c * P + i % P) * P + j % P;
          f(((n * Cin + c) * H + i) * W + j, (n * tokens + t) * K + k);
        }
}

// x (N, Cin, H, W) → y (N, (H/P)·(W/P), Cin·P·P).
template <class T>
void patchify(const T* x, T* y, std::int64_t N, std::int64_t Cin, std::int64_t H, std::int64_t W, std::int64_t P) {
  for_each_patch_element(N, Cin, H, W, P, [&](std::int64_t image, std::int64_t token) { y[token] = x[image]; });
}
// dy (N, (H/P)·(W/P), Cin·P·P) → dx (N, Cin, H, W), overwritten.
template <class T>
void unpatchify(const T* dy, T* dx, std::int64_t N, std::int64_t Cin, std::int64_t H, std::int64_t W, std::int64_t P) {
  for_each_patch_element(N, Cin, H, W, P, [&](std::int64_t image, std::int64_t token) { dx[image] = dy[token]; });
}

// x (N, T, C), cls (C), pos (1 + T, C) → y (N, 1 + T, C).
template <class T>
void class_token_forward(const T* x, const T* cls, const T* pos, T* y, std::int64_t N, std::int64_t Tn, std::int64_t C) {
  for (std::int64_t n = 0; n < N; ++n) {
    T* yn = y + n * (1 + Tn) * C;
    for (std::int64_t c = 0; c < C; ++c) yn[c] = cls[c] + pos[c];
    const T* xn = x + n * Tn * C;
    for (std::int64_t i = 0; i < Tn * C; ++i) yn[C + i] = xn[i] + pos[C + i];
  }
}
// dy (N, 1 + T, C) → dx (N, T, C), overwritten.
template <class T>
void class_token_backward_input(const T* dy, T* dx, std::int64_t N, std::int64_t Tn, std::int64_t C) {
  for (std::int64_t n = 0; n < N; ++n) std::copy_n(dy + (n * (1 + Tn) + 1) * C, Tn * C, dx + n * Tn * C);
}
// dcls (C) += Σ_n dy[n, 0], dpos (1 + T, C) += Σ_n dy[n], in sample order.
template <class T>
void class_token_backward_weight(const T* dy, T* dcls, T* dpos, std::int64_t N, std::int64_t Tn, std::int64_t C) {
  for (std::int64_t n = 0; n < N; ++n) {
    const T* dn = dy + n * (1 + Tn) * C;
    for (std::int64_t c = 0; c < C; ++c) dcls[c] += dn[c];
    for (std::int64_t i = 0; i < (1 + Tn) * C; ++i) dpos[i] += dn[i];
  }
}

// Ops<HostSpace>'s vision-token family (kernels/ops.hpp).
struct VisionOps {
  using Dev = Device<HostSpace>;
  // x (N, Cin, H, W) → y (N, (H/P)·(W/P), Cin·P·P)
  template <class T>
  static void patchify(Dev&, const T* x, T* y, std::int64_t N, std::int64_t Cin, std::int64_t H, std::int64_t W,
                       std::int64_t P) {
    host::patchify(x, y, N, Cin, H, W, P);
  }
  // dy (N, (H/P)·(W/P), Cin·P·P) → dx (N, Cin, H, W)
  template <class T>
  static void unpatchify(Dev&, const T* dy, T* dx, std::int64_t N, std::int64_t Cin, std::int64_t H, std::int64_t W,
                         std::int64_t P) {
    host::unpatchify(dy, dx, N, Cin, H, W, P);
  }
  // x (N, T, C), cls (C), pos (1 + T, C) → y (N, 1 + T, C)
  template <class T>
  static void class_token_forward(Dev&, const T* x, const T* cls, const T* pos, T* y, std::int64_t N, std::int64_t Tn,
                                  std::int64_t C) {
    host::class_token_forward(x, cls, pos, y, N, Tn, C);
  }
  // dy (N, 1 + T, C) → dx (N, T, C)
  template <class T>
  static void class_token_backward_input(Dev&, const T* dy, T* dx, std::int64_t N, std::int64_t Tn, std::int64_t C) {
    host::class_token_backward_input(dy, dx, N, Tn, C);
  }
  // dcls (C) += Σ_n dy[n, 0], dpos (1 + T, C) += Σ_n dy[n]
  template <class T>
  static void class_token_backward_weight(Dev&, const T* dy, T* dcls, T* dpos, std::int64_t N, std::int64_t Tn,
                                          std::int64_t C) {
    host::class_token_backward_weight(dy, dcls, dpos, N, Tn, C);
  }
};

}  // namespace dpml::kernels::host
