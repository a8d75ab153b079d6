// Must not compile: the GPU convolution kernels (ImplicitGemmConv, CudnnConv) are bf16 only, so a
// Conv2d<float, CudaSpace> is refused with "no convolution kernel for this type on CudaSpace"
// (tests/cuda/CMakeLists.txt builds this target and expects the message).
#include <dpml/layers/conv2d.hpp>

int main() {
  dpml::kernels::Device<dpml::CudaSpace> device;
  dpml::layers::Context<dpml::CudaSpace> ctx;
  ctx.device = &device;
  dpml::layers::Conv2d<float, dpml::CudaSpace> conv(3, 8, 3);
  dpml::Tensor<float, dpml::CudaSpace> x(dpml::Shape{1, 9, 9, 3});
  conv.forward(ctx, x.cview());
}
