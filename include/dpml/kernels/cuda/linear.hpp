#pragma once
// Ops<CudaSpace>'s linear family: the three products of a Linear layer (y = x·Wᵀ + b, W (out, in)
// as nn.Linear) through the GEMM dispatch (gemm/dispatch.hpp), with what the device fuses into
// them: the bias (and GELU, keeping the pre-activation) in the forward epilogue, a residual already
// in y as beta = 1, and the weight gradient's accumulation as beta = 1. The twin of
// kernels/host/gemm.hpp's LinearOps; T is bf16, fp16 or float (fp32 operands: cuBLASLt).

#include "dpml/kernels/cuda/device.hpp"
#include "dpml/kernels/cuda/elementwise.hpp"
#include "dpml/kernels/cuda/gemm/dispatch.hpp"

#include <cstdint>

namespace dpml::kernels::cuda {

struct LinearOps {
  using Dev = Device<CudaSpace>;

  // y (rows, out) = x (rows, in) · Wᵀ + bias (out; null: none) [+ y when accumulate]
  template <class T>
  static void linear_forward(Dev& dev, const T* x, const T* W, const T* bias, T* y, std::int64_t rows, std::int64_t in,
                             std::int64_t out, bool accumulate = false) {
    const GemmArgs<T, T> g{.ta = Trans::no, .tb = Trans::yes, .M = rows, .N = out, .K = in, .A = x, .lda = in, .B = W,
                           .ldb = in, .C = y, .ldc = out, .beta = accumulate ? 1.f : 0.f, .bias = bias};
    if (bias) gemm<epilogue::Bias>(dev.gemm(), g, dev.stream());
    else gemm<epilogue::None>(dev.gemm(), g, dev.stream());
  }
  // pre (rows, out) = x · Wᵀ + bias; y = gelu(pre): one GEMM with the GELU epilogue
  template <class T>
  static void linear_gelu_forward(Dev& dev, const T* x, const T* W, const T* bias, T* pre, T* y, std::int64_t rows,
                                  std::int64_t in, std::int64_t out) {
    if (!bias) {  // the epilogue needs a bias: a plain product, then the activation
      linear_forward(dev, x, W, bias, pre, rows, in, out);
      gelu_forward(pre, y, rows * out, dev.stream());
      return;
    }
    const GemmArgs<T, T> g{.ta = Trans::no, .tb = Trans::yes, .M = rows, .N = out, .K = in, .A = x, .lda = in, .B = W,
                           .ldb = in, .C = y, .ldc = out, .bias = bias, .pre_gelu = pre};
    gemm<epilogue::BiasGelu>(dev.gemm(), g, dev.stream());
  }
  // dx (rows, in) = dy (rows, out) · W
  template <class T>
  static void linear_backward_input(Dev& dev, const T* dy, const T* W, T* dx, std::int64_t rows, std::int64_t in,
                                    std::int64_t out) {
    gemm<epilogue::None>(dev.gemm(),
                         GemmArgs<T, T>{.ta = Trans::no, .tb = Trans::no, .M = rows, .N = in, .K = out, .A = dy,
                                        .lda = out, .B = W, .ldb = in, .C = dx, .ldc = in},
                         dev.stream());
  }
  // dW (out, in) += dyᵀ · x (overwrite: dW = dyᵀ · x, beta = 0, dW's zeros not read);
  // dbias (out) += Σ_rows dy (dbias null: none)
  template <class T>
  static void linear_backward_weight(Dev& dev, const T* dy, const T* x, T* dW, T* dbias, std::int64_t rows,
                                     std::int64_t in, std::int64_t out, bool overwrite = false) {
    gemm<epilogue::None>(dev.gemm(),
                         GemmArgs<T, T>{.ta = Trans::yes, .tb = Trans::no, .M = out, .N = in, .K = rows, .A = dy,
                                        .lda = out, .B = x, .ldb = in, .C = dW, .ldc = in, .beta = overwrite ? 0.f : 1.f},
                         dev.stream());
    if (dbias) bias_grad_rows(dy, dbias, dev.scratch<float>(column_sums_scratch(rows, out, 1)), rows, out, dev.stream());
  }
};

}  // namespace dpml::kernels::cuda
