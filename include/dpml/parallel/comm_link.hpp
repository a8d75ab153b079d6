#pragma once
// CommLink<Comm, Space>: how the parallel runtime (gradient buckets, ZeRO's all-gather, the global
// gradient norm) issues its collectives on a communicator, and orders them against the compute
// work of a kernels::Device. Written once per kind of communicator, so that the runtime above it
// is written once for both memory spaces:
//
//   host (comm::Mpi, comm::Hierarchical<comm::Mpi>)
//                          a collective is a non-blocking MPI call started in program order; its
//                          Pending is the communicator's request (test() lets MPICH progress,
//                          wait() ends it); join() has nothing to do
//   device (a communicator with a stream: comm::Nccl, comm::Staged, comm::CopyEngine —
//           parallel/cuda_comm_link.hpp)
//                          a collective is enqueued on the communicator's stream after that
//                          stream waits on an event recorded on the compute stream (it acts on
//                          what compute has produced so far); its Pending is empty; join() makes
//                          the compute stream wait for everything enqueued: no host
//                          synchronisation anywhere
//
//   auto p = link.allreduce(grads, n);   // start
//   p.wait(); link.join();               // the result is visible to what runs next on this space
//
// A Fence marks the communicator's position after one collective (mark), so that compute can
// later wait for that one alone (join(fence)), not for what was enqueued after it: ZeRO-3's
// prefetched gather, waited for when its bucket is read while later reductions still run.
//
// Reductions sum (the runtime's one gradient convention: losses divide by the global batch).

#include "dpml/comm/communicator.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/memory_space.hpp"
#include "dpml/kernels/device.hpp"

#include <cstddef>

namespace dpml::parallel {

// A communicator whose collectives are enqueued on a stream (device buffers).
template <class C>
concept StreamCommunicator = requires(const C& c) { c.stream(); };

template <class Comm, class Space>
class CommLink {
  static_assert(Space::host_accessible && !StreamCommunicator<Comm>,
                "dpml: CommLink: device buffers need a communicator with a stream (comm::Nccl, comm::Staged, "
                "comm::CopyEngine) and a CUDA translation unit");

 public:
  using Pending = typename Comm::Request;

  CommLink(kernels::Device<Space>&, const Comm& comm) : comm_(&comm) {}

  const Comm& comm() const noexcept { return *comm_; }
  template <class T>
  Pending allreduce(T* data, std::size_t n) {
    return comm_->iallreduce(data, n, comm::ReduceOp::sum);
  }
  // send holds size() blocks of n, and may be overwritten (comm::Hierarchical's scratch); recv (n)
  // gets this rank's summed block.
  template <class T>
  Pending reduce_scatter(T* send, T* recv, std::size_t n) {
    return comm_->ireduce_scatter(send, recv, n, comm::ReduceOp::sum);
  }
  // recv holds size() blocks of n, rank order; in place when send == recv + rank() · n.
  template <class T>
  Pending allgather(const T* send, T* recv, std::size_t n) {
    return comm_->iallgather(send, recv, n);
  }
  void join() {}
  struct Fence {};  // the host waits on each collective's Pending instead
  void mark(Fence&) {}
  void join(const Fence&) {}

 private:
  const Comm* comm_;
};

}  // namespace dpml::parallel

#if defined(__CUDACC__)
#include "dpml/parallel/cuda_comm_link.hpp"
#endif
