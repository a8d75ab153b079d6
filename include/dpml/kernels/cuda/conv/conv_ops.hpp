#pragma once
// Ops<CudaSpace>'s convolution family: Conv2d's three passes over NHWC bf16 images, the weight
// stored (Cout, kh, kw, Cin) — conv_weight_order, the logical (Cout, Cin, kh, kw) permuted — through
// a convolution policy (the layer's template argument):
//
//   CudnnConv            conv/cudnn.hpp, cuDNN's engines: the default where DPML_HAS_CUDNN
//   ImplicitGemmConv<P>  conv/conv2d.hpp, our implicit GEMM on tensor cores (the default without)
//
// The policy object is one per Device (Device::resource): every layer shares its cuDNN handle,
// plans and workspace, or its split-K scratch, as the fused ResNet shares one. prepare(shape)
// before a weight pass grows what that shape needs (first step only).
//
//   forward          y (N, Ho, Wo, Cout) = conv(x (N, H, W, Cin), w)   (+ bias: a row pass of its own)
//   backward_input   dx (N, H, W, Cin), overwritten
//   backward_weight  dw (Cout, kh, kw, Cin) += the policy's fp32 weight gradient, written into the
//                    Device's scratch (beta = 0) and added into the parameter's T gradient by
//                    accumulate_kernel below; dbias (Cout) += Σ_pixels dy (bias_grad_rows)
//
// bf16 only: both policies are bf16 kernels; Conv2d<float, CudaSpace> (or any other T) fails to
// compile with "no convolution kernel for this type".

#include "dpml/core/bf16.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/conv/conv2d.hpp"
#include "dpml/kernels/cuda/device.hpp"
#include "dpml/kernels/cuda/elementwise.hpp"
#include "dpml/kernels/cuda/reduce.hpp"
#include "dpml/kernels/host/conv.hpp"
#if DPML_HAS_CUDNN
#include "dpml/kernels/cuda/conv/cudnn.hpp"
#endif

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <type_traits>

namespace dpml::kernels::cuda {

namespace detail::conv {
// dst (n) += src (n): an fp32 weight gradient added into the parameter's gradient of type T.
template <class T>
__global__ void accumulate_kernel(const float* __restrict__ src, T* __restrict__ dst, std::int64_t n) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    dst[i] = from_f<T>(load_f(dst[i]) + src[i]);
}
}  // namespace detail::conv

struct ConvOps {
  using Dev = Device<CudaSpace>;
#if DPML_HAS_CUDNN
  using DefaultConvPolicy = CudnnConv;
#else
  using DefaultConvPolicy = ImplicitGemmConv<>;
#endif
  static constexpr std::array<int, 4> conv_weight_order{0, 2, 3, 1};  // (Cout, kh, kw, Cin)

  // y (N, Ho, Wo, Cout) = conv(x (N, H, W, Cin), w) + bias (Cout; null: none)
  template <class Policy, class T>
  static void conv2d_forward(Dev& dev, const T* x, const T* w, const T* bias, T* y, std::int64_t N, std::int64_t Cout,
                             const host::ConvGeometry& g) {
    check_type<T>();
    if (N == 0) return;
    const Conv2dShape s{N, Cout, g};
    dev.resource<Policy>().forward(x, w, y, s, dev.stream());
    if (bias) cuda::bias_add_rows(y, bias, s.pixels(), Cout, dev.stream());
  }
  // dx (N, H, W, Cin) = ∂(Σ y·dy)/∂x for dy (N, Ho, Wo, Cout); overwritten
  template <class Policy, class T>
  static void conv2d_backward_input(Dev& dev, const T* dy, const T* w, T* dx, std::int64_t N, std::int64_t Cout,
                                    const host::ConvGeometry& g) {
    check_type<T>();
    if (N == 0) return;
    dev.resource<Policy>().backward_input(dy, w, dx, Conv2dShape{N, Cout, g}, dev.stream());
  }
  // dw (Cout, kh, kw, Cin) += ∂(Σ y·dy)/∂w; dbias (Cout) += Σ dy (null: none)
  template <class Policy, class T>
  static void conv2d_backward_weight(Dev& dev, const T* dy, const T* x, T* dw, T* dbias, std::int64_t N,
                                     std::int64_t Cout, const host::ConvGeometry& g) {
    check_type<T>();
    if (N == 0) return;
    const Conv2dShape s{N, Cout, g};
    Policy& conv = dev.resource<Policy>();
    conv.prepare(s);
    const std::int64_t n = Cout * s.taps();
    float* dw32 = dev.scratch<float>(n);  // (Cout, kh·kw·Cin) fp32
    conv.backward_weight(dy, x, dw32, 0.f, s, dev.stream());
    constexpr int threads = 256;
    detail::conv::accumulate_kernel<<<grid_for(n, threads), threads, 0, dev.stream()>>>(dw32, dw, n);
    DPML_CHECK_LAUNCH();
    if (dbias)
      cuda::bias_grad_rows(dy, dbias, dev.scratch<float>(column_sums_scratch(s.pixels(), Cout, 1)), s.pixels(), Cout,
                           dev.stream());
  }

 private:
  template <class T>
  static constexpr void check_type() {
    static_assert(std::is_same_v<T, bf16>,
                  "dpml: no convolution kernel for this type on CudaSpace: Conv2d runs bf16 (ImplicitGemmConv and "
                  "CudnnConv are bf16 kernels)");
  }
};

}  // namespace dpml::kernels::cuda
