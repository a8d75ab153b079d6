// train_gpt --device cuda --fp16: the fp16 GPU trainers (gpu.cuh).
#include "gpu.cuh"

#include <dpml/kernels/cuda/common.hpp>

namespace train_gpt {
int train_on_gpus_fp16(const models::GptConfig& config, const parallel::ProcessGrid& grid, const Run& run, bool staged) {
  return staged ? train_on_gpu<kernels::cuda::f16, comm::Staged>(config, grid, run) : train_on_gpu<kernels::cuda::f16, comm::Nccl>(config, grid, run);
}
}  // namespace train_gpt
