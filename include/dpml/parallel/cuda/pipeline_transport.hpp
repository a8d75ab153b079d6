#pragma once
// parallel::cuda::StreamTransport: the pipeline executor's transport (pipeline/transport.hpp) for
// device buffers, stream-ordered. Sends and receives run on the communicator's own stream (the
// communication stream), ordered against the stage's compute stream by CUDA events only — the
// host never waits inside a step, so the transfers overlap the compute the streams allow:
//
//   post (Send/Recv action)   an event on the compute stream: the data is written / the buffer is
//                             free once the compute enqueued so far has run
//   launch (a batch)          the communication stream waits for the batch's latest post event,
//                             then runs the batch's sends and receives in one comm.group()
//                             (ncclGroupStart/End), then records a "done" event
//   wait (before F/B)         the compute stream waits for the done event of the batch that
//                             carried the message
//   wait_all (step's end)     the compute stream waits for the communication stream
//
// Which messages share a batch, and why that cannot deadlock, is BatchedTransport's (transport.hpp):
// a batch is launched where the executor first needs one of its messages, in rounds that group
// the messages of each pair of stages alike on both sides.
//
// Comm: comm::Nccl (one GPU per rank) or comm::Staged (host staging over MPI, GPUs shared) — any
// type with rank(), size(), stream(), group(), send() and recv() on device pointers, with NCCL's
// matching rule (messages between two ranks match in posting order). Its stream is the
// communication stream and must not be the compute stream.
//
//   auto pipe = comm::Nccl::from(grid.comm(Axis::pipeline));     // a stream of its own
//   StreamTransport<bf16> transport(StreamLauncher<bf16>(pipe, model.stream()),
//                                   pipeline::peer_batches(schedule, pipe.rank()));   // groups alike
//   pipeline::run_stage(actions, stage, transport);

#include "dpml/comm/nccl.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/parallel/pipeline/transport.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace dpml::parallel::cuda {

namespace detail {
// Events recorded again every step: index i is the i-th taken since the last reset().
class EventPool {
 public:
  EventPool() = default;
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  // A fresh index, its event recorded on `stream`.
  int record(cudaStream_t stream) {
    if (next_ == events_.size()) {
      cudaEvent_t e = nullptr;
      DPML_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events_.push_back(e);
    }
    DPML_CHECK_CUDA(cudaEventRecord(events_[next_], stream));
    return static_cast<int>(next_++);
  }
  cudaEvent_t operator[](int i) const { return events_[static_cast<std::size_t>(i)]; }
  // Indices start over; re-recording an event a stream was told to wait for does not change that wait.
  void reset() noexcept { next_ = 0; }

 private:
  std::vector<cudaEvent_t> events_;
  std::size_t next_ = 0;
};
}  // namespace detail

template <class T, class Comm = comm::Nccl>
class StreamLauncher {
 public:
  using Mark = int;  // an event of the pool, recorded on the compute stream

  // `comm` (the pipeline axis, rank = stage) must outlive the launcher; `compute` is the stage's stream.
  StreamLauncher(const Comm& comm, cudaStream_t compute)
      : comm_(&comm), compute_(compute), events_(std::make_unique<detail::EventPool>()) {
    DPML_REQUIRE(comm.stream() != compute, "StreamLauncher: the communicator's stream is the compute stream; give it one of its own");
  }

  int rank() const noexcept { return comm_->rank(); }
  int size() const noexcept { return comm_->size(); }

  Mark mark() { return events_->record(compute_); }

  template <class Batch>
  void launch(const Batch& batch) {
    Mark latest = batch.front().payload.mark;
    for (const auto& e : batch) latest = std::max(latest, e.payload.mark);  // one stream: the latest covers the rest
    DPML_CHECK_CUDA(cudaStreamWaitEvent(comm_->stream(), (*events_)[latest], 0));
    {
      const auto group = comm_->group();
      for (const auto& e : batch) {
        const pipeline::Message& m = e.message;
        const int peer = pipeline::peer_of(m.flow, m.send, rank()), tag = pipeline::tag_of(m.flow, m.micro_batch);
        if (m.send) comm_->send(e.payload.send, e.payload.n, peer, tag);
        else comm_->recv(e.payload.recv, e.payload.n, peer, tag);
      }
    }
    const int done = events_->record(comm_->stream());
    for (const auto& e : batch) done_[pipeline::key_of(e.message)] = done;
  }
  bool launched(pipeline::Message m) const { return done_.contains(pipeline::key_of(m)); }
  void wait(pipeline::Message m) { DPML_CHECK_CUDA(cudaStreamWaitEvent(compute_, (*events_)[done_.at(pipeline::key_of(m))], 0)); }
  void wait_all() {
    DPML_CHECK_CUDA(cudaStreamWaitEvent(compute_, (*events_)[events_->record(comm_->stream())], 0));
    done_.clear();
    events_->reset();
  }

 private:
  const Comm* comm_;
  cudaStream_t compute_;
  std::unique_ptr<detail::EventPool> events_;  // movable launcher
  std::map<pipeline::MessageKey, int> done_;  // message → the done event of the group that carried it
};

template <class T, class Comm = comm::Nccl>
using StreamTransport = pipeline::BatchedTransport<T, StreamLauncher<T, Comm>>;

}  // namespace dpml::parallel::cuda
