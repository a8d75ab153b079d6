// train_lstm --device cuda: models::LstmLm on this rank's GPU in bf16 (Comm: comm::Nccl, or
// comm::Staged where ranks share GPUs), cut into pipeline stages between its layers as on CPU
// ranks, trained by the same train::Trainer and loop (train_lstm.hpp).
#include "train_lstm.hpp"

#include <dpml/comm/cuda_placement.hpp>
#include <dpml/core/bf16.hpp>
#include <dpml/core/cuda_space.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/layers/cross_entropy.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/parallel/device_grid.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/trainer.hpp>

namespace train_lstm {
int train_on_gpus(const comm::Mpi& world, const ProcessGrid& grid, const models::LstmLmConfig& config, const Flags& f,
                  data::LmWindows& lm, int micro_batches) {
  const comm::GpuPlacement gpus = comm::place_on_gpus(world, f.gpu_comm, "train_lstm");  // before any CUDA allocation
  kernels::Device<CudaSpace> dev;
  return comm::with_gpu_comm(gpus.comm, [&]<class Comm>() {
    return parallel::with_strategy(f.schedule, f.zero, [&]<class Strategy>() {
      using DataComm = parallel::data_comm_t<Strategy, Comm>;
      const parallel::DeviceGrid<Comm, DataComm> comms(grid, dev);
      auto model = models::LstmLm<bf16, CudaSpace>::make(config);
      layers::initialize_all(model.parameters(), f.seed, &grid);  // the CPU's initial weights, rounded to bf16
      train::Trainer<decltype(model), layers::SoftmaxCrossEntropy<bf16, CudaSpace>, Strategy, optim::AdamW, CudaSpace, Comm, DataComm>
          trainer(model, comms, dev, {.beta2 = 0.95, .weight_decay = f.weight_decay}, {.clip = f.clip},
                  {.micro_batches = micro_batches, .global_batch = f.global_batch, .seed = f.seed, .virtual_stages = f.virtual_stages});
      return train_and_validate(trainer, f, world, lm);
    });
  });
}
}  // namespace train_lstm
