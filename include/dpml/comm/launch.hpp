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
// Before the body it gives the host BLAS the cores of this process divided among the ranks of its
// node (kernels/host/blas_threads.hpp), unless OPENBLAS_NUM_THREADS or OMP_NUM_THREADS is set.
//
//   int main(int argc, char** argv) {
//     return dpml::run(argc, argv, [&](const dpml::comm::Mpi& world) { ...; return 0; });
//   }
//
// dpml::run_local(program, body) is the same for a program that opens no MPI session (a converter,
// a planning tool): an escaping error is printed as "program: message" and main returns 1.

#include "dpml/comm/local_rank.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/kernels/host/blas_threads.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>

namespace dpml {

namespace detail {
// Collective over `world`.
inline void share_blas_threads(const comm::Mpi& world) {
  const int ranks_here = comm::node_local_rank(world).size;  // collective: every rank calls it
  if (std::getenv("OPENBLAS_NUM_THREADS") || std::getenv("OMP_NUM_THREADS")) return;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int all = static_cast<int>(std::thread::hardware_concurrency());
  const int cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : all;
  // A rank bound to some cores (Open MPI's --bind-to, srun --cpu-bind) sees only its share already.
  const bool bound = cores < all;
  kernels::host::set_blas_threads(bound ? cores : std::max(1, cores / std::max(1, ranks_here)));
}
}  // namespace detail

template <class Body>
int run(int argc, char** argv, Body&& body) {
  comm::MpiSession session(argc, argv);
  const comm::Mpi world = session.world();
  try {
    detail::share_blas_threads(world);
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

template <class Body>
int run_local(const char* program, Body&& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.message().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
  }
  return 1;
}

}  // namespace dpml
