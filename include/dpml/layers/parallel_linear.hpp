#pragma once
// Tensor-parallel linear layers (Megatron-LM, Shoeybi et al. 2019), built from Linear and the
// conjugate operations of parallel/tensor.hpp — the only places they communicate.
//
//   ColumnParallelLinear  y_k = x · W_kᵀ + b_k     W (out, in) split by rows (dim 0), b split:
//                         x is whole on every rank (copy_to: identity forward, all-reduce of
//                         dx backward); y stays split, (..., out/tp), unless gather_output
//                         asks for the whole (..., out) (gather: all-gather forward, keep own
//                         slice backward).
//   RowParallelLinear     y = Σ_k x_k · W_kᵀ + b  W (out, in) split by columns (dim 1); x arrives
//                         split, (..., in/tp) (typically a column-parallel output); the partial
//                         products are summed by reduce_from (all-reduce forward, identity
//                         backward), then the bias, replicated, is added once.
//
// A column-parallel layer followed by a row-parallel one (attention, MLP) communicates once in
// each direction. Every shard is initialised from its slice of the global weight
// (layers/init.hpp; fan_in is the global in), so any tp starts from the same model. A size that
// tp does not divide is refused on every rank alike (Scope::everywhere), naming the layer.

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/host/elementwise.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/linear.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/parallel/tensor.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace dpml::layers {

namespace detail {
// `n` split across tp ranks, or an Error every rank raises alike.
inline std::int64_t split_size(std::int64_t n, int tp, const std::string& layer, const char* what) {
  DPML_REQUIRE_EVERYWHERE(n % tp == 0, layer << ": " << what << " " << n << " is not divisible by the tensor-parallel "
                                             << "degree --tp " << tp);
  return n / tp;
}
}  // namespace detail

struct ColumnParallelOptions {
  bool bias = true;
  bool gather_output = false;  // return (..., out) on every rank instead of this rank's (..., out/tp)
  std::string name = "linear";
};

template <class T = float, class Space = HostSpace>
class ColumnParallelLinear {
  static_assert(std::is_same_v<Space, HostSpace>, "dpml ColumnParallelLinear: only the host path exists so far");

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (..., in), whole on every tensor rank
  using Output = TensorView<const T, Space>;  // (..., out/tp), or (..., out) with gather_output

  ColumnParallelLinear(std::int64_t in, std::int64_t out, ColumnParallelOptions o = {},
                       const parallel::TensorRegion<comm::Mpi>& region = {})
      : gather_(o.gather_output), region_(region),
        linear_(in, detail::split_size(out, region.size(), "ColumnParallelLinear " + o.name, "output size"),
                LinearOptions{.bias = o.bias, .name = o.name, .weight_sharding = Sharding::split(0),
                              .bias_sharding = Sharding::split(0), .fan_in = in}) {}

  Output forward(Context<Space>& ctx, Input x) {
    Output y = linear_.forward(ctx, x);  // copy_to forward: the identity
    if (!gather_ || region_.size() == 1) return y;
    Shape full = y.shape();
    full[full.rank() - 1] *= region_.size();
    auto g = ensure(slots_.slot(ctx).gathered, full);
    region_.gather_last_dim(y, g);
    return g;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Input dx = linear_.backward_input(ctx, local_dy(ctx, dy));
    if (region_.size() == 1) return dx;
    auto sum = ensure(slots_.slot(ctx).dx, dx.shape());
    copy(sum, dx);
    region_.copy_to_backward(sum);
    return sum;
  }

  void backward_weight(Context<Space>& ctx, Output dy) { linear_.backward_weight(ctx, local_dy(ctx, dy)); }

  std::vector<Param<T, Space>*> parameters() { return linear_.parameters(); }

 private:
  struct Saved {
    Tensor<T, Space> gathered;  // (..., out)      with gather_output
    Tensor<T, Space> dy;        // (..., out/tp)   own slice of a gathered dy
    Tensor<T, Space> dx;        // (..., in)       summed over the tensor axis
  };
  // This rank's slice of dy (gather's backward).
  Output local_dy(Context<Space>& ctx, Output dy) {
    if (!gather_ || region_.size() == 1) return dy;
    Shape local = dy.shape();
    local[local.rank() - 1] /= region_.size();
    auto own = ensure(slots_.slot(ctx).dy, local);
    region_.gather_backward(dy, own);
    return own;
  }

  bool gather_;
  parallel::TensorRegion<comm::Mpi> region_;
  Linear<T, Space> linear_;
  Slots<Saved> slots_;
};

struct RowParallelOptions {
  bool bias = true;
  std::string name = "linear";
};

template <class T = float, class Space = HostSpace>
class RowParallelLinear {
  static_assert(std::is_same_v<Space, HostSpace>, "dpml RowParallelLinear: only the host path exists so far");

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (..., in/tp), this rank's slice
  using Output = TensorView<const T, Space>;  // (..., out), whole on every tensor rank

  RowParallelLinear(std::int64_t in, std::int64_t out, RowParallelOptions o = {},
                    const parallel::TensorRegion<comm::Mpi>& region = {})
      : out_(out), has_bias_(o.bias), region_(region),
        linear_(detail::split_size(in, region.size(), "RowParallelLinear " + o.name, "input size"), out,
                LinearOptions{.bias = false, .name = o.name, .weight_sharding = Sharding::split(1), .fan_in = in}) {
    if (has_bias_) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(in));
      bias_ = Param<T, Space>(o.name + ".bias", Shape{out}, Init::uniform(-bound, bound));
    }
  }

  Output forward(Context<Space>& ctx, Input x) {
    Output partial = linear_.forward(ctx, x);
    auto y = ensure(slots_.slot(ctx).y, partial.shape());
    copy(y, partial);
    region_.reduce_from_forward(y);
    if (has_bias_) kernels::host::bias_add_rows(y.data(), bias_.value().data(), y.numel() / out_, out_);
    return y;
  }

  // reduce_from's backward is the identity: dy goes straight to this rank's shard.
  Input backward_input(Context<Space>& ctx, Output dy) { return linear_.backward_input(ctx, dy); }

  void backward_weight(Context<Space>& ctx, Output dy) {
    linear_.backward_weight(ctx, dy);
    if (has_bias_) kernels::host::bias_grad_rows(dy.data(), bias_.grad().data(), dy.numel() / out_, out_);
  }

  // weight (out, in/tp), then bias (out) — the order of Linear's.
  std::vector<Param<T, Space>*> parameters() {
    auto p = linear_.parameters();
    if (has_bias_) p.push_back(&bias_);
    return p;
  }

 private:
  struct Saved {
    Tensor<T, Space> y;  // (..., out)
  };

  std::int64_t out_;
  bool has_bias_;
  parallel::TensorRegion<comm::Mpi> region_;
  Linear<T, Space> linear_;
  Param<T, Space> bias_;  // replicated over the tensor axis
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
