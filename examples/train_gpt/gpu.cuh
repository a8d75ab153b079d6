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

#include <type_traits>

namespace train_gpt {
template <class T, class Comm>
int train_on_gpu(models::GptConfig config, const parallel::ProcessGrid& grid, const Run& run) {
  const Flags& f = run.f;
  config = on_gpu(config, f.tp);
  kernels::Device<CudaSpace> dev;
  const parallel::DistributedOptimizerOptions dist = dist_of(f);
  // One models::Gpt stage per pipeline rank, or v chunks per rank (models::GptChunks) under the
  // interleaved schedule; the device grid's data communicator is the strategy's. `Compression`:
  // the gradient buckets' (NoCompression, PowerSgd or TopK).
  const auto train = [&]<class Model, class Compression>(std::type_identity<Model>, const auto& schedule, Compression) {
    const auto body = [&]<class Strategy>() {
      using DataComm = parallel::data_comm_t<Strategy, Comm>;
      const parallel::DeviceGrid<Comm, DataComm> comms(grid, dev);
      Model model = [&] {
        if constexpr (std::is_same_v<Model, models::GptChunks<T, CudaSpace, Comm>>) return Model(config, comms, f.virtual_stages);
        else return Model(config, comms);
      }();
      layers::initialize_all(model.parameters(), f.seed, &grid);  // the CPU's initial weights, rounded to T
      train::GptTrainer<Strategy, optim::AdamW, T, CudaSpace, Comm, DataComm, Model> trainer(model, comms, dev, adamw_of(f), dist,
                                                                                           train_options_of(f));
      return train_and_sample(trainer, run);
    };
    if constexpr (std::is_same_v<Compression, NoCompression>) return parallel::with_strategy(schedule, f.zero, f.axis.dp_allreduce, body);
    else return parallel::with_strategy<parallel::Flat, Compression>(schedule, f.zero, body);
  };
  using Stages = models::Gpt<T, CudaSpace, Comm>;
  if (f.schedule == "interleaved")
    return train(std::type_identity<models::GptChunks<T, CudaSpace, Comm>>{},
                 parallel::schedule_among<parallel::pipeline::Interleaved1F1B>(f.schedule), NoCompression{});
  // PowerSGD and top-k under 1F1B only (main.cpp refuses the other schedules with them on GPUs):
  // each further schedule would compile the trainer once more per precision.
  if (f.axis.grad_compression == "powersgd") return train(std::type_identity<Stages>{}, parallel::pipeline::OneFOneB{}, PowerSgd{});
  if (f.axis.grad_compression == "topk") return train(std::type_identity<Stages>{}, parallel::pipeline::OneFOneB{}, TopK{});
  return train(std::type_identity<Stages>{}, parallel::staged_model_schedule(f.schedule), NoCompression{});
}
}  // namespace train_gpt
