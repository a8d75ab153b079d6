#pragma once
// Checks a layer on CudaSpace against the same layer on the host in float64, the reference every
// device layer answers to: both are built alike, the device one gets the host one's initial
// weights (rounded to its element type), both see the same random input and output gradient,
// and forward, backward_input and backward_weight (every parameter's gradient) are compared by
// relative L2 error. Any shape: tests pick sizes that are not multiples of the kernels' tiles.
//
//   DeviceLayerCheck<bf16> check(seed);
//   LayerNorm<double> host(45, "ln");  LayerNorm<bf16, CudaSpace> dev(45, "ln");
//   check.run(host, dev, Shape{37, 45}, kBf16Tol);
#include "device.hpp"

#include <dpml/kernels/ops.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/layers/layer.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace dpml::test {

// Tolerance of a device layer in element type T against float64: bf16/fp16 storage rounds each
// stored value (kBf16Tol); fp32 runs fp32 arithmetic (GEMM sums, reductions) against float64.
template <class T>
inline constexpr double kLayerTol = std::is_same_v<T, float> ? 1e-4 : kBf16Tol;

// Host float64 values of a device tensor of any element type.
template <class T>
std::vector<double> download_doubles(TensorView<const T, CudaSpace> v) {
  Tensor<T> h(v.shape());
  copy(h.view(), v);
  std::vector<double> d(static_cast<std::size_t>(h.numel()));
  for (std::int64_t i = 0; i < h.numel(); ++i) d[static_cast<std::size_t>(i)] = as_double(h[i]);
  return d;
}
template <class T>
std::vector<double> download_doubles(TensorView<T, CudaSpace> v) {
  return download_doubles(TensorView<const T, CudaSpace>(v));
}

// A device tensor of element type T holding `h`'s values (rounded).
template <class T, class S>
Tensor<T, CudaSpace> upload_as(const Tensor<S>& h) {
  Tensor<T> cast(h.shape());
  for (std::int64_t i = 0; i < h.numel(); ++i) cast[i] = static_cast<T>(static_cast<float>(h[i]));
  return to_space<CudaSpace>(cast.cview());
}

// The host values of `h` rounded to T and back: what the device layer actually starts from.
template <class T>
void round_to(Tensor<double>& h) {
  for (auto& v : h) v = as_double(static_cast<T>(static_cast<float>(v)));
}

template <class T>
class DeviceLayerCheck {
 public:
  explicit DeviceLayerCheck(std::uint64_t seed) : gen_(rng(seed)), seed_(seed) {
    dctx_.device = &device_;
  }

  layers::Context<HostSpace>& host_context() noexcept { return hctx_; }
  layers::Context<CudaSpace>& device_context() noexcept { return dctx_; }
  kernels::Device<CudaSpace>& device() noexcept { return device_; }
  std::mt19937_64& gen() noexcept { return gen_; }

  // The host layer's parameters initialised (rounded to T, so both start alike) and copied into
  // the device layer's, matched by position; names and (logical) shapes must agree, and each
  // tensor goes into the device parameter's storage order (a convolution's weight: Param's
  // StorageOrder), as the host one is read in its own. Gradients zeroed on both.
  template <class HostLayer, class DevLayer>
  void copy_parameters(HostLayer& host, DevLayer& dev) {
    auto hp = host.parameters();
    auto dp = dev.parameters();
    REQUIRE(hp.size() == dp.size());
    layers::initialize_all(hp, seed_, nullptr);
    for (std::size_t i = 0; i < hp.size(); ++i) {
      CAPTURE(hp[i]->name());
      REQUIRE(hp[i]->name() == dp[i]->name());
      REQUIRE(hp[i]->shape() == dp[i]->shape());
      Tensor<double> v(hp[i]->shape()), logical(hp[i]->shape()), stored(hp[i]->shape());
      copy(v.view(), TensorView<const double>(hp[i]->value()));
      round_to<T>(v);
      copy(hp[i]->value(), v.cview());
      to_logical_order(*hp[i], v.data(), logical.data());
      to_storage_order(*dp[i], logical.data(), stored.data());
      auto d = upload_as<T>(stored);
      copy(dp[i]->value(), d.cview());
      layers::zero_grad(*dp[i]);
    }
  }

  // Every parameter's gradient, device against host (both in logical order).
  template <class HostLayer, class DevLayer>
  void compare_gradients(HostLayer& host, DevLayer& dev, double tol) {
    auto hp = host.parameters();
    auto dp = dev.parameters();
    for (std::size_t i = 0; i < hp.size(); ++i) {
      CAPTURE(hp[i]->name());
      const auto h = hp[i]->grad();
      std::vector<double> want(static_cast<std::size_t>(h.numel())), got(want.size());
      to_logical_order(*hp[i], h.data(), want.data());
      to_logical_order(*dp[i], download_doubles(dp[i]->grad()).data(), got.data());
      CHECK(rel_l2(got, want) < tol);
    }
  }

  // A random input of `shape` (rounded to T), forward, a random dy, backward_input and
  // backward_weight on both; outputs, input gradients and parameter gradients compared. For layers
  // whose Input and Output are TensorView<const T, Space>.
  template <class HostLayer, class DevLayer>
  void run(HostLayer& host, DevLayer& dev, Shape shape, double tol) {
    copy_parameters(host, dev);
    Tensor<double> x = random_tensor<double>(shape, gen_);
    round_to<T>(x);
    const auto dx_in = upload_as<T>(x);
    const auto y = host.forward(hctx_, x.cview());
    const auto dy_dev = dev.forward(dctx_, dx_in.cview());
    CHECK(rel_l2(download_doubles(dy_dev), std::vector<double>(y.begin(), y.end())) < tol);

    Tensor<double> g = random_tensor<double>(y.shape(), gen_);
    round_to<T>(g);
    const auto g_dev = upload_as<T>(g);
    const auto dx = host.backward_input(hctx_, g.cview());
    const auto dx_dev = dev.backward_input(dctx_, g_dev.cview());
    if (dx.data() != nullptr)
      CHECK(rel_l2(download_doubles(dx_dev), std::vector<double>(dx.begin(), dx.end())) < tol);
    host.backward_weight(hctx_, g.cview());  // (gradients zeroed by copy_parameters: a fused block forms
                                             // them in backward_input already)
    dev.backward_weight(dctx_, g_dev.cview());
    compare_gradients(host, dev, tol);
  }

 private:
  std::mt19937_64 gen_;
  std::uint64_t seed_;
  kernels::Device<CudaSpace> device_;
  layers::Context<HostSpace> hctx_;
  layers::Context<CudaSpace> dctx_;
};

}  // namespace dpml::test
