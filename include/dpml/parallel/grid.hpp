#pragma once
// ProcessGrid: the world's ranks arranged on three axes — tensor (fastest), data, pipeline
// (slowest) — with one sub-communicator per axis and per pair of axes.
//
//   rank = tp_rank + tp · (dp_rank + dp · pp_rank)        (DESIGN.md, "Rank layout")
//
// Tensor-parallel groups are consecutive ranks (one node, NVLink); the data axis is what is left
// of the world once tp and pp are given. The data axis' nodes, for a hierarchical all-reduce
// (DataParallel<…, Hierarchical>): the ranks sharing a host, or, to model a cluster on one host,
// consecutive data ranks by Layout::ranks_per_node (--ranks-per-node), which must divide dp. A layout that does not divide the world raises an Error
// with Scope::everywhere: every rank detects it alone, dpml::run prints it once and every rank
// exits 1 — no collective is entered, so nothing can hang.
//
// The grid is a value handed to whoever needs a communicator; there is no global grid.

#include "dpml/comm/mpi.hpp"
#include "dpml/core/axis.hpp"
#include "dpml/core/error.hpp"

#include <array>
#include <sstream>
#include <string>

namespace dpml::parallel {

using dpml::Axis;  // core/axis.hpp
using dpml::axis_name;
using dpml::kAxes;

// Requested degrees. dp = 0 means "what is left of the world".
struct Layout {
  int tp = 1;
  int pp = 1;
  int dp = 0;
  int ranks_per_node = 0;  // data ranks per node; 0: the ranks of the data axis sharing a host
};

struct Coord {
  int tp = 0, dp = 0, pp = 0;
  int operator[](Axis a) const { return a == Axis::tensor ? tp : a == Axis::data ? dp : pp; }
};

class ProcessGrid {
 public:
  // Collective over `world`: every rank must call it with the same layout.
  static ProcessGrid create(const comm::Mpi& world, Layout layout) {
    check_layout(world.size(), layout).throw_if_error(Scope::everywhere);
    return ProcessGrid(world, layout);
  }

  // Why a layout cannot run on `world_size` ranks, or ok.
  static Status check_layout(int world_size, Layout l) {
    std::ostringstream os;
    if (l.tp < 1 || l.pp < 1 || l.dp < 0) {
      os << "invalid layout --tp " << l.tp << " --pp " << l.pp << " --dp " << l.dp << ": degrees must be positive";
    } else if (world_size % (l.tp * l.pp) != 0) {
      os << "layout --tp " << l.tp << " × --pp " << l.pp << " = " << l.tp * l.pp << " does not divide the "
         << world_size << " ranks of this launch; launch a multiple of " << l.tp * l.pp << " ranks or change --tp/--pp";
    } else if (l.dp != 0 && l.tp * l.pp * l.dp != world_size) {
      os << "layout --tp " << l.tp << " × --pp " << l.pp << " × --dp " << l.dp << " = " << l.tp * l.pp * l.dp
         << " ranks, but this launch has " << world_size;
    } else if (const int dp = world_size / (l.tp * l.pp); l.ranks_per_node < 0 || (l.ranks_per_node > 0 && dp % l.ranks_per_node != 0)) {
      os << "--ranks-per-node " << l.ranks_per_node << " does not divide the data axis' " << dp << " ranks (world "
         << world_size << " = tp " << l.tp << " × dp " << dp << " × pp " << l.pp
         << "): give a divisor of " << dp << ", or 0 for the hosts of the launch";
    } else {
      return {};
    }
    return Status::failure(os.str());
  }

  int world_size() const noexcept { return world_size_; }
  int world_rank() const noexcept { return world_rank_; }
  int size(Axis a) const noexcept { return sizes_[static_cast<int>(a)]; }
  int coord(Axis a) const noexcept { return coord_[a]; }
  const Coord& coord() const noexcept { return coord_; }
  int tp() const noexcept { return size(Axis::tensor); }
  int dp() const noexcept { return size(Axis::data); }
  int pp() const noexcept { return size(Axis::pipeline); }
  // Data ranks per node as laid out (0: the launch's hosts decide; comm::Hierarchical).
  int ranks_per_node() const noexcept { return ranks_per_node_; }

  // World rank of the process at these coordinates.
  int rank_of(Coord c) const noexcept { return c.tp + tp() * (c.dp + dp() * c.pp); }
  static Coord coord_of(int rank, int tp, int dp) noexcept { return {rank % tp, (rank / tp) % dp, rank / (tp * dp)}; }

  const comm::Mpi& world() const noexcept { return world_; }
  // The ranks that differ from this one only along `a` (ordered by their coordinate on `a`).
  const comm::Mpi& comm(Axis a) const noexcept { return axis_comms_[static_cast<int>(a)]; }
  // The ranks that differ from this one only along `a` and `b` (ordered by layout rank).
  const comm::Mpi& comm(Axis a, Axis b) const noexcept {
    return pair_comms_[static_cast<int>(a) + static_cast<int>(b) - 1];
  }

  bool is_first_stage() const noexcept { return coord_.pp == 0; }
  bool is_last_stage() const noexcept { return coord_.pp == pp() - 1; }

  std::string describe() const {
    std::ostringstream os;
    os << "world " << world_size_ << " = tp " << tp() << " × dp " << dp() << " × pp " << pp();
    return os.str();
  }

 private:
  ProcessGrid(const comm::Mpi& world, Layout l)
      : world_(world.native()), world_size_(world.size()), world_rank_(world.rank()), ranks_per_node_(l.ranks_per_node) {
    sizes_ = {l.tp, world_size_ / (l.tp * l.pp), l.pp};
    coord_ = coord_of(world_rank_, l.tp, sizes_[1]);
    for (Axis a : kAxes) {
      // Color: the coordinates on the other two axes; key: the coordinate on this one.
      int color = 0;
      for (Axis o : kAxes)
        if (o != a) color = color * world_size_ + coord_[o];
      axis_comms_[static_cast<int>(a)] = world.split(color, coord_[a]);
    }
    // Pairs (tensor,data)=0, (tensor,pipeline)=1, (data,pipeline)=2: color = the third axis.
    for (Axis a : kAxes)
      for (Axis b : kAxes)
        if (static_cast<int>(a) < static_cast<int>(b)) {
          const Axis third = static_cast<Axis>(3 - static_cast<int>(a) - static_cast<int>(b));
          pair_comms_[static_cast<int>(a) + static_cast<int>(b) - 1] = world.split(coord_[third], world_rank_);
        }
  }

  comm::Mpi world_;
  int world_size_, world_rank_;
  int ranks_per_node_;
  std::array<int, 3> sizes_{};
  Coord coord_{};
  std::array<comm::Mpi, 3> axis_comms_;
  std::array<comm::Mpi, 3> pair_comms_;
};

}  // namespace dpml::parallel

namespace dpml {
using parallel::Coord;
using parallel::Layout;
using parallel::ProcessGrid;
}  // namespace dpml
