#pragma once
// comm::Hierarchical<Comm>: the data axis' reductions in two levels — inside a node, then across
// nodes — written once over any Communicator (comm::Mpi on the host, comm::Nccl on GPUs). On a
// cluster the links inside a node (shared memory, NVLink) are far faster than those between
// nodes; a flat all-reduce over all ranks sends every byte over the slow links from each rank,
// the two-level one only a node-size-th of it, from each rank of the node in parallel:
//
//   all-reduce of n   reduce-scatter inside the node (rank l of the node keeps block l of n/K,
//                     uneven n: the first n % K blocks one longer) → all-reduce of that block
//                     across nodes, between the ranks of equal node rank l → all-gather inside
//                     the node                                               (K = ranks per node)
//   reduce-scatter    (ZeRO-1) inside the node in place, then across nodes: rank (node m, l)
//                     ends with block l · nodes + m — so this communicator numbers its ranks
//                     l · nodes + m ("node rank major"), and the shards follow that order
//   all-gather        its inverse: across nodes, then inside the node (in place when send is
//                     recv + rank() · n)
//
// Nodes are the ranks of a group that share a host (MPI_COMM_TYPE_SHARED), or, to model a
// cluster on one host, consecutive ranks of the group by `ranks_per_node` (--ranks-per-node).
// Every node must hold as many ranks: otherwise every rank refuses, naming the sizes.
//
// Ordering. A stream communicator (a Comm with stream(): comm::Nccl) enqueues the three steps on
// one stream — the cross-node communicator shares the node one's — and returns: the stream orders
// them, the host never waits. On the host the i-forms return a Request; a collective's next step
// starts when its previous one has completed (Request::test/wait drive it), and the started
// collectives run one after another in the order they were started, the same on every rank, as
// MPI requires of the collectives of one communicator.
//
//   auto dp = comm::Hierarchical<comm::Mpi>::from(grid.comm(Axis::data), /*ranks_per_node=*/2);
//   auto r = dp.iallreduce(grads, n, comm::ReduceOp::sum);   …   r.wait();

#include "dpml/comm/communicator.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

namespace dpml::comm {

namespace detail {

// How a step calls Comm: Start — its non-blocking form, returning the request; Enqueue — its
// plain form (which a stream communicator enqueues and returns from at once).
struct Start {
  template <class C, class... A> auto reduce_scatterv(const C& c, A... a) const { return c.ireduce_scatterv(a...); }
  template <class C, class... A> auto reduce_scatter(const C& c, A... a) const { return c.ireduce_scatter(a...); }
  template <class C, class... A> auto allreduce(const C& c, A... a) const { return c.iallreduce(a...); }
  template <class C, class... A> auto allgatherv(const C& c, A... a) const { return c.iallgatherv(a...); }
  template <class C, class... A> auto allgather(const C& c, A... a) const { return c.iallgather(a...); }
};
struct Enqueue {
  template <class C, class... A> void reduce_scatterv(const C& c, A... a) const { c.reduce_scatterv(a...); }
  template <class C, class... A> void reduce_scatter(const C& c, A... a) const { c.reduce_scatter(a...); }
  template <class C, class... A> void allreduce(const C& c, A... a) const { c.allreduce(a...); }
  template <class C, class... A> void allgatherv(const C& c, A... a) const { c.allgatherv(a...); }
  template <class C, class... A> void allgather(const C& c, A... a) const { c.allgather(a...); }
};

// The started collectives of a host Hierarchical, each a list of steps, run one step at a time in
// the order they were pushed.
template <class Req>
class StepQueue {
 public:
  using Step = std::function<Req()>;

  // Queues a collective (its first step starts now if nothing runs); returns its ticket.
  std::uint64_t push(std::vector<Step> steps) {
    chains_.push_back(std::move(steps));
    if (chains_.size() == 1) start(0);
    return pushed_++;
  }
  // Drives the queue without blocking; true once collective `ticket` has completed.
  bool test(std::uint64_t ticket) {
    while (ticket >= finished_ && current_.test()) advance();
    return ticket < finished_;
  }
  void wait(std::uint64_t ticket) {
    while (ticket >= finished_) {
      current_.wait();
      advance();
    }
  }

 private:
  void start(std::size_t step) {
    next_ = step + 1;
    current_ = chains_.front()[step]();
  }
  // The running step completed: the next step of its collective, or the next collective's first.
  void advance() {
    if (next_ < chains_.front().size()) return start(next_);
    chains_.pop_front();
    ++finished_;
    if (!chains_.empty()) start(0);
  }

  std::deque<std::vector<Step>> chains_;
  Req current_;
  std::size_t next_ = 0;
  std::uint64_t pushed_ = 0, finished_ = 0;
};

}  // namespace detail

template <Communicator Comm>
class Hierarchical {
  static constexpr bool on_stream = requires(const Comm& c) { c.stream(); };
  // The started forms drive their steps from the host; a stream communicator takes the plain ones.
  // (Asserted in their bodies, not a requires-clause: nvcc 13's front end then fails to deduce T.)
  static constexpr void host_only() {
    static_assert(!on_stream, "dpml: comm::Hierarchical over a stream communicator: call the plain forms (enqueued, ordered by the stream)");
  }
  using CommRequest = decltype(std::declval<const Comm&>().iallreduce(static_cast<float*>(nullptr), 0, ReduceOp::sum));

  struct State {
    Comm node, cross;  // cross after node: on a stream communicator it enqueues on node's stream
    int nodes = 1, ranks_per_node = 1;
    detail::StepQueue<CommRequest> queue;
  };

 public:
  // A started host collective. Destroying a pending one waits for it (its peers need its steps).
  class Request {
   public:
    Request() = default;
    Request(std::shared_ptr<State> s, std::uint64_t ticket) : state_(std::move(s)), ticket_(ticket) {}
    Request(Request&& o) noexcept : state_(std::move(o.state_)), ticket_(o.ticket_) {}
    Request& operator=(Request&& o) noexcept {
      if (this != &o) {
        finish_noexcept();
        state_ = std::move(o.state_);
        ticket_ = o.ticket_;
      }
      return *this;
    }
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;
    ~Request() { finish_noexcept(); }

    bool test() {
      if (state_ && state_->queue.test(ticket_)) state_.reset();
      return !state_;
    }
    void wait() {
      if (!state_) return;
      state_->queue.wait(ticket_);
      state_.reset();
    }

   private:
    void finish_noexcept() noexcept {
      try {
        wait();
      } catch (...) {
      }
    }
    std::shared_ptr<State> state_;
    std::uint64_t ticket_ = 0;
  };

  // Collective over `group`. ranks_per_node > 0: consecutive ranks of `group` by that many form a
  // node (it must divide group.size(); ProcessGrid refuses a data axis it does not divide before
  // this); 0: the ranks sharing a host.
  static Hierarchical from(const Mpi& group, int ranks_per_node) {
    DPML_REQUIRE_EVERYWHERE(ranks_per_node >= 0 && (ranks_per_node == 0 || group.size() % ranks_per_node == 0),
                            "--ranks-per-node " << ranks_per_node << " does not divide the " << group.size()
                                                << " ranks of the hierarchical all-reduce's group");
    Mpi node = ranks_per_node > 0 ? group.split(group.rank() / ranks_per_node, group.rank())
                                  : group.split_by_host(group.rank());
    const int smallest = group.allreduce(node.size(), ReduceOp::min), largest = group.allreduce(node.size(), ReduceOp::max);
    DPML_REQUIRE_EVERYWHERE(smallest == largest,
                            "hierarchical all-reduce: the hosts of this launch hold between "
                                << smallest << " and " << largest << " of the group's " << group.size()
                                << " ranks; it needs as many on every host (launch evenly, or model nodes with "
                                   "--ranks-per-node)");
    Mpi cross = group.split(node.rank(), group.rank());
    if constexpr (std::same_as<Comm, Mpi>) {
      return Hierarchical(std::move(node), std::move(cross));
    } else {
      Comm n = Comm::from(node);
      Comm c = Comm::from(cross, n.stream());
      return Hierarchical(std::move(n), std::move(c));
    }
  }

  // Node rank major: rank() = node().rank() · nodes() + cross().rank() (see the top of the file).
  int rank() const noexcept { return s_->node.rank() * s_->nodes + s_->cross.rank(); }
  int size() const noexcept { return s_->nodes * s_->ranks_per_node; }
  int nodes() const noexcept { return s_->nodes; }
  int ranks_per_node() const noexcept { return s_->ranks_per_node; }
  const Comm& node() const noexcept { return s_->node; }    // this node's ranks
  const Comm& cross() const noexcept { return s_->cross; }  // the ranks of this node rank, one per node
  auto stream() const noexcept
    requires on_stream
  {
    return s_->node.stream();
  }

  // ---- collectives: plain forms (host: blocking; stream communicator: enqueued) ------------------
  // data (n) becomes the elementwise reduction over all ranks.
  template <class T>
  void allreduce(T* data, std::size_t n, ReduceOp op) const {
    std::apply([this](auto... s) { run(s...); }, allreduce_steps(data, n, op));
  }
  // data holds size() blocks of n and is overwritten (scratch of the first level); recv (n) gets
  // the reduction of block rank().
  template <class T>
  void reduce_scatter(T* data, T* recv, std::size_t n, ReduceOp op) const {
    std::apply([this](auto... s) { run(s...); }, reduce_scatter_steps(data, recv, n, op));
  }
  // recv holds size() blocks of n in rank() order; in place when send == recv + rank() · n.
  template <class T>
  void allgather(const T* send, T* recv, std::size_t n) const {
    std::apply([this](auto... s) { run(s...); }, allgather_steps(send, recv, n));
  }

  // ---- host communicators: the same, started ---------------------------------------------------
  template <class T>
  Request iallreduce(T* data, std::size_t n, ReduceOp op) const {
    host_only();
    return std::apply([this](auto... s) { return start(s...); }, allreduce_steps(data, n, op));
  }
  template <class T>
  Request ireduce_scatter(T* data, T* recv, std::size_t n, ReduceOp op) const {
    host_only();
    return std::apply([this](auto... s) { return start(s...); }, reduce_scatter_steps(data, recv, n, op));
  }
  template <class T>
  Request iallgather(const T* send, T* recv, std::size_t n) const {
    host_only();
    return std::apply([this](auto... s) { return start(s...); }, allgather_steps(send, recv, n));
  }

 private:
  Hierarchical(Comm node, Comm cross) : s_(std::make_shared<State>(State{std::move(node), std::move(cross)})) {
    s_->nodes = s_->cross.size();
    s_->ranks_per_node = s_->node.size();
  }

  // Each step is a callable of a form (detail::Start or detail::Enqueue) making one of Comm's calls.
  template <class T>
  auto allreduce_steps(T* data, std::size_t n, ReduceOp op) const {
    const int k = s_->ranks_per_node, l = s_->node.rank();
    auto counts = std::make_shared<std::vector<int>>();
    for (int i = 0; i < k; ++i) counts->push_back(static_cast<int>(block_count(n, k, i)));
    T* mine = data + block_offset(n, k, l);
    const std::size_t m = block_count(n, k, l);
    const Comm *node = &s_->node, *cross = &s_->cross;
    return std::tuple(
        [=](auto form) { return form.reduce_scatterv(*node, static_cast<const T*>(data), mine, std::span<const int>(*counts), op); },
        [=](auto form) { return form.allreduce(*cross, mine, m, op); },
        [=](auto form) { return form.allgatherv(*node, static_cast<const T*>(mine), data, std::span<const int>(*counts)); });
  }
  template <class T>
  auto reduce_scatter_steps(T* data, T* recv, std::size_t n, ReduceOp op) const {
    const std::size_t part = n * static_cast<std::size_t>(s_->nodes);  // a node rank's blocks
    T* mine = data + part * static_cast<std::size_t>(s_->node.rank());
    const Comm *node = &s_->node, *cross = &s_->cross;
    return std::tuple([=](auto form) { return form.reduce_scatter(*node, static_cast<const T*>(data), mine, part, op); },
                      [=](auto form) { return form.reduce_scatter(*cross, static_cast<const T*>(mine), recv, n, op); });
  }
  template <class T>
  auto allgather_steps(const T* send, T* recv, std::size_t n) const {
    const std::size_t part = n * static_cast<std::size_t>(s_->nodes);
    T* mine = recv + part * static_cast<std::size_t>(s_->node.rank());
    const Comm *node = &s_->node, *cross = &s_->cross;
    return std::tuple([=](auto form) { return form.allgather(*cross, send, mine, n); },
                      [=](auto form) { return form.allgather(*node, static_cast<const T*>(mine), recv, part); });
  }

  template <class... Steps>
  void run(Steps... steps) const {
    if constexpr (on_stream) (steps(detail::Enqueue{}), ...);
    else start(steps...).wait();
  }
  template <class... Steps>
  Request start(Steps... steps) const {
    return Request(s_, s_->queue.push({[steps] { return steps(detail::Start{}); }...}));
  }

  std::shared_ptr<State> s_;
};

template <class C>
inline constexpr bool is_hierarchical = false;
template <class Comm>
inline constexpr bool is_hierarchical<Hierarchical<Comm>> = true;

}  // namespace dpml::comm
