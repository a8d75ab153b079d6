#pragma once
// The pipeline executor: runs one stage's action list (schedule.hpp) for one training step.
//
// The model side is a `Stage` — any type with the members below (train::Trainer's stage over any
// model on either space, the toy stages of the tests and the bubble benchmark).
// The executor owns no tensors and does no arithmetic: it calls the stage's compute members in
// table order and moves the stage's buffers between neighbours through a transport
// (transport.hpp): MpiTransport for host buffers (run_stage(actions, stage, pipe) with the
// pipeline-axis comm::Mpi, ProcessGrid::comm(Axis::pipeline); stage s is rank s there, its
// neighbours ranks s ± 1), StreamTransport (stream_transport.hpp) for device buffers,
// stream-ordered.
//
//   using value_type = float;                          // element type of the messages
//   void forward(int mb);              // F: stage 0 reads mb's data itself; other stages find mb's
//                                      //    input activation in recv_forward_buffer(mb), received.
//                                      //    The last stage also computes mb's loss here.
//   void backward_input(int mb);       // B: the last stage starts from mb's loss; the others find
//                                      //    the gradient of mb's output in recv_backward_buffer(mb).
//                                      //    Computes the gradient of mb's input (not on stage 0).
//   void backward_weight(int mb);      // W: weight gradients += mb's share. May run long after B
//                                      //    (ZB-H1): keep what it needs until then.
//   recv_forward_buffer(mb)            // (mb's input activation)           stages > 0
//   send_forward_buffer(mb)            // (mb's output) after F             stages < p−1
//   recv_backward_buffer(mb)           // (gradient of mb's output)         stages < p−1
//   send_backward_buffer(mb)           // (gradient of mb's input) after B  stages > 0
//   — each a contiguous view (TensorView of any memory space) of value_type elements.
//
// Buffer lifetimes: a recv buffer is asked for when its RecvForward/RecvBackward action posts the
// receive and must stay put until the consuming F/B has run. A send buffer is asked for right
// after the F/B that filled it and must stay unmodified until the transport has completed the
// send: the MPI transport at the step's end, except send_forward_buffer(mb), complete before
// backward_input(mb) runs (so that B may reuse it); the stream transport in addition before the
// next action that reads a received message. The receiver's buffer must be as large as the
// sender's.
//
// Timing: the wall time of each op kind and of the transport's waits is recorded in StepTimings
// (for the bubble benchmark and the training metrics), each action inside an NVTX range (core/
// nvtx.hpp: F3, B3, W3, w3 for a wait) and, when asked, as Spans (a Gantt chart of the step).
// Stream-ordered stages return as soon as their work is enqueued: their times are the host's
// launch times, not the device's (the NVTX ranges then sit above the kernels they launched).

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/nvtx.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/parallel/pipeline/schedule.hpp"
#include "dpml/parallel/pipeline/transport.hpp"

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dpml::parallel::pipeline {

template <class V, class T>
concept MessageBuffer = requires(const V& v) {
  { v.data() } -> std::convertible_to<T*>;
  { v.numel() } -> std::convertible_to<std::int64_t>;
};

template <class S>
concept Stage = requires(S& s, int mb) {
  typename S::value_type;
  s.forward(mb);
  s.backward_input(mb);
  s.backward_weight(mb);
  { s.recv_forward_buffer(mb) } -> MessageBuffer<typename S::value_type>;
  { s.send_forward_buffer(mb) } -> MessageBuffer<const typename S::value_type>;
  { s.recv_backward_buffer(mb) } -> MessageBuffer<typename S::value_type>;
  { s.send_backward_buffer(mb) } -> MessageBuffer<const typename S::value_type>;
};

// One timed stretch of a stage's step (StepTimings::spans): F, B or W of a micro-batch, or a wait
// ('w': for the message micro-batch `micro_batch` needs, or, with micro_batch −1, for the sends at
// the end). Times in seconds on the host's steady clock (CLOCK_MONOTONIC: one time base for all
// processes of a node).
struct Span {
  char kind = 'F';
  int micro_batch = 0;
  double start = 0, end = 0;
};

// Seconds spent by one stage in one step (wall clock).
struct StepTimings {
  double forward = 0, backward_input = 0, backward_weight = 0;  // busy, per op kind
  double wait = 0;   // blocked in a receive (before F/B) or completing sends
  double total = 0;  // the whole step on this stage
  std::vector<Span> spans;  // each F/B/W and wait in order, when run_stage was asked to trace
  double busy() const { return forward + backward_input + backward_weight; }
  double idle() const { return total - busy(); }
  StepTimings& operator+=(const StepTimings& o) {
    forward += o.forward, backward_input += o.backward_input, backward_weight += o.backward_weight;
    wait += o.wait, total += o.total;
    return *this;
  }
};

namespace detail {
using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
inline double clock_seconds(Clock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }
}  // namespace detail

// Runs `actions` (this stage's list of a checked schedule) on `stage`, moving its messages through
// `transport` (whose rank is the stage index). Returns this stage's timings; with `trace`, also
// each F/B/W and wait as a Span (a Gantt chart of the step: train_gpt --trace-pipeline).
template <Stage S, class Transport>
StepTimings run_stage(const std::vector<Action>& actions, S& stage, Transport& transport, bool trace = false) {
  using detail::Clock;
  const int s = transport.rank(), p = transport.size();
  StepTimings t;
  const auto step_start = Clock::now();
  // f's wall time into `slot` (and a span of `kind` for micro-batch mb), inside an NVTX range.
  auto timed = [&](double& slot, char kind, int mb, auto&& f) {
    const auto t0 = Clock::now();
    {
      const NvtxRange range(kind, mb);
      f();
    }
    const auto t1 = Clock::now();
    slot += std::chrono::duration<double>(t1 - t0).count();
    if (trace) t.spans.push_back({kind, mb, detail::clock_seconds(t0), detail::clock_seconds(t1)});
  };
  auto numel = [](const auto& buf) { return static_cast<std::size_t>(buf.numel()); };
  try {
    for (const Action& a : actions) {
      const int mb = a.micro_batch;
      switch (a.op) {
        case Op::RecvForward: {
          auto buf = stage.recv_forward_buffer(mb);
          transport.post_recv(Flow::forward, buf.data(), numel(buf), mb);
          break;
        }
        case Op::RecvBackward: {
          auto buf = stage.recv_backward_buffer(mb);
          transport.post_recv(Flow::backward, buf.data(), numel(buf), mb);
          break;
        }
        case Op::Forward:
          if (s > 0) timed(t.wait, 'w', mb, [&] { transport.wait_recv(Flow::forward, mb); });
          timed(t.forward, 'F', mb, [&] { stage.forward(mb); });
          break;
        case Op::BackwardInput:
          if (s < p - 1) timed(t.wait, 'w', mb, [&] { transport.wait_recv(Flow::backward, mb); });
          timed(t.wait, 'w', mb, [&] { transport.wait_send(Flow::forward, mb); });  // F's output reusable after
          timed(t.backward_input, 'B', mb, [&] { stage.backward_input(mb); });
          break;
        case Op::BackwardWeight: timed(t.backward_weight, 'W', mb, [&] { stage.backward_weight(mb); }); break;
        case Op::SendForward: {
          auto buf = stage.send_forward_buffer(mb);
          transport.post_send(Flow::forward, buf.data(), numel(buf), mb);
          break;
        }
        case Op::SendBackward: {
          auto buf = stage.send_backward_buffer(mb);
          transport.post_send(Flow::backward, buf.data(), numel(buf), mb);
          break;
        }
      }
    }
    DPML_REQUIRE(transport.pending_receives() == 0, "pipeline stage " << s << ": the step ended with " << transport.pending_receives()
                                                                      << " posted receives never consumed (schedule not checked?)");
  } catch (...) {
    transport.abandon();
    throw;
  }
  timed(t.wait, 'w', -1, [&] { transport.finish(); });
  t.total = detail::seconds_since(step_start);
  return t;
}

// The host form: messages over the pipeline-axis communicator `pipe` (MpiTransport).
template <Stage S>
StepTimings run_stage(const std::vector<Action>& actions, S& stage, const comm::Mpi& pipe, bool trace = false) {
  MpiTransport<typename S::value_type> transport(pipe);
  return run_stage(actions, stage, transport, trace);
}

}  // namespace dpml::parallel::pipeline
