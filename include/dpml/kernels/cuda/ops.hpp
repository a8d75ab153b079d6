#pragma once
// kernels::Ops<CudaSpace>: the device kernels behind the one extension point of kernels/ops.hpp,
// composed of the kernel families, each defined beside its kernels in kernels/cuda/. CUDA
// translation units only (kernels/ops.hpp includes this file under __CUDACC__).

#include "dpml/kernels/cuda/attention.hpp"
#include "dpml/kernels/cuda/compression.hpp"
#include "dpml/kernels/cuda/conv/batch_norm.hpp"
#include "dpml/kernels/cuda/conv/conv_ops.hpp"
#include "dpml/kernels/cuda/conv/pool.hpp"
#include "dpml/kernels/cuda/cross_entropy.hpp"
#include "dpml/kernels/cuda/device.hpp"
#include "dpml/kernels/cuda/dropout.hpp"
#include "dpml/kernels/cuda/elementwise.hpp"
#include "dpml/kernels/cuda/embedding.hpp"
#include "dpml/kernels/cuda/grad_norm.hpp"
#include "dpml/kernels/cuda/id_check.hpp"
#include "dpml/kernels/cuda/layer_norm.hpp"
#include "dpml/kernels/cuda/linear.hpp"
#include "dpml/kernels/cuda/lstm.hpp"
#include "dpml/kernels/cuda/update.hpp"
#include "dpml/kernels/cuda/vision.hpp"
#include "dpml/kernels/image.hpp"
#include "dpml/kernels/ops.hpp"

namespace dpml::kernels {

template <>
struct Ops<CudaSpace> : cuda::ElementwiseOps,
                        cuda::LinearOps,
                        cuda::LayerNormOps,
                        cuda::ActivationOps,
                        ImageOps<ImageLayout::nhwc>,
                        cuda::ConvOps,
                        cuda::BatchNormOps,
                        cuda::PoolOps,
                        cuda::AttentionOps,
                        cuda::DropoutOps,
                        cuda::UpdateOps,
                        cuda::GradNormOps,
                        cuda::EmbeddingOps,
                        cuda::CrossEntropyOps,
                        cuda::IdCheckOps,
                        cuda::LstmOps,
                        cuda::VisionOps,
                        cuda::CompressionOps {};

}  // namespace dpml::kernels
