#pragma once
// The Communicator concept: what the parallel layers need from a group of ranks. dpml::comm::Mpi
// (host buffers, any MPI), dpml::comm::Self (one rank, no library) and, in CUDA builds,
// dpml::comm::Nccl (device buffers) model it. Collectives are typed; reductions take a ReduceOp.
// Every collective has a non-blocking form returning a Request whose wait() completes it.
//
// Sizes: allgather and reduce_scatter move `count` elements per rank (equal blocks); the *_v forms
// take one count per rank, for sizes that do not divide.

#include <concepts>
#include <cstddef>
#include <span>

namespace dpml::comm {

enum class ReduceOp { sum, avg, max, min };

template <class C>
concept Communicator = requires(C& c, const C& cc, float* p, const float* cp, std::size_t n, int peer,
                                std::span<const int> counts) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.barrier();
  c.allreduce(cp, p, n, ReduceOp::sum);
  c.allreduce(p, n, ReduceOp::sum);  // in place
  c.broadcast(p, n, peer);
  c.allgather(cp, p, n);
  c.allgatherv(cp, p, counts);
  c.reduce_scatter(cp, p, n, ReduceOp::sum);
  c.reduce_scatterv(cp, p, counts, ReduceOp::sum);
  c.send(cp, n, peer, 0);
  c.recv(p, n, peer, 0);
  { c.iallreduce(p, n, ReduceOp::sum) };
};

// Element counts of `n` items split into `parts` blocks: the first n % parts get one more.
inline std::size_t block_count(std::size_t n, int parts, int index) {
  const std::size_t base = n / static_cast<std::size_t>(parts), extra = n % static_cast<std::size_t>(parts);
  return base + (static_cast<std::size_t>(index) < extra ? 1 : 0);
}
inline std::size_t block_offset(std::size_t n, int parts, int index) {
  const std::size_t base = n / static_cast<std::size_t>(parts), extra = n % static_cast<std::size_t>(parts);
  const std::size_t i = static_cast<std::size_t>(index);
  return i * base + (i < extra ? i : extra);
}

}  // namespace dpml::comm
