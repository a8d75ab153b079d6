#pragma once
// The pipeline executor: runs one stage's action list (schedule.hpp) for one training step.
//
// The model side is a `Stage` — any type with the members below (the GPT stage adapter, the toy
// stages of the tests and the bubble benchmark). The executor owns no tensors and does no
// arithmetic: it calls the stage's compute members in table order and moves the stage's buffers
// between neighbours of the pipeline communicator (ProcessGrid::comm(Axis::pipeline); stage s is
// rank s there, its neighbours ranks s ± 1).
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
//   TensorView<value_type> recv_forward_buffer(int mb);   // (mb's input activation)  stages > 0
//   TensorView<const value_type> send_forward_buffer(int mb);   // (mb's output) after F, stages < p−1
//   TensorView<value_type> recv_backward_buffer(int mb);  // (gradient of mb's output) stages < p−1
//   TensorView<const value_type> send_backward_buffer(int mb);  // (gradient of mb's input) after B, stages > 0
//
// Buffer lifetimes: a recv buffer is asked for when its RecvForward/RecvBackward action posts the
// receive and must stay put until the consuming F/B has run. A send buffer is asked for right
// after the F/B that filled it and must stay unmodified until the step returns (the executor
// completes every send before returning); the only exception: send_forward_buffer(mb) may be
// reused once backward_input(mb) has been called — the executor completes that send first.
// Buffers must be contiguous, and the receiver's buffer as large as the sender's.
//
// Communication: sends are isend (the Request is kept and completed before the step returns);
// a Recv action posts an irecv, and the F/B that needs the data waits for it there, so the
// transfer overlaps the compute placed between the two (the generators post receives one compute
// action early). Tags: 2·mb for activations, 2·mb + 1 for gradients, so messages of different
// micro-batches never match by mistake. Times of each op kind and of the waits are recorded in
// StepTimings (for the bubble benchmark and the training metrics).

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/parallel/pipeline/schedule.hpp"

#include <chrono>
#include <concepts>
#include <cstddef>
#include <map>
#include <vector>

namespace dpml::parallel::pipeline {

template <class S>
concept Stage = requires(S& s, int mb) {
  typename S::value_type;
  s.forward(mb);
  s.backward_input(mb);
  s.backward_weight(mb);
  { s.recv_forward_buffer(mb) } -> std::convertible_to<TensorView<typename S::value_type>>;
  { s.send_forward_buffer(mb) } -> std::convertible_to<TensorView<const typename S::value_type>>;
  { s.recv_backward_buffer(mb) } -> std::convertible_to<TensorView<typename S::value_type>>;
  { s.send_backward_buffer(mb) } -> std::convertible_to<TensorView<const typename S::value_type>>;
};

// Seconds spent by one stage in one step (wall clock).
struct StepTimings {
  double forward = 0, backward_input = 0, backward_weight = 0;  // busy, per op kind
  double wait = 0;   // blocked in a receive (before F/B) or completing sends
  double total = 0;  // the whole step on this stage
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
inline int forward_tag(int mb) { return 2 * mb; }
inline int backward_tag(int mb) { return 2 * mb + 1; }
}  // namespace detail

// Runs `actions` (this stage's list of a checked schedule) on `stage`; `pipe` is the pipeline-axis
// communicator, whose rank is the stage index. Returns this stage's timings.
template <Stage S>
StepTimings run_stage(const std::vector<Action>& actions, S& stage, const comm::Mpi& pipe) {
  using T = typename S::value_type;
  using detail::Clock;
  const int s = pipe.rank(), p = pipe.size();
  StepTimings t;
  const auto step_start = Clock::now();
  std::map<int, comm::Request> recv_fwd, recv_bwd, send_fwd;  // by micro-batch
  std::vector<comm::Request> sends;
  auto wait_for = [&](std::map<int, comm::Request>& pending, int mb, const char* what) {
    auto it = pending.find(mb);
    DPML_REQUIRE(it != pending.end(), "pipeline stage " << s << ": " << what << " of micro-batch " << mb
                                                        << " needed before its receive was posted (schedule not checked?)");
    const auto t0 = Clock::now();
    it->second.wait();
    t.wait += detail::seconds_since(t0);
    pending.erase(it);
  };
  auto timed = [&](double& slot, auto&& f) {
    const auto t0 = Clock::now();
    f();
    slot += detail::seconds_since(t0);
  };
  // A stage that throws leaves receives posted that no neighbour will ever match; comm::Request
  // waits in its destructor, so unwinding would hang before dpml::run could abort the job. On
  // that path the pending requests are deliberately leaked (the job is about to end).
  auto abandon_pending = [&] {
    auto* leaked = new std::vector<comm::Request>;
    for (auto* m : {&recv_fwd, &recv_bwd, &send_fwd})
      for (auto& [mb, r] : *m) leaked->push_back(std::move(r));
    for (auto& r : sends) leaked->push_back(std::move(r));
  };
  try {
    for (const Action& a : actions) {
      const int mb = a.micro_batch;
      switch (a.op) {
        case Op::RecvForward: {
          TensorView<T> buf = stage.recv_forward_buffer(mb);
          recv_fwd.emplace(mb, pipe.irecv(buf.data(), static_cast<std::size_t>(buf.numel()), s - 1, detail::forward_tag(mb)));
          break;
        }
        case Op::RecvBackward: {
          TensorView<T> buf = stage.recv_backward_buffer(mb);
          recv_bwd.emplace(mb, pipe.irecv(buf.data(), static_cast<std::size_t>(buf.numel()), s + 1, detail::backward_tag(mb)));
          break;
        }
        case Op::Forward:
          if (s > 0) wait_for(recv_fwd, mb, "the activation");
          timed(t.forward, [&] { stage.forward(mb); });
          break;
        case Op::BackwardInput:
          if (s < p - 1) wait_for(recv_bwd, mb, "the output gradient");
          if (send_fwd.contains(mb)) wait_for(send_fwd, mb, "the activation send");  // buffer reusable after
          timed(t.backward_input, [&] { stage.backward_input(mb); });
          break;
        case Op::BackwardWeight: timed(t.backward_weight, [&] { stage.backward_weight(mb); }); break;
        case Op::SendForward: {
          TensorView<const T> buf = stage.send_forward_buffer(mb);
          send_fwd.emplace(mb, pipe.isend(buf.data(), static_cast<std::size_t>(buf.numel()), s + 1, detail::forward_tag(mb)));
          break;
        }
        case Op::SendBackward: {
          TensorView<const T> buf = stage.send_backward_buffer(mb);
          sends.push_back(pipe.isend(buf.data(), static_cast<std::size_t>(buf.numel()), s - 1, detail::backward_tag(mb)));
          break;
        }
      }
    }
    DPML_REQUIRE(recv_fwd.empty() && recv_bwd.empty(),
                 "pipeline stage " << s << ": the step ended with " << recv_fwd.size() + recv_bwd.size()
                                   << " posted receives never consumed (schedule not checked?)");
  } catch (...) {
    abandon_pending();
    throw;
  }
  const auto t0 = Clock::now();
  for (auto& [mb, r] : send_fwd) r.wait();
  for (auto& r : sends) r.wait();
  t.wait += detail::seconds_since(t0);
  t.total = detail::seconds_since(step_start);
  return t;
}

}  // namespace dpml::parallel::pipeline
