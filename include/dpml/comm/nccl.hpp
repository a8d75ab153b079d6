#pragma once
// comm::Nccl: the Communicator for device buffers (CUDA builds only). One NCCL communicator per
// group of ranks, bootstrapped over MPI: rank 0 of the group calls ncclGetUniqueId and broadcasts
// the id, then every member calls ncclCommInitRank on its current device (comm/local_rank.hpp
// chooses it). Collectives are templates whose NCCL datatype is chosen at compile time by
// NcclType<T>; a type without one fails to compile with a message naming it.
//
// Every collective is enqueued on the communicator's stream and returns at once: no host
// synchronisation, so work on other streams orders itself against it with CUDA events. The
// i-forms also return a Request whose wait() records an event on the stream and synchronises on
// it; while waiting it polls ncclCommGetAsyncError and gives up after a timeout
// (DPML_NCCL_TIMEOUT_S, default 300 s), so a peer that died or skipped a collective gives a clear
// message instead of a hang. group() batches calls (ncclGroupStart/End), e.g. the sends and
// receives of a ring, which NCCL would otherwise deadlock on.
//
// A group of one rank (an axis of size 1: tp 1, pp 1, one data rank) gets no NCCL communicator:
// its collectives are the identity (a device copy when out of place), and it has no peer to send
// to. NCCL communicators cost device memory even alone: the four of a one-GPU DeviceGrid (tensor,
// data, pipeline, world) took 1.7 GiB on an H100 (bench/gpt_train's gpt_train_memory lines).
//
//   comm::Nccl dp = comm::Nccl::from(grid.comm(Axis::data), stream);
//   dp.allreduce(grads, n, ReduceOp::avg);            // enqueued on `stream`
//   { auto g = dp.group(); dp.send(a, n, next, 0); dp.recv(b, n, prev, 0); }

#include "dpml/comm/communicator.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/bf16.hpp"
#include "dpml/core/cuda_error.hpp"

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace dpml::comm {

template <class T>
struct NcclType {
  static_assert(sizeof(T) == 0, "dpml: this element type has no NCCL datatype (see NcclType in comm/nccl.hpp)");
};
#define DPML_NCCL_TYPE(T, N)                                   \
  template <>                                                  \
  struct NcclType<T> {                                         \
    static constexpr ncclDataType_t value = N;                 \
  };
DPML_NCCL_TYPE(float, ncclFloat32)
DPML_NCCL_TYPE(double, ncclFloat64)
DPML_NCCL_TYPE(bf16, ncclBfloat16)
DPML_NCCL_TYPE(__half, ncclFloat16)
DPML_NCCL_TYPE(char, ncclChar)
DPML_NCCL_TYPE(std::int8_t, ncclInt8)
DPML_NCCL_TYPE(std::uint8_t, ncclUint8)
DPML_NCCL_TYPE(std::int32_t, ncclInt32)
DPML_NCCL_TYPE(std::uint32_t, ncclUint32)
DPML_NCCL_TYPE(std::int64_t, ncclInt64)
DPML_NCCL_TYPE(std::uint64_t, ncclUint64)
#undef DPML_NCCL_TYPE

namespace detail {
inline ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

// Seconds a Request waits before declaring its peers lost: DPML_NCCL_TIMEOUT_S, default 300.
inline double nccl_timeout_seconds() {
  const char* s = std::getenv("DPML_NCCL_TIMEOUT_S");
  if (!s || !*s) return 300.0;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  DPML_REQUIRE(end && *end == '\0' && v > 0, "DPML_NCCL_TIMEOUT_S='" << s << "' is not a positive number of seconds");
  return v;
}

// NCCL settings dpml changes from NCCL's defaults, applied before the process's first NCCL call
// (NCCL reads its environment once) unless the user set them:
//   NCCL_CUMEM_ENABLE=0  buffers from cudaMalloc and peers mapped by CUDA IPC instead of cuMem
//                        virtual memory. With cuMem, every kernel of a process holding three
//                        communicators (a pipeline stage of the library's trainer) started ~1 µs
//                        later after the previous one on its stream (the kernels' own times
//                        unchanged): 3–4 % of a GPT-2 pp 2 step; with 0, the step equals the
//                        fused model's (bench/RESULTS.md, "the pipeline's millisecond").
inline void apply_nccl_defaults() {
  static const bool applied = [] {
    ::setenv("NCCL_CUMEM_ENABLE", "0", /*overwrite=*/0);
    return true;
  }();
  (void)applied;
}

// What a communicator and its pending requests share. A communicator that saw an error or a
// timeout, or that is released while an exception unwinds (this rank left the step midway, its
// peers may be inside a collective or a connection with it), is aborted (ncclCommAbort) instead
// of destroyed: ncclCommDestroy would wait for peers that never come, and the peers' own calls
// then fail instead of hanging.
//
// Handles on other streams of one NCCL communicator (Nccl::on) each have a state of their own
// (stream, scratch) whose `owner` is the state holding the communicator: the communicator, its
// broken flag and its abort live there only, and it outlives every handle.
struct NcclState {
  ncclComm_t comm = nullptr;  // null in a handle with an owner: see communicator()
  std::shared_ptr<NcclState> owner;
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  int rank = 0, size = 1;
  double timeout_s = 300.0;
  bool broken = false;
  int* scratch = nullptr;  // (1) device int for barrier()
  bool solo = false;       // a group of one rank: no NCCL communicator, collectives are copies

  NcclState() = default;
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;
  NcclState& holder() noexcept { return owner ? *owner : *this; }
  ncclComm_t communicator() noexcept { return holder().comm; }
  void mark_broken() noexcept { holder().broken = true; }
  ~NcclState() {
    if (comm) (broken || std::uncaught_exceptions() > 0 ? ncclCommAbort(comm) : ncclCommDestroy(comm));
    if (scratch) cudaFree(scratch);
    if (owns_stream && stream) cudaStreamDestroy(stream);
  }
  std::string who() const {
    return "NCCL communicator (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
  }
};
}  // namespace detail

// Completion of the calls a communicator has enqueued. The first test() or wait() records an
// event on the communicator's stream (so a Request made inside group() covers the batched calls,
// once the group has ended: wait after it) and then polls the event, the communicator's
// asynchronous error and the clock; test() never blocks. Destroying a pending Request waits for
// it (errors then go unreported: call wait()).
class NcclRequest {
 public:
  NcclRequest() = default;
  explicit NcclRequest(std::shared_ptr<detail::NcclState> state) : state_(std::move(state)) {}
  NcclRequest(NcclRequest&& o) noexcept : state_(std::move(o.state_)), event_(std::exchange(o.event_, nullptr)) {}
  NcclRequest& operator=(NcclRequest&& o) noexcept {
    if (this != &o) {
      finish_noexcept();
      state_ = std::move(o.state_);
      event_ = std::exchange(o.event_, nullptr);
    }
    return *this;
  }
  NcclRequest(const NcclRequest&) = delete;
  NcclRequest& operator=(const NcclRequest&) = delete;
  ~NcclRequest() { finish_noexcept(); }

  bool pending() const noexcept { return state_ != nullptr; }

  // True when complete; throws on an asynchronous NCCL or CUDA error.
  bool test() {
    if (!state_) return true;
    if (!event_) {
      DPML_CHECK_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
      DPML_CHECK_CUDA(cudaEventRecord(event_, state_->stream));
    }
    const cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaSuccess) {
      release();
      return true;
    }
    if (rc != cudaErrorNotReady)
      fail(std::string("operation failed on the device: ") + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")");
    if (state_->solo) return false;
    if (!state_->communicator()) fail("waiting on an aborted communicator");
    ncclResult_t async = ncclSuccess;
    DPML_CHECK_NCCL(ncclCommGetAsyncError(state_->communicator(), &async));
    if (async != ncclSuccess && async != ncclInProgress)
      fail(std::string("asynchronous error: ") + ncclGetErrorString(async) +
           " (a peer rank may have failed; NCCL_DEBUG=WARN says more)");
    return false;
  }

  void wait() {
    const auto start = std::chrono::steady_clock::now();
    while (!test()) {
      const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
      if (waited.count() > state_->timeout_s) {
        std::ostringstream os;
        os << "operation did not complete within " << state_->timeout_s
           << " s (DPML_NCCL_TIMEOUT_S): a peer rank has probably died, hung, or not called the same collective";
        fail(os.str());
      }
      sched_yield();
    }
  }

 private:
  // Marks the communicator broken (it will be aborted, not destroyed) and throws.
  [[noreturn]] void fail(const std::string& what) {
    state_->mark_broken();
    const std::string who = state_->who();
    release();
    throw Error(who + ": " + what);
  }
  void release() noexcept {
    if (event_) cudaEventDestroy(event_);
    event_ = nullptr;
    state_.reset();
  }
  void finish_noexcept() noexcept {
    try {
      wait();
    } catch (...) {
    }
  }
  std::shared_ptr<detail::NcclState> state_;
  cudaEvent_t event_ = nullptr;
};

class Nccl {
 public:
  using Request = NcclRequest;

  // ncclGroupStart for its lifetime: the calls made meanwhile are launched together at the end.
  // The destructor reports a failing ncclGroupEnd unless the scope is already unwinding.
  class Group {
   public:
    Group() : exceptions_(std::uncaught_exceptions()) { DPML_CHECK_NCCL(ncclGroupStart()); }
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;
    ~Group() noexcept(false) {
      const ncclResult_t rc = ncclGroupEnd();
      if (rc != ncclSuccess && std::uncaught_exceptions() == exceptions_)
        throw Error(std::string("ncclGroupEnd() failed: ") + ncclGetErrorString(rc));
    }

   private:
    int exceptions_;
  };

  // A communicator over the members of `group`, on the current CUDA device, enqueuing on `stream`
  // (which must outlive it). Collective over `group`.
  static Nccl from(const Mpi& group, cudaStream_t stream) { return Nccl(group, stream, false); }
  // The same on a stream of its own (non-blocking with respect to the legacy default stream).
  static Nccl from(const Mpi& group) {
    cudaStream_t s = nullptr;
    DPML_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return Nccl(group, s, true);
  }

  // This communicator enqueuing on `stream` (which must outlive the handle) instead of its own:
  // the same NCCL communicator, no new one, no device memory and no collective call. NCCL
  // serialises the operations of one communicator whatever their streams (it orders them with
  // events), so the handles' calls must be issued in the same order on every rank, as one
  // communicator's are. For groups whose operations never overlap anyway, e.g. an axis spanning
  // the world and the world's gradient-norm sum (parallel/device_grid.hpp).
  Nccl on(cudaStream_t stream) const {
    auto view = std::make_shared<detail::NcclState>();
    view->owner = state_->owner ? state_->owner : state_;
    view->stream = stream;
    view->rank = state_->rank;
    view->size = state_->size;
    view->timeout_s = state_->timeout_s;
    view->solo = state_->solo;
    DPML_CHECK_CUDA(cudaMalloc(&view->scratch, sizeof(int)));
    DPML_CHECK_CUDA(cudaMemsetAsync(view->scratch, 0, sizeof(int), stream));
    return Nccl(std::move(view));
  }

  Nccl(Nccl&&) noexcept = default;
  Nccl& operator=(Nccl&&) noexcept = default;
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;

  int rank() const noexcept { return state_->rank; }
  int size() const noexcept { return state_->size; }
  cudaStream_t stream() const noexcept { return state_->stream; }
  ncclComm_t native() const noexcept { return state_->communicator(); }  // null for a group of one

  // Seconds a Request waits before reporting its peers lost (default DPML_NCCL_TIMEOUT_S or 300).
  void set_timeout(double seconds) {
    DPML_REQUIRE(seconds > 0, "NCCL timeout must be positive, got " << seconds);
    state_->timeout_s = seconds;
  }
  // Ends the communicator now (ncclCommAbort), cancelling what it has in flight: for a rank that
  // knows its peers are lost. Later calls on it fail.
  void abort() noexcept {
    if (state_ && state_->communicator()) ncclCommAbort(std::exchange(state_->holder().comm, nullptr));
  }

  [[nodiscard]] Group group() const { return Group(); }
  // A request for everything enqueued before its first wait() or test().
  Request request() const { return Request(state_); }

  // ---- collectives (enqueued on stream(), no host synchronisation) ------------------------------
  template <class T>
  void allreduce(const T* send, T* recv, std::size_t n, ReduceOp op) const {
    if (solo()) return copy(send, recv, n);
    DPML_CHECK_NCCL(ncclAllReduce(send, recv, n, NcclType<T>::value, detail::nccl_op(op), comm(), stream()));
  }
  template <class T>
  void allreduce(T* data, std::size_t n, ReduceOp op) const { allreduce(data, data, n, op); }
  template <class T>
  void broadcast(const T* send, T* recv, std::size_t n, int root) const {
    if (solo()) return copy(send, recv, n);
    DPML_CHECK_NCCL(ncclBroadcast(send, recv, n, NcclType<T>::value, root, comm(), stream()));
  }
  template <class T>
  void broadcast(T* data, std::size_t n, int root) const { broadcast(data, data, n, root); }
  // recv holds size() blocks of `n`, rank order; in place when send == recv + rank() * n.
  template <class T>
  void allgather(const T* send, T* recv, std::size_t n) const {
    if (solo()) return copy(send, recv, n);
    DPML_CHECK_NCCL(ncclAllGather(send, recv, n, NcclType<T>::value, comm(), stream()));
  }
  // Blocks of counts[r] elements, packed in rank order: one broadcast per rank, batched.
  template <class T>
  void allgatherv(const T* send, T* recv, std::span<const int> counts) const {
    const std::vector<std::size_t> at = displacements(counts);
    const Group batch;
    for (int r = 0; r < size(); ++r) {
      const std::size_t i = static_cast<std::size_t>(r);
      broadcast(r == rank() ? send : recv + at[i], recv + at[i], static_cast<std::size_t>(counts[i]), r);
    }
  }
  // send holds size() blocks of `n`; recv gets this rank's reduced block.
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t n, ReduceOp op) const {
    if (solo()) return copy(send, recv, n);
    DPML_CHECK_NCCL(ncclReduceScatter(send, recv, n, NcclType<T>::value, detail::nccl_op(op), comm(), stream()));
  }
  // send holds blocks of counts[r] elements in rank order; recv gets this rank's reduced block: one
  // reduce per rank, batched.
  template <class T>
  void reduce_scatterv(const T* send, T* recv, std::span<const int> counts, ReduceOp op) const {
    const std::vector<std::size_t> at = displacements(counts);
    if (solo()) return copy(send, recv, static_cast<std::size_t>(counts[0]));
    const Group batch;
    for (int r = 0; r < size(); ++r) {
      const std::size_t i = static_cast<std::size_t>(r);
      DPML_CHECK_NCCL(ncclReduce(send + at[i], recv, static_cast<std::size_t>(counts[i]), NcclType<T>::value,
                                 detail::nccl_op(op), r, comm(), stream()));
    }
  }
  // NCCL has no tags: messages between two ranks match in the order they are posted. A send and
  // the matching receive of another pair must sit in one group() when they could wait on each other.
  template <class T>
  void send(const T* data, std::size_t n, int peer, int /*tag*/) const {
    DPML_REQUIRE(!solo(), "NCCL send to rank " << peer << " in a group of one rank");
    DPML_CHECK_NCCL(ncclSend(data, n, NcclType<T>::value, peer, comm(), stream()));
  }
  template <class T>
  void recv(T* data, std::size_t n, int peer, int /*tag*/) const {
    DPML_REQUIRE(!solo(), "NCCL receive from rank " << peer << " in a group of one rank");
    DPML_CHECK_NCCL(ncclRecv(data, n, NcclType<T>::value, peer, comm(), stream()));
  }
  // Returns when every member has reached it and this rank's enqueued work is done.
  void barrier() const {
    allreduce(state_->scratch, 1, ReduceOp::sum);
    request().wait();
  }

  // ---- non-blocking: the call, then a Request for it ------------------------------------------
  template <class T>
  Request iallreduce(const T* send, T* recv, std::size_t n, ReduceOp op) const {
    allreduce(send, recv, n, op);
    return request();
  }
  template <class T>
  Request iallreduce(T* data, std::size_t n, ReduceOp op) const { return iallreduce(data, data, n, op); }
  template <class T>
  Request ibroadcast(T* data, std::size_t n, int root) const {
    broadcast(data, n, root);
    return request();
  }
  template <class T>
  Request iallgather(const T* send, T* recv, std::size_t n) const {
    allgather(send, recv, n);
    return request();
  }
  template <class T>
  Request iallgatherv(const T* send, T* recv, std::span<const int> counts) const {
    allgatherv(send, recv, counts);
    return request();
  }
  template <class T>
  Request ireduce_scatter(const T* send, T* recv, std::size_t n, ReduceOp op) const {
    reduce_scatter(send, recv, n, op);
    return request();
  }
  template <class T>
  Request ireduce_scatterv(const T* send, T* recv, std::span<const int> counts, ReduceOp op) const {
    reduce_scatterv(send, recv, counts, op);
    return request();
  }
  // Tags are ignored as in send()/recv(): post the messages of a pair in the same order on both.
  template <class T>
  Request isend(const T* data, std::size_t n, int peer, int tag) const {
    send(data, n, peer, tag);
    return request();
  }
  template <class T>
  Request irecv(T* data, std::size_t n, int peer, int tag) const {
    recv(data, n, peer, tag);
    return request();
  }

 private:
  Nccl(const Mpi& group, cudaStream_t stream, bool owns_stream) : state_(std::make_shared<detail::NcclState>()) {
    detail::apply_nccl_defaults();
    state_->stream = stream;
    state_->owns_stream = owns_stream;
    state_->rank = group.rank();
    state_->size = group.size();
    state_->timeout_s = detail::nccl_timeout_seconds();
    DPML_CHECK_CUDA(cudaMalloc(&state_->scratch, sizeof(int)));
    DPML_CHECK_CUDA(cudaMemsetAsync(state_->scratch, 0, sizeof(int), stream));
    state_->solo = group.size() == 1;
    if (state_->solo) return;
    // The id travels with rank 0's verdict, so a failure there is reported on every rank
    // instead of leaving them waiting for an id.
    struct Bootstrap {
      ncclUniqueId id;
      char error[200];
    } boot{};
    if (group.rank() == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&boot.id);
      if (rc != ncclSuccess)
        std::snprintf(boot.error, sizeof boot.error, "ncclGetUniqueId failed on rank 0 of the group: %s",
                      ncclGetErrorString(rc));
    }
    group.broadcast(reinterpret_cast<char*>(&boot), sizeof boot, 0);
    DPML_REQUIRE_EVERYWHERE(boot.error[0] == '\0', boot.error);
    int device = -1;
    DPML_CHECK_CUDA(cudaGetDevice(&device));
    const ncclResult_t rc = ncclCommInitRank(&state_->comm, group.size(), boot.id, group.rank());
    DPML_REQUIRE(rc == ncclSuccess, "ncclCommInitRank failed for rank " << group.rank() << " of " << group.size()
                                     << " on CUDA device " << device << ": " << ncclGetErrorString(rc)
                                     << " (two ranks on one GPU? see comm/local_rank.hpp)");
  }

  explicit Nccl(std::shared_ptr<detail::NcclState> state) : state_(std::move(state)) {}

  ncclComm_t comm() const noexcept { return state_->communicator(); }
  bool solo() const noexcept { return state_->solo; }
  // A group of one's collective: recv = send, on the stream.
  template <class T>
  void copy(const T* send, T* recv, std::size_t n) const {
    if (send != recv && n > 0) DPML_CHECK_CUDA(cudaMemcpyAsync(recv, send, n * sizeof(T), cudaMemcpyDeviceToDevice, stream()));
  }
  std::vector<std::size_t> displacements(std::span<const int> counts) const {
    DPML_REQUIRE(static_cast<int>(counts.size()) == size(),
                 "need one count per rank: got " << counts.size() << " for " << size() << " ranks");
    std::vector<std::size_t> d(counts.size(), 0);
    for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + static_cast<std::size_t>(counts[i - 1]);
    return d;
  }

  std::shared_ptr<detail::NcclState> state_;
};

static_assert(Communicator<Nccl>);

}  // namespace dpml::comm
