#pragma once
// CommLink<Comm, CudaSpace> for a communicator with a stream (comm::Nccl, comm::Staged,
// comm::CopyEngine): collectives enqueued on the communicator's stream, ordered against the
// compute stream by events only (parallel/comm_link.hpp says why). CUDA translation units only.
//
//   compute ──record(ready)──┐                         ┌──wait(done)── compute continues
//                            ▼                         │
//   comm stream         wait(ready) → collective → … → record(done)   (join)
//
// One `ready` event serves every collective: a stream waits on the record made just before its
// wait is enqueued, so re-recording it later changes nothing already enqueued. comm::Staged
// synchronises its stream inside each call, so over it the host waits there (the price of
// staging through host memory), not elsewhere.

#include "dpml/comm/communicator.hpp"
#include "dpml/core/cuda_space.hpp"
#include "dpml/core/cuda_stream.hpp"
#include "dpml/kernels/cuda/device.hpp"
#include "dpml/parallel/comm_link.hpp"

#include <cuda_runtime.h>

#include <cstddef>

namespace dpml::parallel {

template <StreamCommunicator Comm>
class CommLink<Comm, CudaSpace> {
 public:
  // Nothing to wait for on the host: the stream order carries completion.
  struct Pending {
    bool test() const noexcept { return true; }
    void wait() const noexcept {}
  };

  CommLink(kernels::Device<CudaSpace>& dev, const Comm& comm) : comm_(&comm), compute_(dev.stream()) {}

  const Comm& comm() const noexcept { return *comm_; }
  template <class T>
  Pending allreduce(T* data, std::size_t n) {
    after_compute();
    comm_->allreduce(data, n, comm::ReduceOp::sum);
    return {};
  }
  template <class T>
  Pending reduce_scatter(T* send, T* recv, std::size_t n) {
    after_compute();
    comm_->reduce_scatter(send, recv, n, comm::ReduceOp::sum);
    return {};
  }
  template <class T>
  Pending allgather(const T* send, T* recv, std::size_t n) {
    after_compute();
    comm_->allgather(send, recv, n);
    return {};
  }
  // The compute stream's later work waits for everything enqueued on the communicator's stream.
  void join() {
    done_.record(comm_->stream());
    Stream::borrow(compute_).wait(done_);
  }
  // The compute stream's later work waits for what was enqueued on the communicator's stream up
  // to mark(f), and not for what came after it.
  struct Fence {
    Event done;
  };
  void mark(Fence& f) { f.done.record(comm_->stream()); }
  void join(const Fence& f) { Stream::borrow(compute_).wait(f.done); }

 private:
  void after_compute() {
    ready_.record(compute_);
    Stream::borrow(comm_->stream()).wait(ready_);
  }

  const Comm* comm_;
  cudaStream_t compute_;
  Event ready_, done_;
};

}  // namespace dpml::parallel
