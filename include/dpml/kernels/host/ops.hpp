#pragma once
// kernels::Ops<HostSpace>: the host kernels behind the one extension point of kernels/ops.hpp,
// composed of the kernel families, each defined beside its kernels in kernels/host/.

#include "dpml/kernels/host/activation.hpp"
#include "dpml/kernels/host/attention.hpp"
#include "dpml/kernels/host/batch_norm.hpp"
#include "dpml/kernels/host/compression.hpp"
#include "dpml/kernels/host/conv.hpp"
#include "dpml/kernels/host/cross_entropy.hpp"
#include "dpml/kernels/host/elementwise.hpp"
#include "dpml/kernels/host/embedding.hpp"
#include "dpml/kernels/host/gemm.hpp"
#include "dpml/kernels/host/grad_norm.hpp"
#include "dpml/kernels/host/id_check.hpp"
#include "dpml/kernels/host/layer_norm.hpp"
#include "dpml/kernels/host/lstm.hpp"
#include "dpml/kernels/host/pool.hpp"
#include "dpml/kernels/host/update.hpp"
#include "dpml/kernels/host/vision.hpp"
#include "dpml/kernels/image.hpp"
#include "dpml/kernels/ops.hpp"

namespace dpml::kernels {

template <>
struct Ops<HostSpace> : host::ElementwiseOps,
                        host::LinearOps,
                        host::LayerNormOps,
                        host::ActivationOps,
                        ImageOps<ImageLayout::nchw>,
                        host::ConvOps,
                        host::BatchNormOps,
                        host::PoolOps,
                        host::AttentionOps,
                        host::DropoutOps,
                        host::UpdateOps,
                        host::GradNormOps,
                        host::EmbeddingOps,
                        host::CrossEntropyOps,
                        host::IdCheckOps,
                        host::VisionOps,
                        host::LstmOps,
                        host::CompressionOps {};

}  // namespace dpml::kernels
