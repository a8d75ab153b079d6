#pragma once
// Where the ranks of a GPU launch run and how their device buffers travel: the choice behind a
// program's --gpu-comm auto | nccl | staged (examples/train_gpt, examples/fashion_mnist).
//
//   nccl    every rank a GPU of its own (comm::select_device: one clear Error on every rank where
//           a node has fewer GPUs than ranks) and comm::Nccl between them
//   staged  the ranks of a node share its GPUs round robin (device = node-local rank % GPUs) and
//           talk through comm::Staged (device buffers through the host over MPI: tests and small
//           machines; far slower than NCCL)
//   auto    nccl where every node has a GPU per rank, else staged
//
// place_on_gpus() makes the chosen device current, so call it before any CUDA allocation; it is
// collective over the world (every rank decides alike; a rank without any GPU is an Error on all).
// The placement it returns also says how many of the node's ranks share each rank's GPU
// (gpu_ranks, told apart by UUID: train::device_bytes_per_rank splits the free memory by it).
// with_gpu_comm() turns the choice into the communicator type, as parallel::with_strategy does
// for the strategy:
//
//   const comm::GpuPlacement gpus = comm::place_on_gpus(world, flags.gpu_comm);
//   return comm::with_gpu_comm(gpus.comm, [&]<class Comm>() { return train_on_gpus<Comm>(...); });

#include "dpml/comm/local_rank.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/comm/nccl.hpp"
#include "dpml/comm/staged.hpp"
#include "dpml/core/cuda_space.hpp"
#include "dpml/core/error.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>

namespace dpml::comm {

enum class GpuComm { nccl, staged };

struct GpuPlacement {
  GpuComm comm = GpuComm::nccl;
  int node_ranks = 1;  // ranks on this node
  int devices = 1;     // CUDA devices this rank sees
  int gpu_ranks = 1;   // ranks of this node on this rank's GPU, itself included (nccl: 1; staged: by UUID)
};

// `choice`: auto | nccl | staged (see the top of the file). Where ranks share GPUs and `program`
// is named, rank 0 says so once: "dpml <program>: 4 ranks per node on 1 GPU(s): device buffers
// travel through the host (comm::Staged)". Collective over `world`.
inline GpuPlacement place_on_gpus(const Mpi& world, const std::string& choice, std::string_view program = {}) {
  DPML_REQUIRE_EVERYWHERE(choice == "auto" || choice == "nccl" || choice == "staged",
                          "--gpu-comm " << choice << " is not one of auto, nccl, staged");
  const Mpi node = world.split_by_host(world.rank());
  const int devices = cuda_device_count();
  DPML_REQUIRE_EVERYWHERE(world.allreduce(devices == 0 ? 1 : 0, ReduceOp::max) == 0,
                          "--device cuda: a rank of this launch sees no CUDA device");
  const bool short_of_gpus = world.allreduce(node.size() > devices ? 1 : 0, ReduceOp::max) != 0;
  if (choice == "nccl" || (choice == "auto" && !short_of_gpus)) {
    select_device(world);  // one GPU each, or one clear Error on every rank
    return {GpuComm::nccl, node.size(), devices, 1};
  }
  const int device = node.rank() % devices;
  set_device(device);
  const auto uuids = detail::node_gpu_uuids(node, device);
  const std::string& mine = uuids[static_cast<std::size_t>(node.rank())];
  if (!program.empty() && world.rank() == 0)
    std::printf("dpml %.*s: %d ranks per node on %d GPU(s): device buffers travel through the host (comm::Staged)\n",
                static_cast<int>(program.size()), program.data(), node.size(), devices);
  return {GpuComm::staged, node.size(), devices, static_cast<int>(std::count(uuids.begin(), uuids.end(), mine))};
}

// body.template operator()<comm::Nccl>() or <comm::Staged>(), as `comm` says; returns its result.
template <class Body>
decltype(auto) with_gpu_comm(GpuComm comm, Body&& body) {
  if (comm == GpuComm::staged) return body.template operator()<Staged>();
  return body.template operator()<Nccl>();
}

}  // namespace dpml::comm
