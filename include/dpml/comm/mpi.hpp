#pragma once
// MPI communication for host buffers.
//
// MpiSession is the RAII MPI_Init/MPI_Finalize; Mpi wraps one communicator (world, or one that it
// owns after split()). Collectives are templates whose MPI datatype is chosen at compile time by
// MpiType<T>; a type without one fails to compile with a message naming it.
//
// Every blocking call here is a non-blocking call followed by Request::wait(), which polls
// MPI_Test and yields the core between polls. On machines with more ranks than cores (CI runs 8
// ranks on 2 cores) blocking MPICH collectives spin and are 50–100× slower; polling with
// sched_yield() lets the peer ranks run (TOOLCHAIN.md). The same loop is where the watchdog
// (comm/watchdog.hpp) notices a wait that lasts past --collective-timeout: each Request knows its
// operation, communicator and peer, for the report.

#include "dpml/comm/communicator.hpp"
#include "dpml/comm/watchdog.hpp"
#include "dpml/core/bf16.hpp"
#include "dpml/core/error.hpp"

#include <mpi.h>
#include <sched.h>
#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpml::comm {

template <class T>
struct MpiType {
  static_assert(sizeof(T) == 0, "dpml: this element type has no MPI datatype (see MpiType in comm/mpi.hpp)");
};
#define DPML_MPI_TYPE(T, M)                          \
  template <>                                        \
  struct MpiType<T> {                                \
    static MPI_Datatype get() noexcept { return M; } \
  };
DPML_MPI_TYPE(float, MPI_FLOAT)
DPML_MPI_TYPE(double, MPI_DOUBLE)
DPML_MPI_TYPE(std::int8_t, MPI_INT8_T)
DPML_MPI_TYPE(std::uint8_t, MPI_UINT8_T)
DPML_MPI_TYPE(std::int32_t, MPI_INT32_T)
DPML_MPI_TYPE(std::uint32_t, MPI_UINT32_T)
DPML_MPI_TYPE(std::int64_t, MPI_INT64_T)
DPML_MPI_TYPE(std::uint64_t, MPI_UINT64_T)
DPML_MPI_TYPE(std::uint16_t, MPI_UINT16_T)
DPML_MPI_TYPE(char, MPI_CHAR)
DPML_MPI_TYPE(bf16, MPI_UINT16_T)  // moved as bits: never reduced by MPI (see Reducible)
#if defined(__CUDACC__)
DPML_MPI_TYPE(__half, MPI_UINT16_T)  // kernels::cuda::f16 (IEEE fp16, CUDA TUs only): bits, as bf16
#endif
#undef DPML_MPI_TYPE

// Types MPI can reduce arithmetically.
template <class T>
concept Reducible = std::is_arithmetic_v<T>;

namespace detail {
inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;  // avg = sum, then divided by the group size
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}
inline int to_int_count(std::size_t n) {
  DPML_REQUIRE(n <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
               "MPI message of " << n << " elements exceeds INT_MAX");
  return static_cast<int>(n);
}
}  // namespace detail

// A pending non-blocking operation. wait() completes it (polling + yield); a post-step (the
// division of an average, a copy) runs after completion. Destroying a pending request waits.
class Request {
 public:
  Request() = default;
  // `op`, `comm` and `peer` (the other rank of a send/receive in `comm`, else -1) name the
  // operation in a watchdog report.
  Request(MPI_Request r, const char* op, MPI_Comm comm, int peer = -1) : op_(op), comm_(comm), peer_(peer) {
    reqs_.push_back(r);
  }
  Request(Request&& o) noexcept
      : reqs_(std::move(o.reqs_)), after_(std::move(o.after_)), op_(o.op_), comm_(o.comm_), peer_(o.peer_) {
    o.reqs_.clear();
  }
  Request& operator=(Request&& o) noexcept {
    if (this != &o) {
      finish_noexcept();
      reqs_ = std::move(o.reqs_);
      after_ = std::move(o.after_);
      op_ = o.op_;
      comm_ = o.comm_;
      peer_ = o.peer_;
      o.reqs_.clear();
    }
    return *this;
  }
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request() { finish_noexcept(); }

  template <class F>
  Request& then(F&& f) {
    after_.emplace_back(std::forward<F>(f));
    return *this;
  }
  // True when complete (and post-steps done); never blocks.
  bool test() {
    if (!reqs_.empty()) {
      int done = 0;
      DPML_CHECK_MPI(MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &done, MPI_STATUSES_IGNORE));
      if (!done) return false;
      reqs_.clear();
    }
    run_after();
    return true;
  }
  void wait() {
    watchdog::Timer timer;
    while (!test()) {
      if (timer.expired()) watchdog::expire(op_, comm_, peer_, timer.elapsed());
      sched_yield();
    }
  }
  bool pending() const noexcept { return !reqs_.empty() || !after_.empty(); }

 private:
  void run_after() {
    auto steps = std::move(after_);
    after_.clear();
    for (auto& f : steps) f();
  }
  void finish_noexcept() noexcept {
    try {
      wait();
    } catch (...) {
    }
  }
  std::vector<MPI_Request> reqs_;
  std::vector<std::function<void()>> after_;
  const char* op_ = "";
  MPI_Comm comm_ = MPI_COMM_NULL;
  int peer_ = -1;
};

class Mpi {
 public:
  using Request = comm::Request;

  // A view of an existing communicator (not freed by this object).
  explicit Mpi(MPI_Comm comm = MPI_COMM_WORLD) : comm_(comm) { query(); }
  Mpi(Mpi&& o) noexcept : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), owned_(std::exchange(o.owned_, false)),
                          rank_(o.rank_), size_(o.size_) {}
  Mpi& operator=(Mpi&& o) noexcept {
    if (this != &o) {
      free();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      owned_ = std::exchange(o.owned_, false);
      rank_ = o.rank_;
      size_ = o.size_;
    }
    return *this;
  }
  Mpi(const Mpi&) = delete;
  Mpi& operator=(const Mpi&) = delete;
  ~Mpi() { free(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  MPI_Comm native() const noexcept { return comm_; }

  // Ranks with equal `color` form one new communicator, ordered by `key`.
  Mpi split(int color, int key) const {
    MPI_Comm out = MPI_COMM_NULL;
    DPML_CHECK_MPI(MPI_Comm_split(comm_, color, key, &out));
    return owning(out);
  }
  // The members that share this one's host (MPI_COMM_TYPE_SHARED), ordered by `key`.
  Mpi split_by_host(int key) const {
    MPI_Comm out = MPI_COMM_NULL;
    DPML_CHECK_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, &out));
    return owning(out);
  }
  // Rank of this group's member `r` in MPI_COMM_WORLD.
  int world_rank_of(int r) const {
    MPI_Group mine, world;
    DPML_CHECK_MPI(MPI_Comm_group(comm_, &mine));
    DPML_CHECK_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
    int out = -1;
    DPML_CHECK_MPI(MPI_Group_translate_ranks(mine, 1, &r, world, &out));
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    return out;
  }

  // ---- non-blocking --------------------------------------------------------------------------
  Request ibarrier() const {
    MPI_Request r;
    DPML_CHECK_MPI(MPI_Ibarrier(comm_, &r));
    return Request(r, "barrier", comm_);
  }
  template <Reducible T>
  Request iallreduce(const T* send, T* recv, std::size_t n, ReduceOp op) const {
    MPI_Request r;
    DPML_CHECK_MPI(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, detail::to_int_count(n),
                                  MpiType<T>::get(), detail::mpi_op(op), comm_, &r));
    Request req(r, "allreduce", comm_);
    if (op == ReduceOp::avg) req.then([recv, n, s = size_] { divide(recv, n, s); });
    return req;
  }
  template <Reducible T>
  Request iallreduce(T* data, std::size_t n, ReduceOp op) const {
    return iallreduce(data, data, n, op);
  }
  template <class T>
  Request ibroadcast(T* data, std::size_t n, int root) const {
    MPI_Request r;
    DPML_CHECK_MPI(MPI_Ibcast(data, detail::to_int_count(n), MpiType<T>::get(), root, comm_, &r));
    return Request(r, "broadcast", comm_);
  }
  // recv holds size() blocks of `n`, rank order.
  template <class T>
  Request iallgather(const T* send, T* recv, std::size_t n) const {
    MPI_Request r;
    const bool in_place = send == recv + n * static_cast<std::size_t>(rank_);
    DPML_CHECK_MPI(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, detail::to_int_count(n), MpiType<T>::get(), recv,
                                  detail::to_int_count(n), MpiType<T>::get(), comm_, &r));
    return Request(r, "allgather", comm_);
  }
  template <class T>
  Request iallgatherv(const T* send, T* recv, std::span<const int> counts) const {
    std::vector<int> displs = displacements(counts);
    MPI_Request r;
    const bool in_place = send == recv + displs[static_cast<std::size_t>(rank_)];
    auto c = std::make_shared<std::vector<int>>(counts.begin(), counts.end());
    auto d = std::make_shared<std::vector<int>>(std::move(displs));
    DPML_CHECK_MPI(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send, (*c)[static_cast<std::size_t>(rank_)],
                                   MpiType<T>::get(), recv, c->data(), d->data(), MpiType<T>::get(), comm_, &r));
    Request req(r, "allgatherv", comm_);
    req.then([c, d] {});  // keep the count arrays alive until completion (MPI reads them late)
    return req;
  }
  // send holds size() blocks of `n`; recv gets this rank's reduced block. In place when
  // recv == send + rank() · n (the rest of send is then overwritten: MPI leaves the block at its start).
  template <Reducible T>
  Request ireduce_scatter(const T* send, T* recv, std::size_t n, ReduceOp op) const {
    const std::size_t at = n * static_cast<std::size_t>(rank_);
    MPI_Request r;
    DPML_CHECK_MPI(MPI_Ireduce_scatter_block(in_place_send(send, recv, at), in_place_recv(send, recv, at),
                                             detail::to_int_count(n), MpiType<T>::get(), detail::mpi_op(op), comm_, &r));
    Request req(r, "reduce_scatter", comm_);
    finish_reduce_scatter(req, send, recv, at, n, op);
    return req;
  }
  // Blocks of counts[r] elements in rank order; in place when recv == send + (the blocks before
  // this rank's), as ireduce_scatter.
  template <Reducible T>
  Request ireduce_scatterv(const T* send, T* recv, std::span<const int> counts, ReduceOp op) const {
    auto c = std::make_shared<std::vector<int>>(counts.begin(), counts.end());
    const std::size_t at = static_cast<std::size_t>(displacements(counts)[static_cast<std::size_t>(rank_)]);
    MPI_Request r;
    DPML_CHECK_MPI(MPI_Ireduce_scatter(in_place_send(send, recv, at), in_place_recv(send, recv, at), c->data(),
                                       MpiType<T>::get(), detail::mpi_op(op), comm_, &r));
    Request req(r, "reduce_scatterv", comm_);
    req.then([c] {});  // keep the count array alive until completion (MPI reads it late)
    finish_reduce_scatter(req, send, recv, at, static_cast<std::size_t>((*c)[static_cast<std::size_t>(rank_)]), op);
    return req;
  }
  // Block r of send (send_counts[r] elements, rank order) goes to rank r; recv gets block rank()
  // of every rank, in rank order (recv_counts[r] from rank r). Moves elements, reduces nothing.
  template <class T>
  Request ialltoallv(const T* send, std::span<const int> send_counts, T* recv, std::span<const int> recv_counts) const {
    auto sc = std::make_shared<std::vector<int>>(send_counts.begin(), send_counts.end());
    auto rc = std::make_shared<std::vector<int>>(recv_counts.begin(), recv_counts.end());
    auto sd = std::make_shared<std::vector<int>>(displacements(send_counts));
    auto rd = std::make_shared<std::vector<int>>(displacements(recv_counts));
    MPI_Request r;
    DPML_CHECK_MPI(MPI_Ialltoallv(send, sc->data(), sd->data(), MpiType<T>::get(), recv, rc->data(), rd->data(),
                                  MpiType<T>::get(), comm_, &r));
    Request req(r, "alltoallv", comm_);
    req.then([sc, rc, sd, rd] {});  // keep the count arrays alive until completion (MPI reads them late)
    return req;
  }
  template <class T>
  Request isend(const T* data, std::size_t n, int dest, int tag) const {
    MPI_Request r;
    DPML_CHECK_MPI(MPI_Isend(data, detail::to_int_count(n), MpiType<T>::get(), dest, tag, comm_, &r));
    return Request(r, "send", comm_, dest);
  }
  template <class T>
  Request irecv(T* data, std::size_t n, int source, int tag) const {
    MPI_Request r;
    DPML_CHECK_MPI(MPI_Irecv(data, detail::to_int_count(n), MpiType<T>::get(), source, tag, comm_, &r));
    return Request(r, "recv", comm_, source);
  }

  // ---- blocking (non-blocking + wait) -------------------------------------------------------------
  void barrier() const { ibarrier().wait(); }
  template <Reducible T>
  void allreduce(const T* send, T* recv, std::size_t n, ReduceOp op) const { iallreduce(send, recv, n, op).wait(); }
  template <Reducible T>
  void allreduce(T* data, std::size_t n, ReduceOp op) const { iallreduce(data, data, n, op).wait(); }
  template <Reducible T>
  T allreduce(T value, ReduceOp op) const {
    allreduce(&value, 1, op);
    return value;
  }
  template <class T>
  void broadcast(T* data, std::size_t n, int root) const { ibroadcast(data, n, root).wait(); }
  // Root's string, length and contents, on every rank.
  void broadcast(std::string& s, int root) const {
    std::uint64_t n = s.size();
    broadcast(&n, 1, root);
    s.resize(n);
    broadcast(s.data(), n, root);
  }
  template <class T>
  void allgather(const T* send, T* recv, std::size_t n) const { iallgather(send, recv, n).wait(); }
  // Every rank's string, on every rank, in rank order.
  std::vector<std::string> allgather(const std::string& mine) const {
    const int n = detail::to_int_count(mine.size());
    std::vector<int> counts(static_cast<std::size_t>(size()));
    allgather(&n, counts.data(), 1);
    std::size_t total = 0;
    for (int c : counts) total += static_cast<std::size_t>(c);
    std::string all(total, '\0');
    allgatherv(mine.data(), all.data(), counts);
    std::vector<std::string> out;
    std::size_t at = 0;
    for (int c : counts) {
      out.push_back(all.substr(at, static_cast<std::size_t>(c)));
      at += static_cast<std::size_t>(c);
    }
    return out;
  }
  template <class T>
  void allgatherv(const T* send, T* recv, std::span<const int> counts) const {
    iallgatherv(send, recv, counts).wait();
  }
  template <Reducible T>
  void reduce_scatter(const T* send, T* recv, std::size_t n, ReduceOp op) const {
    ireduce_scatter(send, recv, n, op).wait();
  }
  template <Reducible T>
  void reduce_scatterv(const T* send, T* recv, std::span<const int> counts, ReduceOp op) const {
    ireduce_scatterv(send, recv, counts, op).wait();
  }
  template <class T>
  void alltoallv(const T* send, std::span<const int> send_counts, T* recv, std::span<const int> recv_counts) const {
    ialltoallv(send, send_counts, recv, recv_counts).wait();
  }
  template <class T>
  void send(const T* data, std::size_t n, int dest, int tag) const { isend(data, n, dest, tag).wait(); }
  template <class T>
  void recv(T* data, std::size_t n, int source, int tag) const { irecv(data, n, source, tag).wait(); }

 private:
  static Mpi owning(MPI_Comm comm) {
    Mpi m(comm);
    m.owned_ = true;
    return m;
  }
  template <class T>
  static void divide(T* data, std::size_t n, int by) {
    for (std::size_t i = 0; i < n; ++i) data[i] /= static_cast<T>(by);
  }
  // A reduce-scatter whose block `recv` sits at element `at` of `send` is MPI_IN_PLACE on the whole
  // buffer (recv − at: writable, as recv is).
  template <class T>
  static const void* in_place_send(const T* send, const T* recv, std::size_t at) {
    return send + at == recv ? MPI_IN_PLACE : static_cast<const void*>(send);
  }
  template <class T>
  static T* in_place_recv(const T* send, T* recv, std::size_t at) {
    return send + at == recv ? recv - at : recv;
  }
  // After a reduce-scatter: an in-place block moves from the buffer's start to `recv`; an average divides.
  template <class T>
  void finish_reduce_scatter(Request& req, const T* send, T* recv, std::size_t at, std::size_t n, ReduceOp op) const {
    if (send + at == recv && at > 0) req.then([recv, at, n] { std::memmove(recv, recv - at, n * sizeof(T)); });
    if (op == ReduceOp::avg) req.then([recv, n, s = size_] { divide(recv, n, s); });
  }
  std::vector<int> displacements(std::span<const int> counts) const {
    DPML_REQUIRE(static_cast<int>(counts.size()) == size_, "need one count per rank: got " << counts.size()
                                                                                         << " for " << size_ << " ranks");
    std::vector<int> d(counts.size(), 0);
    for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
    return d;
  }
  void query() {
    if (comm_ == MPI_COMM_NULL) return;
    DPML_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
    DPML_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  }
  void free() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
    owned_ = false;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int rank_ = 0, size_ = 1;
};

// MPI_Init_thread / MPI_Finalize for the lifetime of main(). MPI_THREAD_SERIALIZED: background
// threads (data loader, checkpoint writer) never call MPI concurrently with the main thread.
class MpiSession {
 public:
  MpiSession(int& argc, char**& argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      DPML_CHECK_MPI(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided));
      owns_ = true;
    }
    dpml::detail::remember_world_rank();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    dpml::detail::forget_world_rank();
    if (owns_ && !finalized) MPI_Finalize();
  }
  Mpi world() const { return Mpi(MPI_COMM_WORLD); }

 private:
  bool owns_ = false;
};

static_assert(Communicator<Mpi>);

}  // namespace dpml::comm
