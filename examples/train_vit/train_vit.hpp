// What train_vit's host unit (main.cpp) and its CUDA unit (gpu.cu) share: the training settings
// beside the model's shape (models::VitConfig) and the epochs' (examples::EpochOptions).
#pragma once

#include "fashion_mnist_epochs.hpp"

#include <dpml/comm/mpi.hpp>
#include <dpml/models/vit.hpp>
#include <dpml/parallel/grid.hpp>

#include <string>

namespace train_vit {
using namespace dpml;

struct Training {
  int micro_batches = 1;
  double weight_decay = 0.05, clip = 1.0;
  bool zero = false;
  std::string gpu_comm = "auto";
};

#ifdef DPML_WITH_CUDA
// --device cuda (gpu.cu): the ranks placed on GPUs (--gpu-comm), models::Vit on each rank's GPU
// in bf16 (fp32 master weights and AdamW state), trained over the grid's device communicators.
// Collective.
int train_on_gpus(const comm::Mpi& world, const ProcessGrid& grid, const models::VitConfig& vit,
                  const examples::EpochOptions& epochs, const Training& t);
#endif
}  // namespace train_vit
