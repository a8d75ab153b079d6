#pragma once
// The layout of image tensors — N images of C channels and H × W pixels — is a property of a
// memory space's kernels, not of the layers: the host kernels (im2col + OpenBLAS, kernels/host/)
// read NCHW, the GPU kernels (implicit-GEMM and cuDNN convolutions, BatchNorm as column sums,
// pooling; kernels/cuda/conv/) read channels-last NHWC, where a pixel's channels are one
// contiguous row and a channel is a column. A CNN layer asks its space's Ops for the layout
// (ImageOps below is a family of kernels::Ops<Space>) and never transposes activations: the data
// path uploads images in the space's layout (to_layout below), so a network on a GPU runs without
// a single layout transpose per step.
//
//   HostSpace  ImageOps<ImageLayout::nchw>   x (N, C, H, W)
//   CudaSpace  ImageOps<ImageLayout::nhwc>   x (N, H, W, C)
//
// What is layout-independent stays so: parameters keep one logical shape (a convolution's weight
// (Cout, Cin, kh, kw); core/parameter.hpp's StorageOrder says how a space stores it), and a
// global-average-pooled (N, C) is the same on both. Flattening an (N, C, H, W) image is not: its
// feature order follows the layout, so a Linear after a Flatten of an image sees its inputs in
// another order on each space (pool globally first, as ResNets do, or convert with to_layout).

#include "dpml/core/tensor.hpp"

#include <cstdint>

namespace dpml::kernels {

enum class ImageLayout { nchw, nhwc };

// An image batch's sizes, whatever the layout.
struct ImageDims {
  std::int64_t N = 0, C = 0, H = 0, W = 0;
  std::int64_t pixels() const noexcept { return N * H * W; }  // rows of an NHWC tensor
  std::int64_t numel() const noexcept { return N * C * H * W; }
  friend bool operator==(const ImageDims&, const ImageDims&) = default;
};

// Ops<Space>'s image family: the layout of the space's image tensors and their shapes.
template <ImageLayout L>
struct ImageOps {
  static constexpr ImageLayout image_layout = L;

  // The sizes of an image tensor of this layout (rank 4; checked by the caller).
  static ImageDims image_dims(const Shape& s) noexcept {
    if constexpr (L == ImageLayout::nchw) return {s[0], s[1], s[2], s[3]};
    else return {s[0], s[3], s[1], s[2]};
  }
  // The shape of an image tensor of this layout: (N, C, H, W) or (N, H, W, C).
  static Shape image_shape(const ImageDims& d) {
    if constexpr (L == ImageLayout::nchw) return Shape{d.N, d.C, d.H, d.W};
    else return Shape{d.N, d.H, d.W, d.C};
  }
};

// dst (in layout `to`) = src (in layout `from`), images of sizes d, on the host: the data path's
// upload to a space and the tests' comparisons across spaces. dst must not alias src.
template <class T>
void to_layout(ImageLayout from, ImageLayout to, const T* src, T* dst, const ImageDims& d) {
  const std::int64_t HW = d.H * d.W;
  for (std::int64_t n = 0; n < d.N; ++n)
    for (std::int64_t c = 0; c < d.C; ++c)
      for (std::int64_t p = 0; p < HW; ++p) {
        const std::int64_t nchw = (n * d.C + c) * HW + p, nhwc = (n * HW + p) * d.C + c;
        if (from == to) dst[nchw] = src[nchw];
        else if (from == ImageLayout::nchw) dst[nhwc] = src[nchw];
        else dst[nchw] = src[nhwc];
      }
}

}  // namespace dpml::kernels
