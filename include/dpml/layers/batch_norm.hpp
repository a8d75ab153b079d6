#pragma once
// BatchNorm2d: per-channel statistics over (N, H, W), weight (C) = 1 and bias (C) = 0 at init,
// running mean / variance updated with `momentum` in training and used in eval, as PyTorch's
// nn.BatchNorm2d (the running variance takes the unbiased batch variance).
//
// Any space, one code path: kernels::Ops<Space>'s BatchNorm family (kernels/host/batch_norm.hpp,
// kernels/cuda/conv/batch_norm.hpp, where the maths is), over the space's image layout (NCHW on
// the host, NHWC on a GPU: kernels/image.hpp). Element types: float or double on the host; bf16,
// fp16 or float on a GPU. Statistics (mean, rstd, the running statistics) are kept in
// kernels::accum_t<T>: double for double, float otherwise.
//
// Fused tail (the fused GPU ResNet's, open to any model): relu = true gives y = relu(bn(x)), and
// forward(ctx, x, residual) adds a residual before it, y = act(bn(x) + residual) — a ResNet
// block's last BatchNorm, shortcut add and ReLU in one pass. backward_input masks dy by the ReLU
// (from the saved y) and, when the forward had a residual, also writes its gradient, read with
// residual_grad(ctx). forward_into and backward_input_into do the same into the caller's buffers
// (a fused block's forward-only temporary; its gradient scratch shared by all blocks, dx possibly
// over dy: in place). backward_input_masked_into is backward_input_into for a caller that applied
// the ReLU's mask to dy itself, from what it keeps anyway (a max pool's output over y is positive
// exactly where the window's maximum is: ResNetStem): it does not read y, so forward_into's y may
// be a temporary even with relu — the ResNet stem's ReLU output, the largest activation of the
// network, is then not kept.
//
// backward_weight reads the per-channel sums (Σdy, Σdy·(x − mean); two C-vectors) that
// backward_input kept in the micro-batch's slot — the pass over the activations runs once, in
// backward_input — so it must follow backward_input of the same micro-batch, which every schedule
// does (zero-bubble ones only delay it).
//
// Synchronised statistics (sync = true): each training pass all-reduces its per-channel sums over
// the data axis in ONE collective — forward (Σ(x − k), Σ(x − k)², count) with k the running mean,
// backward_input (Σdy, Σdy·(x − mean), count) — so the statistics are those of the global
// micro-batch and K ranks compute exactly what one rank computes on the concatenated batch, also
// when the ranks hold different numbers of images (the count travels with the sums). dweight and
// dbias take this rank's sums only: the data-parallel gradient reduction adds the ranks' afterwards.
// Every rank must run the same passes (an empty local batch still joins), and start from the same
// running mean (the shift of the sums). The collective runs on Comm, a communicator of the space's
// memory given by type (parallel::default_comm_t<Space>: comm::Mpi on the host, comm::Nccl on a
// GPU; comm::Staged where ranks share a GPU) and by instance at construction; on the host it
// defaults to ctx.grid's data-axis communicator. A device communicator must enqueue on the stream
// of ctx.dev() (checked). Without one, and with one data rank, the statistics are this rank's.

#include "dpml/comm/communicator.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/parallel/tensor.hpp"

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpml::layers {

struct BatchNormOptions {
  double momentum = 0.1;
  double eps = 1e-5;
  bool sync = false;  // synchronised statistics across the data axis
  bool relu = false;  // y = relu(bn(x) [+ residual])
  std::string name = "bn";
};

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>>
class BatchNorm2d {
  using Ops = kernels::Ops<Space>;
  using Stat = kernels::accum_t<T>;
  static_assert(Space::host_accessible || requires(const Comm& c) { c.stream(); },
                "dpml BatchNorm2d: statistics in device memory travel through a device communicator "
                "(comm::Nccl, comm::Staged), not one that reads host memory (comm::Mpi)");

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (N, C, H, W) in the space's image layout
  using Output = TensorView<const T, Space>;  // (N, C, H, W) in the space's image layout

  // data_comm: the data axis' communicator for sync (may be null: on the host, ctx.grid's).
  explicit BatchNorm2d(std::int64_t channels, BatchNormOptions opts = {}, const Comm* data_comm = nullptr)
      : C_(channels), opts_(std::move(opts)), data_comm_(data_comm),
        weight_(opts_.name + ".weight", Shape{channels}, Init::constant(1.0)),
        bias_(opts_.name + ".bias", Shape{channels}, Init::constant(0.0)) {
    DPML_REQUIRE(C_ > 0 && opts_.eps > 0 && opts_.momentum >= 0 && opts_.momentum <= 1,
                 "BatchNorm2d " << opts_.name << ": channels " << C_ << ", eps " << opts_.eps << ", momentum "
                                << opts_.momentum << " out of range");
    running_mean_ = to_space<Space>(Tensor<Stat>(Shape{channels}, Stat(0)).cview());
    running_var_ = to_space<Space>(Tensor<Stat>(Shape{channels}, Stat(1)).cview());
  }

  Output forward(Context<Space>& ctx, Input x) { return forward(ctx, x, Input()); }

  // y = act(bn(x) + residual); residual of x's shape (a null view: none).
  Output forward(Context<Space>& ctx, Input x, Input residual) {
    return forward_into(ctx, x, residual, ensure(slots_.slot(ctx).y, x.shape()));
  }

  // The same into the caller's buffer y (of x's shape) instead of the layer's own: a block's
  // forward-only temporary. Without relu nothing reads y afterwards; with relu backward_input does
  // (the ReLU's mask), so the buffer must keep y until then — unless the backward is
  // backward_input_masked_into, which does not read it.
  Output forward_into(Context<Space>& ctx, Input x, Input residual, TensorView<T, Space> y) {
    DPML_REQUIRE(x.rank() == 4 && x.is_contiguous() && Ops::image_dims(x.shape()).C == C_,
                 "BatchNorm2d " << opts_.name << ": input " << x.shape().str() << " is not " << image_of(C_));
    const bool has_residual = residual.data() != nullptr;
    DPML_REQUIRE(!has_residual || (residual.shape() == x.shape() && residual.is_contiguous()),
                 "BatchNorm2d " << opts_.name << ": residual " << residual.shape().str() << " differs from the input "
                                << x.shape().str());
    DPML_REQUIRE(y.shape() == x.shape() && y.is_contiguous(),
                 "BatchNorm2d " << opts_.name << ": output buffer " << y.shape().str() << " differs from the input "
                                << x.shape().str());
    Saved& s = slots_.slot(ctx);
    s.x = x;
    s.y_out = y;
    s.training = ctx.training();
    s.residual = has_residual;
    s.sums_kept = false;
    with_data_axis(ctx, s.training, [&](const auto* across) {
      Ops::batch_norm_forward(ctx.dev(), x.data(), residual.data(), weight_.value().data(), bias_.value().data(),
                              y.data(), ensure(s.mean, Shape{C_}).data(), ensure(s.rstd, Shape{C_}).data(),
                              running_mean_.data(), running_var_.data(), Ops::image_dims(x.shape()), s.training,
                              opts_.relu, opts_.momentum, opts_.eps, across);
    });
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    return backward_input_into(ctx, dy, ensure(s.dx, s.x.shape()),
                               s.residual ? ensure(s.dres, s.x.shape()) : TensorView<T, Space>());
  }

  // The same into the caller's buffers — a fused block's gradient scratch shared by all blocks —
  // instead of the layer's own: dx (N, C, H, W; may be dy's own buffer: in place) and, exactly when
  // the forward added a residual, dres (N, C, H, W) for its gradient (else a null view).
  Input backward_input_into(Context<Space>& ctx, Output dy, TensorView<T, Space> dx, TensorView<T, Space> dres) {
    return backward_into(ctx, dy, dx, dres, opts_.relu);
  }

  // backward_input_into with dy already masked by the ReLU (zero where y is not positive) by the
  // caller: y is not read (see the top of the file). Without relu the same as backward_input_into.
  Input backward_input_masked_into(Context<Space>& ctx, Output dy, TensorView<T, Space> dx, TensorView<T, Space> dres) {
    return backward_into(ctx, dy, dx, dres, false);
  }

  // The gradient of the residual that forward(ctx, x, residual) added, written by backward_input.
  Input residual_grad(Context<Space>& ctx) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.residual && s.sums_kept, "BatchNorm2d " << opts_.name << ": residual_grad of micro-batch "
                                                           << ctx.micro_batch
                                                           << " needs a forward with a residual, then backward_input");
    return s.residual_grad;
  }

  // dweight += Σdy·x̂, dbias += Σdy over this rank's batch, from the sums backward_input kept.
  void backward_weight(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    check_dy(ctx, s, dy);
    DPML_REQUIRE(s.sums_kept, "BatchNorm2d " << opts_.name << ": backward_weight of micro-batch " << ctx.micro_batch
                                             << " before its backward_input");
    Ops::batch_norm_backward_weight(ctx.dev(), s.sums.data(), s.rstd.data(), weight_.grad().data(),
                                    bias_.grad().data(), C_);
  }

  // weight (C), bias (C). The running statistics are state, not parameters: running_mean/var().
  std::vector<Param<T, Space>*> parameters() { return {&weight_, &bias_}; }
  TensorView<Stat, Space> running_mean() const noexcept { return running_mean_.view(); }  // (C)
  TensorView<Stat, Space> running_var() const noexcept { return running_var_.view(); }    // (C)

 private:
  // backward_input_into; mask: apply the ReLU's mask from the saved y (false: dy comes masked, or
  // there is no ReLU).
  Input backward_into(Context<Space>& ctx, Output dy, TensorView<T, Space> dx, TensorView<T, Space> dres, bool mask) {
    Saved& s = slots_.slot(ctx);
    check_dy(ctx, s, dy);
    const bool has_dres = dres.data() != nullptr;
    DPML_REQUIRE(dx.shape() == s.x.shape() && dx.is_contiguous() && has_dres == s.residual &&
                     (!has_dres || (dres.shape() == s.x.shape() && dres.is_contiguous() && dres.data() != dx.data())),
                 "BatchNorm2d " << opts_.name << ": gradient buffers dx " << dx.shape().str() << " and dres "
                                << dres.shape().str() << " for the input " << s.x.shape().str()
                                << (s.residual ? " (and its residual)" : " (no residual: dres is a null view)"));
    with_data_axis(ctx, s.training, [&](const auto* across) {
      Ops::batch_norm_backward_input(ctx.dev(), dy.data(), mask ? s.y_out.data() : nullptr, s.x.data(),
                                     s.mean.data(), s.rstd.data(), weight_.value().data(), dx.data(), dres.data(),
                                     ensure(s.sums, Shape{2, C_}).data(), Ops::image_dims(s.x.shape()), s.training,
                                     mask, across);
    });
    s.sums_kept = true;
    s.residual_grad = dres;
    return dx;
  }

  struct Saved {
    Input x;                              // (N, C, H, W), the caller's buffer
    bool training = true;
    bool residual = false;                // the forward added one
    bool sums_kept = false;               // backward_input ran since the forward
    Tensor<T, Space> y, dx, dres;         // (N, C, H, W) each (the layer's own: forward's, backward_input's)
    Input y_out;                          // (N, C, H, W): y, or the caller's (forward_into)
    Input residual_grad;                  // (N, C, H, W): dres, or the caller's (backward_input_into)
    Tensor<Stat, Space> mean, rstd;       // (C), (C)
    Tensor<Stat, Space> sums;             // (2, C): this rank's Σdy, Σdy·(x − mean), for backward_weight
  };

  // run(across): across null for this rank's statistics, else a callable that sums statistics over
  // the data axis in place (eval passes need none).
  template <class Run>
  void with_data_axis(const Context<Space>& ctx, bool training, Run&& run) const {
    const Comm* dc = training ? data_comm(ctx) : nullptr;
    const auto across = [dc](Stat* data, std::int64_t n) {
      dc->allreduce(data, static_cast<std::size_t>(n), comm::ReduceOp::sum);
    };
    run(dc != nullptr ? &across : nullptr);
  }

  // The data axis' communicator of a synchronised BatchNorm; null: this rank's statistics.
  const Comm* data_comm(const Context<Space>& ctx) const {
    if (!opts_.sync) return nullptr;
    const Comm* dc = data_comm_;
    if constexpr (std::is_same_v<Comm, comm::Mpi>)
      if (dc == nullptr && ctx.grid != nullptr) dc = &ctx.grid->comm(parallel::Axis::data);
    DPML_REQUIRE(dc != nullptr || ctx.grid == nullptr || ctx.grid->dp() == 1,
                 "BatchNorm2d " << opts_.name << ": sync over " << ctx.grid->dp()
                                << " data-parallel ranks needs the data axis' communicator for " << Space::name
                                << " memory (BatchNorm2d(channels, options, &comm))");
    if (dc == nullptr || dc->size() == 1) return nullptr;
    if constexpr (requires(const Comm& c, kernels::Device<Space>& dev) { c.stream() == dev.stream(); })
      DPML_REQUIRE(dc->stream() == ctx.dev().stream(),
                   "BatchNorm2d " << opts_.name << ": the data axis' communicator enqueues on another stream than "
                                                   "ctx.dev()'s (make it on the model's stream)");
    return dc;
  }

  void check_dy(const Context<Space>& ctx, const Saved& s, const Output& dy) const {
    DPML_REQUIRE(s.x.rank() == 4 && dy.shape() == s.x.shape() && dy.is_contiguous(),
                 "BatchNorm2d " << opts_.name << ": dy " << dy.shape().str() << " differs from the input "
                                << s.x.shape().str() << " of micro-batch " << ctx.micro_batch);
  }
  // "(N, C, H, W)" with C spelled out, in the space's image layout.
  static std::string image_of(std::int64_t C) {
    const std::string c = std::to_string(C);
    return Ops::image_layout == kernels::ImageLayout::nchw ? "(N, " + c + ", H, W)" : "(N, H, W, " + c + ")";
  }

  std::int64_t C_;
  BatchNormOptions opts_;
  const Comm* data_comm_;
  Param<T, Space> weight_, bias_;
  Tensor<Stat, Space> running_mean_, running_var_;  // (C), (C)
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
