#pragma once
// DeviceGrid<Comm, DataComm>: the communicators of a ProcessGrid's axes for *device* buffers, built
// once from the grid's MPI groups (which stay the host's: bootstrap, host data, checkpoints). The
// trainer hands them to whoever moves device tensors: the tensor axis to TensorRegion<Comm> (the
// tensor-parallel layers), the data axis to the gradient buckets and ZeRO
// (DistributedOptimizer), the pipeline axis to the pipeline transport, the world to the global
// gradient norm.
//
//   tensor, world    on the compute stream of `dev`: their results are needed by the very next
//                    kernel (a row-parallel output, the clipping scale), so nothing overlaps them
//   data, pipeline   on streams of their own: bucket reductions and activations in flight overlap
//                    compute, ordered against it by events (parallel/comm_link.hpp)
//   pipeline_ends    pp > 1: the first and the last stage of this rank's pipeline (ranks of equal
//                    tensor and data coordinates), on the compute stream — a model whose first and
//                    last stage hold a tied tensor (GPT's token embedding) sums its two gradients
//                    there after the backward; null on the other stages and at pp = 1
//
// Every NCCL communicator costs device memory (~0.25 GiB on an H200 with NCCL's default buffers),
// so a group that another already spans gets no communicator of its own but a handle of that one
// on its stream (Nccl::on; NCCL serialises one communicator's operations across streams): the
// world shares the communicator of an axis that spans it (dp, tp or pp = world size; the world
// only sums, the gradient norm, after that axis' work of the step), and at pp = 2 the two ends
// are the whole pipeline axis. Two GPUs then hold one communicator, not two (dp 2, tp 2) or
// three (pp 2). A communicator without such handles (comm::Staged, or a DataComm unlike Comm)
// gets its own.
//
// Comm is comm::Nccl (a GPU per rank) or comm::Staged (ranks sharing a GPU, through host memory);
// DataComm may differ for the data axis: comm::CopyEngine for two GPUs of one host, or
// comm::Hierarchical<Comm> over the grid's data nodes (DataParallel<…, Hierarchical>: node and
// cross-node communicators sharing one stream; grid.ranks_per_node()). Construction is
// collective over the world (each axis' communicator over its group, in the same order on every
// rank). Instantiated only in CUDA translation units (the communicators are CUDA types).
//
//   kernels::Device<CudaSpace> dev;
//   parallel::DeviceGrid<comm::Nccl> comms(grid, dev);
//   TensorRegion<comm::Nccl> tp(&comms.tensor());

#include "dpml/comm/hierarchical.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/axis.hpp"
#include "dpml/kernels/device.hpp"
#include "dpml/parallel/grid.hpp"

#include <concepts>
#include <optional>

namespace dpml::parallel {

template <class Comm, class DataComm = Comm>
class DeviceGrid {
 public:
  template <class Space>
  DeviceGrid(const ProcessGrid& grid, kernels::Device<Space>& dev)
      : grid_(&grid),
        tensor_(Comm::from(grid.comm(Axis::tensor), dev.stream())),
        data_(data_axis(grid)),
        pipeline_(Comm::from(grid.comm(Axis::pipeline))),
        world_(world_comm(grid, dev.stream())) {
    if (grid.pp() == 1) return;
    if constexpr (shares<decltype(dev.stream())>) {
      if (grid.pp() == 2) {
        ends_.emplace(pipeline_.on(dev.stream()));
        return;
      }
    }
    const int stage = grid.coord(Axis::pipeline);
    const bool end = stage == 0 || stage == grid.pp() - 1;
    ends_group_ = grid.comm(Axis::pipeline).split(end ? 0 : MPI_UNDEFINED, stage);  // collective over the pipeline axis
    if (end) ends_.emplace(Comm::from(ends_group_, dev.stream()));                  // over the two ends only
  }

  DeviceGrid(const DeviceGrid&) = delete;
  DeviceGrid& operator=(const DeviceGrid&) = delete;

  const ProcessGrid& grid() const noexcept { return *grid_; }
  const Comm& tensor() const noexcept { return tensor_; }
  const DataComm& data() const noexcept { return data_; }
  const Comm& pipeline() const noexcept { return pipeline_; }
  const Comm& world() const noexcept { return world_; }
  const Comm* pipeline_ends() const noexcept { return ends_ ? &*ends_ : nullptr; }
  // The communicator of axis `a` (one type for all axes).
  const Comm& comm(Axis a) const noexcept
    requires std::same_as<Comm, DataComm>
  {
    return a == Axis::tensor ? tensor_ : a == Axis::data ? data_ : pipeline_;
  }

 private:
  // Comm has handles on other streams (comm::Nccl::on).
  template <class Stream>
  static constexpr bool shares = requires(const Comm& c, Stream s) {
    { c.on(s) } -> std::same_as<Comm>;
  };

  // The world's communicator: a handle of an axis' that spans the world (members built above;
  // every rank takes the same branch: the sizes are the grid's), else a new one.
  template <class Stream>
  Comm world_comm(const ProcessGrid& grid, Stream stream) const {
    if constexpr (shares<Stream>) {
      const int n = grid.world().size();
      if (grid.tp() == n) return tensor_.on(stream);
      if (grid.pp() == n) return pipeline_.on(stream);
      if constexpr (std::same_as<Comm, DataComm>)
        if (grid.dp() == n) return data_.on(stream);
    }
    return Comm::from(grid.world(), stream);
  }

  static DataComm data_axis(const ProcessGrid& grid) {
    if constexpr (comm::is_hierarchical<DataComm>) return DataComm::from(grid.comm(Axis::data), grid.ranks_per_node());
    else return DataComm::from(grid.comm(Axis::data));
  }

  const ProcessGrid* grid_;
  Comm tensor_;
  DataComm data_;
  Comm pipeline_;
  Comm world_;
  comm::Mpi ends_group_{MPI_COMM_NULL};  // the host group of pipeline_ends (kept for its lifetime)
  std::optional<Comm> ends_;
};

}  // namespace dpml::parallel
