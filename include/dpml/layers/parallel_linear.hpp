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
//                         backward). The bias, replicated, is added by tensor rank 0 alone into
//                         its partial product before the sum, so it counts once and costs no pass
//                         of its own (the GEMM's epilogue on a GPU).
//
// Residual join (the fused GPT's trick, open to any model): RowParallelLinear::forward(ctx, x,
// residual) gives y = residual + Σ_k x_k · W_kᵀ + b — rank 0 copies the residual into y and its
// GEMM accumulates onto it (beta = 1), so a pre-LN block's skip connection costs one copy and no
// add. Its optional last argument is the buffer to write (a null view: the layer's own per slot).
//
// For blocks that keep their backward buffers in shared scratch, both layers have
// backward_input_into(ctx, dy, dx) (the column-parallel one all-reduces dx over the tensor axis
// in place), and ColumnParallelLinear::forward_gelu_into the MLP's c_fc with its GELU fused.
//
// A column-parallel layer followed by a row-parallel one (attention, MLP) communicates once in
// each direction. Every shard is initialised from its slice of the global weight
// (layers/init.hpp; fan_in is the global in), so any tp starts from the same model. A size that
// tp does not divide is refused on every rank alike (Scope::everywhere), naming the layer.
//
// Any space; Comm is the tensor axis' communicator type (parallel::default_comm_t<Space>: comm::Mpi
// on the host, comm::Nccl on a GPU; comm::Staged for ranks sharing a GPU), made on the stream of
// the Context's Device.

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/linear.hpp"
#include "dpml/parallel/tensor.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dpml::layers {

namespace detail {
// `n` split across tp ranks, or an Error every rank raises alike.
inline std::int64_t split_size(std::int64_t n, int tp, const std::string& layer, const char* what) {
  DPML_REQUIRE_EVERYWHERE(n % tp == 0, layer << ": " << what << " " << n << " is not divisible by the tensor-parallel "
                                             << "degree --tp " << tp);
  return n / tp;
}
// `s` with its last dimension set to n.
inline Shape with_last(Shape s, std::int64_t n) {
  s[s.rank() - 1] = n;
  return s;
}
}  // namespace detail

struct ColumnParallelOptions {
  bool bias = true;
  bool gather_output = false;  // return (..., out) on every rank instead of this rank's (..., out/tp)
  std::string name = "linear";
};

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>>
class ColumnParallelLinear {
 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (..., in), whole on every tensor rank
  using Output = TensorView<const T, Space>;  // (..., out/tp), or (..., out) with gather_output

  ColumnParallelLinear(std::int64_t in, std::int64_t out, ColumnParallelOptions o = {},
                       const parallel::TensorRegion<Comm>& region = {})
      : gather_(o.gather_output), region_(region),
        linear_(in, detail::split_size(out, region.size(), "ColumnParallelLinear " + o.name, "output size"),
                LinearOptions{.bias = o.bias, .name = o.name, .weight_sharding = Sharding::split(0),
                              .bias_sharding = Sharding::split(0), .fan_in = in}) {}

  Output forward(Context<Space>& ctx, Input x) {
    Output y = linear_.forward(ctx, x);  // copy_to forward: the identity
    if (!gathers()) return y;
    auto g = ensure(slots_.slot(ctx).gathered, detail::with_last(y.shape(), y.size(y.rank() - 1) * region_.size()));
    region_.gather_last_dim(ctx.dev(), y, g);
    return g;
  }

  // pre (..., out/tp) = x · W_kᵀ + b_k and act = gelu(pre), into the caller's buffers (an MLP's c_fc).
  void forward_gelu_into(Context<Space>& ctx, Input x, TensorView<T, Space> pre, TensorView<T, Space> act) {
    DPML_REQUIRE(!gathers(), "ColumnParallelLinear: forward_gelu_into keeps this rank's slice (no gather_output)");
    linear_.forward_gelu_into(ctx, x, pre, act);
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    auto dx = ensure(slots_.slot(ctx).dx, detail::with_last(dy.shape(), linear_.in_features()));
    backward_input_into(ctx, dy, dx);
    return dx;
  }
  // dx (..., in) = Σ_k dy_k · W_k over the tensor ranks k (copy_to's backward: in place).
  void backward_input_into(Context<Space>& ctx, Output dy, TensorView<T, Space> dx) {
    linear_.backward_input_into(ctx, local_dy(ctx, dy), dx);
    region_.copy_to_backward(dx);
  }

  void backward_weight(Context<Space>& ctx, Output dy) { linear_.backward_weight(ctx, local_dy(ctx, dy)); }

  std::vector<Param<T, Space>*> parameters() { return linear_.parameters(); }

 private:
  struct Saved {
    Tensor<T, Space> gathered;  // (..., out)      with gather_output
    Tensor<T, Space> dy;        // (..., out/tp)   own slice of a gathered dy
    Tensor<T, Space> dx;        // (..., in)       summed over the tensor axis
  };
  bool gathers() const noexcept { return gather_ && region_.size() > 1; }
  // This rank's slice of dy (gather's backward).
  Output local_dy(Context<Space>& ctx, Output dy) {
    if (!gathers()) return dy;
    auto own = ensure(slots_.slot(ctx).dy, detail::with_last(dy.shape(), dy.size(dy.rank() - 1) / region_.size()));
    region_.gather_backward(ctx.dev(), dy, own);
    return own;
  }

  bool gather_;
  parallel::TensorRegion<Comm> region_;
  Linear<T, Space> linear_;
  Slots<Saved> slots_;
};

struct RowParallelOptions {
  bool bias = true;
  std::string name = "linear";
};

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>>
class RowParallelLinear {
  using Ops = kernels::Ops<Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (..., in/tp), this rank's slice
  using Output = TensorView<const T, Space>;  // (..., out), whole on every tensor rank

  // The bias is replicated over the tensor axis (every rank computes its gradient from the whole dy).
  RowParallelLinear(std::int64_t in, std::int64_t out, RowParallelOptions o = {},
                    const parallel::TensorRegion<Comm>& region = {})
      : region_(region),
        linear_(detail::split_size(in, region.size(), "RowParallelLinear " + o.name, "input size"), out,
                LinearOptions{.bias = o.bias, .name = o.name, .weight_sharding = Sharding::split(1),
                              .bias_sharding = Sharding::replicated(), .fan_in = in}) {}

  Output forward(Context<Space>& ctx, Input x) { return forward(ctx, x, Input()); }

  // y (..., out) = residual + Σ_k x_k · W_kᵀ + b. residual: (..., out), a null view for none (it may
  // be y's own buffer: then the sum lands in place); y: where to write, a null view for the
  // layer's own buffer of this micro-batch slot.
  Output forward(Context<Space>& ctx, Input x, Input residual, TensorView<T, Space> y = {}) {
    const Shape ys = detail::with_last(x.shape(), linear_.out_features());
    if (y.data() == nullptr) y = ensure(slots_.slot(ctx).y, ys);
    DPML_REQUIRE(y.shape() == ys, "RowParallelLinear: output buffer " << y.shape().str() << " is not " << ys.str());
    const bool lead = region_.rank() == 0;  // adds the residual and the bias, once
    const bool join = lead && residual.data() != nullptr;
    if (join) {
      DPML_REQUIRE(residual.shape() == ys, "RowParallelLinear: residual " << residual.shape().str() << " is not " << ys.str());
      if (residual.data() != y.data()) Ops::copy(ctx.dev(), residual.data(), y.data(), y.numel());
    }
    linear_.forward_into(ctx, x, y, {.bias = lead, .accumulate = join});
    region_.reduce_from_forward(y);
    return y;
  }

  // reduce_from's backward is the identity: dy goes straight to this rank's shard.
  Input backward_input(Context<Space>& ctx, Output dy) { return linear_.backward_input(ctx, dy); }
  void backward_input_into(Context<Space>& ctx, Output dy, TensorView<T, Space> dx) {
    linear_.backward_input_into(ctx, dy, dx);
  }

  void backward_weight(Context<Space>& ctx, Output dy) { linear_.backward_weight(ctx, dy); }
  // The same from x recomputed into another buffer (Linear::backward_weight).
  void backward_weight(Context<Space>& ctx, Output dy, Input x) { linear_.backward_weight(ctx, dy, x); }

  // weight (out, in/tp), then bias (out) — the order of Linear's.
  std::vector<Param<T, Space>*> parameters() { return linear_.parameters(); }

 private:
  struct Saved {
    Tensor<T, Space> y;  // (..., out)
  };

  parallel::TensorRegion<Comm> region_;
  Linear<T, Space> linear_;
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
