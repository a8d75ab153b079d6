// train_gpt --device cuda: the model and trainer on this rank's GPU (Comm: comm::Nccl, or
// comm::Staged where ranks share GPUs), T = bf16 or fp16 with fp32 master weights. Included by
// gpu_bf16.cu and gpu_fp16.cu, one CUDA translation unit per precision.
#pragma once

#include "train_gpt.hpp"

#include <dpml/comm/nccl.hpp>
#include <dpml/comm/staged.hpp>
#include <dpml/core/cuda_space.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/parallel/device_grid.hpp>
#include <dpml/parallel/strategy.hpp>

namespace train_gpt {
template <class T, class Comm>
int train_on_gpu(models::GptConfig config, const parallel::ProcessGrid& grid, const Run& run) {
  const Flags& f = run.f;
  config = on_gpu(config, f.tp);
  kernels::Device<CudaSpace> dev;
  return parallel::with_strategy(parallel::staged_model_schedule(f.schedule), f.zero, f.axis.dp_allreduce, [&]<class Strategy>() {
    const parallel::DeviceGrid<Comm, parallel::data_comm_t<Strategy, Comm>> comms(grid, dev);
    models::Gpt<T, CudaSpace, Comm> model(config, comms);
    layers::initialize_all(model.parameters(), f.seed, &grid);  // the CPU's initial weights, rounded to T
    train::GptTrainer<Strategy, optim::AdamW, T, CudaSpace, Comm> trainer(model, comms, dev, adamw_of(f), {.clip = f.clip},
                                                                          train_options_of(f));
    return train_and_sample(trainer, run);
  });
}
}  // namespace train_gpt
