#pragma once
// The world of a multi-GPU test: one GPU per rank, chosen from the node-local rank
// (comm::select_device). Where a node has fewer GPUs than ranks, every rank exits 77 (CTest:
// skipped) after MPI_Finalize, all deciding alike. Call before any CUDA allocation.
#include "test.hpp"

#include <dpml/comm/local_rank.hpp>
#include <dpml/core/cuda_space.hpp>

#include <cstdio>
#include <cstdlib>

namespace dpml::test {

// The chosen CUDA device of this rank; the first call decides (and may end the process).
inline int gpu_per_rank() {
  static const int device = [] {
    const auto w = world();
    const comm::NodeRank local = comm::node_local_rank(w);
    const int short_of_gpus = w.allreduce(local.size > cuda_device_count() ? 1 : 0, comm::ReduceOp::max);
    if (short_of_gpus) {
      if (w.rank() == 0) std::fprintf(stderr, "fewer GPUs than ranks on a node: test skipped\n");
      MPI_Finalize();
      std::exit(77);
    }
    return comm::select_device(w);
  }();
  return device;
}

}  // namespace dpml::test
