// The program both consumer projects build against dpml (FetchContent and find_package): it runs
// under mpiexec -n 2, builds a tensor-parallel grid over the whole launch, all-reduces each rank's
// (rank + 1) over the tensor axis and exits 1 when the sum is wrong.
#include <dpml/comm/launch.hpp>
#include <dpml/parallel/grid.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const dpml::comm::Mpi& world) {
    const auto grid = dpml::ProcessGrid::create(world, {.tp = world.size(), .pp = 1});
    const int n = world.size();
    const int sum = grid.comm(dpml::Axis::tensor).allreduce(world.rank() + 1, dpml::comm::ReduceOp::sum);
    const int ok = world.allreduce(sum == n * (n + 1) / 2 ? 1 : 0, dpml::comm::ReduceOp::min);
    if (world.rank() == 0) std::printf("consumer: %s, tensor all-reduce %s\n", grid.describe().c_str(), ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
  });
}
