#pragma once
// Self: the communicator of a group of one rank. Every collective is a copy (or nothing), so code
// written against the Communicator concept runs without MPI in unit tests and one-process runs.

#include "dpml/comm/communicator.hpp"
#include "dpml/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <span>

namespace dpml::comm {

class Self {
 public:
  // Already complete: non-blocking calls finish immediately.
  struct Request {
    bool test() const noexcept { return true; }
    void wait() const noexcept {}
  };

  int rank() const noexcept { return 0; }
  int size() const noexcept { return 1; }

  void barrier() const noexcept {}
  template <class T>
  void allreduce(const T* send, T* recv, std::size_t n, ReduceOp) const { copy(send, recv, n); }
  template <class T>
  void allreduce(T*, std::size_t, ReduceOp) const noexcept {}
  template <class T>
  T allreduce(T value, ReduceOp) const noexcept { return value; }
  template <class T>
  void broadcast(T*, std::size_t, int root) const { check_peer(root); }
  template <class T>
  void allgather(const T* send, T* recv, std::size_t n) const { copy(send, recv, n); }
  template <class T>
  void allgatherv(const T* send, T* recv, std::span<const int> counts) const {
    DPML_REQUIRE(counts.size() == 1, "Self::allgatherv needs one count, got " << counts.size());
    copy(send, recv, static_cast<std::size_t>(counts[0]));
  }
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t n, ReduceOp) const { copy(send, recv, n); }
  template <class T>
  void reduce_scatterv(const T* send, T* recv, std::span<const int> counts, ReduceOp) const {
    allgatherv(send, recv, counts);
  }
  template <class T>
  void send(const T*, std::size_t, int dest, int) const {
    DPML_REQUIRE(false, "Self communicator: send to rank " << dest << " (a one-rank group has no peer)");
  }
  template <class T>
  void recv(T*, std::size_t, int source, int) const {
    DPML_REQUIRE(false, "Self communicator: recv from rank " << source << " (a one-rank group has no peer)");
  }
  template <class T>
  Request iallreduce(T*, std::size_t, ReduceOp) const noexcept { return {}; }
  template <class T>
  Request iallreduce(const T* send, T* recv, std::size_t n, ReduceOp op) const {
    allreduce(send, recv, n, op);
    return {};
  }

 private:
  template <class T>
  static void copy(const T* src, T* dst, std::size_t n) {
    if (src != dst) std::copy(src, src + n, dst);
  }
  static void check_peer(int r) { DPML_REQUIRE(r == 0, "Self communicator has only rank 0, asked for " << r); }
};

static_assert(Communicator<Self>);

}  // namespace dpml::comm
