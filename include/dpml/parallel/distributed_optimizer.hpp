#pragma once
// DistributedOptimizer: everything between the last backward_weight of a step and the updated
// weights, for any layout, any update rule, on either memory space — written once:
//
//   begin_step(k)      zero the flat gradients; buckets expect k reports per parameter
//   (backward runs; Context::grad_ready → on_grad_ready → buckets start reducing over the data axis)
//   finish_step(lr, S) finish the buckets → global gradient norm → clip scale → update rule on this
//                      rank's ranges → (ZeRO-1) all-gather the updated values → read the norm
//
// Parameters live in one flat buffer (FlatParameters: 64-element-aligned offsets on a GPU, buckets
// splitting into equal shards under ZeRO-1). Without ZeRO every data rank updates all of it, one
// optimizer range per parameter; with ZeRO-1 (GradReduction::reduce_scatter) each data rank
// updates only its segments, so the optimizer state (and fp32 master weights) is sharded dp ways;
// ZeRO-2 (shard_gradients: GradReduction::sharded_gradients) drops the whole gradient buffer too,
// the buckets collecting each round in a slot of a small pool and reducing it into the shard;
// ZeRO-3 (shard_values: GradReduction::sharded_parameters) the whole values buffer as well: the
// update writes this rank's value shard, and the buckets gather a bucket's values when a layer
// reads them (parallel/data.hpp).
//
// The gradient norm counts every element of the global model once: a tensor replicated over the
// tensor axis only on tensor rank 0, a shared copy (Param::is_duplicate, e.g. the tied embedding
// on the last pipeline stage) never, and without ZeRO only data rank 0 (all hold the same sum);
// one all-reduce over the world then gives every rank the same norm, hence the same clipping.
// Norm, clip scale and update run through kernels::Ops<Space>, so on a GPU they stay on the device
// (the scale is a device value the update kernel reads; a non-finite norm skips the update there,
// on every rank alike); the host reads the norm once, at the end (one synchronisation per step),
// and a skipped update does not count as a step (StepReport::skipped).
//
// Compression (a policy of the data axis, parallel/compression/policy.hpp; sizes in
// DistributedOptimizerOptions::compression) changes only how the buckets reduce; StepReport
// carries the bytes they sent.
//
// Precision: T is the parameters' and gradients' type; with 16-bit T the rule keeps fp32 master
// weights and state and rounds the master into the values (optim/rule.hpp). Gradients are summed
// over the data axis (losses divide by the global batch). Loss scaling (fp16, optim/loss_scale.hpp):
// the gradients of a step whose loss gradient was scaled by S are S times the true ones;
// finish_step(lr, S) reports the unscaled norm, clips by it and divides S out in the update (the
// clip scale carries 1/S), so a power-of-two S leaves every bit of the update as without it. An
// overflowed (non-finite) norm skips the update like any other non-finite norm.
//
// Communicators: on the host the grid's MPI groups (Comm = comm::Hierarchical<comm::Mpi>: the data
// axis' nodes, built from the grid's data group and kept here); on a GPU a DeviceGrid's (data axis:
// Comm; the world, any type, for the norm), enqueued on their streams and ordered by events
// (CommLink).
//
//   parallel::DistributedOptimizer<optim::AdamW, float> opt(model.parameters(), &grid, adamw, {.zero = true});
//   parallel::DistributedOptimizer<optim::AdamW, bf16, CudaSpace, comm::Nccl> dopt(
//       model.parameters(), &grid, adamw, {.clip = 1.0}, device_grid, dev);

#include "dpml/comm/hierarchical.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/axis.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/nvtx.hpp"
#include "dpml/core/flat_parameters.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/optim/optimizer.hpp"
#include "dpml/parallel/comm_link.hpp"
#include "dpml/parallel/compression/policy.hpp"
#include "dpml/parallel/data.hpp"
#include "dpml/parallel/device_grid.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/parallel/tensor.hpp"  // default_comm_t

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dpml::parallel {

struct DistributedOptimizerOptions {
  std::size_t bucket_bytes = std::size_t{25} << 20;  // PyTorch DDP's default
  bool zero = false;                                  // ZeRO-1: shard optimizer state over the data axis
  bool shard_gradients = false;                       // ZeRO-2 (with zero): no whole gradient buffer either
  bool shard_values = false;                          // ZeRO-3 (with shard_gradients): no whole values buffer either
  bool prefetch_values = true;                        // ZeRO-3: gather the next bucket ahead of its first read
  bool offload_optimizer = false;                     // ZeRO-Offload: optimizer state and update on the host
  double clip = 0.0;                                  // max global gradient norm; 0 = off
  CompressionOptions compression{};                   // sizes of the Compression policy (if any)
};

struct StepReport {
  double grad_norm = 0.0;          // before clipping, without the loss scale
  double exposed_comm_seconds = 0.0;  // host time waiting for collectives (GPU streams: the launches only)
  bool skipped = false;            // a non-finite norm: no update, the step count unchanged
  std::int64_t wire_bytes = 0;     // bytes this rank sent for the step: gradients, ZeRO-3's weights (GradientBuckets::wire_bytes)
  std::int64_t dense_bytes = 0;    // … and would have sent uncompressed
};

template <optim::UpdateRule Rule, class T = float, class Space = HostSpace, class Comm = default_comm_t<Space>,
          class Compression = NoCompression>
class DistributedOptimizer {
  using Ops = kernels::Ops<Space>;

 public:
  using ParamT = Param<T, Space>;
  using Optimizer = optim::Optimizer<Rule, T, Space>;
  using master_type = optim::master_t<T>;

  // Host: the grid's MPI communicators (no grid: one process).
  template <std::ranges::range Params>
    requires(std::same_as<Space, HostSpace> &&
             (std::same_as<Comm, comm::Mpi> || std::same_as<Comm, comm::Hierarchical<comm::Mpi>>))
  DistributedOptimizer(Params&& params, const ProcessGrid* grid, typename Rule::Options rule,
                       DistributedOptimizerOptions options = {})
      : DistributedOptimizer(std::forward<Params>(params), grid, rule, options, host_data(grid),
                             grid ? &grid->world() : nullptr, kernels::host_device()) {}

  // Any space: the data axis' and the world's communicators for device buffers from `comms`
  // (built from the same grid), kernels on `dev`; both must outlive the optimizer.
  template <std::ranges::range Params, class WorldComm>
  DistributedOptimizer(Params&& params, const ProcessGrid* grid, typename Rule::Options rule,
                       DistributedOptimizerOptions options, const DeviceGrid<WorldComm, Comm>& comms,
                       kernels::Device<Space>& dev)
      : DistributedOptimizer(std::forward<Params>(params), grid, rule, options, borrowed(&comms.data()), &comms.world(), dev) {
    DPML_REQUIRE(grid == &comms.grid(), "DistributedOptimizer: the DeviceGrid was built from another ProcessGrid");
  }

  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // The containers' grad-ready reports (layers::Context::on_grad_ready): the buckets start reducing.
  void on_grad_ready(std::span<ParamBase* const> ps) { buckets_.on_grad_ready(ps); }
  // Keep the bucket of `p` until finish_step (a tied weight another stage adds to after backward).
  void hold(const ParamBase* p) { buckets_.hold(p); }

  // `step`: the trainer's step count (from 1), when the compression waits for a start step.
  void begin_step(int micro_batches, std::int64_t step = std::numeric_limits<std::int64_t>::max()) {
    if (!options_.shard_gradients) {  // (ZeRO-2: each round's slot is zeroed when it opens)
      Ops::zero(*dev_, flat_.grads().data(), flat_.numel());
      for (ParamBase* p : flat_.params()) p->mark_grad_zero();  // the first weight-gradient GEMM may overwrite
    }
    buckets_.begin_step(micro_batches, step);
  }

  // `loss_scale`: S, the factor every gradient of the step carries (1: none).
  StepReport finish_step(double lr, double loss_scale = 1.0) {
    const NvtxRange range("optimizer step");
    DPML_REQUIRE(loss_scale > 0.0 && std::isfinite(loss_scale),
                 "DistributedOptimizer: loss scale " << loss_scale << " must be finite and positive");
    const double inv_scale = 1.0 / loss_scale;
    buckets_.finish();
    Ops::sum_squares(*dev_, static_cast<const T*>(buckets_.shard_grads().data()), counted_begin_.data(),
                     counted_before_.data(), static_cast<int>(counted_begin_.numel()), counted_total_, norm_sq_.data());
    if (world_sum_) world_sum_(norm_sq_.data());
    Ops::clip_scale(*dev_, static_cast<const double*>(norm_sq_.data()), scale_.data(),
                    options_.clip > 0.0 ? options_.clip : std::numeric_limits<double>::infinity(), inv_scale);
    buckets_.release_values();  // ZeRO-3: the shards are about to change
    optimizer_.step(lr, scale_.data());
    buckets_.all_gather_values();
    double squared = 0.0;  // the step's one synchronisation on a GPU
    SpaceCopy<HostSpace, Space>::copy(&squared, norm_sq_.data(), sizeof(double));
    StepReport report;
    report.grad_norm = std::sqrt(squared) * inv_scale;  // the clip scale's norm (kernels' GradNormOps)
    if (!std::isfinite(report.grad_norm)) {  // the update skipped itself on every rank
      optimizer_.set_step_count(optimizer_.step_count() - 1);
      report.skipped = true;
    }
    report.exposed_comm_seconds = buckets_.exposed_seconds();
    report.wire_bytes = buckets_.wire_bytes();
    report.dense_bytes = buckets_.dense_bytes();
    return report;
  }

  FlatParameters<T, Space>& flat() noexcept { return flat_; }
  GradientBuckets<T, Space, Comm, Compression>& buckets() noexcept { return buckets_; }
  Optimizer& optimizer() noexcept { return optimizer_; }
  const DistributedOptimizerOptions& options() const noexcept { return options_; }

  // ---- state by name, on the host (checkpoints) ---------------------------------------------------
  // The slots: the rule's state_names, then "master" — the weights the rule updates (the fp32
  // master weights under mixed precision, the values themselves otherwise).
  static std::vector<std::string> state_slots() {
    std::vector<std::string> s(Rule::state_names.begin(), Rule::state_names.end());
    s.emplace_back("master");
    return s;
  }
  // Elements [offset, offset + count) of the flat buffer in slot `slot`, as master_type on the host;
  // zero where no parameter lies. Under ZeRO-1 each element's state lives on one data rank: the
  // call is collective over the data axis (every data rank calls it with the same range).
  std::vector<master_type> read_state(std::string_view slot, std::int64_t offset, std::int64_t count) {
    check_range("read", offset, count);
    std::vector<master_type> out(static_cast<std::size_t>(count), master_type(0));
    buckets_.release_values();  // ZeRO-3: a write through a parameter's value is in the shard
    if constexpr (!Optimizer::keeps_master)
      if (slot == "master" && !options_.shard_values) {  // the values: every rank holds all of them
        SpaceCopy<HostSpace, Space>::copy(out.data(), flat_.values().data() + offset, static_cast<std::size_t>(count) * sizeof(T));
        return out;
      }
    const std::size_t k = slot_index(slot);
    for_each_owned(offset, count, [&](std::span<master_type> state, bool on_host, std::int64_t at, std::int64_t lo, std::int64_t n) {
      const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(master_type);
      if (on_host) SpaceCopy<HostSpace, HostSpace>::copy(out.data() + (lo - offset), state.data() + (lo - at), bytes);
      else SpaceCopy<HostSpace, Space>::copy(out.data() + (lo - offset), state.data() + (lo - at), bytes);
    }, k);
    if (options_.zero && grid_ && grid_->dp() > 1)
      grid_->comm(Axis::data).allreduce(out.data(), out.size(), comm::ReduceOp::sum);  // one owner each
    return out;
  }
  std::vector<master_type> read_state(std::string_view slot, const ParamBase& p) {
    return read_state(slot, flat_.offsets()[flat_.index_of(&p)], p.numel());
  }
  // Writes elements [offset, offset + values.size()) of slot `slot`: every rank passes the same
  // values and keeps what it owns. Local. "master" writes the values themselves without mixed
  // precision; with it, the fp32 master weights only (the values follow at the next update: write
  // them through the parameters too, or write the values and reload_master()).
  void write_state(std::string_view slot, std::int64_t offset, std::span<const master_type> values) {
    const auto count = static_cast<std::int64_t>(values.size());
    check_range("write", offset, count);
    buckets_.release_values();  // ZeRO-3: no gathered slot may later write back what this replaces
    if constexpr (!Optimizer::keeps_master)
      if (slot == "master" && !options_.shard_values) {
        SpaceCopy<Space, HostSpace>::copy(flat_.values().data() + offset, values.data(), static_cast<std::size_t>(count) * sizeof(T));
        return;
      }
    for_each_owned(offset, count, [&](std::span<master_type> state, bool on_host, std::int64_t at, std::int64_t lo, std::int64_t n) {
      const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(master_type);
      if (on_host) SpaceCopy<HostSpace, HostSpace>::copy(state.data() + (lo - at), values.data() + (lo - offset), bytes);
      else SpaceCopy<Space, HostSpace>::copy(state.data() + (lo - at), values.data() + (lo - offset), bytes);
    }, slot_index(slot));
  }
  void write_state(std::string_view slot, const ParamBase& p, std::span<const master_type> values) {
    DPML_REQUIRE(static_cast<std::int64_t>(values.size()) == p.numel(),
                 "write_state('" << slot << "', '" << p.name() << "'): " << values.size() << " values for "
                                 << p.numel() << " elements");
    write_state(slot, flat_.offsets()[flat_.index_of(&p)], values);
  }
  // Mixed precision: the master weights again from the values, after something other than the
  // update wrote them (a checkpoint's weights). Synchronous.
  void reload_master() {
    buckets_.release_values();
    optimizer_.reload_master();
  }

 private:
  template <std::ranges::range Params, class WorldComm>
  DistributedOptimizer(Params&& params, const ProcessGrid* grid, typename Rule::Options rule,
                       DistributedOptimizerOptions options, std::shared_ptr<const Comm> data, const WorldComm* world,
                       kernels::Device<Space>& dev)
      : grid_(grid), options_(options), dev_(&dev), data_(std::move(data)),
        flat_(std::forward<Params>(params), layout(options, data_.get())),
        buckets_(flat_, data_.get(), reduction(checked(options)), dev, options.compression),
        optimizer_(make_ranges(), rule, dev, options.offload_optimizer), world_sum_(sum_over(world, dev)) {
    buckets_.set_prefetch(options.prefetch_values);
    count_in_norm();
  }

  // A communicator someone else keeps (the grid's, a DeviceGrid's).
  static std::shared_ptr<const Comm> borrowed(const Comm* c) { return std::shared_ptr<const Comm>(std::shared_ptr<void>(), c); }
  // The host data axis: the grid's group, or its nodes (built here, collective over the data axis).
  static std::shared_ptr<const Comm> host_data(const ProcessGrid* grid) {
    if (!grid) return nullptr;
    if constexpr (std::same_as<Comm, comm::Mpi>) return borrowed(&grid->comm(Axis::data));
    else return std::make_shared<const Comm>(Comm::from(grid->comm(Axis::data), grid->ranks_per_node()));
  }

  static FlatLayout layout(const DistributedOptimizerOptions& o, const Comm* data) {
    return {.align = flat_alignment<Space>,
            .bucket_elements = static_cast<std::int64_t>(std::max(o.bucket_bytes, sizeof(T)) / sizeof(T)),
            .shards = o.zero && data ? data->size() : 1,
            .grads = !o.shard_gradients};
  }
  static const DistributedOptimizerOptions& checked(const DistributedOptimizerOptions& o) {
    DPML_REQUIRE_EVERYWHERE(!o.shard_gradients || o.zero, "DistributedOptimizer: ZeRO-2's sharded gradients need ZeRO's "
                                                          "sharded optimizer state (zero)");
    DPML_REQUIRE_EVERYWHERE(!o.shard_values || o.shard_gradients, "DistributedOptimizer: ZeRO-3's sharded values need ZeRO-2's "
                                                                  "sharded gradients (shard_gradients)");
    return o;
  }
  static GradReduction reduction(const DistributedOptimizerOptions& o) {
    if (!o.zero) return GradReduction::all_reduce;
    if (o.shard_values) return GradReduction::sharded_parameters;
    return o.shard_gradients ? GradReduction::sharded_gradients : GradReduction::reduce_scatter;
  }

  // The norm's sum over the world (none on one process), ordered like the buckets' collectives.
  template <class WorldComm>
  static std::function<void(double*)> sum_over(const WorldComm* world, kernels::Device<Space>& dev) {
    if (!world || world->size() == 1) return {};
    auto link = std::make_shared<CommLink<WorldComm, Space>>(dev, *world);
    return [link](double* squared) {
      link->allreduce(squared, 1).wait();
      link->join();
    };
  }

  // One range per parameter without ZeRO, one per own segment with it; range_offsets_ keeps where
  // each starts in the flat buffer.
  std::vector<optim::Range<T>> make_ranges() {
    std::vector<optim::Range<T>> ranges;
    T* values = flat_.values().data();
    if (!options_.zero) {
      for (std::size_t i = 0; i < flat_.params().size(); ++i) {
        const auto n = static_cast<std::size_t>(flat_.params()[i]->numel());
        const std::int64_t at = flat_.offsets()[i];
        ranges.push_back({flat_.params()[i]->name(), std::span<T>(values + at, n),
                          std::span<const T>(flat_.grads().data() + at, n)});
        range_offsets_.push_back(at);
      }
      return ranges;
    }
    const T* shard = buckets_.shard_grads().data();
    T* value_shard = buckets_.value_shard().data();  // ZeRO-3: the values' shard, laid out as the gradients'
    for (const auto& s : buckets_.own_segments()) {
      const auto n = static_cast<std::size_t>(s.count);
      T* v = options_.shard_values ? value_shard + s.shard_offset : values + s.flat_offset;
      ranges.push_back({"shard@" + std::to_string(s.flat_offset), std::span<T>(v, n), std::span<const T>(shard + s.shard_offset, n)});
      range_offsets_.push_back(s.flat_offset);
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

  // The ranges of shard_grads() this rank adds to the norm: its segments' elements of the
  // parameters it counts (segments and parameters are both sorted by flat offset).
  void count_in_norm() {
    const auto& params = flat_.params();
    const auto& offsets = flat_.offsets();
    std::vector<std::int64_t> begin, before{0};
    for (const auto& s : buckets_.own_segments()) {
      const std::int64_t s_end = s.flat_offset + s.count;
      auto it = std::upper_bound(offsets.begin(), offsets.end(), s.flat_offset);
      if (it != offsets.begin()) --it;
      for (; it != offsets.end() && *it < s_end; ++it) {
        const std::size_t i = static_cast<std::size_t>(it - offsets.begin());
        const std::int64_t lo = std::max(*it, s.flat_offset), hi = std::min(*it + params[i]->numel(), s_end);
        if (lo >= hi || !counted_here(*params[i])) continue;
        begin.push_back(s.shard_offset + (lo - s.flat_offset));
        before.push_back(before.back() + (hi - lo));
      }
    }
    counted_total_ = before.back();
    counted_begin_ = to_space(begin);
    counted_before_ = to_space(before);
  }
  static Tensor<std::int64_t, Space> to_space(const std::vector<std::int64_t>& v) {
    Tensor<std::int64_t, Space> t(Shape{static_cast<std::int64_t>(v.size())});
    SpaceCopy<Space, HostSpace>::copy(t.data(), v.data(), v.size() * sizeof(std::int64_t));
    return t;
  }

  std::size_t slot_index(std::string_view slot) const {
    if (slot == "master") return Optimizer::kStates;  // the master weights, or (ZeRO-3, no master) the value shard
    for (std::size_t k = 0; k < Optimizer::kStates; ++k)
      if (slot == Rule::state_names[k]) return k;
    std::string known;
    for (const auto& s : state_slots()) known += (known.empty() ? "" : ", ") + s;
    throw Error("DistributedOptimizer: no optimizer state slot '" + std::string(slot) + "' (slots: " + known + ")");
  }
  void check_range(const char* what, std::int64_t offset, std::int64_t count) const {
    DPML_REQUIRE(offset >= 0 && count >= 0 && offset + count <= flat_.numel(),
                 "DistributedOptimizer: " << what << " of state elements [" << offset << ", " << offset + count
                                          << ") beyond the flat buffer's " << flat_.numel());
  }
  // f(slot k's span of range i, whether it is in host memory (offloaded state) or this space, range
  // i's flat offset, first common element, count) for every optimizer range meeting
  // [offset, offset + count); k = kStates: the master weights.
  template <class F>
  void for_each_owned(std::int64_t offset, std::int64_t count, F&& f, std::size_t k) {
    for (std::size_t i = 0; i < optimizer_.range_count(); ++i) {
      const std::int64_t at = range_offsets_[i], n = static_cast<std::int64_t>(optimizer_.range(i).value.size());
      const std::int64_t lo = std::max(offset, at), hi = std::min(offset + count, at + n);
      if (lo >= hi) continue;
      std::span<master_type> state;
      bool on_host = optimizer_.state_on_host();
      if constexpr (Optimizer::keeps_master) {
        state = k == Optimizer::kStates ? optimizer_.master(i) : optimizer_.state(i, k);
      } else if (k == Optimizer::kStates) {  // the values themselves (ZeRO-3: the value shard)
        state = optimizer_.range(i).value;
        on_host = Space::host_accessible;
      } else {
        state = optimizer_.state(i, k);
      }
      f(state, on_host, at, lo, hi - lo);
    }
  }

  const ProcessGrid* grid_;
  DistributedOptimizerOptions options_;
  kernels::Device<Space>* dev_;
  std::shared_ptr<const Comm> data_;         // the data axis (owned for a host hierarchy, else borrowed)
  std::vector<std::int64_t> range_offsets_;  // per optimizer range: its first flat element
  FlatParameters<T, Space> flat_;
  GradientBuckets<T, Space, Comm, Compression> buckets_;
  Optimizer optimizer_;
  std::function<void(double*)> world_sum_;
  Tensor<std::int64_t, Space> counted_begin_, counted_before_;  // the norm's ranges of shard_grads()
  std::int64_t counted_total_ = 0;
  Tensor<double, Space> norm_sq_{Shape{1}};    // Σ g² of the step, summed over the world
  Tensor<master_type, Space> scale_{Shape{1}}; // the gradients' clipping scale (NaN: skip)
};

}  // namespace dpml::parallel
