#pragma once
// comm::Staged: a Communicator for device buffers over any MPI, through host memory — what gloo
// does for CUDA tensors. Every call copies its device input to the host, runs the MPI operation
// there and copies the result back, so it is far slower than NCCL; but it needs neither NCCL nor
// a GPU per rank: several ranks may share one GPU. dpml uses it to run the multi-rank GPU tests
// (data, tensor and pipeline parallel models, synchronised BatchNorm) on a machine with one GPU,
// and it serves machines without NCCL. The parallel GPU code is written against the members it
// shares with comm::Nccl, as a `Comm` template parameter.
//
// Ordering is comm::Nccl's: a call acts on what the communicator's stream has run before it, and
// the stream's later work sees its result. Unlike NCCL the call returns only once that is done:
// it synchronises the stream (so it also waits for the events the stream waits on). The i-forms
// therefore return a request that is already complete.
//
// 16-bit floating types (bf16, __half) are reduced in fp32 on the host and rounded once (NCCL
// also adds them in fp32; for two ranks the results agree bit for bit). Point-to-point messages
// match in posting order, as NCCL's do (tags are ignored). Inside group(), sends and receives are
// posted without blocking and completed when the group ends, so a ring's paired send/recv cannot
// deadlock — the role of ncclGroupStart/End.
//
//   comm::Staged tp = comm::Staged::from(grid.comm(Axis::tensor), model.stream());
//   tp.allreduce(partial, n, ReduceOp::sum);   // same call as on a comm::Nccl

#include "dpml/comm/communicator.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/bf16.hpp"
#include "dpml/core/cuda_error.hpp"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpml::comm {

namespace detail {

// Element types MPI cannot add, reduced as float.
template <class T>
inline constexpr bool widened_on_host = std::is_same_v<T, bf16> || std::is_same_v<T, __half>;

struct StagedState {
  Mpi group;
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  int group_depth = 0;
  struct PendingRecv {
    void* device;
    std::vector<char> host;
  };
  std::vector<Request> requests;                 // of the open group
  std::vector<std::vector<char>> send_buffers;   // staged sends of the open group
  std::vector<PendingRecv> recvs;                // staged receives of the open group

  StagedState(Mpi g, cudaStream_t s, bool owns) : group(std::move(g)), stream(s), owns_stream(owns) {}
  StagedState(const StagedState&) = delete;
  StagedState& operator=(const StagedState&) = delete;
  ~StagedState() {
    if (owns_stream && stream) cudaStreamDestroy(stream);
  }
};

}  // namespace detail

// An already completed request (the staged calls are synchronous).
struct StagedRequest {
  void wait() const noexcept {}
  bool test() const noexcept { return true; }
};

class Staged {
 public:
  // Collective over `group`: a communicator over its members (a duplicate of it, so it may
  // outlive `group`), enqueuing on `stream`, which must outlive it.
  static Staged from(const Mpi& group, cudaStream_t stream) { return Staged(group, stream, false); }
  // The same on a stream of its own.
  static Staged from(const Mpi& group) {
    cudaStream_t s = nullptr;
    DPML_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return Staged(group, s, true);
  }

  Staged(Staged&&) noexcept = default;
  Staged& operator=(Staged&&) noexcept = default;
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;

  int rank() const noexcept { return state_->group.rank(); }
  int size() const noexcept { return state_->group.size(); }
  cudaStream_t stream() const noexcept { return state_->stream; }
  const Mpi& host() const noexcept { return state_->group; }

  // Sends and receives made during its lifetime complete at its end (ncclGroupStart/End).
  class Group {
   public:
    explicit Group(detail::StagedState* s) : s_(s) { ++s_->group_depth; }
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;
    ~Group() noexcept(false) {
      if (--s_->group_depth > 0) return;
      auto requests = std::exchange(s_->requests, {});
      auto recvs = std::exchange(s_->recvs, {});
      const auto sends = std::exchange(s_->send_buffers, {});  // read by the Isends: kept until they end
      for (Request& r : requests) r.wait();
      for (auto& r : recvs)
        DPML_CHECK_CUDA(cudaMemcpyAsync(r.device, r.host.data(), r.host.size(), cudaMemcpyHostToDevice, s_->stream));
      DPML_CHECK_CUDA(cudaStreamSynchronize(s_->stream));
    }

   private:
    detail::StagedState* s_;
  };
  [[nodiscard]] Group group() const { return Group(state_.get()); }

  // ---- collectives (ordered on stream(); return when done) --------------------------------------
  template <class T>
  void allreduce(const T* send, T* recv, std::size_t n, ReduceOp op) const {
    auto h = to_host(send, n);
    reduce_on_host(h, op, [&](auto* data, std::size_t count) { host().allreduce(data, count, op); });
    to_device(h, recv);
  }
  template <class T>
  void allreduce(T* data, std::size_t n, ReduceOp op) const { allreduce(data, data, n, op); }
  template <class T>
  void broadcast(const T* send, T* recv, std::size_t n, int root) const {
    std::vector<T> h = rank() == root ? to_host(send, n) : std::vector<T>(n);
    host().broadcast(bytes(h), n * sizeof(T), root);
    to_device(h, recv);
  }
  template <class T>
  void broadcast(T* data, std::size_t n, int root) const { broadcast(data, data, n, root); }
  template <class T>
  void allgather(const T* send, T* recv, std::size_t n) const {
    const auto mine = to_host(send, n);
    std::vector<T> all(n * static_cast<std::size_t>(size()));
    host().allgather(reinterpret_cast<const char*>(mine.data()), bytes(all), n * sizeof(T));
    to_device(all, recv);
  }
  template <class T>
  void allgatherv(const T* send, T* recv, std::span<const int> counts) const {
    const auto mine = to_host(send, static_cast<std::size_t>(counts[static_cast<std::size_t>(rank())]));
    std::vector<int> byte_counts(counts.begin(), counts.end());
    std::size_t total = 0;
    for (int& c : byte_counts) {
      total += static_cast<std::size_t>(c);
      c *= static_cast<int>(sizeof(T));
    }
    std::vector<T> all(total);
    host().allgatherv(reinterpret_cast<const char*>(mine.data()), bytes(all), std::span<const int>(byte_counts));
    to_device(all, recv);
  }
  // recv (n) = this rank's block of the reduction of send (size()·n); in place when
  // recv == send + rank()·n, as NCCL allows.
  template <class T>
  void reduce_scatter(const T* send, T* recv, std::size_t n, ReduceOp op) const {
    const std::vector<int> counts(static_cast<std::size_t>(size()), static_cast<int>(n));
    reduce_scatterv(send, recv, std::span<const int>(counts), op);
  }
  template <class T>
  void reduce_scatterv(const T* send, T* recv, std::span<const int> counts, ReduceOp op) const {
    std::size_t total = 0, offset = 0;
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) offset = total;
      total += static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]);
    }
    auto h = to_host(send, total);
    reduce_on_host(h, op, [&](auto* data, std::size_t count) { host().allreduce(data, count, op); });
    const std::size_t mine = static_cast<std::size_t>(counts[static_cast<std::size_t>(rank())]);
    to_device(std::vector<T>(h.begin() + static_cast<std::ptrdiff_t>(offset),
                             h.begin() + static_cast<std::ptrdiff_t>(offset + mine)),
              recv);
  }
  template <class T>
  void send(const T* data, std::size_t n, int peer, int /*tag*/) const {
    auto h = to_host(data, n);
    std::vector<char> raw(reinterpret_cast<const char*>(h.data()), reinterpret_cast<const char*>(h.data()) + n * sizeof(T));
    if (state_->group_depth == 0) {
      host().send(raw.data(), raw.size(), peer, 0);
      return;
    }
    state_->send_buffers.push_back(std::move(raw));
    const auto& b = state_->send_buffers.back();
    state_->requests.push_back(host().isend(b.data(), b.size(), peer, 0));
  }
  template <class T>
  void recv(T* data, std::size_t n, int peer, int /*tag*/) const {
    if (state_->group_depth == 0) {
      std::vector<T> h(n);
      host().recv(bytes(h), n * sizeof(T), peer, 0);
      to_device(h, data);
      return;
    }
    state_->recvs.push_back({data, std::vector<char>(n * sizeof(T))});
    auto& r = state_->recvs.back();
    state_->requests.push_back(host().irecv(r.host.data(), r.host.size(), peer, 0));
  }
  void barrier() const {
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream()));
    host().barrier();
  }

  // The non-blocking forms: already complete on return.
  template <class T>
  StagedRequest iallreduce(T* data, std::size_t n, ReduceOp op) const { return allreduce(data, n, op), StagedRequest{}; }
  template <class T>
  StagedRequest iallreduce(const T* send, T* recv, std::size_t n, ReduceOp op) const {
    return allreduce(send, recv, n, op), StagedRequest{};
  }
  template <class T>
  StagedRequest iallgather(const T* send, T* recv, std::size_t n) const { return allgather(send, recv, n), StagedRequest{}; }
  template <class T>
  StagedRequest ireduce_scatter(const T* send, T* recv, std::size_t n, ReduceOp op) const {
    return reduce_scatter(send, recv, n, op), StagedRequest{};
  }
  template <class T>
  StagedRequest isend(const T* data, std::size_t n, int peer, int tag) const { return send(data, n, peer, tag), StagedRequest{}; }
  template <class T>
  StagedRequest irecv(T* data, std::size_t n, int peer, int tag) const { return recv(data, n, peer, tag), StagedRequest{}; }

 private:
  Staged(const Mpi& group, cudaStream_t stream, bool owns_stream)
      : state_(std::make_shared<detail::StagedState>(group.split(0, group.rank()), stream, owns_stream)) {}

  template <class T>
  static char* bytes(std::vector<T>& v) { return reinterpret_cast<char*>(v.data()); }

  // The stream's work up to here, then n elements of `src` on the host.
  template <class T>
  std::vector<T> to_host(const T* src, std::size_t n) const {
    std::vector<T> h(n);
    if (n) DPML_CHECK_CUDA(cudaMemcpyAsync(h.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost, stream()));
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream()));
    return h;
  }
  template <class T>
  void to_device(const std::vector<T>& h, T* dst) const {
    if (!h.empty()) DPML_CHECK_CUDA(cudaMemcpyAsync(dst, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, stream()));
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream()));  // h goes out of scope
  }
  // reduce(data, count) on h itself, or on an fp32 copy for the 16-bit types.
  template <class T, class Reduce>
  static void reduce_on_host(std::vector<T>& h, ReduceOp, Reduce&& reduce) {
    if constexpr (detail::widened_on_host<T>) {
      std::vector<float> f(h.size());
      for (std::size_t i = 0; i < h.size(); ++i) f[i] = static_cast<float>(h[i]);
      reduce(f.data(), f.size());
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = T(f[i]);
    } else {
      reduce(h.data(), h.size());
    }
  }

  std::shared_ptr<detail::StagedState> state_;
};

static_assert(Communicator<Staged>);

}  // namespace dpml::comm
