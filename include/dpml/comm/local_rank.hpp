#pragma once
// Which GPU a rank uses: its rank among the ranks of its node (MPI_Comm_split_type SHARED), the
// same under mpirun on one host and srun on a cluster. select_device() (CUDA builds) makes
// visible device `local rank % visible devices` current: device `local rank` where every rank
// sees all of the node's GPUs, device 0 where Slurm gives each task a GPU of its own
// (--gpus-per-task=1). The ranks of a node then compare the UUIDs of their picks: if two would
// share a GPU (more ranks than GPUs), or one has none, every rank stops at once with one message
// naming the node, instead of NCCL failing or hanging later.
//
//   dpml::run(argc, argv, [](const comm::Mpi& world) {
//     comm::select_device(world);                 // before any CUDA allocation
//     auto dp = comm::Nccl::from(world); ... });

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#ifdef DPML_WITH_CUDA
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/cuda_space.hpp"

#include <cuda_runtime.h>
#endif

#include <mpi.h>

#include <array>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace dpml::comm {

// This process among the processes of its node.
struct NodeRank {
  int rank = 0;
  int size = 1;
};

// Collective over `world`.
inline NodeRank node_local_rank(const Mpi& world) {
  const Mpi local = world.split_by_host(world.rank());
  return {local.rank(), local.size()};
}

#ifdef DPML_WITH_CUDA
// Makes device `index` current; an index the process cannot see is an Error naming it.
inline void set_device(int index) {
  const int count = cuda_device_count();
  DPML_REQUIRE(index >= 0 && index < count, "CUDA device " << index << " does not exist: this process sees "
                                                               << count << " device(s) (CUDA_VISIBLE_DEVICES='"
                                                               << (std::getenv("CUDA_VISIBLE_DEVICES")
                                                                       ? std::getenv("CUDA_VISIBLE_DEVICES")
                                                                       : "")
                                                               << "')");
  DPML_CHECK_CUDA(cudaSetDevice(index));
}

namespace detail {
// The UUID (16 bytes) of each node rank's visible device `device`, in node-rank order: which
// ranks are on the same GPU, whatever devices each process sees. All zero where `device` is −1
// (no GPU). Collective over `node`.
inline std::vector<std::string> node_gpu_uuids(const Mpi& node, int device) {
  std::array<char, 16> uuid{};
  if (device >= 0) {
    cudaDeviceProp prop{};
    DPML_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
    std::memcpy(uuid.data(), prop.uuid.bytes, uuid.size());
  }
  std::vector<char> all(uuid.size() * static_cast<std::size_t>(node.size()));  // (node ranks, 16)
  node.allgather(uuid.data(), all.data(), uuid.size());
  std::vector<std::string> uuids;
  for (int r = 0; r < node.size(); ++r) uuids.emplace_back(all.data() + static_cast<std::size_t>(r) * uuid.size(), uuid.size());
  return uuids;
}
}  // namespace detail

// Every rank takes visible device `local rank % visible devices` and returns its index.
// Collective over `world`: where the ranks of any node would not each have a GPU of their own,
// every rank throws the same Error (Scope::everywhere) naming the first such rank's node.
inline int select_device(const Mpi& world) {
  const Mpi node = world.split_by_host(world.rank());
  const int count = cuda_device_count();
  const int pick = count > 0 ? node.rank() % count : -1;
  std::set<std::string> distinct;
  for (const std::string& u : detail::node_gpu_uuids(node, pick))
    if (u != std::string(u.size(), '\0')) distinct.insert(u);
  const bool own_gpu = pick >= 0 && static_cast<int>(distinct.size()) == node.size();
  const int first_bad = world.allreduce(own_gpu ? INT_MAX : world.rank(), ReduceOp::min);
  if (first_bad != INT_MAX) {
    struct Report {
      int ranks, distinct, visible;
      char host[MPI_MAX_PROCESSOR_NAME];
    } report{node.size(), static_cast<int>(distinct.size()), count, {}};
    int len = 0;
    DPML_CHECK_MPI(MPI_Get_processor_name(report.host, &len));
    world.broadcast(reinterpret_cast<char*>(&report), sizeof report, first_bad);
    DPML_REQUIRE_EVERYWHERE(false, "node " << report.host << " runs " << report.ranks << " ranks but has "
                                           << report.distinct << " usable CUDA device(s) for them (world rank "
                                           << first_bad << " sees " << report.visible
                                           << "): start one rank per GPU (mpirun -n <GPUs>, or Slurm "
                                              "--ntasks-per-node equal to --gpus-per-node)");
  }
  set_device(pick);
  return pick;
}
#endif

}  // namespace dpml::comm
