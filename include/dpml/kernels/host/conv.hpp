#pragma once
// im2col / col2im for 2-D convolution on the host, one image at a time (layout CHW).
//
// im2col unrolls every receptive field of x (C, H, W) into a column of
// col (C·kh·kw, Ho·Wo): row (c, i, j) holds x[c, ho·stride − pad + i, wo·stride − pad + j] for
// every output position (ho, wo), 0 outside the image. A convolution is then one GEMM,
// y (Cout, Ho·Wo) = W (Cout, C·kh·kw) · col, which OpenBLAS runs near peak; col2im is the
// adjoint (it scatters a column gradient back onto the image, summing overlaps). The inner loop
// runs over wo, contiguous in col, so it vectorises when stride is 1.

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
          for (std::int64_t wo = 0; wo < Wo; ++wo) {
            const std::int64_t w = wo * g.stride - g.pad + j;
            out[wo] = (w >= 0 && w < g.W) ? in[w] : T(0);
          }
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
          for (std::int64_t wo = 0; wo < Wo; ++wo) {
            const std::int64_t w = wo * g.stride - g.pad + j;
            if (w >= 0 && w < g.W) out[w] += in[wo];
          }
        }
      }
}

}  // namespace dpml::kernels::host
