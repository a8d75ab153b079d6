#pragma once
// A layer of the consumer's own, written the way dpml's layers are (layers/activation.hpp,
// layers/linear.hpp) but outside the library: Swish with a learnable slope per feature,
//
//   forward          y  (rows, C)  = x · σ(β x)                    β (C), broadcast over rows
//   backward_input   dx (rows, C)  = dy · (σ + β x σ (1 − σ))      σ = σ(β x)
//   backward_weight  dβ (C)       += Σ_rows dy · x² σ (1 − σ)
//
// The user cannot add members to dpml::kernels::Ops<Space>, so the layer declares its own
// extension point the same way: SwishOps<Space>, a primary template that fails loudly for a space
// without kernels, a HostSpace specialisation here (plain loops) and a CudaSpace one in
// cuda_swish.hpp (__global__ kernels on the Device's stream), included only when nvcc compiles
// the translation unit. Each op takes the space's kernels::Device first, then raw pointers and
// sizes, as dpml's ops do; Swish<T, Space> is written once and calls SwishOps<Space>.
//
// Host arithmetic is in kernels::accum_t<T> (double for the float64 reference); on a GPU, T is
// bf16 or float with fp32 arithmetic.

#include <dpml/core/error.hpp>
#include <dpml/core/memory_space.hpp>
#include <dpml/core/parameter.hpp>
#include <dpml/core/tensor.hpp>
#include <dpml/kernels/device.hpp>
#include <dpml/layers/layer.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace consumer {

template <class Space>
struct SwishOps {
  static_assert(dpml::dependent_false<Space>, "consumer::Swish: no kernel for this space (SwishOps<CudaSpace> "
                                              "needs a translation unit compiled by nvcc)");
};

template <>
struct SwishOps<dpml::HostSpace> {
  using Dev = dpml::kernels::Device<dpml::HostSpace>;

  // y (rows, cols) = x · σ(β x), beta (cols)
  template <class T>
  static void forward(Dev&, const T* x, const T* beta, T* y, std::int64_t rows, std::int64_t cols) {
    using A = dpml::kernels::accum_t<T>;
    for (std::int64_t i = 0; i < rows * cols; ++i) {
      const A v = A(x[i]), s = sigmoid(A(beta[i % cols]) * v);
      y[i] = T(v * s);
    }
  }
  // dx (rows, cols) = dy · (σ + β x σ (1 − σ))
  template <class T>
  static void backward_input(Dev&, const T* x, const T* beta, const T* dy, T* dx, std::int64_t rows, std::int64_t cols) {
    using A = dpml::kernels::accum_t<T>;
    for (std::int64_t i = 0; i < rows * cols; ++i) {
      const A b = A(beta[i % cols]), v = A(x[i]), s = sigmoid(b * v);
      dx[i] = T(A(dy[i]) * (s + b * v * s * (1 - s)));
    }
  }
  // dbeta (cols) += Σ_rows dy · x² σ (1 − σ)
  template <class T>
  static void backward_weight(Dev&, const T* x, const T* beta, const T* dy, T* dbeta, std::int64_t rows, std::int64_t cols) {
    using A = dpml::kernels::accum_t<T>;
    for (std::int64_t c = 0; c < cols; ++c) {
      A sum = 0;
      for (std::int64_t r = 0; r < rows; ++r) {
        const A v = A(x[r * cols + c]), s = sigmoid(A(beta[c]) * v);
        sum += A(dy[r * cols + c]) * v * v * s * (1 - s);
      }
      dbeta[c] = T(A(dbeta[c]) + sum);
    }
  }

 private:
  template <class A>
  static A sigmoid(A z) {
    return A(1) / (A(1) + std::exp(-z));
  }
};

template <class T = float, class Space = dpml::HostSpace>
class Swish {
  using Ops = SwishOps<Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = dpml::TensorView<const T, Space>;   // (..., C)
  using Output = dpml::TensorView<const T, Space>;  // (..., C)

  explicit Swish(std::int64_t features, const std::string& name = "swish")
      : beta_(name + ".beta", dpml::Shape{features}, dpml::Init::constant(1.0)) {}

  Output forward(dpml::layers::Context<Space>& ctx, Input x) {
    const std::int64_t C = beta_.shape()[0];
    DPML_REQUIRE(x.rank() >= 1 && x.size(x.rank() - 1) == C && x.is_contiguous(),
                 "Swish: input " << x.shape().str() << " is not contiguous (..., " << C << ")");
    Saved& s = saved_.slot(ctx);
    s.x = x;  // the previous layer's slot buffer, valid until this slot's next forward
    auto y = dpml::layers::ensure(s.y, x.shape());
    Ops::forward(ctx.dev(), x.data(), beta_.value().data(), y.data(), x.numel() / C, C);
    return y;
  }

  Input backward_input(dpml::layers::Context<Space>& ctx, Output dy) {
    Saved& s = checked(ctx, dy);
    const std::int64_t C = beta_.shape()[0];
    auto dx = dpml::layers::ensure(s.dx, s.x.shape());
    Ops::backward_input(ctx.dev(), s.x.data(), beta_.value().data(), dy.data(), dx.data(), dy.numel() / C, C);
    return dx;
  }

  void backward_weight(dpml::layers::Context<Space>& ctx, Output dy) {
    Saved& s = checked(ctx, dy);
    const std::int64_t C = beta_.shape()[0];
    Ops::backward_weight(ctx.dev(), s.x.data(), beta_.value().data(), dy.data(), beta_.grad().data(), dy.numel() / C, C);
  }

  std::vector<dpml::Param<T, Space>*> parameters() { return {&beta_}; }

 private:
  struct Saved {
    Input x;                       // the forward's input
    dpml::Tensor<T, Space> y, dx;  // shaped as x
  };
  Saved& checked(dpml::layers::Context<Space>& ctx, Output dy) {
    Saved& s = saved_.slot(ctx);
    DPML_REQUIRE(s.x.rank() > 0 && dy.shape() == s.x.shape() && dy.is_contiguous(),
                 "Swish: dy " << dy.shape().str() << " differs from the input " << s.x.shape().str() << " of micro-batch "
                              << ctx.micro_batch);
    return s;
  }

  dpml::Param<T, Space> beta_;  // (C)
  dpml::layers::Slots<Saved> saved_;
};

}  // namespace consumer

#if defined(__CUDACC__)
#include "cuda_swish.hpp"
#endif
