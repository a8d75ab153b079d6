#pragma once
// Tensor parallelism's four conjugate operations (Megatron-LM, Shoeybi et al. 2019), the only
// places where tensor-parallel layers communicate:
//
//   copy_to      forward: identity             backward: all-reduce (sum) over the tensor axis
//   reduce_from  forward: all-reduce (sum)     backward: identity
//   gather       forward: all-gather the last dimension     backward: keep own slice
//   scatter      forward: keep own slice of the last dim    backward: all-gather
//
// A column-parallel linear is copy_to → local GEMM; a row-parallel linear is local GEMM →
// reduce_from. TensorRegion holds the tensor axis' communicator (or none when tp = 1, where all
// four are identities/copies) and exposes exactly these operations, on views of the space's
// memory. Comm is any Communicator (comm::Mpi for host tensors, comm::Nccl or comm::Staged for
// device tensors). A device communicator must enqueue on the stream the layers' kernels run on
// (Comm::from(group, device.stream())): its collectives are then ordered with them, and nothing
// here synchronises the host. The gather and scatter of the last dimension take the space's
// kernels::Device (the Context's), for a scratch buffer and the strided copy of
// kernels::Ops<Space>::copy_columns; host callers may leave it out.
//
// Traffic: sent_bytes() counts the bytes this rank sent through the region's operations since it
// was made, by the ring formulas of parallel/wire_bytes.hpp (an all-reduce of n elements over tp
// ranks 2(tp−1)/tp · n, an all-gather (tp−1) · n per rank). Copies of a region share the count, so
// a model that hands its region to its layers reads its tensor-parallel traffic from its own copy
// (models::Gpt::tensor_bytes, StepResult::tensor_bytes).
//
// default_comm_t<Space> is the communicator a space's tensor-parallel layers take unless told
// otherwise: comm::Mpi on the host, comm::Nccl on a GPU (in CUDA translation units); a layer's Comm
// argument names another (comm::Staged: several ranks sharing one GPU, as the tests do).

#include "dpml/comm/communicator.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/parallel/wire_bytes.hpp"
#if defined(__CUDACC__)
#include "dpml/comm/nccl.hpp"
#include "dpml/core/cuda_space.hpp"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace dpml::parallel {

template <class Space>
struct DefaultComm {
  static_assert(dependent_false<Space>, "dpml: no default tensor-parallel communicator for this memory space");
};
template <>
struct DefaultComm<HostSpace> {
  using type = comm::Mpi;
};
#if defined(__CUDACC__)
template <>
struct DefaultComm<CudaSpace> {
  using type = comm::Nccl;
};
#endif
template <class Space>
using default_comm_t = typename DefaultComm<Space>::type;

template <class Comm>
class TensorRegion {
 public:
  TensorRegion() = default;  // tp = 1
  explicit TensorRegion(const Comm* comm)
      : comm_(comm && comm->size() > 1 ? comm : nullptr), sent_(comm_ ? std::make_shared<std::int64_t>(0) : nullptr) {}

  int size() const noexcept { return comm_ ? comm_->size() : 1; }
  int rank() const noexcept { return comm_ ? comm_->rank() : 0; }

  // copy_to backward / reduce_from forward: in-place sum over the tensor axis.
  template <class T, class Space>
  void all_reduce(TensorView<T, Space> x) const {
    if (!comm_) return;
    comm_->allreduce(x.data(), static_cast<std::size_t>(x.numel()), comm::ReduceOp::sum);
    *sent_ += wire_bytes::allreduce(x.numel(), sizeof(T), size());
  }
  template <class T, class Space>
  void copy_to_backward(TensorView<T, Space> dx) const { all_reduce(dx); }
  template <class T, class Space>
  void reduce_from_forward(TensorView<T, Space> y) const { all_reduce(y); }

  // gather forward: local (rows, c) → full (rows, c·tp), slices in tensor-rank order. The ranks'
  // slices are all-gathered into the Device's scratch, (tp, rows, c), then each is copied into its
  // columns of `full` (one strided copy per rank).
  template <class T, class Space>
  void gather_last_dim(kernels::Device<Space>& dev, TensorView<const T, Space> local, TensorView<T, Space> full) const {
    using Ops = kernels::Ops<Space>;
    const auto [rows, c] = rows_and_cols(local, full, "gather");
    if (!comm_) return Ops::copy(dev, local.data(), full.data(), local.numel());
    T* parts = dev.template scratch<T>(full.numel());  // (tp, rows, c)
    comm_->allgather(local.data(), parts, static_cast<std::size_t>(local.numel()));
    *sent_ += wire_bytes::allgather(local.numel(), sizeof(T), size());
    const std::int64_t p = size();
    for (std::int64_t k = 0; k < p; ++k) Ops::copy_columns(dev, parts + k * rows * c, c, full.data() + k * c, c * p, rows, c);
  }
  // scatter forward / gather backward: full (rows, c·tp) → this rank's slice (rows, c).
  template <class T, class Space>
  void keep_own_slice(kernels::Device<Space>& dev, TensorView<const T, Space> full, TensorView<T, Space> local) const {
    const auto [rows, c] = rows_and_cols(TensorView<const T, Space>(local), TensorView<const T, Space>(full), "scatter");
    kernels::Ops<Space>::copy_columns(dev, full.data() + rank() * c, c * size(), local.data(), c, rows, c);
  }
  template <class T, class Space>
  void gather_backward(kernels::Device<Space>& dev, TensorView<const T, Space> dfull, TensorView<T, Space> dlocal) const {
    keep_own_slice(dev, dfull, dlocal);
  }
  template <class T, class Space>
  void scatter_forward(kernels::Device<Space>& dev, TensorView<const T, Space> full, TensorView<T, Space> local) const {
    keep_own_slice(dev, full, local);
  }
  template <class T, class Space>
  void scatter_backward(kernels::Device<Space>& dev, TensorView<const T, Space> dlocal, TensorView<T, Space> dfull) const {
    gather_last_dim(dev, dlocal, dfull);
  }

  // The same on host tensors, without a Device at hand (a temporary one holds the scratch).
  template <class T>
  void gather_last_dim(TensorView<const T> local, TensorView<T> full) const {
    kernels::Device<HostSpace> dev;
    gather_last_dim(dev, local, full);
  }
  template <class T>
  void keep_own_slice(TensorView<const T> full, TensorView<T> local) const {
    kernels::Device<HostSpace> dev;
    keep_own_slice(dev, full, local);
  }
  template <class T>
  void gather_backward(TensorView<const T> dfull, TensorView<T> dlocal) const { keep_own_slice(dfull, dlocal); }
  template <class T>
  void scatter_forward(TensorView<const T> full, TensorView<T> local) const { keep_own_slice(full, local); }
  template <class T>
  void scatter_backward(TensorView<const T> dlocal, TensorView<T> dfull) const { gather_last_dim(dlocal, dfull); }

  const Comm* comm() const noexcept { return comm_; }
  // Bytes this rank sent through the operations of this region and its copies (0 when tp = 1).
  std::int64_t sent_bytes() const noexcept { return sent_ ? *sent_ : 0; }

 private:
  // (rows, c) of the local side, checking that the full side is tp times as wide.
  template <class T, class Space, class U>
  std::pair<std::int64_t, std::int64_t> rows_and_cols(TensorView<const T, Space> local, TensorView<U, Space> full,
                                                      const char* what) const {
    const std::int64_t c = local.rank() > 0 ? local.size(local.rank() - 1) : 1;
    DPML_REQUIRE(full.numel() == local.numel() * size() && local.is_contiguous() && full.is_contiguous(),
                 what << ": full tensor " << full.shape().str() << " is not tp=" << size() << " × "
                      << local.shape().str() << " (both contiguous)");
    return {local.numel() / std::max<std::int64_t>(c, 1), c};
  }

  const Comm* comm_ = nullptr;
  std::shared_ptr<std::int64_t> sent_;  // shared by the copies; none when tp = 1
};

}  // namespace dpml::parallel
