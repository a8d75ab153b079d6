// Chooses this rank's GPU (comm::select_device), builds an NCCL communicator over the world and
// passes a barrier. The failure test runs it with more ranks than visible GPUs: every rank must
// stop with one message naming the node, not hang in NCCL.
#include <dpml/comm/launch.hpp>
#include <dpml/comm/local_rank.hpp>
#include <dpml/comm/nccl.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [](const dpml::comm::Mpi& world) {
    const int device = dpml::comm::select_device(world);
    const auto nccl = dpml::comm::Nccl::from(world);
    nccl.barrier();
    std::printf("rank %d of %d: CUDA device %d, NCCL barrier passed\n", world.rank(), world.size(), device);
    return 0;
  });
}
