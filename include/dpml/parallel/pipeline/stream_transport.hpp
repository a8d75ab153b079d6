#pragma once
// parallel::pipeline::StreamTransport: the pipeline executor's transport (transport.hpp) for
// device buffers, stream-ordered (CUDA translation units only). Sends and receives run on the communicator's own stream (the
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
//   StreamTransport<bf16> transport(StreamLauncher<bf16>(pipe, dev.stream()),
//                                   peer_batches(schedule, pipe.rank()),    // groups alike
//                                   chunks_in(schedule));                   // interleaved: v
//   run_stage(actions, stage, transport);   // train::Trainer does this on CudaSpace

#include "dpml/comm/nccl.hpp"
#include "dpml/core/cuda_stream.hpp"
#include "dpml/core/error.hpp"
#include "dpml/parallel/pipeline/transport.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace dpml::parallel::pipeline {

namespace detail {
// Events recorded again every step (core/cuda_stream.hpp's): index i is the i-th taken since the
// last reset().
class EventPool {
 public:
  // A fresh index, its event recorded on `stream`.
  int record(cudaStream_t stream) {
    if (next_ == events_.size()) events_.emplace_back();
    events_[next_].record(stream);
    return static_cast<int>(next_++);
  }
  const Event& operator[](int i) const { return events_[static_cast<std::size_t>(i)]; }
  // Indices start over; re-recording an event a stream was told to wait for does not change that wait.
  void reset() noexcept { next_ = 0; }

 private:
  std::vector<Event> events_;  // a vector of movable events: references are taken only between records
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
    Stream::borrow(comm_->stream()).wait((*events_)[latest]);
    {
      const auto group = comm_->group();
      for (const auto& e : batch) {
        const Route& r = e.payload.route;  // BatchedTransport's: the peer rank and the tag
        if (e.message.send) comm_->send(e.payload.send, e.payload.n, r.peer, r.tag);
        else comm_->recv(e.payload.recv, e.payload.n, r.peer, r.tag);
      }
    }
    const int done = events_->record(comm_->stream());
    for (const auto& e : batch) done_[key_of(e.message)] = done;
  }
  bool launched(Message m) const { return done_.contains(key_of(m)); }
  void wait(Message m) { Stream::borrow(compute_).wait((*events_)[done_.at(key_of(m))]); }
  void wait_all() {
    const int done = events_->record(comm_->stream());
    Stream::borrow(compute_).wait((*events_)[done]);
    done_.clear();
    events_->reset();
  }

 private:
  const Comm* comm_;
  cudaStream_t compute_;
  std::unique_ptr<detail::EventPool> events_;  // movable launcher
  std::map<MessageKey, int> done_;  // message → the done event of the group that carried it
};

template <class T, class Comm = comm::Nccl>
using StreamTransport = BatchedTransport<T, StreamLauncher<T, Comm>>;

}  // namespace dpml::parallel::pipeline
