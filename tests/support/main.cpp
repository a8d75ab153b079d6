// The main() of every dpml test program: MPI_Init, one Catch2 session per rank, failures summed
// over all ranks. Rank 0 reports normally; the other ranks report only when they fail (their
// output goes to a temporary file that is copied to stderr), so a failure on any rank is shown
// and makes the whole program exit non-zero.
#define CATCH_CONFIG_RUNNER  // Catch2 v2: this file provides main()
#include "catch.hpp"

#include <dpml/core/error.hpp>

#include <mpi.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  dpml::detail::remember_world_rank();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  std::vector<char*> args(argv, argv + argc);
  const std::string out_path = "/tmp/dpml-test-rank" + std::to_string(rank) + "-" + std::to_string(::getpid()) + ".txt";
  std::string out_flag = "--out", out_arg = out_path;
  if (rank != 0) {
    args.push_back(out_flag.data());
    args.push_back(out_arg.data());
  }
  Catch::Session session;
  int failed = session.applyCommandLine(static_cast<int>(args.size()), args.data());
  if (failed == 0) failed = session.run();

  if (rank != 0) {
    if (failed != 0) {
      std::ifstream in(out_path);
      std::stringstream ss;
      ss << in.rdbuf();
      std::cerr << "---- rank " << rank << " failed ----\n" << ss.str() << std::flush;
    }
    std::remove(out_path.c_str());
  }
  int local = failed != 0 ? 1 : 0, total = 0;
  MPI_Allreduce(&local, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
