#pragma once
// dpml::run: the body of a dpml main(). It opens the MPI session, runs `body(world)`, and turns
// every escaping error into a clean, job-wide exit:
//   * an Error with Scope::everywhere (every rank found it alone: a bad layout or flag) is printed
//     once, by world rank 0, and every rank returns 1 after MPI_Finalize;
//   * any other exception is printed by the rank that caught it, which then calls MPI_Abort, so
//     ranks waiting for it in a collective do not hang. It waits a moment first: the launcher
//     (MPICH's hydra) may tear the job down before it has forwarded that rank's last lines, and
//     the message is the point (seen lost in ~2 % of runs of test_pipeline_executor_failure_np3).
//
//   int main(int argc, char** argv) {
//     return dpml::run(argc, argv, [&](const dpml::comm::Mpi& world) { ...; return 0; });
//   }

#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"

#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

namespace dpml {

template <class Body>
int run(int argc, char** argv, Body&& body) {
  comm::MpiSession session(argc, argv);
  const comm::Mpi world = session.world();
  try {
    return body(world);
  } catch (const Error& e) {
    if (e.scope() == Scope::everywhere) {
      if (world.rank() == 0) std::fprintf(stderr, "dpml: %s\n", e.message().c_str());
      return 1;
    }
    std::fprintf(stderr, "%s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dpml error on rank %d: %s\n", world.rank(), e.what());
  }
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

}  // namespace dpml
