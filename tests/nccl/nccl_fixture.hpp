#pragma once
// The world of a multi-GPU test. gpu_per_rank(): one GPU per rank, chosen from the node-local
// rank (comm::select_device); where a node has fewer GPUs than ranks, every rank exits 77 (CTest:
// skipped) after MPI_Finalize, all deciding alike. gpu_comm(): the same where every rank can
// have a GPU of its own (the tests then talk through comm::Nccl), else all ranks share device 0
// and talk through comm::Staged (comm/staged.hpp), so that a one-GPU machine runs the multi-rank
// GPU tests too; skipped only without any GPU. Call either before any CUDA allocation.
#include "test.hpp"

#include <dpml/comm/local_rank.hpp>
#include <dpml/comm/nccl.hpp>
#include <dpml/comm/staged.hpp>
#include <dpml/core/cuda_error.hpp>
#include <dpml/core/cuda_space.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

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

// How the ranks of a multi-rank GPU test talk (gpu_comm()).
enum class GpuComm { nccl, staged };

// Every rank its own GPU and NCCL where the node has enough GPUs; device 0 shared through
// comm::Staged where it has fewer; exit 77 on every rank where a rank sees no GPU.
inline GpuComm gpu_comm() {
  static const GpuComm kind = [] {
    const auto w = world();
    const comm::NodeRank local = comm::node_local_rank(w);
    const int devices = cuda_device_count();
    if (w.allreduce(devices == 0 ? 1 : 0, comm::ReduceOp::max)) {
      if (w.rank() == 0) std::fprintf(stderr, "no GPU: test skipped\n");
      MPI_Finalize();
      std::exit(77);
    }
    if (w.allreduce(local.size > devices ? 1 : 0, comm::ReduceOp::max) == 0) {
      comm::select_device(w);
      return GpuComm::nccl;
    }
    DPML_CHECK_CUDA(cudaSetDevice(0));
    if (w.rank() == 0) std::fprintf(stderr, "fewer GPUs than ranks: the ranks share GPU 0 through comm::Staged\n");
    return GpuComm::staged;
  }();
  return kind;
}

// Whether `v` holds the same bits on every rank: the elementwise max and min of its bit patterns agree.
inline bool same_on_every_rank(const std::vector<float>& v) {
  const auto w = world();
  std::vector<std::uint32_t> hi(v.size()), lo(v.size());
  std::memcpy(hi.data(), v.data(), v.size() * sizeof(float));
  lo = hi;
  w.allreduce(hi.data(), hi.size(), comm::ReduceOp::max);
  w.allreduce(lo.data(), lo.size(), comm::ReduceOp::min);
  return hi == lo;
}

// body(std::type_identity<Comm>{}) with the communicator type gpu_comm() chose: a test written as
//   test::with_gpu_comm([&]<class Comm>(std::type_identity<Comm>) { auto dp = Comm::from(test::world()); ... });
// runs over NCCL on a machine with a GPU per rank and over comm::Staged on a one-GPU one.
template <class Body>
void with_gpu_comm(Body&& body) {
  if (gpu_comm() == GpuComm::nccl) body(std::type_identity<comm::Nccl>{});
  else body(std::type_identity<comm::Staged>{});
}

}  // namespace dpml::test
