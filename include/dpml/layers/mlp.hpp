#pragma once
// The transformer's feed-forward block with its hidden layer split across the tensor axis:
//
//   h = GELU(x · W_fcᵀ + b_fc)      column-parallel, C → hidden (default 4C), (..., hidden/tp)
//   y = h · W_projᵀ + b_proj        row-parallel, hidden → C (reduce_from over the tensor axis)
//
// GELU is the tanh approximation (GPT-2), applied to each rank's slice: elementwise, so no
// communication. One all-reduce forward (in c_proj) and one backward (in c_fc). A hidden size
// that tp does not divide is refused on every rank alike.

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/host/activation.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/parallel_linear.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/parallel/tensor.hpp"

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace dpml::layers {

template <class T = float, class Space = HostSpace>
class Mlp {
  static_assert(std::is_same_v<Space, HostSpace>, "dpml Mlp: only the host path exists so far");

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (..., C), whole on every tensor rank
  using Output = TensorView<const T, Space>;  // (..., C), whole on every tensor rank

  // hidden = 0: 4 · dim.
  Mlp(std::int64_t dim, std::int64_t hidden = 0, std::string name = "mlp",
      const parallel::TensorRegion<comm::Mpi>& region = {})
      : c_fc_(dim, checked_hidden(dim, hidden, name, region.size()), {.bias = true, .name = name + ".c_fc"}, region),
        c_proj_(hidden > 0 ? hidden : 4 * dim, dim, {.bias = true, .name = name + ".c_proj"}, region) {}

  Output forward(Context<Space>& ctx, Input x) {
    Saved& s = slots_.slot(ctx);
    s.pre = c_fc_.forward(ctx, x);  // (..., hidden/tp)
    auto h = ensure(s.h, s.pre.shape());
    kernels::host::gelu_forward(s.pre.data(), h.data(), h.numel());
    return c_proj_.forward(ctx, h);
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    auto dh = c_proj_.backward_input(ctx, dy);
    auto dpre = ensure(s.dpre, s.pre.shape());
    kernels::host::gelu_backward(s.pre.data(), dh.data(), dpre.data(), dpre.numel());
    return c_fc_.backward_input(ctx, dpre);
  }

  void backward_weight(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    c_proj_.backward_weight(ctx, dy);
    c_fc_.backward_weight(ctx, s.dpre.cview());
  }

  std::vector<Param<T, Space>*> parameters() {
    auto p = c_fc_.parameters();
    for (auto* q : c_proj_.parameters()) p.push_back(q);
    return p;
  }

 private:
  static std::int64_t checked_hidden(std::int64_t dim, std::int64_t hidden, const std::string& name, int tp) {
    const std::int64_t n = hidden > 0 ? hidden : 4 * dim;
    DPML_REQUIRE_EVERYWHERE(n % tp == 0, "MLP " << name << ": hidden size " << n
                                                << " is not divisible by the tensor-parallel degree --tp " << tp);
    return n;
  }
  struct Saved {
    TensorView<const T, Space> pre;  // (..., hidden/tp), c_fc's output buffer
    Tensor<T, Space> h;              // (..., hidden/tp), GELU(pre)
    Tensor<T, Space> dpre;           // (..., hidden/tp)
  };

  ColumnParallelLinear<T, Space> c_fc_;
  RowParallelLinear<T, Space> c_proj_;
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
