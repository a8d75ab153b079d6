#pragma once
// DistributedOptimizer: everything between the last backward_weight of a step and the updated
// weights, for any layout.
//
//   begin_step(k)      zero the flat gradients; buckets expect k reports per parameter
//   (backward runs; Context::grad_ready → buckets start reducing over the data axis)
//   finish_step(lr)    wait for the buckets → global gradient norm → clip → update rule on this
//                      rank's ranges → (ZeRO-1) all-gather the updated values
//
// Parameters live in one flat buffer (FlatParameters). Without ZeRO every data rank updates all
// of it, one optimizer range per parameter; with ZeRO-1 (GradReduction::reduce_scatter) each data
// rank updates only its segments, so the optimizer state is sharded dp ways.
//
// The gradient norm counts every element of the global model once: a tensor replicated over the
// tensor axis only on tensor rank 0, a shared copy (Param::is_duplicate, e.g. the tied embedding
// on the last pipeline stage) never, and without ZeRO only data rank 0 (all hold the same sum);
// one all-reduce over the world then gives every rank the same norm, hence the same clipping.

#include "dpml/core/parameter.hpp"
#include "dpml/optim/optimizer.hpp"
#include "dpml/parallel/data.hpp"
#include "dpml/core/flat_parameters.hpp"
#include "dpml/parallel/grid.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

namespace dpml::parallel {

struct DistributedOptimizerOptions {
  std::size_t bucket_bytes = std::size_t{25} << 20;  // PyTorch DDP's default
  bool zero = false;                                  // ZeRO-1: shard optimizer state over the data axis
  double clip = 0.0;                                  // max global gradient norm; 0 = off
};

struct StepReport {
  double grad_norm = 0.0;          // before clipping
  double exposed_comm_seconds = 0.0;
};

template <optim::UpdateRule Rule, class T = float>
class DistributedOptimizer {
 public:
  using ParamT = Param<T, HostSpace>;

  template <std::ranges::range Params>
  DistributedOptimizer(Params&& params, const ProcessGrid* grid, typename Rule::Options rule,
                       DistributedOptimizerOptions options = {})
      : grid_(grid), options_(options), flat_(std::forward<Params>(params)),
        buckets_(flat_, grid ? &grid->comm(Axis::data) : nullptr, options.bucket_bytes,
                 options.zero ? GradReduction::reduce_scatter : GradReduction::all_reduce),
        optimizer_(make_ranges(), rule) {}

  // The containers' grad-ready reports (layers::Context::on_grad_ready): the buckets start reducing.
  void on_grad_ready(std::span<ParamBase* const> ps) { buckets_.on_grad_ready(ps); }

  void begin_step(int micro_batches) {
    flat_.zero_grads();
    buckets_.begin_step(micro_batches);
  }

  StepReport finish_step(double lr) {
    buckets_.finish();
    StepReport report;
    report.grad_norm = global_grad_norm();
    if (options_.clip > 0.0 && std::isfinite(report.grad_norm)) {
      const double coef = options_.clip / (report.grad_norm + 1e-6);  // torch.nn.utils.clip_grad_norm_
      if (coef < 1.0)
        for (const auto& s : buckets_.own_segments()) {
          T* g = buckets_.shard_grads().data() + s.shard_offset;
          for (std::int64_t i = 0; i < s.count; ++i) g[i] = static_cast<T>(static_cast<double>(g[i]) * coef);
        }
    }
    optimizer_.step(lr);
    buckets_.all_gather_values();
    report.exposed_comm_seconds = buckets_.exposed_seconds();
    return report;
  }

  FlatParameters<T>& flat() noexcept { return flat_; }
  GradientBuckets<T>& buckets() noexcept { return buckets_; }
  optim::Optimizer<Rule, T>& optimizer() noexcept { return optimizer_; }
  const DistributedOptimizerOptions& options() const noexcept { return options_; }

 private:
  std::vector<optim::Range<T>> make_ranges() {
    std::vector<optim::Range<T>> ranges;
    const auto shard = buckets_.shard_grads();
    if (!options_.zero) {
      for (ParamT* p : flat_.params()) {
        const auto n = static_cast<std::size_t>(p->numel());
        ranges.push_back({p->name(), std::span<T>(p->value().data(), n), std::span<const T>(p->grad().data(), n)});
      }
      return ranges;
    }
    for (const auto& s : buckets_.own_segments()) {
      const auto n = static_cast<std::size_t>(s.count);
      ranges.push_back({"shard@" + std::to_string(s.flat_offset), std::span<T>(flat_.values().data() + s.flat_offset, n),
                        std::span<const T>(shard.data() + s.shard_offset, n)});
    }
    return ranges;
  }

  bool counted_here(const ParamT& p) const {
    if (p.is_duplicate()) return false;
    if (!grid_) return true;
    if (p.sharding().is_replicated() && grid_->coord(Axis::tensor) != 0) return false;
    if (!options_.zero && grid_->coord(Axis::data) != 0) return false;
    return true;
  }

  double global_grad_norm() const {
    double local = 0.0;
    const auto& params = flat_.params();
    const auto& offsets = flat_.offsets();
    const T* shard = buckets_.shard_grads().data();
    // Segments and parameters are both sorted by flat offset: walk the intersections.
    for (const auto& s : buckets_.own_segments()) {
      const std::int64_t s_end = s.flat_offset + s.count;
      auto first = std::upper_bound(offsets.begin(), offsets.end(), s.flat_offset) - 1;
      for (auto it = first; it != offsets.end() && *it < s_end; ++it) {
        const std::size_t i = static_cast<std::size_t>(it - offsets.begin());
        if (!counted_here(*params[i])) continue;
        const std::int64_t lo = std::max(*it, s.flat_offset), hi = std::min(*it + params[i]->numel(), s_end);
        for (std::int64_t f = lo; f < hi; ++f) {
          const double g = static_cast<double>(shard[f - s.flat_offset + s.shard_offset]);
          local += g * g;
        }
      }
    }
    if (grid_) local = grid_->world().allreduce(local, comm::ReduceOp::sum);
    return std::sqrt(local);
  }

  const ProcessGrid* grid_;
  DistributedOptimizerOptions options_;
  FlatParameters<T> flat_;
  GradientBuckets<T> buckets_;
  optim::Optimizer<Rule, T> optimizer_;
};

}  // namespace dpml::parallel
