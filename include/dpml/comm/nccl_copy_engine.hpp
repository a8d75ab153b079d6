#pragma once
// comm::CopyEngine: comm::Nccl for the two GPUs of one host, whose all-reduce of a registered
// buffer runs on the GPUs' copy engines (DMA) instead of NCCL's kernels, so the compute it
// overlaps keeps every SM. NCCL's all-reduce kernels hold their CTAs for the whole transfer; a
// data-parallel backward that overlaps its bucket all-reduces loses those SMs. Measured on 2×H100
// (bench/RESULTS.md): GPT-2 124M data parallel 0–0.9 % faster than over NCCL, though a lone
// all-reduce reaches only ~0.78 of NCCL's busbw at 256 MB (one copy engine per direction, the
// two copies of a bucket in sequence). Every other collective, and an all-reduce of a buffer not
// registered, is comm::Nccl's.
//
// A buffer is registered once (register_buffer, collective): its allocation is shared with the
// peer through CUDA IPC, and a receive buffer of the same size is allocated and shared. Then an
// in-place all-reduce of n elements inside it is, on each rank r (rank r owns half r: [0, m) or
// [m, n), m = n/2 rounded down to 64 elements):
//
//   1. copy engine: my elements of the peer's half  → the peer's receive buffer (NVLink push)
//   2. signal the peer (a stream memory write into its flag), wait for its signal to me
//   3. kernel:      my half = (my half + received) · scale      (the only SM work: one pass)
//   4. copy engine: my half (final)                 → the same place in the peer's buffer
//   5. signal, wait: the peer's half has arrived; both ranks hold the same bits
//
// The signals are cuStreamWriteValue32 / cuStreamWaitValue32 on a pair of words per rank that
// count the calls (a cyclic ≥, so they never need resetting): the communication stream waits in
// the GPU's front end, not in a spinning kernel. Both ranks must call in the same order, as for
// any collective. Each step only writes where the peer has already read: the peer's receive
// buffer is written again only after the peer signalled that its sum (which reads it) is done;
// the peer's half is written after the peer signalled that it sent it.
//
// The sum is formed in fp32 from the two contributions and rounded once (ranks' order does not
// matter: a + b = b + a), so the result is deterministic and identical on both ranks.
//
//   comm::CopyEngine dp = comm::CopyEngine::from(grid.comm(Axis::data));  // 2 ranks, one host
//   dp.register_buffer(grads, n * sizeof(bf16));
//   dp.allreduce(grads + begin, count, ReduceOp::avg);                     // copy engines
//
// Limits: exactly two ranks on one host (checked, with a message naming the hosts), sum and avg
// only (others go to NCCL). A peer that dies leaves this rank's stream waiting on its flag; the
// launcher (mpirun, srun) ends the job when a rank dies.

#include "dpml/comm/nccl.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/elementwise.hpp"

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dpml::comm {

namespace detail {

// The driver's stream memory operations, found through the runtime (no link to libcuda).
struct StreamMemOps {
  PFN_cuStreamWriteValue32_v11070 write = nullptr;
  PFN_cuStreamWaitValue32_v11070 wait = nullptr;
  PFN_cuMemGetAddressRange_v3020 address_range = nullptr;

  static const StreamMemOps& get() {
    static const StreamMemOps ops = [] {
      StreamMemOps o;
      auto find = [](const char* name, void** fn, int version) {
        cudaDriverEntryPointQueryResult found{};
        DPML_CHECK_CUDA(cudaGetDriverEntryPointByVersion(name, fn, version, cudaEnableDefault, &found));
        DPML_REQUIRE(found == cudaDriverEntryPointSuccess && *fn,
                     "comm::CopyEngine: the CUDA driver has no " << name << " (driver too old?)");
      };
      find("cuStreamWriteValue32", reinterpret_cast<void**>(&o.write), 11070);
      find("cuStreamWaitValue32", reinterpret_cast<void**>(&o.wait), 11070);
      find("cuMemGetAddressRange", reinterpret_cast<void**>(&o.address_range), 3020);
      return o;
    }();
    return ops;
  }
};

inline void check_cu(CUresult rc, const char* what) {
  DPML_REQUIRE(rc == CUDA_SUCCESS, "comm::CopyEngine: " << what << " failed (CUresult " << static_cast<int>(rc) << ")");
}

// One registered buffer: mine, the peer's (mapped through IPC), and both receive buffers.
struct PeerRegion {
  std::uint8_t* mine = nullptr;
  std::size_t bytes = 0;
  std::uint8_t* peers = nullptr;       // the peer's registered buffer, mapped here
  std::uint8_t* received = nullptr;    // my receive buffer (bytes), written by the peer
  std::uint8_t* peers_received = nullptr;  // the peer's receive buffer, mapped here
};

// What an exchange of one allocation through NCCL carries.
struct IpcShare {
  cudaIpcMemHandle_t handle;
  std::uint64_t offset, bytes;
};

// The IPC state, shared by a CopyEngine's moved-from and moved-to objects.
struct CopyEngineState {
  std::uint32_t* flags = nullptr;       // (2) mine: [0] reduce-scatter arrived, [1] all-gather arrived
  std::uint32_t* peer_flags = nullptr;  // the peer's, mapped here
  std::uint32_t calls = 0;              // all-reduces on the copy engines so far
  std::vector<PeerRegion> regions;
  std::vector<void*> opened;            // IPC mappings to close
  std::vector<void*> owned;             // receive buffers and flags to free

  CopyEngineState() = default;
  CopyEngineState(const CopyEngineState&) = delete;
  CopyEngineState& operator=(const CopyEngineState&) = delete;
  ~CopyEngineState() {  // (cudaFree waits for the work in flight)
    for (void* p : opened) cudaIpcCloseMemHandle(p);
    for (void* p : owned) cudaFree(p);
  }
};
}  // namespace detail

class CopyEngine : public Nccl {
 public:
  // A communicator over `group` (two ranks of one host), enqueuing on `stream` or on its own.
  static CopyEngine from(const Mpi& group, cudaStream_t stream) { return CopyEngine(Nccl::from(group, stream)); }
  static CopyEngine from(const Mpi& group) { return CopyEngine(Nccl::from(group)); }

  // Shares [data, data + bytes) (device memory from cudaMalloc, the same size on both ranks) with
  // the peer, and allocates its receive buffer. Collective; synchronises.
  void register_buffer(void* data, std::size_t bytes) {
    auto& s = *state_;
    for (const auto& r : s.regions)
      DPML_REQUIRE(!(static_cast<std::uint8_t*>(data) < r.mine + r.bytes && r.mine < static_cast<std::uint8_t*>(data) + bytes),
                   "comm::CopyEngine: register_buffer: the buffer overlaps one registered before");
    detail::PeerRegion region{.mine = static_cast<std::uint8_t*>(data), .bytes = bytes};
    region.peers = share(data, bytes);
    void* received = nullptr;
    DPML_CHECK_CUDA(cudaMalloc(&received, bytes));
    s.owned.push_back(received);
    region.received = static_cast<std::uint8_t*>(received);
    region.peers_received = share(received, bytes);
    s.regions.push_back(region);
  }

  // In place: on the copy engines when [data, data + n) lies in a registered buffer and op is sum
  // or avg; otherwise NCCL's.
  template <class T>
  void allreduce(T* data, std::size_t n, ReduceOp op) const {
    const detail::PeerRegion* region = find(data, n * sizeof(T));
    if (!region || (op != ReduceOp::sum && op != ReduceOp::avg)) return Nccl::allreduce(data, n, op);
    reduce_on_copy_engines(*region, data, n, op == ReduceOp::avg ? 0.5f : 1.f);
  }
  template <class T>
  void allreduce(const T* send, T* recv, std::size_t n, ReduceOp op) const {
    if (send == recv) return allreduce(recv, n, op);
    Nccl::allreduce(send, recv, n, op);
  }

 private:
  static constexpr std::size_t kSplitAlign = 64;  // elements: where the two halves meet

  explicit CopyEngine(Nccl nccl) : Nccl(std::move(nccl)), state_(std::make_shared<detail::CopyEngineState>()) {
    check_pair();
    auto& s = *state_;
    void* flags = nullptr;
    DPML_CHECK_CUDA(cudaMalloc(&flags, 2 * sizeof(std::uint32_t)));
    DPML_CHECK_CUDA(cudaMemset(flags, 0, 2 * sizeof(std::uint32_t)));
    s.owned.push_back(flags);
    s.flags = static_cast<std::uint32_t*>(flags);
    s.peer_flags = reinterpret_cast<std::uint32_t*>(share(flags, 2 * sizeof(std::uint32_t)));
    detail::StreamMemOps::get();
  }

  // Two ranks, one host: anything else is refused on every rank with the hosts named.
  void check_pair() const {
    struct Host {
      char name[256];
    };
    Host mine{}, both[2]{};
    gethostname(mine.name, sizeof mine.name - 1);
    DPML_REQUIRE(size() == 2, "comm::CopyEngine: the copy-engine all-reduce is for 2 ranks of one host; this group has "
                                  << size() << " ranks (use comm::Nccl)");
    exchange(&mine, both, sizeof(Host));
    DPML_REQUIRE(std::strcmp(both[0].name, both[1].name) == 0,
                 "comm::CopyEngine: ranks 0 and 1 run on different hosts ('" << both[0].name << "', '" << both[1].name
                                                                             << "'); CUDA IPC needs one host (use comm::Nccl)");
  }

  // Every rank's `bytes` of `mine` into `all` (rank order), through NCCL; synchronises.
  void exchange(const void* mine, void* all, std::size_t bytes) const {
    std::uint8_t* device = nullptr;
    DPML_CHECK_CUDA(cudaMalloc(&device, 2 * bytes));
    DPML_CHECK_CUDA(cudaMemcpyAsync(device + static_cast<std::size_t>(rank()) * bytes, mine, bytes, cudaMemcpyHostToDevice, stream()));
    Nccl::allgather(device + static_cast<std::size_t>(rank()) * bytes, device, bytes);
    DPML_CHECK_CUDA(cudaMemcpyAsync(all, device, 2 * bytes, cudaMemcpyDeviceToHost, stream()));
    request().wait();
    DPML_CHECK_CUDA(cudaFree(device));
  }

  // The peer's counterpart of `data` (bytes inside one cudaMalloc allocation), mapped here.
  std::uint8_t* share(void* data, std::size_t bytes) {
    const auto& ops = detail::StreamMemOps::get();
    CUdeviceptr base = 0;
    std::size_t size = 0;
    detail::check_cu(ops.address_range(&base, &size, reinterpret_cast<CUdeviceptr>(data)), "cuMemGetAddressRange");
    detail::IpcShare mine{}, both[2]{};
    DPML_CHECK_CUDA(cudaIpcGetMemHandle(&mine.handle, reinterpret_cast<void*>(base)));
    mine.offset = reinterpret_cast<CUdeviceptr>(data) - base;
    mine.bytes = bytes;
    exchange(&mine, both, sizeof mine);
    const detail::IpcShare& peer = both[1 - rank()];
    DPML_REQUIRE(peer.bytes == bytes, "comm::CopyEngine: rank " << rank() << " registers " << bytes
                                          << " bytes, its peer " << peer.bytes << ": the buffers must match");
    void* mapped = nullptr;
    const cudaError_t rc = cudaIpcOpenMemHandle(&mapped, peer.handle, cudaIpcMemLazyEnablePeerAccess);
    DPML_REQUIRE(rc == cudaSuccess, "comm::CopyEngine: rank " << rank() << " cannot map its peer's memory (cudaIpcOpenMemHandle: "
                                        << cudaGetErrorString(rc) << "); the GPUs need peer access (NVLink or PCIe P2P)");
    state_->opened.push_back(mapped);
    return static_cast<std::uint8_t*>(mapped) + peer.offset;
  }

  const detail::PeerRegion* find(const void* data, std::size_t bytes) const {
    const auto* p = static_cast<const std::uint8_t*>(data);
    for (const auto& r : state_->regions)
      if (p >= r.mine && p + bytes <= r.mine + r.bytes) return &r;
    return nullptr;
  }

  template <class T>
  void reduce_on_copy_engines(const detail::PeerRegion& r, T* data, std::size_t n, float scale) const {
    auto& s = *state_;
    const auto& ops = detail::StreamMemOps::get();
    const cudaStream_t st = stream();
    const std::uint32_t call = ++s.calls;
    const std::size_t offset = static_cast<std::size_t>(reinterpret_cast<std::uint8_t*>(data) - r.mine);
    const std::size_t m = n / 2 / kSplitAlign * kSplitAlign;
    const std::size_t mine_begin = rank() == 0 ? 0 : m, mine_count = rank() == 0 ? m : n - m;
    const std::size_t peer_begin = rank() == 0 ? m : 0, peer_count = n - mine_count;
    auto at = [&](std::uint8_t* base, std::size_t element) { return base + offset + element * sizeof(T); };
    auto signal = [&](int word) {
      detail::check_cu(ops.write(reinterpret_cast<CUstream>(st), reinterpret_cast<CUdeviceptr>(s.peer_flags + word), call,
                                 CU_STREAM_WRITE_VALUE_DEFAULT),
                       "cuStreamWriteValue32");
    };
    auto await = [&](int word) {
      detail::check_cu(ops.wait(reinterpret_cast<CUstream>(st), reinterpret_cast<CUdeviceptr>(s.flags + word), call,
                                CU_STREAM_WAIT_VALUE_GEQ),
                       "cuStreamWaitValue32");
    };
    // 1–2: my contribution to the peer's half, into its receive buffer.
    if (peer_count)
      DPML_CHECK_CUDA(cudaMemcpyAsync(at(r.peers_received, peer_begin), at(r.mine, peer_begin), peer_count * sizeof(T),
                                      cudaMemcpyDeviceToDevice, st));
    signal(0);
    await(0);
    // 3: my half, summed.
    if (mine_count) {
      T* half = reinterpret_cast<T*>(at(r.mine, mine_begin));
      kernels::cuda::add_scaled(half, reinterpret_cast<const T*>(at(r.received, mine_begin)), half,
                                static_cast<std::int64_t>(mine_count), scale, st);
      // 4–5: my half to the peer, the peer's half from it.
      DPML_CHECK_CUDA(cudaMemcpyAsync(at(r.peers, mine_begin), at(r.mine, mine_begin), mine_count * sizeof(T),
                                      cudaMemcpyDeviceToDevice, st));
    }
    signal(1);
    await(1);
  }

  std::shared_ptr<detail::CopyEngineState> state_;
};

}  // namespace dpml::comm
