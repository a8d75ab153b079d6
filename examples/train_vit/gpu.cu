// train_vit --device cuda: models::Vit on this rank's GPU in bf16 (Comm: comm::Nccl, or
// comm::Staged where ranks share GPUs), its heads and MLP split over the tensor axis' device
// communicator, trained by the same ClassifierTrainer and epochs as on CPU ranks.
#include "train_vit.hpp"

#include <dpml/comm/cuda_placement.hpp>
#include <dpml/core/bf16.hpp>
#include <dpml/core/cuda_space.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/parallel/device_grid.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/parallel/tensor.hpp>
#include <dpml/train/classifier.hpp>

namespace train_vit {
int train_on_gpus(const comm::Mpi& world, const ProcessGrid& grid, const models::VitConfig& vit,
                  const examples::EpochOptions& epochs, const Training& t) {
  const comm::GpuPlacement gpus = comm::place_on_gpus(world, t.gpu_comm, "train_vit");  // before any CUDA allocation
  kernels::Device<CudaSpace> dev;
  return comm::with_gpu_comm(gpus.comm, [&]<class Comm>() {
    return parallel::with_strategy(OneFOneB{}, t.zero, [&]<class Strategy>() {
      const parallel::DeviceGrid<Comm, parallel::data_comm_t<Strategy, Comm>> comms(grid, dev);
      const parallel::TensorRegion<Comm> region(&comms.tensor());
      auto model = models::Vit<bf16, CudaSpace, Comm>::make(vit, region);
      layers::initialize_all(model.parameters(), epochs.seed, &grid);  // the CPU's initial weights, rounded to bf16
      train::ClassifierTrainer<decltype(model), optim::AdamW, Strategy, Comm> trainer(
          model, comms, dev, {.weight_decay = t.weight_decay}, {.clip = t.clip}, {.micro_batches = t.micro_batches, .seed = epochs.seed});
      return examples::train_epochs(epochs, grid, trainer, gpus.comm == comm::GpuComm::nccl);
    });
  });
}
}  // namespace train_vit
