#pragma once
// BatchNorm2d over NCHW: per-channel statistics over (N, H, W), weight (C) = 1 and bias (C) = 0 at
// init, running mean / variance updated with `momentum` in training and used in eval, as
// PyTorch's nn.BatchNorm2d (the running variance takes the unbiased batch variance).
//
// Synchronised statistics (sync = true): the per-channel sums of forward (Σx with the count, then
// Σ(x − mean)²) and of backward_input (Σdy, Σdy·x̂) are all-reduced over the data axis
// (ctx.grid->comm(Axis::data)), so the statistics are those of the global micro-batch and K ranks
// compute exactly what one rank computes on the concatenated batch. backward_weight needs only
// local sums: the data-parallel gradient reduction adds the ranks' dweight, dbias afterwards.
// Each rank must then run the same number of forwards (an empty local batch still joins).

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/host/batch_norm.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/parallel/grid.hpp"

#include <cmath>
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
  std::string name = "bn";
};

template <class T = float, class Space = HostSpace>
class BatchNorm2d {
  static_assert(std::is_same_v<Space, HostSpace>, "dpml BatchNorm2d: only the host path (kernels/host) exists so far");

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (N, C, H, W)
  using Output = TensorView<const T, Space>;  // (N, C, H, W)

  explicit BatchNorm2d(std::int64_t channels, BatchNormOptions opts = {})
      : C_(channels), opts_(std::move(opts)), weight_(opts_.name + ".weight", Shape{channels}, Init::constant(1.0)),
        bias_(opts_.name + ".bias", Shape{channels}, Init::constant(0.0)), running_mean_(Shape{channels}, T(0)),
        running_var_(Shape{channels}, T(1)) {
    DPML_REQUIRE(C_ > 0 && opts_.eps > 0 && opts_.momentum >= 0 && opts_.momentum <= 1,
                 "BatchNorm2d " << opts_.name << ": channels " << C_ << ", eps " << opts_.eps << ", momentum "
                                << opts_.momentum << " out of range");
  }

  Output forward(Context<Space>& ctx, Input x) {
    DPML_REQUIRE(x.rank() == 4 && x.size(1) == C_ && x.is_contiguous(),
                 "BatchNorm2d " << opts_.name << ": input " << x.shape().str() << " is not (N, " << C_ << ", H, W)");
    Saved& s = slots_.slot(ctx);
    s.x = x;
    s.training = ctx.training();
    s.mean.resize(static_cast<std::size_t>(C_));
    s.rstd.resize(static_cast<std::size_t>(C_));
    const std::int64_t N = x.size(0), S = x.size(2) * x.size(3);
    if (s.training) {
      batch_statistics(ctx, s, N, S);
    } else {
      for (std::int64_t c = 0; c < C_; ++c) {
        s.mean[c] = running_mean_[c];
        s.rstd[c] = 1.0 / std::sqrt(static_cast<double>(running_var_[c]) + opts_.eps);
      }
    }
    auto y = ensure(s.y, x.shape());
    kernels::host::bn_normalize(x.data(), s.mean.data(), s.rstd.data(), weight_.value().data(), bias_.value().data(), N,
                                C_, S, y.data());
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    check_dy(ctx, s, dy);
    const std::int64_t N = s.x.size(0), S = s.x.size(2) * s.x.size(3);
    std::vector<double> sums(static_cast<std::size_t>(2 * C_));  // Σdy (C), Σdy·x̂ (C)
    kernels::host::bn_backward_sums(dy.data(), s.x.data(), s.mean.data(), s.rstd.data(), N, C_, S, sums.data(),
                                    sums.data() + C_);
    if (s.training && synchronised(ctx)) data_comm(ctx).allreduce(sums.data(), sums.size(), comm::ReduceOp::sum);
    auto dx = ensure(s.dx, s.x.shape());
    kernels::host::bn_backward_input(dy.data(), s.x.data(), s.mean.data(), s.rstd.data(), weight_.value().data(),
                                     sums.data(), sums.data() + C_, s.count, s.training, N, C_, S, dx.data());
    return dx;
  }

  void backward_weight(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    check_dy(ctx, s, dy);
    std::vector<double> sums(static_cast<std::size_t>(2 * C_));  // Σdy (C), Σdy·x̂ (C), this rank's
    kernels::host::bn_backward_sums(dy.data(), s.x.data(), s.mean.data(), s.rstd.data(), s.x.size(0), C_,
                                    s.x.size(2) * s.x.size(3), sums.data(), sums.data() + C_);
    auto dw = weight_.grad(), db = bias_.grad();
    for (std::int64_t c = 0; c < C_; ++c) {
      dw[c] += static_cast<T>(sums[C_ + c]);
      db[c] += static_cast<T>(sums[c]);
    }
  }

  // weight (C), bias (C). The running statistics are state, not parameters: running_mean/var().
  std::vector<Param<T, Space>*> parameters() { return {&weight_, &bias_}; }
  TensorView<T, Space> running_mean() const noexcept { return running_mean_.view(); }  // (C)
  TensorView<T, Space> running_var() const noexcept { return running_var_.view(); }    // (C)

 private:
  struct Saved {
    Input x;                          // (N, C, H, W), the caller's buffer
    bool training = true;
    double count = 0;                 // values per channel behind the statistics (global with sync)
    std::vector<double> mean, rstd;   // (C)
    Tensor<T, Space> y, dx;           // (N, C, H, W)
  };

  bool synchronised(const Context<Space>& ctx) const noexcept { return opts_.sync && ctx.grid != nullptr; }
  const comm::Mpi& data_comm(const Context<Space>& ctx) const { return ctx.grid->comm(parallel::Axis::data); }

  // Batch mean and rstd (global with sync), and the running statistics' update.
  void batch_statistics(const Context<Space>& ctx, Saved& s, std::int64_t N, std::int64_t S) {
    std::vector<double> sums(static_cast<std::size_t>(C_ + 1));  // Σx (C), count
    kernels::host::bn_channel_sum(s.x.data(), N, C_, S, sums.data());
    sums[C_] = static_cast<double>(N * S);
    if (synchronised(ctx)) data_comm(ctx).allreduce(sums.data(), sums.size(), comm::ReduceOp::sum);
    s.count = sums[C_];
    DPML_REQUIRE(s.count > 1, "BatchNorm2d " << opts_.name << ": training needs more than one value per channel, got "
                                             << s.count << " (input " << s.x.shape().str() << ")");
    for (std::int64_t c = 0; c < C_; ++c) s.mean[c] = sums[c] / s.count;
    std::vector<double> sqdev(static_cast<std::size_t>(C_));  // Σ(x − mean)² (C)
    kernels::host::bn_channel_sqdev(s.x.data(), s.mean.data(), N, C_, S, sqdev.data());
    if (synchronised(ctx)) data_comm(ctx).allreduce(sqdev.data(), sqdev.size(), comm::ReduceOp::sum);
    const double m = opts_.momentum;
    for (std::int64_t c = 0; c < C_; ++c) {
      const double var = sqdev[c] / s.count;
      s.rstd[c] = 1.0 / std::sqrt(var + opts_.eps);
      running_mean_[c] = static_cast<T>((1 - m) * running_mean_[c] + m * s.mean[c]);
      running_var_[c] = static_cast<T>((1 - m) * running_var_[c] + m * var * s.count / (s.count - 1));
    }
  }

  void check_dy(const Context<Space>& ctx, const Saved& s, const Output& dy) const {
    DPML_REQUIRE(s.x.rank() == 4 && dy.shape() == s.x.shape() && dy.is_contiguous(),
                 "BatchNorm2d " << opts_.name << ": dy " << dy.shape().str() << " differs from the input "
                                << s.x.shape().str() << " of micro-batch " << ctx.micro_batch);
  }

  std::int64_t C_;
  BatchNormOptions opts_;
  Param<T, Space> weight_, bias_;
  Tensor<T, Space> running_mean_, running_var_;  // (C), (C)
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
