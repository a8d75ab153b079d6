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
// memory. Comm is any Communicator (comm::Mpi for host tensors, comm::Nccl for device tensors).
//
// default_comm_t<Space> is the communicator a space's tensor-parallel layers take unless told
// otherwise: comm::Mpi on the host, comm::Nccl on a GPU (in CUDA translation units); a layer's Comm
// argument names another (comm::Staged: several ranks sharing one GPU, as the tests do).

#include "dpml/comm/communicator.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#if defined(__CUDACC__)
#include "dpml/comm/nccl.hpp"
#include "dpml/core/cuda_space.hpp"
#endif

#include <algorithm>
#include <vector>

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
  explicit TensorRegion(const Comm* comm) : comm_(comm && comm->size() > 1 ? comm : nullptr) {}

  int size() const noexcept { return comm_ ? comm_->size() : 1; }
  int rank() const noexcept { return comm_ ? comm_->rank() : 0; }

  // copy_to backward / reduce_from forward: in-place sum over the tensor axis.
  template <class T, class Space>
  void all_reduce(TensorView<T, Space> x) const {
    if (comm_) comm_->allreduce(x.data(), static_cast<std::size_t>(x.numel()), comm::ReduceOp::sum);
  }
  template <class T, class Space>
  void copy_to_backward(TensorView<T, Space> dx) const { all_reduce(dx); }
  template <class T, class Space>
  void reduce_from_forward(TensorView<T, Space> y) const { all_reduce(y); }

  // gather forward: local (rows, c) → full (rows, c·tp), slices in tensor-rank order.
  template <class T>
  void gather_last_dim(TensorView<const T> local, TensorView<T> full) const {
    const std::int64_t c = local.size(local.rank() - 1), rows = local.numel() / std::max<std::int64_t>(c, 1);
    DPML_REQUIRE(full.numel() == local.numel() * size(), "gather: full tensor " << full.shape().str() << " is not tp="
                                                                                << size() << " × " << local.shape().str());
    if (!comm_) {
      std::copy(local.begin(), local.end(), full.begin());
      return;
    }
    std::vector<T> parts(static_cast<std::size_t>(full.numel()));  // (tp, rows, c)
    comm_->allgather(local.data(), parts.data(), static_cast<std::size_t>(local.numel()));
    const std::int64_t p = size();
    for (std::int64_t k = 0; k < p; ++k)
      for (std::int64_t r = 0; r < rows; ++r)
        std::copy_n(parts.data() + (k * rows + r) * c, c, full.data() + r * c * p + k * c);
  }
  // scatter forward / gather backward: full (rows, c·tp) → this rank's slice (rows, c).
  template <class T>
  void keep_own_slice(TensorView<const T> full, TensorView<T> local) const {
    const std::int64_t c = local.size(local.rank() - 1), rows = local.numel() / std::max<std::int64_t>(c, 1);
    DPML_REQUIRE(full.numel() == local.numel() * size(), "scatter: full tensor " << full.shape().str()
                                                                                 << " is not tp=" << size() << " × "
                                                                                 << local.shape().str());
    const std::int64_t p = size(), k = rank();
    for (std::int64_t r = 0; r < rows; ++r) std::copy_n(full.data() + r * c * p + k * c, c, local.data() + r * c);
  }
  template <class T>
  void gather_backward(TensorView<const T> dfull, TensorView<T> dlocal) const { keep_own_slice(dfull, dlocal); }
  template <class T>
  void scatter_forward(TensorView<const T> full, TensorView<T> local) const { keep_own_slice(full, local); }
  template <class T>
  void scatter_backward(TensorView<const T> dlocal, TensorView<T> dfull) const { gather_last_dim(dlocal, dfull); }

  const Comm* comm() const noexcept { return comm_; }

 private:
  const Comm* comm_ = nullptr;
};

}  // namespace dpml::parallel
