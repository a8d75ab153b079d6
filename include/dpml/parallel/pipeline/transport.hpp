#pragma once
// How the pipeline executor (executor.hpp) moves a stage's messages: a transport policy. The
// executor walks the table and calls
//
//   post_recv(flow, data, n, mb, c)  RecvForward / RecvBackward: mb's message will land in data (n)
//   post_send(flow, data, n, mb, c)  SendForward / SendBackward: data (n) holds mb's message
//   wait_recv(flow, mb, c)         before the F / B that reads the message
//   wait_send(flow, mb, c)         before the stage may write a sent buffer again (F's output, at B)
//   finish()                       the step's end: every send complete
//   abandon()                      a stage threw: let go of what is pending without waiting
//   pending_receives()             receives posted and not yet waited for
//   rank(), size(), chunks()       this rank, the pipeline's ranks p, the model chunks v per rank
//
// c is the action's chunk (0 unless interleaved). Flow::forward carries activations from virtual
// stage k = c·p + rank to k + 1, Flow::backward their gradients from k + 1 to k: between ranks
// r and r ± 1 mod p (route() below; without interleaving stage s and s ± 1). Two transports:
//
//   MpiTransport<T>            host buffers over comm::Mpi: isend / irecv when posted, waits on
//                              the host. Every message travels at once, so the transfers overlap
//                              the compute actions between a post and its wait; a send completes
//                              at wait_send or finish() — until then the stage leaves the buffer
//                              alone.
//   BatchedTransport<T, L>     for communicators whose point-to-point calls rendezvous (NCCL: a
//                              send waits for its receive; comm::Staged: the call returns once
//                              done): messages go out in batches (P2pBatcher below) that a
//                              launcher L runs — StreamLauncher (stream_transport.hpp) on
//                              a communication stream ordered against the compute stream
//                              by CUDA events, the recording launcher of
//                              tests/pipeline/test_transport.cpp on paper.
//
// P2pBatcher: why and how. A rendezvous transport that posts each message alone, in table order,
// deadlocks: under 1F1B stage 0 posts "receive the gradient of mb 0" one action before B0, while
// stage 1, having run F0 B0, posts "receive the activation of mb 1" before it sends that gradient
// — each waits for the other. The batcher holds sends and receives back and launches them only
// where the executor waits: wait_recv(mb) launches one batch (one group(): ncclGroupStart/End)
// of every send still held plus that receive, wait_send launches the held sends, finish() the
// rest. Where the two directions meet, they are in one group — 1F1B's steady state becomes
// Megatron's send_forward_recv_backward and send_backward_recv_forward. Messages between two
// stages still match in posting order (check_schedule: each direction is sent in the order it is
// received). tests/pipeline/test_transport.cpp replays the batches of GPipe, 1F1B and ZB-H1 on
// up to 8 stages and 16 micro-batches under rendezvous semantics: none deadlocks (and the
// one-message-at-a-time transport does).
//
// A BatchedTransport send completes before the next action that reads a received message (its
// batch is launched there, and that action waits for the batch), or at finish().
//
// Groups alike on both sides. The stages' batches differ — GPipe's stage 0 launches its four
// activation sends and a gradient receive in one batch, stage 1 receives each activation in a
// batch of its own — and NCCL leaves undefined what point-to-point calls do where two ranks group
// them differently (NVIDIA/nccl#1279). With NCCL 2.28.3 on 2×H200 and 2×H100 they failed ("Message
// truncated", internal error) or hung with both GPUs in ncclDevKernel_SendRecv (bench/RESULTS.md,
// 2026-11-26). So, given PeerBatches (the neighbours' batch of each message's match: peer_batches()
// in pipeline/peer_batches.hpp, from the whole table), BatchedTransport launches a batch in rounds:
// round k holds, for each neighbour, the messages whose matches lie in the k-th of the neighbour's
// batches this batch meets. The neighbour splits its batch the same way, so every group holds, per
// neighbour, exactly the messages of one group of that neighbour, in the same order on both sides
// (peer_batches() checks that such an order exists).
//
// One order for the interleaved table. Its batches cross (the last rank sends to the first, and
// the neighbours' batch indices go down along a stage's batches), so no rounds exist. Given a
// MessageOrder instead (message_order() in pipeline/peer_batches.hpp), BatchedTransport launches
// each message as a group of its own, in one global order that every rank derives from the whole
// table: a replay of all ranks' transport calls in which a wait blocks until the other end posted,
// each message timed by the later of its two posts. By a wait for message m, this rank has
// launched its messages up to m in that order: all of them are posted by then (their posts come
// before the wait in the replay, hence in the rank's table). Why it cannot deadlock: a group's
// compute-side dependencies (the marks of its posts) wait only for messages earlier in the order,
// and every rank's groups run in that order, so the earliest message not yet done always has both
// ends started. The messages go out as soon as they and all before them are posted, not at the waits:
// a host may block between a post and its wait (the trainer's first step learns the message
// shapes over MPI; NCCL connects two peers on their first message; comm::Staged's calls return
// once matched), and its peers may need what it posted before. tests/pipeline/test_transport.cpp
// replays it for p ≤ 8, v ≤ 4.

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

namespace dpml::parallel::pipeline {

enum class Flow { forward, backward };

inline const char* flow_name(Flow f) { return f == Flow::forward ? "activation" : "gradient"; }
// The stage a message of `flow` goes to (sending) or comes from (receiving), seen from `stage`
// (one chunk per rank; route() for any).
inline int peer_of(Flow flow, bool sending, int stage) { return stage + ((flow == Flow::forward) == sending ? 1 : -1); }
// Tags keep messages of different micro-batches apart where the transport has tags (MPI).
inline int tag_of(Flow flow, int mb) { return 2 * mb + (flow == Flow::backward ? 1 : 0); }

// Where a message of chunk `chunk` on rank `rank` goes (sending) or comes from (receiving), on
// `ranks` ranks of `chunks` chunks (virtual stage k = chunk·ranks + rank talks to k ± 1): the
// rank and chunk at the other end, and a tag both ends compute alike — from the flow, the
// micro-batch and the boundary crossed (between virtual stages low and low + 1; two boundaries
// between the same ranks differ in low / ranks). With one chunk: peer_of and tag_of.
struct Route {
  int peer, peer_chunk, tag;
};
inline Route route(Flow flow, bool sending, int rank, int chunk, int mb, int ranks, int chunks) {
  const bool up = (flow == Flow::forward) == sending;  // towards virtual stage k + 1
  const int k = chunk * ranks + rank, far = up ? k + 1 : k - 1, low = std::min(k, far);
  const int wrapped = (far % ranks + ranks) % ranks;  // a far end outside the pipeline: a table not checked
  return {wrapped, (far - wrapped) / ranks, tag_of(flow, mb * chunks + low / ranks)};
}

// ---- host transport ----------------------------------------------------------------------------

template <class T>
class MpiTransport {
 public:
  // `pipe`: the pipeline-axis communicator; its rank is the stage index. `chunks`: model chunks per
  // rank (the interleaved schedule's v).
  explicit MpiTransport(const comm::Mpi& pipe, int chunks = 1) : pipe_(pipe), chunks_(chunks) {}
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  int rank() const noexcept { return pipe_.rank(); }
  int size() const noexcept { return pipe_.size(); }
  int chunks() const noexcept { return chunks_; }

  void post_recv(Flow f, T* data, std::size_t n, int mb, int chunk = 0) {
    const Route r = route(f, false, rank(), chunk, mb, size(), chunks_);
    recvs_.emplace(Key{f, chunk, mb}, pipe_.irecv(data, n, r.peer, r.tag));
  }
  void post_send(Flow f, const T* data, std::size_t n, int mb, int chunk = 0) {
    const Route r = route(f, true, rank(), chunk, mb, size(), chunks_);
    sends_.emplace(Key{f, chunk, mb}, pipe_.isend(data, n, r.peer, r.tag));
  }
  void wait_recv(Flow f, int mb, int chunk = 0) {
    auto it = recvs_.find({f, chunk, mb});
    DPML_REQUIRE(it != recvs_.end(), "pipeline stage " << rank() << ": the " << flow_name(f) << " of micro-batch " << mb << " (chunk "
                                                      << chunk << ") needed before its receive was posted (schedule not checked?)");
    it->second.wait();
    recvs_.erase(it);
  }
  void wait_send(Flow f, int mb, int chunk = 0) {
    if (auto it = sends_.find({f, chunk, mb}); it != sends_.end()) {
      it->second.wait();
      sends_.erase(it);
    }
  }
  void finish() {
    for (auto& [key, r] : sends_) r.wait();
    sends_.clear();
  }
  // A stage that throws leaves receives posted that no neighbour will ever match; comm::Request
  // waits in its destructor, so unwinding would hang before dpml::run could abort the job. On
  // that path the pending requests are deliberately leaked (the job is about to end).
  void abandon() noexcept {
    auto* leaked = new std::vector<comm::Request>;
    for (auto* m : {&recvs_, &sends_})
      for (auto& [key, r] : *m) leaked->push_back(std::move(r));
    recvs_.clear();
    sends_.clear();
  }
  std::size_t pending_receives() const noexcept { return recvs_.size(); }

 private:
  using Key = std::tuple<Flow, int, int>;  // (flow, chunk, micro-batch)
  const comm::Mpi& pipe_;
  int chunks_;
  std::map<Key, comm::Request> recvs_, sends_;
};

// ---- batching for rendezvous transports ---------------------------------------------------------

// One message a stage posted; Payload: what the transport needs to launch it (buffer, size, …).
struct Message {
  Flow flow;
  int micro_batch;
  bool send;
  int chunk = 0;  // the posting rank's chunk
  friend bool operator==(const Message&, const Message&) = default;
};

using MessageKey = std::tuple<int, int, int, bool>;  // (flow, chunk, micro-batch, send)
inline MessageKey key_of(Message m) { return {static_cast<int>(m.flow), m.chunk, m.micro_batch, m.send}; }

// For each message of a stage: the index (launch order, from 0) of the neighbour's batch that
// carries its match — the receive of a send, the send of a receive.
using PeerBatches = std::map<MessageKey, int>;

// A rank's messages of one step in the order all ranks launch them (message_order()).
using MessageOrder = std::vector<Message>;

template <class Payload>
class P2pBatcher {
 public:
  struct Entry {
    Message message;
    Payload payload;
  };
  using Batch = std::vector<Entry>;  // launched together, in this order

  void post(Message m, Payload p) { held_.push_back({m, std::move(p)}); }
  bool held(Message m) const { return find(m) != held_.end(); }
  // Held message m alone (it must be held).
  Batch take(Message m) {
    auto it = find(m);
    DPML_REQUIRE(it != held_.end(), "pipeline: the " << flow_name(m.flow) << " of micro-batch " << m.micro_batch << " (chunk " << m.chunk
                                                     << (m.send ? ") is to be sent" : ") is to be received")
                                                     << " before it was posted (the message order does not fit the table)");
    Batch b{std::move(*it)};
    held_.erase(it);
    return b;
  }
  std::size_t held_receives() const {
    return static_cast<std::size_t>(std::count_if(held_.begin(), held_.end(), [](const Entry& e) { return !e.message.send; }));
  }

  // Before the compute action that reads received message `m`: every held send, then `m` (empty
  // when `m` is not held: launched already).
  Batch for_receive(Message m) {
    auto it = find(m);
    if (it == held_.end()) return {};
    Entry wanted = std::move(*it);
    held_.erase(it);
    Batch b = take_sends();
    b.push_back(std::move(wanted));
    return b;
  }
  // Every held send (before a sent buffer is written again, and at the step's end).
  Batch take_sends() {
    Batch sends;
    std::vector<Entry> receives;
    for (auto& e : held_) (e.message.send ? sends : receives).push_back(std::move(e));
    held_ = std::move(receives);
    return sends;
  }
  void clear() noexcept { held_.clear(); }

 private:
  typename std::vector<Entry>::const_iterator find(Message m) const {
    return std::find_if(held_.begin(), held_.end(), [&](const Entry& e) { return e.message == m; });
  }
  typename std::vector<Entry>::iterator find(Message m) {
    return std::find_if(held_.begin(), held_.end(), [&](const Entry& e) { return e.message == m; });
  }
  std::vector<Entry> held_;  // in posting order
};

// A transport that launches its messages in P2pBatcher's batches. The Launcher runs them:
//
//   using Mark = …;                  what a post remembers of the compute order (e.g. an event)
//   Mark mark();                     at each post: "the data / the buffer is ready after this"
//   void launch(const Batch&);       the batch's messages as one group, after the latest mark
//   bool launched(Message) const;    launched this step
//   void wait(Message);              the compute order waits for the batch that carried it
//   void wait_all();                 … for every batch of the step; the step's records end
//   int rank() const, size() const;  the pipeline-axis communicator's
template <class T, class Launcher>
class BatchedTransport {
 public:
  struct Payload {
    const T* send;  // (n) for a send
    T* recv;        // (n) for a receive
    std::size_t n;
    typename Launcher::Mark mark;
    Route route;    // the peer and the tag
  };
  using Batch = typename P2pBatcher<Payload>::Batch;

  // Without PeerBatches each batch is one group (a launcher that records batches, on paper).
  // `chunks`: model chunks per rank (the interleaved schedule's v).
  explicit BatchedTransport(Launcher launcher, PeerBatches peer_batches = {}, int chunks = 1)
      : launcher_(std::move(launcher)), peer_batches_(std::move(peer_batches)), chunks_(chunks) {}
  // Each message a group of its own, in `order` (the interleaved schedule; see the header comment),
  // which must outlive the transport's use of it.
  BatchedTransport(Launcher launcher, const MessageOrder* order, int chunks)
      : launcher_(std::move(launcher)), order_(order), chunks_(chunks) {}

  // The order of the table the executor runs next (a trainer's step, its evaluation and its
  // probe each have one), or nullptr for PeerBatches' rounds. Between steps only.
  void follow(const MessageOrder* order) {
    DPML_REQUIRE(next_ == 0 && batcher_.held_receives() == 0, "pipeline: a transport's message order changed inside a step");
    order_ = order;
  }

  int rank() const noexcept { return launcher_.rank(); }
  int size() const noexcept { return launcher_.size(); }
  int chunks() const noexcept { return chunks_; }

  void post_recv(Flow f, T* data, std::size_t n, int mb, int chunk = 0) {
    batcher_.post({f, mb, false, chunk}, {nullptr, data, n, launcher_.mark(), route(f, false, rank(), chunk, mb, size(), chunks_)});
    if (order_) launch_posted();
  }
  void post_send(Flow f, const T* data, std::size_t n, int mb, int chunk = 0) {
    batcher_.post({f, mb, true, chunk}, {data, nullptr, n, launcher_.mark(), route(f, true, rank(), chunk, mb, size(), chunks_)});
    if (order_) launch_posted();
  }
  void wait_recv(Flow f, int mb, int chunk = 0) {
    const Message m{f, mb, false, chunk};
    DPML_REQUIRE(batcher_.held(m) || launcher_.launched(m), "pipeline stage " << rank() << ": the " << flow_name(f) << " of micro-batch " << mb
                                                                              << " (chunk " << chunk
                                                                              << ") needed before its receive was posted (schedule not checked?)");
    if (order_) require_launched(m);
    else launch(batcher_.for_receive(m));
    launcher_.wait(m);
  }
  void wait_send(Flow f, int mb, int chunk = 0) {
    const Message m{f, mb, true, chunk};
    if (batcher_.held(m)) {
      if (order_) require_launched(m);
      else launch(batcher_.take_sends());
    }
    if (launcher_.launched(m)) launcher_.wait(m);
  }
  void finish() {
    if (order_) {
      DPML_REQUIRE(next_ == order_->size(), "pipeline stage " << rank() << ": the step ended with "
                                                               << order_->size() - next_
                                                               << " messages of its order not posted (the order does not fit the table)");
      next_ = 0;
    } else {
      launch(batcher_.take_sends());
    }
    launcher_.wait_all();
  }
  void abandon() noexcept { batcher_.clear(); }
  std::size_t pending_receives() const { return batcher_.held_receives(); }
  const Launcher& launcher() const noexcept { return launcher_; }

 private:
  // The batch in rounds (see the header comment): entries keyed by (neighbour, the neighbour's
  // batch) — the ranks r ± 1 mod p, one rank for both sides when p = 2 —; round k takes the k-th
  // key of each neighbour, the lower rank first.
  void launch(Batch b) {
    if (b.empty()) return;
    if (peer_batches_.empty()) return launcher_.launch(b);
    std::map<int, std::map<int, Batch>> sides;
    for (auto& e : b) {
      const auto at = peer_batches_.find(key_of(e.message));
      DPML_REQUIRE(at != peer_batches_.end(), "pipeline stage " << rank() << ": no neighbour's batch carries the match of the "
                                                                << flow_name(e.message.flow) << " of micro-batch " << e.message.micro_batch);
      sides[e.payload.route.peer][at->second].push_back(std::move(e));
    }
    std::vector<std::pair<typename std::map<int, Batch>::iterator, typename std::map<int, Batch>::iterator>> next;
    for (auto& [peer, batches] : sides) next.emplace_back(batches.begin(), batches.end());
    for (bool more = true; more;) {
      Batch round;
      more = false;
      for (auto& [it, end] : next)
        if (it != end) {
          for (auto& e : it->second) round.push_back(std::move(e));
          more = ++it != end || more;
        }
      launcher_.launch(round);
    }
  }
  // With a MessageOrder: as soon as the next messages of the order are posted, each alone — so a
  // host that blocks elsewhere (the probe's shape exchange over MPI, NCCL connecting two peers on
  // their first message, comm::Staged's calls) has launched everything its peers may wait for.
  void launch_posted() {
    while (next_ < order_->size() && batcher_.held((*order_)[next_])) launcher_.launch(batcher_.take((*order_)[next_++]));
  }
  // … so that a wait finds its message launched (else the order does not fit the table).
  void require_launched(Message m) const {
    DPML_REQUIRE(!batcher_.held(m), "pipeline stage " << rank() << ": the " << flow_name(m.flow) << " of micro-batch " << m.micro_batch
                                                      << " (chunk " << m.chunk
                                                      << ") is waited for before the messages ahead of it in the order were posted "
                                                         "(the order does not fit the table)");
  }

  Launcher launcher_;
  PeerBatches peer_batches_;
  const MessageOrder* order_ = nullptr;
  std::size_t next_ = 0;  // order_: the first message not launched this step
  int chunks_;
  P2pBatcher<Payload> batcher_;
};

}  // namespace dpml::parallel::pipeline
