#pragma once
// dpml: everything in one include. Layers of the library, bottom to top (DESIGN.md):
// core → comm → kernels → parallel / optim / data / checkpoint → layers → models → train.

#include "dpml/core/arena.hpp"
#include "dpml/core/bf16.hpp"
#include "dpml/core/config.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/memory_space.hpp"
#include "dpml/core/philox.hpp"
#include "dpml/core/tensor.hpp"
#if defined(DPML_WITH_CUDA)
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/cuda_space.hpp"
#endif

#include "dpml/comm/communicator.hpp"
#include "dpml/comm/launch.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/comm/self.hpp"
#include "dpml/comm/watchdog.hpp"

#include "dpml/parallel/grid.hpp"

#include "dpml/kernels/host/gemm.hpp"

#include "dpml/optim/adamw.hpp"
#include "dpml/optim/clip.hpp"
#include "dpml/optim/optimizer.hpp"
#include "dpml/optim/schedule.hpp"
#include "dpml/optim/sgd.hpp"

#include "dpml/data/idx.hpp"
#include "dpml/data/image.hpp"
#include "dpml/data/loader.hpp"
#include "dpml/data/sampler.hpp"

#include "dpml/checkpoint/checkpoint.hpp"
#include "dpml/checkpoint/json.hpp"
#include "dpml/checkpoint/manifest.hpp"
#include "dpml/checkpoint/safetensors.hpp"

#include "dpml/parallel/data.hpp"
#include "dpml/parallel/distributed_optimizer.hpp"
#include "dpml/parallel/flat_parameters.hpp"
#include "dpml/parallel/tensor.hpp"

#include "dpml/layers/init.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/parameter.hpp"
#include "dpml/layers/stack.hpp"

#include "dpml/train/args.hpp"
#include "dpml/train/checkpointing.hpp"
#include "dpml/train/gpt_trainer.hpp"
#include "dpml/train/progress.hpp"
