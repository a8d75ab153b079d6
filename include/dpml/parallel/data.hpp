#pragma once
// Data parallelism: gradient buckets reduced across the data axis while backward still runs.
//
// The flat gradient buffer (FlatParameters) is cut into buckets of whole parameters, taken in
// reverse registration order (the order in which backward finishes them), each at least
// `bucket_bytes` (PyTorch DDP's default is 25 MB) unless parameters run out. Containers report
// each child's parameters after its backward_weight (Context::grad_ready); when every parameter
// of a bucket has been reported for every micro-batch of the step, the bucket's reduction starts
// at once with non-blocking MPI, overlapping the rest of backward. finish() starts whatever was
// not reported (so nothing can hang) and waits.
//
// Two reductions (GradReduction):
//   all_reduce      every data rank ends with the summed gradient (plain DDP)
//   reduce_scatter  ZeRO-1: each data rank ends with the summed gradient of its own part of
//                   every bucket (its shard); after the optimizer updated the shard's values,
//                   all_gather_values() gives every rank the full updated values.
// Gradients are *summed*: losses already divide by the global batch (Context::global_batch), so
// the sum is the gradient of the global mean, equal to the sequential run's.

#include "dpml/comm/communicator.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/flat_parameters.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace dpml::parallel {

enum class GradReduction { all_reduce, reduce_scatter };

template <class T>
class GradientBuckets {
 public:
  // A contiguous range of the flat buffer owned by this rank under ZeRO (all of it otherwise).
  struct Segment {
    std::int64_t flat_offset = 0;   // into FlatParameters::values()/grads()
    std::int64_t count = 0;
    std::int64_t shard_offset = 0;  // into shard_grads()
  };

  GradientBuckets(FlatParameters<T>& flat, const comm::Mpi* data_comm, std::size_t bucket_bytes,
                  GradReduction mode = GradReduction::all_reduce)
      : flat_(flat), comm_(data_comm && data_comm->size() > 1 ? data_comm : nullptr), mode_(mode) {
    build_buckets(std::max<std::size_t>(bucket_bytes, sizeof(T)) / sizeof(T));
    build_segments();
  }

  std::size_t bucket_count() const noexcept { return buckets_.size(); }
  // Buckets whose reduction has started this step (before finish(): the overlapped ones).
  std::size_t buckets_started() const noexcept {
    return static_cast<std::size_t>(std::count_if(buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.started; }));
  }
  GradReduction mode() const noexcept { return mode_; }
  int data_size() const noexcept { return comm_ ? comm_->size() : 1; }

  // Keep the bucket holding `p` from starting before finish(), e.g. a tied weight whose gradient
  // another pipeline stage adds to after backward (the caller sums it in between).
  void hold(const ParamBase* p) { buckets_[bucket_of_param_[flat_.index_of(p)]].held = true; }

  // Each parameter will be reported `reports_per_param` times this step (its micro-batch count).
  void begin_step(int reports_per_param) {
    reports_per_param_ = reports_per_param;
    std::fill(reports_.begin(), reports_.end(), 0);
    for (auto& b : buckets_) {
      b.missing = b.last_param - b.first_param;
      b.started = false;
    }
    exposed_seconds_ = 0;
  }

  // The Context::grad_ready hook: these parameters have one more micro-batch of gradient.
  void on_grad_ready(std::span<ParamBase* const> params) {
    for (auto* p : params) {
      const std::size_t i = flat_.index_of(p);
      if (++reports_[i] == reports_per_param_) {
        Bucket& b = buckets_[bucket_of_param_[i]];
        if (--b.missing == 0 && !b.held) start(b);
      }
    }
    progress();
  }

  // Let MPI advance in-flight reductions (MPICH progresses only inside MPI calls).
  void progress() {
    for (auto& b : buckets_)
      if (b.request) (void)b.request->test();
  }

  // Start what was not reported, wait for every bucket. The time spent here is the exposed
  // (non-overlapped) communication of the step.
  void finish() {
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& b : buckets_)
      if (!b.started) start(b);
    for (auto& b : buckets_)
      if (b.request) {
        b.request->wait();
        b.request.reset();
      }
    exposed_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // ZeRO-1: this rank's segments and their summed gradients (valid after finish()).
  const std::vector<Segment>& own_segments() const noexcept { return segments_; }
  TensorView<T> shard_grads() const noexcept {
    return mode_ == GradReduction::reduce_scatter ? shard_grads_.view() : flat_.grads();
  }
  std::int64_t shard_numel() const noexcept { return shard_numel_; }

  // ZeRO-1, after the optimizer updated this rank's segments of the values: every rank gets all.
  void all_gather_values() {
    if (mode_ != GradReduction::reduce_scatter || !comm_) return;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<comm::Request> reqs;
    for (const auto& b : buckets_) {
      T* base = flat_.values().data() + b.flat_offset;
      reqs.push_back(comm_->iallgatherv(base + b.displs[static_cast<std::size_t>(comm_->rank())], base, b.counts));
    }
    for (auto& r : reqs) r.wait();
    exposed_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  double exposed_seconds() const noexcept { return exposed_seconds_; }

 private:
  struct Bucket {
    std::size_t first_param = 0, last_param = 0;  // [first, last) in registration order
    std::int64_t flat_offset = 0, count = 0;
    std::vector<int> counts, displs;             // per data rank (ZeRO)
    std::int64_t shard_offset = 0;
    std::size_t missing = 0;
    bool started = false;
    bool held = false;
    std::optional<comm::Request> request;
  };

  void build_buckets(std::size_t elements_per_bucket) {
    const auto& params = flat_.params();
    const auto& offs = flat_.offsets();
    bucket_of_param_.assign(params.size(), 0);
    reports_.assign(params.size(), 0);
    std::size_t end = params.size();
    while (end > 0) {  // from the last parameter backwards
      std::size_t begin = end;
      std::int64_t n = 0;
      while (begin > 0 && static_cast<std::size_t>(n) < elements_per_bucket) n += params[--begin]->numel();
      Bucket b;
      b.first_param = begin;
      b.last_param = end;
      b.flat_offset = offs[begin];
      b.count = n;
      for (std::size_t i = begin; i < end; ++i) bucket_of_param_[i] = buckets_.size();
      buckets_.push_back(std::move(b));
      end = begin;
    }
  }

  void build_segments() {
    const int p = data_size(), r = comm_ ? comm_->rank() : 0;
    std::int64_t shard = 0;
    for (auto& b : buckets_) {
      if (mode_ == GradReduction::reduce_scatter) {
        for (int k = 0; k < p; ++k) {
          b.counts.push_back(static_cast<int>(comm::block_count(static_cast<std::size_t>(b.count), p, k)));
          b.displs.push_back(static_cast<int>(comm::block_offset(static_cast<std::size_t>(b.count), p, k)));
        }
        b.shard_offset = shard;
        segments_.push_back({b.flat_offset + b.displs[static_cast<std::size_t>(r)], b.counts[static_cast<std::size_t>(r)], shard});
        shard += b.counts[static_cast<std::size_t>(r)];
      } else {
        segments_.push_back({b.flat_offset, b.count, b.flat_offset});
      }
    }
    shard_numel_ = mode_ == GradReduction::reduce_scatter ? shard : flat_.numel();
    if (mode_ == GradReduction::reduce_scatter) shard_grads_ = Tensor<T>(Shape{shard});
  }

  void start(Bucket& b) {
    b.started = true;
    T* grads = flat_.grads().data() + b.flat_offset;
    const std::size_t n = static_cast<std::size_t>(b.count);
    if (mode_ == GradReduction::all_reduce) {
      if (comm_) b.request = comm_->iallreduce(grads, n, comm::ReduceOp::sum);
    } else if (comm_) {
      b.request = comm_->ireduce_scatterv(grads, shard_grads_.data() + b.shard_offset, b.counts, comm::ReduceOp::sum);
    } else {
      std::copy_n(grads, n, shard_grads_.data() + b.shard_offset);
    }
  }

  FlatParameters<T>& flat_;
  const comm::Mpi* comm_;
  GradReduction mode_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_param_;
  std::vector<int> reports_;
  int reports_per_param_ = 1;
  std::vector<Segment> segments_;
  std::int64_t shard_numel_ = 0;
  Tensor<T> shard_grads_;
  double exposed_seconds_ = 0;
};

}  // namespace dpml::parallel
