// Must not compile: the LSTM cell has host kernels only (kernels/host/lstm.hpp), so an
// Lstm<bf16, CudaSpace> is refused with "no kernel for this space: lstm_cell_forward on CudaSpace"
// (tests/cuda/CMakeLists.txt builds this target and expects the message).
#include <dpml/core/bf16.hpp>
#include <dpml/layers/lstm.hpp>

int main() {
  dpml::kernels::Device<dpml::CudaSpace> device;
  dpml::layers::Context<dpml::CudaSpace> ctx;
  ctx.device = &device;
  dpml::layers::Lstm<dpml::bf16, dpml::CudaSpace> lstm(8, 16);
  dpml::Tensor<dpml::bf16, dpml::CudaSpace> x(dpml::Shape{2, 5, 8});
  lstm.forward(ctx, x.cview());
}
