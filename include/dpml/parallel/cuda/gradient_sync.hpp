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
//   sync.ready(begin);   // [begin, n) is final on the compute stream: every bucket wholly inside
//                        //   is all-reduced now (comm stream waits on an event of the compute one)
//   ...
//   sync.finish();       // the buckets not yet launched, then the compute stream waits for the
//                        //   comm stream: what follows (grad norm, optimizer) sees the averages
//
// After finish() the buffer holds the mean of the ranks' gradients (ncclAvg: each contribution
// is scaled by 1/K inside the reduction), so a model's norm, clipping and update need no change.
// The Wire policy is the type the reduction runs in: G itself (bf16 gradients reduced in bf16:
// the least traffic), or float (each bucket widened into an fp32 staging buffer, reduced, and
// rounded back once: one rounding instead of one per ring step, at twice the traffic).
//
// Exposed communication: exposed_ms() is the time from the compute stream reaching finish() to
// the last bucket's completion (0 when the all-reduces ended first), for the last step; it
// synchronises, so benchmarks read it outside their timed steps.
//
//   GradientSync<bf16> sync(comm::Nccl::from(world), model.gradients(), model.flat_size(), model.stream());
//   model.set_gradient_sync(&sync);
//
// Comm is the data axis' communicator type: comm::Nccl, or comm::Staged (comm/staged.hpp) where
// ranks share a GPU; it needs stream(), size(), rank() and allreduce on device pointers.

#include "dpml/comm/nccl.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/common.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
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
  virtual void ready(std::size_t begin) = 0;  // gradients [begin, n) are final on the compute stream
  virtual void finish() = 0;                  // all are; the compute stream must see the result
  virtual ~GradientListener() = default;
};

struct GradientSyncOptions {
  std::size_t bucket_bytes = std::size_t{25} << 20;  // per bucket, in the gradients' type (PyTorch DDP: 25 MB)
};

template <class G, class Wire = G, class Comm = comm::Nccl>
class GradientSync final : public GradientListener {
  static_assert(std::is_same_v<Wire, G> || std::is_same_v<Wire, float>,
                "GradientSync: the wire type is the gradients' own type or float");

 public:
  // `grads` (n elements) must stay valid; `compute` is the stream the model's backward runs on.
  GradientSync(Comm comm, G* grads, std::size_t n, cudaStream_t compute, GradientSyncOptions opt = {})
      : comm_(std::move(comm)), grads_(grads), n_(n), compute_(compute) {
    DPML_REQUIRE(n > 0 && grads, "GradientSync: empty gradient buffer");
    constexpr std::size_t kAlign = 64;
    const std::size_t per = std::max<std::size_t>(kAlign, opt.bucket_bytes / sizeof(G) / kAlign * kAlign);
    for (std::size_t end = n; end > 0;) {
      const std::size_t begin = end > per ? (end - per) / kAlign * kAlign : 0;
      buckets_.push_back({begin, end});
      end = begin;
    }
    if constexpr (!std::is_same_v<Wire, G>) {
      std::size_t largest = 0;
      for (const Bucket& b : buckets_) largest = std::max(largest, b.end - b.begin);
      DPML_CHECK_CUDA(cudaMalloc(&staging_, largest * sizeof(Wire)));
    }
    DPML_CHECK_CUDA(cudaEventCreateWithFlags(&produced_, cudaEventDisableTiming));
    DPML_CHECK_CUDA(cudaEventCreate(&compute_done_));
    DPML_CHECK_CUDA(cudaEventCreate(&reduced_));
  }
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;
  ~GradientSync() {
    cudaEventDestroy(produced_);
    cudaEventDestroy(compute_done_);
    cudaEventDestroy(reduced_);
    if (staging_) cudaFree(staging_);
  }

  int ranks() const noexcept { return comm_.size(); }
  int rank() const noexcept { return comm_.rank(); }
  std::size_t bucket_count() const noexcept { return buckets_.size(); }
  const Comm& communicator() const noexcept { return comm_; }

  // [begin, n) of the gradients is final on the compute stream: launch every bucket inside it.
  void ready(std::size_t begin) override {
    DPML_REQUIRE(begin <= n_, "GradientSync::ready(" << begin << ") beyond the buffer's " << n_ << " elements");
    std::size_t upto = next_;
    while (upto < buckets_.size() && buckets_[upto].begin >= begin) ++upto;
    if (upto == next_) return;
    DPML_CHECK_CUDA(cudaEventRecord(produced_, compute_));
    DPML_CHECK_CUDA(cudaStreamWaitEvent(comm_.stream(), produced_, 0));
    for (; next_ < upto; ++next_) reduce(buckets_[next_]);
  }
  // The remaining buckets; then the compute stream waits for all of them.
  void finish() override {
    DPML_CHECK_CUDA(cudaEventRecord(compute_done_, compute_));
    ready(0);
    DPML_CHECK_CUDA(cudaEventRecord(reduced_, comm_.stream()));
    DPML_CHECK_CUDA(cudaStreamWaitEvent(compute_, reduced_, 0));
    next_ = 0;
  }
  // Milliseconds the last step's compute stream waited for the all-reduces (synchronises).
  double exposed_ms() const {
    DPML_CHECK_CUDA(cudaEventSynchronize(reduced_));
    float ms = 0;
    DPML_CHECK_CUDA(cudaEventElapsedTime(&ms, compute_done_, reduced_));
    return std::max(0.f, ms);
  }

 private:
  struct Bucket {
    std::size_t begin, end;  // elements [begin, end) of the buffer
  };
  void reduce(const Bucket& b) {
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
  std::size_t n_;
  cudaStream_t compute_;
  std::vector<Bucket> buckets_;  // from the buffer's end to its start: the order of production
  std::size_t next_ = 0;         // the first bucket of this step not yet launched
  Wire* staging_ = nullptr;      // (largest bucket) fp32 wire only
  cudaEvent_t produced_ = nullptr, compute_done_ = nullptr, reduced_ = nullptr;
};

}  // namespace dpml::parallel::cuda
