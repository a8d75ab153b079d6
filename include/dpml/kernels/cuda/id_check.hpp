#pragma once
// Ops<CudaSpace>'s id check (kernels/host/id_check.hpp says what and why): scan() queues one
// kernel that keeps the first bad id of the ids it reads in a device word, then an asynchronous
// copy of that word into pinned host memory and an event. Nothing waits in the step: a later
// scan looks at the copy only if the event has already passed, and raise_if_bad() (called where
// the host synchronises anyway: a loss's take_loss) waits for the last one. The word is never
// cleared, so a bad id, once seen, is reported by every later look.
//
// The word is (position << 32) | (uint32) id; the smallest word is the bad id at the smallest
// position, so atomicMin keeps the same one whatever order the blocks run in. All ones: none.

#include "dpml/core/cuda_stream.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/device.hpp"
#include "dpml/kernels/host/id_check.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <utility>

namespace dpml::kernels::cuda {

namespace detail::ids {

inline constexpr unsigned long long kNone = ~0ull;

static __global__ void scan_kernel(const std::int32_t* __restrict__ ids, std::int64_t n, std::int32_t lowest, std::int64_t limit,
                            unsigned long long* first_bad) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int32_t id = ids[i];
    if (id < lowest || id >= limit)
      atomicMin(first_bad, (static_cast<unsigned long long>(i) << 32) | static_cast<std::uint32_t>(id));
  }
}

}  // namespace detail::ids

class IdCheck {
 public:
  IdCheck() = default;
  explicit IdCheck(IdRange what) : what_(std::move(what)) {}

  // Checks ids (n) against [0, limit) on the device; throws now only for an earlier scan's bad id
  // whose copy has already arrived.
  void scan(Device<CudaSpace>& dev, const std::int32_t* ids, std::int64_t n, std::int64_t limit) {
    DPML_REQUIRE(n < (std::int64_t{1} << 32), what_.who << ": " << n << " ids are too many to check");
    if (!state_) state_ = std::make_unique<State>(dev.stream());
    raise_if_arrived();
    state_->limit = limit;
    if (n > 0) {
      detail::ids::scan_kernel<<<grid_for(n, 256), 256, 0, dev.stream()>>>(ids, n, what_.lowest(), limit, state_->word);
      DPML_CHECK_LAUNCH();
    }
    DPML_CHECK_CUDA(cudaMemcpyAsync(state_->seen, state_->word, sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                    dev.stream()));
    state_->copied.record(dev.stream());
    state_->pending = true;
  }

  // Waits for the last scan's copy; throws if any scan so far met a bad id.
  void raise_if_bad() {
    if (!state_ || !state_->pending) return;
    state_->copied.synchronize();
    raise_seen();
  }

 private:
  struct State {
    unsigned long long* word = nullptr;  // device: the first bad id of every scan so far
    unsigned long long* seen = nullptr;  // pinned host: the word as of the last finished copy
    Event copied;                        // recorded after the last copy
    std::int64_t limit = 0;
    bool pending = false;                // a copy has been queued

    explicit State(cudaStream_t stream) {
      DPML_CHECK_CUDA(cudaMalloc(&word, sizeof(unsigned long long)));
      DPML_CHECK_CUDA(cudaMallocHost(&seen, sizeof(unsigned long long)));
      *seen = detail::ids::kNone;
      DPML_CHECK_CUDA(cudaMemsetAsync(word, 0xFF, sizeof(unsigned long long), stream));
    }
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    ~State() {
      cudaFree(word);
      cudaFreeHost(seen);
    }
  };

  // The last copy, if it has arrived (no waiting). A query that finds it pending leaves
  // cudaErrorNotReady as the runtime's last error: cleared, so that the next launch check does not
  // take it for a failure.
  void raise_if_arrived() {
    if (!state_->pending) return;
    const cudaError_t e = cudaEventQuery(state_->copied.native());
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return;
    }
    DPML_CHECK_CUDA(e);
    raise_seen();
  }
  void raise_seen() const {
    const unsigned long long w = *state_->seen;
    if (w != detail::ids::kNone)
      throw Error(what_.message(static_cast<std::int32_t>(static_cast<std::uint32_t>(w & 0xffffffffu)),
                                static_cast<std::int64_t>(w >> 32), state_->limit));
  }

  IdRange what_;
  std::unique_ptr<State> state_;
};

// Ops<CudaSpace>'s id-check family.
struct IdCheckOps {
  using IdCheck = cuda::IdCheck;
};

}  // namespace dpml::kernels::cuda
