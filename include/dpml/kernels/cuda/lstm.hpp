#pragma once
// Ops<CudaSpace>'s LSTM family: not written yet. layers::Lstm runs on the host (kernels/host/
// lstm.hpp holds the maths these kernels will implement); a CudaSpace Lstm fails to compile here,
// naming the missing kernel, rather than somewhere inside the layer. The GEMMs it needs exist
// already (cuda::LinearOps), as does the strided copy it transposes with (copy_columns).

#include "dpml/kernels/cuda/device.hpp"

#include <cstdint>

namespace dpml::kernels::cuda {

struct LstmOps {
  using Dev = Device<CudaSpace>;
  template <class T>
  static void lstm_cell_forward(Dev&, T*, const T*, T*, T*, std::int64_t, std::int64_t) {
    static_assert(dependent_false<T>, "dpml: no kernel for this space: lstm_cell_forward on CudaSpace "
                                      "(layers::Lstm has host kernels only: kernels/host/lstm.hpp)");
  }
  template <class T>
  static void lstm_cell_backward(Dev&, const T*, const T*, const T*, const T*, const T*, T*, T*, std::int64_t,
                                 std::int64_t) {
    static_assert(dependent_false<T>, "dpml: no kernel for this space: lstm_cell_backward on CudaSpace "
                                      "(layers::Lstm has host kernels only: kernels/host/lstm.hpp)");
  }
};

}  // namespace dpml::kernels::cuda
