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
// A rank of several model chunks (the interleaved schedule) is a `ChunkedStage`: the same members
// with the chunk first — forward(c, mb), …, recv_forward_buffer(c, mb), … — where chunk c is
// virtual stage c·p + s; "stage 0" and "the last stage" above mean virtual stage 0 and c·p + s =
// v·p − 1. A plain Stage runs tables of chunk 0 only.
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

template <class S>
concept ChunkedStage = requires(S& s, int c, int mb) {
  typename S::value_type;
  s.forward(c, mb);
  s.backward_input(c, mb);
  s.backward_weight(c, mb);
  { s.recv_forward_buffer(c, mb) } -> MessageBuffer<typename S::value_type>;
  { s.send_forward_buffer(c, mb) } -> MessageBuffer<const typename S::value_type>;
  { s.recv_backward_buffer(c, mb) } -> MessageBuffer<typename S::value_type>;
  { s.send_backward_buffer(c, mb) } -> MessageBuffer<const typename S::value_type>;
};

template <class S>
concept AnyStage = Stage<S> || ChunkedStage<S>;

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
  std::int64_t sent_bytes = 0;  // the messages this stage sent: activations forward, their gradients backward
  std::vector<Span> spans;  // each F/B/W and wait in order, when run_stage was asked to trace
  double busy() const { return forward + backward_input + backward_weight; }
  double idle() const { return total - busy(); }
  StepTimings& operator+=(const StepTimings& o) {
    forward += o.forward, backward_input += o.backward_input, backward_weight += o.backward_weight;
    wait += o.wait, total += o.total, sent_bytes += o.sent_bytes;
    return *this;
  }
};

namespace detail {
using Clock = std::chrono::steady_clock;

// member(stage, chunk, mb) on a ChunkedStage, member(stage, mb) on a Stage (whose tables name
// chunk 0 only): `member` is a generic lambda forwarding its indices to one member function.
template <AnyStage S, class Member>
decltype(auto) on_chunk(S& stage, const Action& a, Member&& member) {
  if constexpr (ChunkedStage<S>) {
    return member(stage, a.chunk, a.micro_batch);
  } else {
    DPML_REQUIRE(a.chunk == 0, "pipeline: " << describe(a) << " for a stage of one chunk (an interleaved table needs a ChunkedStage)");
    return member(stage, a.micro_batch);
  }
}
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
inline double clock_seconds(Clock::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }
}  // namespace detail

// Runs `actions` (this stage's list of a checked schedule) on `stage`, moving its messages through
// `transport` (whose rank is the stage index). Returns this stage's timings; with `trace`, also
// each F/B/W and wait as a Span (a Gantt chart of the step: train_gpt --trace-pipeline).
template <AnyStage S, class Transport>
StepTimings run_stage(const std::vector<Action>& actions, S& stage, Transport& transport, bool trace = false) {
  using detail::Clock;
  using detail::on_chunk;
  const int s = transport.rank(), p = transport.size(), last_stage = p * transport.chunks() - 1;
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
  auto send = [&](Flow flow, const auto& buf, int mb, int c) {
    transport.post_send(flow, buf.data(), numel(buf), mb, c);
    t.sent_bytes += buf.numel() * static_cast<std::int64_t>(sizeof(*buf.data()));
  };
  // The stage members, each as a lambda over (stage, indices…) for on_chunk.
  auto forward = [](auto& st, auto... i) { st.forward(i...); };
  auto backward_input = [](auto& st, auto... i) { st.backward_input(i...); };
  auto backward_weight = [](auto& st, auto... i) { st.backward_weight(i...); };
  auto recv_forward = [](auto& st, auto... i) { return st.recv_forward_buffer(i...); };
  auto recv_backward = [](auto& st, auto... i) { return st.recv_backward_buffer(i...); };
  auto send_forward = [](auto& st, auto... i) { return st.send_forward_buffer(i...); };
  auto send_backward = [](auto& st, auto... i) { return st.send_backward_buffer(i...); };
  try {
    for (const Action& a : actions) {
      const int mb = a.micro_batch, c = a.chunk, k = virtual_stage(s, c, p);
      switch (a.op) {
        case Op::RecvForward: {
          auto buf = on_chunk(stage, a, recv_forward);
          transport.post_recv(Flow::forward, buf.data(), numel(buf), mb, c);
          break;
        }
        case Op::RecvBackward: {
          auto buf = on_chunk(stage, a, recv_backward);
          transport.post_recv(Flow::backward, buf.data(), numel(buf), mb, c);
          break;
        }
        case Op::Forward:
          if (k > 0) timed(t.wait, 'w', mb, [&] { transport.wait_recv(Flow::forward, mb, c); });
          timed(t.forward, 'F', mb, [&] { on_chunk(stage, a, forward); });
          break;
        case Op::BackwardInput:
          if (k < last_stage) timed(t.wait, 'w', mb, [&] { transport.wait_recv(Flow::backward, mb, c); });
          timed(t.wait, 'w', mb, [&] { transport.wait_send(Flow::forward, mb, c); });  // F's output reusable after
          timed(t.backward_input, 'B', mb, [&] { on_chunk(stage, a, backward_input); });
          break;
        case Op::BackwardWeight: timed(t.backward_weight, 'W', mb, [&] { on_chunk(stage, a, backward_weight); }); break;
        case Op::SendForward: send(Flow::forward, on_chunk(stage, a, send_forward), mb, c); break;
        case Op::SendBackward: send(Flow::backward, on_chunk(stage, a, send_backward), mb, c); break;
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
// `chunks`: the model chunks per rank of the table (chunks_in(schedule); 1 unless interleaved).
template <AnyStage S>
StepTimings run_stage(const std::vector<Action>& actions, S& stage, const comm::Mpi& pipe, bool trace = false, int chunks = 1) {
  MpiTransport<typename S::value_type> transport(pipe, chunks);
  return run_stage(actions, stage, transport, trace);
}

}  // namespace dpml::parallel::pipeline
