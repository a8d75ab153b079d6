// fashion_mnist --device cuda: the models on this rank's GPU in bf16 (Comm: comm::Nccl, or
// comm::Staged where ranks share GPUs), the trainer over the grid's device communicators.
#include "fashion_mnist.hpp"

#include <dpml/comm/cuda_placement.hpp>
#include <dpml/core/bf16.hpp>
#include <dpml/core/cuda_space.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/mlp.hpp>
#include <dpml/models/resnet.hpp>
#include <dpml/parallel/device_grid.hpp>

#include <optional>
#include <type_traits>

namespace fashion_mnist {
namespace {
template <class Comm>
int train_on_gpu(const Flags& f, const ProcessGrid& grid) {
  kernels::Device<CudaSpace> dev;
  const auto run = [&]<class Model>(Model& model) {
    layers::initialize_all(model.parameters(), f.seed, &grid);  // the CPU's initial weights, rounded to bf16
    return with_optimizer(f, [&]<class Strategy, class Rule>(typename Rule::Options rule) {
      const parallel::DeviceGrid<Comm, parallel::data_comm_t<Strategy, Comm>> comms(grid, dev);
      train::ClassifierTrainer<Model, Rule, Strategy, Comm> trainer(model, comms, dev, rule, {.clip = f.clip}, options_of(f));
      return run_epochs(f, grid, trainer, !std::is_same_v<Comm, comm::Staged>);
    });
  };
  if (f.model == "mlp") {
    auto model = models::Mlp<bf16, CudaSpace>::make({.hidden = f.hidden, .depth = f.depth});
    return run(model);
  }
  // Synchronised BatchNorm all-reduces its statistics over the data axis on the model's stream.
  std::optional<Comm> bn_comm;
  if (f.sync_bn) bn_comm.emplace(Comm::from(grid.comm(Axis::data), dev.stream()));
  auto model = models::ResNet<bf16, CudaSpace, Comm>::make({.width = f.width, .blocks_per_stage = f.blocks, .sync_batch_norm = f.sync_bn},
                                                           bn_comm ? &*bn_comm : nullptr);
  return run(model);
}
}  // namespace

int train_on_gpus(const Flags& f, const comm::Mpi& world, const ProcessGrid& grid) {
  const comm::GpuPlacement gpus = comm::place_on_gpus(world, f.gpu_comm, "fashion_mnist");  // before any CUDA allocation
  return comm::with_gpu_comm(gpus.comm, [&]<class Comm>() { return train_on_gpu<Comm>(f, grid); });
}
}  // namespace fashion_mnist
