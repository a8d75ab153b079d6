#pragma once
// parallel::cuda::DistributedOptimizer: ZeRO-1 for a GPU model's flat buffers (Megatron's
// "distributed optimizer"). Each of the K data-parallel ranks keeps the fp32 master weights and
// AdamW moments of its 1/K of the buffer only: 12 bytes per parameter · (1 − 1/K) less on every
// rank than plain data parallelism (gradient_sync.hpp), where every rank holds all of them. A step:
//
//   backward  the model reports its final gradients as GradientSync's (the same ready()/finish()
//             protocol, detail::BucketQueue); each bucket [begin, end) is REDUCE-SCATTERED in place
//             (ncclAvg) on the communication stream: rank r receives the mean of its shard
//             [begin + r·c, begin + (r+1)·c), c = (end − begin)/K, where it already lies
//   norm      Σ g² over this rank's shards (one CUB reduction over their list of ranges,
//             kernels/cuda/grad_norm.hpp's grad_norm_squared_ranges),
//             one all-reduce (sum) of that double over the data axis: the global norm, the same on
//             every rank, hence the same clip coefficient (kernels/cuda/grad_norm.hpp); a
//             non-finite norm (an fp16 overflow) makes every rank skip the step alike. Under tensor
//             or pipeline parallelism (restrict_norm) only the part of the shards the model counts
//             on this rank, and the model's sum over its tensor axis and stages after the data axis's
//   update    fused AdamW (kernels/cuda/adamw.hpp) on each shard: its master weights, moments and
//             16-bit working weights; as soon as a bucket's shard is updated, the bucket's working
//             weights are ALL-GATHERED in place on the communication stream, overlapping the
//             updates of the buckets after it; the compute stream waits for the last all-gather,
//             so the next forward reads the whole updated model
//
// The two streams are ordered by CUDA events only: no host synchronisation inside a step.
// exposed_ms() sums the compute stream's waits of the last step: the reduce-scatters' tail at
// finish(), the norm's all-reduce, and the all-gathers' tail after the last update.
//
// Shards. A bucket splits into K equal shards, each 64-element aligned (NCCL's in-place forms, the
// vector loads), so buckets are cut on multiples of 64·K elements counted from the buffer's end.
// The first r = n mod 64·K elements (r < 64·K; in a whole GPT the start of wpe) are not sharded: they
// are handled redundantly, as plain data parallelism does — all-reduced (avg) in the last bucket,
// updated by every rank from a full copy of their state, counted in the norm by rank 0 only. That
// costs under 64·K·12 bytes per rank; padding the flat buffer to a multiple of 64·K instead would
// make the model's layout depend on K.
//
// The gradients after finish(): only this rank's shards (and the remainder) hold the averages;
// the rest of the buffer is not reduced here (a model's gradient() reads it as local values).
//
// State (checkpoints). read() gathers a range of the flat master weights or moments from their
// owners — a COLLECTIVE over the data axis: every rank must call it, in the same order, with the
// same range. Each rank copies the elements it owns into a zeroed fp32 staging buffer and one
// all-reduce (sum) composes them exactly (x + 0 = x; the remainder is contributed by rank 0
// only). write() and reset() are local: every rank is handed the whole range and keeps its part.
//
//   DistributedOptimizer<bf16> zero(comm::Nccl::from(world), model.weights(), model.gradients(),
//                                   model.parameter_count(), model.stream());
//   model.set_distributed_optimizer(&zero);  // before init_random/copy_from: the model then never
//                                            //   allocates the full master weights and moments
//
// Comm is the data axis's communicator (comm::Nccl, or one with the same collectives and stream(),
// e.g. comm::Staged); its stream is the communication stream.

#include "dpml/comm/nccl.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/adamw.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/grad_norm.hpp"
#include "dpml/optim/adamw.hpp"
#include "dpml/parallel/cuda/gradient_sync.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpml::parallel::cuda {

// The fp32 state of an AdamW step, per flat element (named as optim::AdamW::state_names).
enum class OptimizerState { master, exp_avg, exp_avg_sq };

// What a model hands its fp32 optimizer state and its update to when they are sharded over the
// data axis (the model knows no more of it). Offsets count elements of the model's flat buffers.
class ShardedOptimizer : public GradientListener {
 public:
  virtual std::size_t size() const = 0;         // elements of the flat buffers it serves
  virtual std::size_t state_bytes() const = 0;  // master weights and moments held on this rank
  // Enqueued on the compute stream, after finish(): *norm_sq (device double) = Σ g² of the whole
  // averaged gradient buffer (as it is: scaled by the loss scale), *clip_coef (device float) =
  // clip_coefficient(*norm_sq, max_norm, inv_scale), AdamW on this rank's shards, and the working
  // weights all-gathered. Every rank calls it.
  virtual void update(double lr, std::int64_t step, const optim::AdamWOptions& opt, double max_norm, double inv_scale,
                      double* norm_sq, float* clip_coef) = 0;
  // Host copy of [offset, offset + dst.size()) of one state. Collective over the data axis: every
  // rank calls it with the same range. Synchronous.
  virtual void read(OptimizerState which, std::size_t offset, std::span<float> dst) = 0;
  // [offset, offset + src.size()) of one state from the host: each rank keeps what it owns (every
  // rank passes the same values). Synchronous.
  virtual void write(OptimizerState which, std::size_t offset, std::span<const float> src) = 0;
  // The master weights of the whole buffer (size() values) from the host, moments zeroed.
  virtual void reset(std::span<const float> master) = 0;
  // A model spread over more ranks than the data axis (tensor parallelism, pipeline stages): the
  // norm counts only the elements of `model_counted` (ranges of the flat buffer: what this rank
  // adds to the full model's norm), and `across_model(norm_sq)`, enqueued on the compute stream
  // after the data axis's sum, adds the sums of the model's other ranks (the tensor axis, the
  // other stages). Once, before the first update.
  virtual void restrict_norm(const kernels::cuda::NormRanges& model_counted,
                             std::function<void(double*)> across_model) = 0;
};

namespace detail {

// One stretch of the flat buffers whose state this rank holds.
struct OwnedRange {
  std::size_t flat;    // first element in the flat buffers
  std::size_t count;   // elements
  std::size_t state;   // first element in this rank's state arrays
  bool sharded;        // a shard of a bucket (false: the replicated remainder)
};

}  // namespace detail

template <class G, class Comm = comm::Nccl>
class DistributedOptimizer final : public detail::BucketListener<DistributedOptimizer<G, Comm>, ShardedOptimizer> {
  static_assert(std::is_same_v<G, bf16> || std::is_same_v<G, kernels::cuda::f16>,
                "DistributedOptimizer: the working weights and gradients are bf16 or fp16");

 public:
  // `weights` and `grads` (n elements each, the model's flat buffers) must stay valid; `compute`
  // is the stream the model's backward and update run on. Allocates this rank's state (zeroed).
  DistributedOptimizer(Comm comm, G* weights, G* grads, std::size_t n, cudaStream_t compute,
                       GradientSyncOptions opt = {})
      : comm_(std::move(comm)), weights_(weights), grads_(grads), n_(n), compute_(compute),
        remainder_(n % shard_align()), queue_(cut(n, opt.bucket_bytes), n, compute, comm_.stream()) {
    DPML_REQUIRE(n > 0 && weights && grads, who() << ": empty weight or gradient buffer");
    const auto K = static_cast<std::size_t>(comm_.size()), r = static_cast<std::size_t>(comm_.rank());
    std::size_t state = 0;
    for (const detail::Bucket& b : queue_.buckets()) {
      const bool sharded = b.begin >= remainder_;
      const std::size_t count = sharded ? (b.end - b.begin) / K : b.end - b.begin;
      owned_.push_back({sharded ? b.begin + r * count : b.begin, count, state, sharded});
      state += count;
    }
    state_n_ = state;
    kernels::cuda::NormRanges counted;
    for (const detail::OwnedRange& o : owned_)
      if (o.sharded || r == 0)  // the remainder's norm: rank 0's alone
        counted.add(static_cast<std::int64_t>(o.flat), static_cast<std::int64_t>(o.count));

    DPML_CHECK_CUDA(cudaMalloc(&state_memory_, 3 * state_n_ * sizeof(float)));
    DPML_CHECK_CUDA(cudaMemsetAsync(state_memory_, 0, 3 * state_n_ * sizeof(float), compute_));
    master_ = state_memory_;
    m_ = master_ + state_n_;
    v_ = m_ + state_n_;
    count_in_norm(std::move(counted));
    DPML_CHECK_CUDA(cudaEventCreateWithFlags(&handoff_, cudaEventDisableTiming));
    for (cudaEvent_t* e : {&norm_sent_, &norm_reduced_, &updated_, &gathered_}) DPML_CHECK_CUDA(cudaEventCreate(e));
    DPML_CHECK_CUDA(cudaStreamSynchronize(compute_));
  }
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;
  ~DistributedOptimizer() {
    for (cudaEvent_t e : {handoff_, norm_sent_, norm_reduced_, updated_, gathered_})
      if (e) cudaEventDestroy(e);
    cudaFree(ws_);
    cudaFree(counted_table_);
    cudaFree(state_memory_);
  }

  std::size_t remainder() const noexcept { return remainder_; }  // leading elements not sharded
  std::size_t size() const override { return n_; }
  std::size_t state_bytes() const override { return 3 * state_n_ * sizeof(float); }

  void restrict_norm(const kernels::cuda::NormRanges& model_counted, std::function<void(double*)> across_model) override {
    count_in_norm(kernels::cuda::intersect(counted_, model_counted));
    across_model_ = std::move(across_model);
  }

  void update(double lr, std::int64_t step, const optim::AdamWOptions& opt, double max_norm, double inv_scale,
              double* norm_sq, float* clip_coef) override {
    namespace kc = kernels::cuda;
    // Global norm: this rank's counted ranges in one reduction, then the sum over the data axis.
    if (counted_.count() > 0)
      kc::grad_norm_squared_ranges(grads_, counted_table_, counted_table_ + counted_.count(), counted_.count(),
                                   counted_.total(), norm_sq, ws_, ws_bytes_, compute_);
    else
      DPML_CHECK_CUDA(cudaMemsetAsync(norm_sq, 0, sizeof(double), compute_));
    DPML_CHECK_CUDA(cudaEventRecord(norm_sent_, compute_));
    DPML_CHECK_CUDA(cudaStreamWaitEvent(comm_.stream(), norm_sent_, 0));
    comm_.allreduce(norm_sq, 1, comm::ReduceOp::sum);
    DPML_CHECK_CUDA(cudaEventRecord(norm_reduced_, comm_.stream()));
    DPML_CHECK_CUDA(cudaStreamWaitEvent(compute_, norm_reduced_, 0));
    if (across_model_) across_model_(norm_sq);
    kc::clip_coefficient(norm_sq, clip_coef, max_norm, compute_, inv_scale);
    // AdamW per owned range; each updated shard's bucket all-gathered while the next one updates.
    const auto r = static_cast<std::size_t>(comm_.rank());
    for (const detail::OwnedRange& o : owned_) {
      kc::adamw_update(master_ + o.state, weights_ + o.flat, grads_ + o.flat, m_ + o.state, v_ + o.state,
                       static_cast<std::int64_t>(o.count), opt, lr, step, clip_coef, compute_);
      if (!o.sharded) continue;
      DPML_CHECK_CUDA(cudaEventRecord(handoff_, compute_));
      DPML_CHECK_CUDA(cudaStreamWaitEvent(comm_.stream(), handoff_, 0));
      comm_.allgather(weights_ + o.flat, weights_ + (o.flat - r * o.count), o.count);
    }
    DPML_CHECK_CUDA(cudaEventRecord(updated_, compute_));
    DPML_CHECK_CUDA(cudaEventRecord(gathered_, comm_.stream()));
    DPML_CHECK_CUDA(cudaStreamWaitEvent(compute_, gathered_, 0));
  }

  void read(OptimizerState which, std::size_t offset, std::span<float> dst) override {
    check_range("read", offset, dst.size());
    if (dst.empty()) return;
    constexpr std::size_t kChunk = std::size_t{1} << 22;  // fp32 elements of staging (16 MiB) per all-reduce
    float* staging = nullptr;
    DPML_CHECK_CUDA(cudaMalloc(&staging, std::min(dst.size(), kChunk) * sizeof(float)));
    const cudaStream_t s = comm_.stream();
    DPML_CHECK_CUDA(cudaEventRecord(handoff_, compute_));  // the state as the last update left it
    DPML_CHECK_CUDA(cudaStreamWaitEvent(s, handoff_, 0));
    const bool first = comm_.rank() == 0;
    for (std::size_t lo = offset; lo < offset + dst.size(); lo += kChunk) {
      const std::size_t hi = std::min(offset + dst.size(), lo + kChunk);
      DPML_CHECK_CUDA(cudaMemsetAsync(staging, 0, (hi - lo) * sizeof(float), s));
      for_each_owned(lo, hi, [&](const detail::OwnedRange& o, std::size_t a, std::size_t b) {
        if (o.sharded || first)
          DPML_CHECK_CUDA(cudaMemcpyAsync(staging + (a - lo), state(which) + o.state + (a - o.flat), (b - a) * sizeof(float),
                                          cudaMemcpyDeviceToDevice, s));
      });
      comm_.allreduce(staging, hi - lo, comm::ReduceOp::sum);
      DPML_CHECK_CUDA(cudaMemcpyAsync(dst.data() + (lo - offset), staging, (hi - lo) * sizeof(float),
                                      cudaMemcpyDeviceToHost, s));
      DPML_CHECK_CUDA(cudaStreamSynchronize(s));
    }
    DPML_CHECK_CUDA(cudaFree(staging));
  }

  void write(OptimizerState which, std::size_t offset, std::span<const float> src) override {
    check_range("write", offset, src.size());
    DPML_CHECK_CUDA(cudaStreamSynchronize(compute_));
    for_each_owned(offset, offset + src.size(), [&](const detail::OwnedRange& o, std::size_t a, std::size_t b) {
      DPML_CHECK_CUDA(cudaMemcpyAsync(state(which) + o.state + (a - o.flat), src.data() + (a - offset),
                                      (b - a) * sizeof(float), cudaMemcpyHostToDevice, compute_));
    });
    DPML_CHECK_CUDA(cudaStreamSynchronize(compute_));  // the host values may go now
  }

  void reset(std::span<const float> master) override {
    DPML_REQUIRE(master.size() == n_, who() << ": reset with " << master.size() << " master weights, the buffers hold " << n_);
    write(OptimizerState::master, 0, master);
    DPML_CHECK_CUDA(cudaMemsetAsync(m_, 0, 2 * state_n_ * sizeof(float), compute_));  // m_ and v_ are adjacent
    DPML_CHECK_CUDA(cudaStreamSynchronize(compute_));
  }

  // Milliseconds the last step's compute stream waited for the collectives (synchronises).
  double exposed_ms() const {
    return queue_.exposed_ms() + detail::waited_ms(norm_sent_, norm_reduced_) + detail::waited_ms(updated_, gathered_);
  }

 private:
  friend class detail::BucketListener<DistributedOptimizer, ShardedOptimizer>;
  static constexpr std::size_t kAlign = 64;  // elements: every shard's alignment

  std::size_t shard_align() const { return kAlign * static_cast<std::size_t>(comm_.size()); }
  // The ranges this rank adds to the norm, and their table on the device (begin, then before) and
  // CUB workspace, replacing any earlier ones.
  void count_in_norm(kernels::cuda::NormRanges counted) {
    DPML_CHECK_CUDA(cudaStreamSynchronize(compute_));  // no update in flight reads the old table
    counted_ = std::move(counted);
    std::vector<std::int64_t> table(counted_.begin);
    table.insert(table.end(), counted_.before.begin(), counted_.before.end());
    DPML_CHECK_CUDA(cudaFree(std::exchange(counted_table_, nullptr)));
    DPML_CHECK_CUDA(cudaFree(std::exchange(ws_, nullptr)));
    DPML_CHECK_CUDA(cudaMalloc(&counted_table_, table.size() * sizeof(std::int64_t)));
    DPML_CHECK_CUDA(cudaMemcpyAsync(counted_table_, table.data(), table.size() * sizeof(std::int64_t),
                                    cudaMemcpyHostToDevice, compute_));
    ws_bytes_ = kernels::cuda::grad_norm_ranges_workspace<G>(std::max<std::int64_t>(1, counted_.total()));
    DPML_CHECK_CUDA(cudaMalloc(&ws_, ws_bytes_));
    DPML_CHECK_CUDA(cudaStreamSynchronize(compute_));  // the host table goes out of scope
  }
  // The buckets, production order: [remainder, n) cut on multiples of 64·K, then the remainder.
  std::vector<detail::Bucket> cut(std::size_t n, std::size_t bucket_bytes) const {
    auto buckets = detail::cut_buckets(n, remainder_, detail::bucket_elements<G>(bucket_bytes, shard_align()), shard_align());
    if (remainder_ > 0) buckets.push_back({0, remainder_});
    return buckets;
  }
  void reduce(const detail::Bucket& b) {
    const std::size_t count = b.end - b.begin;
    if (b.begin < remainder_) {  // the remainder: replicated
      comm_.allreduce(grads_ + b.begin, count, comm::ReduceOp::avg);
      return;
    }
    const std::size_t shard = count / static_cast<std::size_t>(comm_.size());
    comm_.reduce_scatter(grads_ + b.begin, grads_ + b.begin + static_cast<std::size_t>(comm_.rank()) * shard, shard,
                         comm::ReduceOp::avg);
  }
  // f(range, a, b) for each owned range meeting [lo, hi), [a, b) the flat elements in common.
  template <class F>
  void for_each_owned(std::size_t lo, std::size_t hi, F&& f) const {
    for (const detail::OwnedRange& o : owned_) {
      const std::size_t a = std::max(lo, o.flat), b = std::min(hi, o.flat + o.count);
      if (a < b) f(o, a, b);
    }
  }
  float* state(OptimizerState which) const {
    return which == OptimizerState::master ? master_ : which == OptimizerState::exp_avg ? m_ : v_;
  }
  void check_range(const char* what, std::size_t offset, std::size_t count) const {
    DPML_REQUIRE(offset + count <= n_, who() << ": " << what << " of elements [" << offset << ", " << offset + count
                                             << ") beyond the buffers' " << n_);
  }
  std::string who() const {
    return "DistributedOptimizer (data rank " + std::to_string(comm_.rank()) + " of " + std::to_string(comm_.size()) + ")";
  }

  Comm comm_;
  G* weights_;  // (n) the model's 16-bit working weights
  G* grads_;    // (n) the model's gradients
  std::size_t n_;
  cudaStream_t compute_;
  std::size_t remainder_;                   // [0, remainder_) replicated, not sharded
  detail::BucketQueue queue_;
  std::vector<detail::OwnedRange> owned_;   // per bucket, production order: this rank's shard or the remainder
  kernels::cuda::NormRanges counted_;      // the ranges this rank adds to the norm
  std::int64_t* counted_table_ = nullptr;   // counted_ on the device: begin, then before
  std::size_t state_n_ = 0;                 // elements of each state array
  float* state_memory_ = nullptr;           // (3, state_n_): master, m, v
  float *master_ = nullptr, *m_ = nullptr, *v_ = nullptr;  // (state_n_) each
  void* ws_ = nullptr;                      // CUB workspace of the counted ranges' reduction
  std::function<void(double*)> across_model_;  // tp > 1 or stages: the norm's sum over the model's ranks
  std::size_t ws_bytes_ = 0;
  cudaEvent_t handoff_ = nullptr;           // compute → communication ordering, reused
  cudaEvent_t norm_sent_ = nullptr, norm_reduced_ = nullptr, updated_ = nullptr, gathered_ = nullptr;
};

}  // namespace dpml::parallel::cuda
