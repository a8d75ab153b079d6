// process_grid: the Step 1 example. It arranges the launch's ranks on the tensor / data /
// pipeline axes (--tp, --pp; data is what is left), prints every rank's coordinates as one table
// from rank 0, and runs one all-reduce over each axis, checking its result on every rank.
//
//   mpiexec -n 4 process_grid --tp 2          # world 4 = tp 2 × dp 2 × pp 1
//
// A layout that does not divide the launch is refused on every rank with one message; the program
// then exits 1. A wrong all-reduce result also exits 1.
#include <dpml/comm/launch.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/train/args.hpp>

#include <array>
#include <cstdio>
#include <vector>

namespace {

// Sum over the ranks of `a`'s group of (world rank + 1): what the all-reduce along `a` must give.
int expected_axis_sum(const dpml::ProcessGrid& grid, dpml::Axis a) {
  int sum = 0;
  dpml::Coord c = grid.coord();
  for (int i = 0; i < grid.size(a); ++i) {
    (a == dpml::Axis::tensor ? c.tp : a == dpml::Axis::data ? c.dp : c.pp) = i;
    sum += grid.rank_of(c) + 1;
  }
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const dpml::comm::Mpi& world) {
    int tp = 1, pp = 1;
    dpml::train::Args args("process_grid",
                           "Arrange the ranks of this launch on tensor (fastest), data and pipeline (slowest)\n"
                           "axes, print each rank's coordinates and check one all-reduce per axis.\n"
                           "The data-parallel degree is what is left: world / (tp * pp).");
    args.flag("--tp", tp, "tensor-parallel degree", dpml::train::at_least(1)).flag("--pp", pp, "pipeline-parallel degree", dpml::train::at_least(1));
    if (!args.parse(argc, argv, world.rank())) return 0;

    const auto grid = dpml::ProcessGrid::create(world, {.tp = tp, .pp = pp});

    // One all-reduce per axis; each rank contributes (world rank + 1).
    std::array<int, 3> got{};  // (axis)
    int bad = 0;
    for (dpml::Axis a : dpml::parallel::kAxes) {
      const int i = static_cast<int>(a);
      got[i] = grid.comm(a).allreduce(world.rank() + 1, dpml::comm::ReduceOp::sum);
      if (got[i] != expected_axis_sum(grid, a)) {
        std::fprintf(stderr, "rank %d: all-reduce over the %s axis gave %d, expected %d\n", world.rank(),
                     dpml::parallel::axis_name(a), got[i], expected_axis_sum(grid, a));
        bad = 1;
      }
    }

    // Gather every rank's row to rank 0, which prints the table in rank order.
    constexpr int kCols = 7;
    const dpml::Coord c = grid.coord();
    const std::array<int, kCols> row = {world.rank(), c.tp, c.dp, c.pp, got[0], got[1], got[2]};
    std::vector<int> table(static_cast<std::size_t>(kCols * world.size()));  // (world, kCols)
    world.allgather(row.data(), table.data(), kCols);
    if (world.rank() == 0) {
      std::printf("%s\n\n", grid.describe().c_str());
      std::printf(" rank   tp   dp   pp   sum(tensor)  sum(data)  sum(pipeline)\n");
      for (int r = 0; r < world.size(); ++r) {
        const int* t = &table[static_cast<std::size_t>(r * kCols)];
        std::printf("%5d %4d %4d %4d %13d %10d %14d\n", t[0], t[1], t[2], t[3], t[4], t[5], t[6]);
      }
    }

    bad = world.allreduce(bad, dpml::comm::ReduceOp::max);
    if (world.rank() == 0) std::printf("\nall-reduce over each axis: %s\n", bad ? "WRONG" : "ok");
    return bad;
  });
}
