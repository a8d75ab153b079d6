#pragma once
// CUDA streams and events as small RAII values, so that nothing above core/ and kernels/ calls the
// CUDA runtime for them: a training step's work is ordered by events between streams (record on
// the producer, wait on the consumer), never by host synchronisation. CUDA builds only.
//
//   Stream s;                       // a non-blocking stream of the current device
//   Event e; e.record(s); t.wait(e) // t runs after what s had queued at record()
//   s.synchronize();                // the host waits (step boundaries, reading a loss)

#include "dpml/core/cuda_error.hpp"

#include <cuda_runtime.h>

#include <utility>

namespace dpml {

class Event;

class Stream {
 public:
  // A new non-blocking stream: it does not wait for the legacy default stream.
  Stream() { DPML_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  // A view of a stream someone else owns (not destroyed here).
  static Stream borrow(cudaStream_t s) noexcept { return Stream(s, false); }
  Stream(Stream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)), owned_(o.owned_) {}
  Stream& operator=(Stream&& o) noexcept {
    Stream(std::move(o)).swap(*this);
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (stream_ && owned_) cudaStreamDestroy(stream_);
  }

  cudaStream_t native() const noexcept { return stream_; }
  operator cudaStream_t() const noexcept { return stream_; }  // NOLINT: passed to kernels and libraries
  void synchronize() const { DPML_CHECK_CUDA(cudaStreamSynchronize(stream_)); }
  inline void wait(const Event& e) const;
  void swap(Stream& o) noexcept {
    std::swap(stream_, o.stream_);
    std::swap(owned_, o.owned_);
  }

 private:
  Stream(cudaStream_t s, bool owned) noexcept : stream_(s), owned_(owned) {}
  cudaStream_t stream_ = nullptr;
  bool owned_ = true;
};

class Event {
 public:
  // timing = false: the cheap kind, for ordering only.
  explicit Event(bool timing = false) {
    DPML_CHECK_CUDA(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  Event(Event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    std::swap(event_, o.event_);
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (event_) cudaEventDestroy(event_);
  }

  cudaEvent_t native() const noexcept { return event_; }
  void record(cudaStream_t s) const { DPML_CHECK_CUDA(cudaEventRecord(event_, s)); }
  void synchronize() const { DPML_CHECK_CUDA(cudaEventSynchronize(event_)); }
  // Milliseconds from `start` to this event (both recorded with timing = true); synchronises.
  float elapsed_ms_since(const Event& start) const {
    synchronize();
    float ms = 0;
    DPML_CHECK_CUDA(cudaEventElapsedTime(&ms, start.event_, event_));
    return ms;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

inline void Stream::wait(const Event& e) const { DPML_CHECK_CUDA(cudaStreamWaitEvent(stream_, e.native(), 0)); }

}  // namespace dpml
