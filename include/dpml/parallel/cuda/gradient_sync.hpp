#pragma once
// parallel::cuda::GradientSync: data parallelism for a GPU model's flat gradient buffer. While
// the backward pass is still running, the gradients it has finished are averaged over the data
// axis by NCCL on a communication stream of their own, bucket by bucket, ordered against the
// compute stream by CUDA events only: nothing in a step waits on the host.
//
// The buffer (n elements of G) is cut into buckets from its end, each about `bucket_bytes` (the
// last one cut, at the buffer's start, may be shorter; cuts on 64-element boundaries). The model's
// backward pass produces gradients from the end of the buffer towards its start (the last layer's
// parameters sit last), and tells the sync how far it got:
//
//   sync.ready(begin);       // [begin, n) is final on the compute stream: every bucket wholly
//                            //   inside is all-reduced now (comm stream waits on a compute event)
//   sync.ready(begin, end);  // the same for [begin, end): a region final before the ones behind it
//   ...
//   sync.finish();           // the buckets not yet launched, then the compute stream waits for
//                            //   the comm stream: what follows (grad norm, optimizer) sees the averages
//
// A gradient that every rank can form from all ranks' inputs cheaper than it can be all-reduced
// (the GPT's tied embedding: a few rows per token) goes through all_gather() instead: the inputs
// are gathered on the communication stream, and each rank adds the whole axis' contribution after
// finish().
//
// After finish() the buffer holds the mean of the ranks' gradients (ncclAvg: each contribution
// is scaled by 1/K inside the reduction), so a model's norm, clipping and update need no change.
// The Wire policy is the type the reduction runs in: G itself (bf16 gradients reduced in bf16:
// the least traffic), or float (each bucket widened into an fp32 staging buffer, reduced, and
// rounded back once: one rounding instead of one per ring step, at twice the traffic).
//
// Comm is the communicator of the data axis (comm::Nccl, or any type with its collectives and
// stream(), e.g. comm::Staged, or comm::CopyEngine: two GPUs of one host reducing on their copy
// engines, which is handed the buffer it reduces through register_buffer); its stream is the
// communication stream. The buckets and their event protocol (detail::BucketQueue) are shared
// with the ZeRO-1 optimizer (distributed_optimizer.hpp), which reduce-scatters the same buckets
// instead.
//
// Exposed communication: exposed_ms() is the time from the compute stream reaching finish() to
// the last bucket's completion (0 when the all-reduces ended first), for the last step; it
// synchronises, so benchmarks read it outside their timed steps.
//
//   GradientSync<bf16> sync(comm::Nccl::from(world), model.gradients(), model.flat_size(), model.stream());
//   model.set_gradient_sync(&sync);

#include "dpml/comm/nccl.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/common.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpml::parallel::cuda {

namespace detail {
namespace kc = dpml::kernels::cuda;

// dst[i] = To(src[i]) · scale, a grid-stride loop (the fp32 wire's widening and rounding back).
template <class From, class To>
__global__ void convert_kernel(const From* src, To* dst, std::size_t n, float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = kc::detail::from_f<To>(kc::detail::load_f(src[i]) * scale);
}
template <class From, class To>
void convert(const From* src, To* dst, std::size_t n, float scale, cudaStream_t stream) {
  constexpr int kThreads = 256;
  convert_kernel<<<kc::grid_for(static_cast<std::int64_t>(n), kThreads, 4096), kThreads, 0, stream>>>(src, dst, n, scale);
  DPML_CHECK_CUDA(cudaGetLastError());
}
}  // namespace detail

// What a model calls while its backward pass runs (the model knows no more of the data axis).
class GradientListener {
 public:
  // Gradients [begin, end) are final on the compute stream; ready(begin): [begin, n).
  virtual void ready(std::size_t begin, std::size_t end) = 0;
  void ready(std::size_t begin) { ready(begin, std::numeric_limits<std::size_t>::max()); }
  virtual void finish() = 0;  // all are; the compute stream must see the result
  // The data axis' size, and an all-gather on the communication stream ordered after the compute
  // stream's work so far: recv (ranks() blocks of `bytes`, rank order) is seen by the compute
  // stream after finish().
  virtual int ranks() const = 0;
  virtual void all_gather(const void* send, void* recv, std::size_t bytes) = 0;
  virtual ~GradientListener() = default;
};

struct GradientSyncOptions {
  std::size_t bucket_bytes = std::size_t{25} << 20;  // per bucket, in the gradients' type (PyTorch DDP: 25 MB)
};

namespace detail {

struct Bucket {
  std::size_t begin, end;  // elements [begin, end) of the buffer
};

// [floor, n) cut into buckets of about `per` elements (a multiple of `align`) from its end, on
// boundaries floor + k·align; the last bucket cut, at floor, may be shorter. Production order:
// the bucket at the buffer's end first.
inline std::vector<Bucket> cut_buckets(std::size_t n, std::size_t floor, std::size_t per, std::size_t align) {
  std::vector<Bucket> buckets;
  for (std::size_t end = n; end > floor;) {
    const std::size_t begin = end - floor > per ? floor + (end - per - floor) / align * align : floor;
    buckets.push_back({begin, end});
    end = begin;
  }
  return buckets;
}

// Milliseconds from `from` to `to` (0 when `to` came first); synchronises on `to`.
inline double waited_ms(cudaEvent_t from, cudaEvent_t to) {
  DPML_CHECK_CUDA(cudaEventSynchronize(to));
  float ms = 0;
  DPML_CHECK_CUDA(cudaEventElapsedTime(&ms, from, to));
  return std::max(0.f, ms);
}

// Elements of G per bucket of about `bytes`: a multiple of `align`, at least one `align`.
template <class G>
std::size_t bucket_elements(std::size_t bytes, std::size_t align) {
  return std::max(align, bytes / sizeof(G) / align * align);
}

// The ready()/finish() protocol over buckets in production order: each bucket is handed to
// `launch` (which enqueues its collective on the communication stream) once the compute stream
// has produced it, the communication stream waiting on an event of the compute one; finish()
// launches the rest and makes the compute stream wait for the communication stream.
class BucketQueue {
 public:
  BucketQueue(std::vector<Bucket> buckets, std::size_t n, cudaStream_t compute, cudaStream_t comm)
      : buckets_(std::move(buckets)), n_(n), compute_(compute), comm_(comm) {
    DPML_CHECK_CUDA(cudaEventCreateWithFlags(&produced_, cudaEventDisableTiming));
    DPML_CHECK_CUDA(cudaEventCreate(&compute_done_));
    DPML_CHECK_CUDA(cudaEventCreate(&reduced_));
  }
  BucketQueue(const BucketQueue&) = delete;
  BucketQueue& operator=(const BucketQueue&) = delete;
  ~BucketQueue() {
    cudaEventDestroy(produced_);
    cudaEventDestroy(compute_done_);
    cudaEventDestroy(reduced_);
  }

  const std::vector<Bucket>& buckets() const noexcept { return buckets_; }

  // [begin, end) is final on the compute stream: launch every bucket wholly inside it not yet
  // launched this step, in production order.
  template <class Launch>
  void ready(std::size_t begin, std::size_t end, Launch&& launch) {
    DPML_REQUIRE(begin <= n_, "gradient buckets: ready(" << begin << ") beyond the buffer's " << n_ << " elements");
    bool ordered = false;
    for (std::size_t i = 0; i < buckets_.size(); ++i) {
      if (launched_[i] || buckets_[i].begin < begin || buckets_[i].end > end) continue;
      if (!std::exchange(ordered, true)) order_after_compute();
      launched_[i] = true;
      launch(buckets_[i]);
    }
  }
  // The remaining buckets; then the compute stream waits for all of them.
  template <class Launch>
  void finish(Launch&& launch) {
    DPML_CHECK_CUDA(cudaEventRecord(compute_done_, compute_));
    ready(0, n_, launch);
    DPML_CHECK_CUDA(cudaEventRecord(reduced_, comm_));
    DPML_CHECK_CUDA(cudaStreamWaitEvent(compute_, reduced_, 0));
    std::fill(launched_.begin(), launched_.end(), false);
  }
  // What the communication stream runs next waits for the compute stream's work so far.
  void order_after_compute() {
    DPML_CHECK_CUDA(cudaEventRecord(produced_, compute_));
    DPML_CHECK_CUDA(cudaStreamWaitEvent(comm_, produced_, 0));
  }
  // Milliseconds the last step's compute stream waited at finish() (synchronises).
  double exposed_ms() const { return waited_ms(compute_done_, reduced_); }

 private:
  std::vector<Bucket> buckets_;  // from the buffer's end to its start: the order of production
  std::size_t n_;
  cudaStream_t compute_, comm_;
  std::vector<bool> launched_ = std::vector<bool>(buckets_.size(), false);  // this step
  cudaEvent_t produced_ = nullptr, compute_done_ = nullptr, reduced_ = nullptr;
};

// The GradientListener calls over a BucketQueue, shared by GradientSync and the ZeRO-1 optimizer
// (Interface: GradientListener or an interface built on it). Derived holds `comm_` (the data
// axis) and `queue_`, and enqueues one bucket's collective in reduce(bucket).
template <class Derived, class Interface>
class BucketListener : public Interface {
 public:
  int ranks() const noexcept override { return self().comm_.size(); }
  int rank() const noexcept { return self().comm_.rank(); }
  std::size_t bucket_count() const noexcept { return self().queue_.buckets().size(); }
  const auto& communicator() const noexcept { return self().comm_; }

  // [begin, end) of the gradients is final on the compute stream: reduce every bucket inside it.
  using Interface::ready;
  void ready(std::size_t begin, std::size_t end) override { self().queue_.ready(begin, end, reducer()); }
  // The remaining buckets; then the compute stream waits for all of them.
  void finish() override { self().queue_.finish(reducer()); }
  void all_gather(const void* send, void* recv, std::size_t bytes) override {
    self().queue_.order_after_compute();
    self().comm_.allgather(static_cast<const std::uint8_t*>(send), static_cast<std::uint8_t*>(recv), bytes);
  }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
  auto reducer() {
    return [this](const Bucket& b) { self().reduce(b); };
  }
};

}  // namespace detail

template <class G, class Wire = G, class Comm = comm::Nccl>
class GradientSync final : public detail::BucketListener<GradientSync<G, Wire, Comm>, GradientListener> {
  static_assert(std::is_same_v<Wire, G> || std::is_same_v<Wire, float>,
                "GradientSync: the wire type is the gradients' own type or float");

 public:
  // `grads` (n elements) must stay valid; `compute` is the stream the model's backward runs on.
  GradientSync(Comm comm, G* grads, std::size_t n, cudaStream_t compute, GradientSyncOptions opt = {})
      : comm_(std::move(comm)), grads_(grads),
        queue_(detail::cut_buckets(n, 0, detail::bucket_elements<G>(opt.bucket_bytes, kAlign), kAlign), n, compute,
               comm_.stream()) {
    DPML_REQUIRE(n > 0 && grads, "GradientSync: empty gradient buffer");
    if constexpr (!std::is_same_v<Wire, G>) DPML_CHECK_CUDA(cudaMalloc(&staging_, largest_bucket() * sizeof(Wire)));
    // A communicator that moves registered buffers itself (comm::CopyEngine) gets the one reduced.
    if constexpr (requires { comm_.register_buffer(grads_, n); }) {
      if constexpr (std::is_same_v<Wire, G>) comm_.register_buffer(grads_, n * sizeof(G));
      else comm_.register_buffer(staging_, largest_bucket() * sizeof(Wire));
    }
  }
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;
  ~GradientSync() {
    if (staging_) cudaFree(staging_);
  }

  // Milliseconds the last step's compute stream waited for the all-reduces (synchronises).
  double exposed_ms() const { return queue_.exposed_ms(); }

 private:
  friend class detail::BucketListener<GradientSync, GradientListener>;
  static constexpr std::size_t kAlign = 64;  // elements: bucket boundaries (128 bytes of bf16)

  std::size_t largest_bucket() const {
    std::size_t largest = 0;
    for (const detail::Bucket& b : queue_.buckets()) largest = std::max(largest, b.end - b.begin);
    return largest;
  }

  void reduce(const detail::Bucket& b) {
    const std::size_t count = b.end - b.begin;
    if constexpr (std::is_same_v<Wire, G>) {
      comm_.allreduce(grads_ + b.begin, count, comm::ReduceOp::avg);
    } else {
      detail::convert(grads_ + b.begin, staging_, count, 1.f, comm_.stream());
      comm_.allreduce(staging_, count, comm::ReduceOp::sum);
      detail::convert(staging_, grads_ + b.begin, count, 1.f / static_cast<float>(comm_.size()), comm_.stream());
    }
  }

  Comm comm_;
  G* grads_;
  detail::BucketQueue queue_;
  Wire* staging_ = nullptr;  // (largest bucket) fp32 wire only
};

}  // namespace dpml::parallel::cuda
