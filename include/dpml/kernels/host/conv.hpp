#pragma once
// im2col / col2im for 2-D convolution on the host, one image at a time (layout CHW).
//
// im2col unrolls every receptive field of x (C, H, W) into a column of
// col (C·kh·kw, Ho·Wo): row (c, i, j) holds x[c, ho·stride − pad + i, wo·stride − pad + j] for
// every output position (ho, wo), 0 outside the image. A convolution is then one GEMM,
// y (Cout, Ho·Wo) = W (Cout, C·kh·kw) · col, which OpenBLAS runs near peak; col2im is the
// adjoint (it scatters a column gradient back onto the image, summing overlaps). The inner loop
// runs over the range of wo whose input column lies inside the image (computed once per row, no
// per-element test), contiguous in col, so it vectorises when stride is 1.

#include <algorithm>
#include <cstdint>

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

}  // namespace dpml::kernels::host
