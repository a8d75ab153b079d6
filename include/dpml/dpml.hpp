#pragma once
// dpml: everything in one include. Layers of the library, bottom to top (DESIGN.md):
// core → comm → kernels → parallel / optim / data / checkpoint → layers → models → train.
//
// Host code (any C++20 compiler, dpml::dpml) gets every host header; with dpml::cuda
// (DPML_WITH_CUDA) also the CUDA runtime pieces (device memory, NCCL); and in nvcc translation
// units (__CUDACC__) the device kernels, the GPU models and their trainer.

#include "dpml/core/arena.hpp"
#include "dpml/core/bf16.hpp"
#include "dpml/core/config.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/memory_space.hpp"
#include "dpml/core/philox.hpp"
#include "dpml/core/tensor.hpp"

#include "dpml/comm/communicator.hpp"
#include "dpml/comm/launch.hpp"
#include "dpml/comm/local_rank.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/comm/self.hpp"
#include "dpml/comm/watchdog.hpp"

#include "dpml/kernels/host/activation.hpp"
#include "dpml/kernels/host/attention.hpp"
#include "dpml/kernels/host/batch_norm.hpp"
#include "dpml/kernels/host/conv.hpp"
#include "dpml/kernels/host/cross_entropy.hpp"
#include "dpml/kernels/host/elementwise.hpp"
#include "dpml/kernels/host/embedding.hpp"
#include "dpml/kernels/host/gemm.hpp"
#include "dpml/kernels/host/layer_norm.hpp"
#include "dpml/kernels/host/pool.hpp"
#include "dpml/kernels/host/softmax.hpp"

#include "dpml/parallel/data.hpp"
#include "dpml/parallel/distributed_optimizer.hpp"
#include "dpml/core/flat_parameters.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/parallel/pipeline/executor.hpp"
#include "dpml/parallel/pipeline/partition.hpp"
#include "dpml/parallel/pipeline/schedule.hpp"
#include "dpml/parallel/pipeline/transport.hpp"
#include "dpml/parallel/strategy.hpp"
#include "dpml/parallel/tensor.hpp"

#include "dpml/optim/adamw.hpp"
#include "dpml/optim/clip.hpp"
#include "dpml/optim/optimizer.hpp"
#include "dpml/optim/schedule.hpp"
#include "dpml/optim/sgd.hpp"

#include "dpml/data/idx.hpp"
#include "dpml/data/image.hpp"
#include "dpml/data/loader.hpp"
#include "dpml/data/sampler.hpp"
#include "dpml/data/text.hpp"
#include "dpml/data/token_shards.hpp"

#include "dpml/checkpoint/checkpoint.hpp"
#include "dpml/checkpoint/json.hpp"
#include "dpml/checkpoint/manifest.hpp"
#include "dpml/checkpoint/safetensors.hpp"

#include "dpml/layers/activation.hpp"
#include "dpml/layers/attention.hpp"
#include "dpml/layers/batch_norm.hpp"
#include "dpml/layers/conv2d.hpp"
#include "dpml/layers/cross_entropy.hpp"
#include "dpml/layers/dropout.hpp"
#include "dpml/layers/embedding.hpp"
#include "dpml/layers/flatten.hpp"
#include "dpml/layers/init.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/layer_norm.hpp"
#include "dpml/layers/linear.hpp"
#include "dpml/layers/mlp.hpp"
#include "dpml/layers/parallel_linear.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/layers/pool.hpp"
#include "dpml/layers/residual.hpp"
#include "dpml/layers/sequential.hpp"
#include "dpml/layers/stack.hpp"
#include "dpml/layers/transformer_block.hpp"
#include "dpml/layers/vocab_parallel_cross_entropy.hpp"

#include "dpml/models/bottleneck_resnet.hpp"
#include "dpml/models/gpt.hpp"
#include "dpml/models/mlp.hpp"
#include "dpml/models/resnet.hpp"

#include "dpml/train/args.hpp"
#include "dpml/train/batch.hpp"
#include "dpml/train/checkpointing.hpp"
#include "dpml/train/classifier.hpp"
#include "dpml/train/gpt_trainer.hpp"
#include "dpml/train/layer_stage.hpp"
#include "dpml/train/progress.hpp"
#include "dpml/train/trainer.hpp"

#if defined(DPML_WITH_CUDA)
#if defined(DPML_WITH_NCCL)
#include "dpml/comm/nccl.hpp"
#endif
#include "dpml/core/cuda_allocator.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/cuda_space.hpp"
#endif

#if defined(DPML_WITH_CUDA) && defined(__CUDACC__)
#if defined(DPML_WITH_NCCL)
#include "dpml/comm/nccl_copy_engine.hpp"
#endif
#include "dpml/kernels/cuda/adamw.hpp"
#include "dpml/kernels/cuda/attention.hpp"
#include "dpml/kernels/cuda/attention_mma.hpp"
#include "dpml/kernels/cuda/attention_simt.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/conv/batch_norm.hpp"
#include "dpml/kernels/cuda/conv/conv2d.hpp"
#if DPML_HAS_CUDNN
#include "dpml/kernels/cuda/conv/cudnn.hpp"
#endif
#include "dpml/kernels/cuda/conv/pool.hpp"
#include "dpml/kernels/cuda/cross_entropy.hpp"
#include "dpml/kernels/cuda/elementwise.hpp"
#include "dpml/kernels/cuda/embedding.hpp"
#include "dpml/kernels/cuda/gemm/block_tile.hpp"
#include "dpml/kernels/cuda/gemm/cublaslt.hpp"
#include "dpml/kernels/cuda/gemm/dispatch.hpp"
#include "dpml/kernels/cuda/gemm/epilogue.hpp"
#include "dpml/kernels/cuda/gemm/gemm.hpp"
#include "dpml/kernels/cuda/grad_norm.hpp"
#include "dpml/kernels/cuda/layer_norm.hpp"
#include "dpml/kernels/cuda/mma.hpp"
#include "dpml/kernels/cuda/reduce.hpp"
#include "dpml/kernels/cuda/sgd.hpp"
#include "dpml/models/cuda/gpt.hpp"
#include "dpml/models/cuda/gpt_pipeline.hpp"
#include "dpml/models/cuda/precision.hpp"
#include "dpml/models/cuda/profiler.hpp"
#include "dpml/models/cuda/resnet.hpp"
#include "dpml/train/cuda/gpt_trainer.hpp"
#endif
