// train_gpt --device cuda: the bf16 GPU trainers (gpu.cuh).
#include "gpu.cuh"

#include <dpml/core/bf16.hpp>

namespace train_gpt {
int train_on_gpus_bf16(const models::GptConfig& config, const parallel::ProcessGrid& grid, const Run& run, bool staged) {
  return staged ? train_on_gpu<bf16, comm::Staged>(config, grid, run) : train_on_gpu<bf16, comm::Nccl>(config, grid, run);
}
}  // namespace train_gpt
