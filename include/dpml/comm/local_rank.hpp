#pragma once
// Which GPU a rank uses: its rank among the ranks of its node (MPI_Comm_split_type SHARED), the
// same under mpirun on one host and srun on a cluster. select_device() (CUDA builds) makes device
// `local rank` current. A node with fewer usable GPUs than ranks is refused on every rank at once,
// with one message naming the node, instead of two ranks sharing a GPU (NCCL then fails or hangs).
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

#include <climits>
#include <cstdlib>
#include <string>

namespace dpml::comm {

// This process among the processes of its node.
struct NodeRank {
  int rank = 0;
  int size = 1;
};

// Collective over `world`.
inline NodeRank node_local_rank(const Mpi& world) {
  MPI_Comm node = MPI_COMM_NULL;
  DPML_CHECK_MPI(MPI_Comm_split_type(world.native(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &node));
  const Mpi local(node);
  const NodeRank out{local.rank(), local.size()};
  MPI_Comm_free(&node);
  return out;
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

// Every rank takes the GPU of its node-local rank and returns its index. Collective over `world`:
// where any node has fewer GPUs than ranks, every rank throws the same Error (Scope::everywhere)
// naming the first such rank's node.
inline int select_device(const Mpi& world) {
  const NodeRank local = node_local_rank(world);
  const int count = cuda_device_count();
  const int first_bad = world.allreduce(local.size > count ? world.rank() : INT_MAX, ReduceOp::min);
  if (first_bad != INT_MAX) {
    struct Report {
      int ranks, devices;
      char host[MPI_MAX_PROCESSOR_NAME];
    } report{local.size, count, {}};
    int len = 0;
    DPML_CHECK_MPI(MPI_Get_processor_name(report.host, &len));
    world.broadcast(reinterpret_cast<char*>(&report), sizeof report, first_bad);
    DPML_REQUIRE_EVERYWHERE(false, "node " << report.host << " runs " << report.ranks << " ranks but has "
                                           << report.devices << " usable CUDA device(s) (seen by world rank " << first_bad
                                           << "): start at most one rank per GPU (mpirun -n <GPUs>, or Slurm "
                                              "--ntasks-per-node equal to --gpus-per-node)");
  }
  set_device(local.rank);
  return local.rank;
}
#endif

}  // namespace dpml::comm
