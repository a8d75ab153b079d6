// A program that asks for a layout its launch cannot hold (--tp 3 on 4 ranks; --ranks-per-node 3
// on a data axis of 4): it must print one clear message and every rank must exit non-zero,
// quickly (checked by expect_failure.cmake).
#include <dpml/comm/launch.hpp>
#include <dpml/parallel/grid.hpp>

#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const dpml::comm::Mpi& world) {
    int tp = 3, ranks_per_node = 0;
    for (int i = 1; i + 1 < argc; ++i) {
      if (std::strcmp(argv[i], "--tp") == 0) tp = std::atoi(argv[i + 1]);
      if (std::strcmp(argv[i], "--ranks-per-node") == 0) ranks_per_node = std::atoi(argv[i + 1]);
    }
    auto grid = dpml::ProcessGrid::create(world, {.tp = tp, .pp = 1, .ranks_per_node = ranks_per_node});
    world.barrier();  // never reached with a bad layout: no rank may wait here
    return 0;
  });
}
