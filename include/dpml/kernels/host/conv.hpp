#pragma once
// 2-D convolution on the host: im2col / col2im, one image at a time (layout CHW), and
// Ops<HostSpace>'s convolution family built on them (at the end).
//
// im2col unrolls every receptive field of x (C, H, W) into a column of
// col (C·kh·kw, Ho·Wo): row (c, i, j) holds x[c, ho·stride − pad + i, wo·stride − pad + j] for
// every output position (ho, wo), 0 outside the image. A convolution is then one GEMM,
// y (Cout, Ho·Wo) = W (Cout, C·kh·kw) · col, which OpenBLAS runs near peak; col2im is the
// adjoint (it scatters a column gradient back onto the image, summing overlaps). The inner loop
// runs over the range of wo whose input column lies inside the image (computed once per row, no
// per-element test), contiguous in col, so it vectorises when stride is 1.

#include "dpml/kernels/device.hpp"
#include "dpml/kernels/host/elementwise.hpp"
#include "dpml/kernels/host/gemm.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <type_traits>

namespace dpml::kernels::host {

struct ConvGeometry {
  std::int64_t C, H, W;           // input channels and size
  std::int64_t kh, kw;            // kernel size
  std::int64_t stride = 1, pad = 0;
  std::int64_t out_h() const noexcept { return (H + 2 * pad - kh) / stride + 1; }
  std::int64_t out_w() const noexcept { return (W + 2 * pad - kw) / stride + 1; }
  std::int64_t col_rows() const noexcept { return C * kh * kw; }
  std::int64_t col_cols() const noexcept { return out_h() * out_w(); }
  // Output columns [lo, hi) whose input column wo·stride − pad + j lies in [0, W).
  std::int64_t wo_begin(std::int64_t j) const noexcept {
    const std::int64_t need = pad - j;  // wo·stride ≥ pad − j
    return need <= 0 ? 0 : (need + stride - 1) / stride;
  }
  std::int64_t wo_end(std::int64_t j) const noexcept {
    const std::int64_t last = W - 1 + pad - j;  // wo·stride ≤ W − 1 + pad − j
    if (last < 0) return 0;
    const std::int64_t e = last / stride + 1;
    return e < out_w() ? e : out_w();
  }
};

// col (C·kh·kw, Ho·Wo) from x (C, H, W).
template <class T>
void im2col(const T* x, const ConvGeometry& g, T* col) {
  const std::int64_t Ho = g.out_h(), Wo = g.out_w();
  for (std::int64_t c = 0; c < g.C; ++c)
    for (std::int64_t i = 0; i < g.kh; ++i)
      for (std::int64_t j = 0; j < g.kw; ++j) {
        T* row = col + ((c * g.kh + i) * g.kw + j) * Ho * Wo;
        for (std::int64_t ho = 0; ho < Ho; ++ho) {
          const std::int64_t h = ho * g.stride - g.pad + i;
          T* out = row + ho * Wo;
          if (h < 0 || h >= g.H) {
            for (std::int64_t wo = 0; wo < Wo; ++wo) out[wo] = T(0);
            continue;
          }
          const T* in = x + (c * g.H + h) * g.W;
          const std::int64_t off = j - g.pad, lo = g.wo_begin(j), hi = std::max(lo, g.wo_end(j));
          for (std::int64_t wo = 0; wo < lo; ++wo) out[wo] = T(0);
          for (std::int64_t wo = lo; wo < hi; ++wo) out[wo] = in[wo * g.stride + off];
          for (std::int64_t wo = hi; wo < Wo; ++wo) out[wo] = T(0);
        }
      }
}

// x (C, H, W) += col2im(col): the adjoint of im2col (overlapping fields add up).
template <class T>
void col2im(const T* col, const ConvGeometry& g, T* x) {
  const std::int64_t Ho = g.out_h(), Wo = g.out_w();
  for (std::int64_t c = 0; c < g.C; ++c)
    for (std::int64_t i = 0; i < g.kh; ++i)
      for (std::int64_t j = 0; j < g.kw; ++j) {
        const T* row = col + ((c * g.kh + i) * g.kw + j) * Ho * Wo;
        for (std::int64_t ho = 0; ho < Ho; ++ho) {
          const std::int64_t h = ho * g.stride - g.pad + i;
          if (h < 0 || h >= g.H) continue;
          T* out = x + (c * g.H + h) * g.W;
          const T* in = row + ho * Wo;
          const std::int64_t off = j - g.pad;
          for (std::int64_t wo = g.wo_begin(j), hi = g.wo_end(j); wo < hi; ++wo) out[wo * g.stride + off] += in[wo];
        }
      }
}

// The host's one convolution policy: im2col and one OpenBLAS GEMM per image (Conv2d's Policy
// argument on HostSpace; CudaSpace has its own, kernels/cuda/conv/conv_ops.hpp).
struct Im2colGemm {};

// Ops<HostSpace>'s convolution family: NCHW images (kernels/image.hpp), the weight in its logical
// order (Cout, Cin, kh, kw) = (Cout, K) with K = Cin·kh·kw, bias (Cout). Per image n, with col the
// (K, Ho·Wo) im2col of x[n] (one image's worth, allocated per call: memory stays at one image):
//   forward          y[n] (Cout, Ho·Wo)  = W · col  (+ bias)
//   backward_input   dx[n]               = col2im(Wᵀ · dy[n])                (overwritten)
//   backward_weight  dW (Cout, K)       += dy[n] · colᵀ,  dbias += Σ dy[n]  (col recomputed)
// g: Cin (= g.C), H, W, kernel, stride and padding; Cout the output channels.
struct ConvOps {
  using Dev = Device<HostSpace>;
  using DefaultConvPolicy = Im2colGemm;
  static constexpr std::array<int, 4> conv_weight_order{0, 1, 2, 3};  // (Cout, Cin, kh, kw) as it is

  // y (N, Cout, Ho, Wo) = conv(x (N, Cin, H, W), w) + bias (null: none)
  template <class Policy, class T>
  static void conv2d_forward(Dev&, const T* x, const T* w, const T* bias, T* y, std::int64_t N, std::int64_t Cout,
                             const ConvGeometry& g) {
    check_policy<Policy>();
    const std::int64_t K = g.col_rows(), P = g.col_cols(), HW = g.H * g.W;
    const auto col = std::make_unique_for_overwrite<T[]>(static_cast<std::size_t>(K * P));
    for (std::int64_t n = 0; n < N; ++n) {
      im2col(x + n * g.C * HW, g, col.get());
      gemm(Trans::no, Trans::no, Cout, P, K, T(1), w, col.get(), T(0), y + n * Cout * P);
    }
    if (bias) bias_add_channels(y, bias, N, Cout, P);
  }
  // dx (N, Cin, H, W) = ∂(Σ y·dy)/∂x for dy (N, Cout, Ho, Wo); overwritten
  template <class Policy, class T>
  static void conv2d_backward_input(Dev&, const T* dy, const T* w, T* dx, std::int64_t N, std::int64_t Cout,
                                    const ConvGeometry& g) {
    check_policy<Policy>();
    const std::int64_t K = g.col_rows(), P = g.col_cols(), HW = g.H * g.W;
    const auto dcol = std::make_unique_for_overwrite<T[]>(static_cast<std::size_t>(K * P));
    std::fill_n(dx, N * g.C * HW, T(0));
    for (std::int64_t n = 0; n < N; ++n) {
      gemm(Trans::yes, Trans::no, K, P, Cout, T(1), w, dy + n * Cout * P, T(0), dcol.get());
      col2im(dcol.get(), g, dx + n * g.C * HW);
    }
  }
  // dw (Cout, Cin, kh, kw) += ∂(Σ y·dy)/∂w; dbias (Cout) += Σ dy (null: none)
  template <class Policy, class T>
  static void conv2d_backward_weight(Dev&, const T* dy, const T* x, T* dw, T* dbias, std::int64_t N,
                                     std::int64_t Cout, const ConvGeometry& g) {
    check_policy<Policy>();
    const std::int64_t K = g.col_rows(), P = g.col_cols(), HW = g.H * g.W;
    const auto col = std::make_unique_for_overwrite<T[]>(static_cast<std::size_t>(K * P));
    for (std::int64_t n = 0; n < N; ++n) {
      im2col(x + n * g.C * HW, g, col.get());
      gemm(Trans::no, Trans::yes, Cout, K, P, T(1), dy + n * Cout * P, col.get(), T(1), dw);
    }
    if (dbias) bias_grad_channels(dy, dbias, N, Cout, P);
  }

 private:
  template <class Policy>
  static constexpr void check_policy() {
    static_assert(std::is_same_v<Policy, Im2colGemm>,
                  "dpml: no host convolution for this policy (HostSpace has kernels::host::Im2colGemm only)");
  }
};

}  // namespace dpml::kernels::host
