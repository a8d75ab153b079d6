// train_gpt --device cuda: which GPU each rank uses, and how much of its memory (train_gpt.hpp).
#include "train_gpt.hpp"

#include <dpml/comm/cuda_placement.hpp>
#include <dpml/train/memory_fit.hpp>

namespace train_gpt {
GpuRanks place_ranks_on_gpus(const comm::Mpi& world, const std::string& gpu_comm) {
  const comm::GpuPlacement gpus = comm::place_on_gpus(world, gpu_comm, "train_gpt");
  return {.staged = gpus.comm == comm::GpuComm::staged, .bytes_per_rank = train::device_bytes_per_rank(world, gpus)};
}
}  // namespace train_gpt
