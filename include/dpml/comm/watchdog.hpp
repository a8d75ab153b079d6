#pragma once
// The collective watchdog: no silent hangs.
//
// Every blocking MPI call of dpml is a non-blocking call followed by Request::wait(), a polling
// loop (comm/mpi.hpp). The loop asks the watchdog every kPollsPerCheck polls whether the wait has
// lasted longer than the timeout; only then does it read the clock, so a healthy wait costs one
// counter increment per poll. When the timeout passes (a peer died, hangs, or stopped calling
// the collective) the waiting rank prints
//
//   dpml watchdog: rank 1 waited 5.0 s in allreduce on group 'data' (2 ranks) at step 7 —
//   a peer is dead or stuck; ending the job
//
// and calls MPI_Abort, which ends every rank of the job with a non-zero status (Hydra and Slurm
// kill the others) — nobody is left waiting, and a restart loop can resume from the last
// checkpoint.
//
// State is per process: the timeout (--collective-timeout, 0 = off, the default until a
// program sets it), the step the trainer is in, and names for communicators (the grid's axes:
// "tensor", "data", "pipeline"; unnamed ones are described by their size).
//
//   comm::watchdog::set_timeout(300.0);
//   comm::watchdog::name_group(grid.comm(Axis::data).native(), "data");
//   comm::watchdog::set_step(step);          // once per step, by the training loop

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace dpml::comm::watchdog {

// Polls between two clock reads in Request::wait().
inline constexpr std::uint32_t kPollsPerCheck = 256;

namespace detail {
inline std::atomic<double> timeout_seconds{0.0};
inline std::atomic<std::int64_t> current_step{-1};
inline std::mutex names_mutex;
inline std::map<MPI_Comm, std::string>& names() {
  static std::map<MPI_Comm, std::string> n;
  return n;
}
}  // namespace detail

// Seconds a single wait may last before the job is ended; <= 0 turns the watchdog off.
inline void set_timeout(double seconds) noexcept { detail::timeout_seconds.store(seconds); }
inline double timeout() noexcept { return detail::timeout_seconds.load(); }
// The step being run, for the report (-1: outside training).
inline void set_step(std::int64_t step) noexcept { detail::current_step.store(step); }

// Names a communicator for the report ("data", "tensor", …).
inline void name_group(MPI_Comm comm, std::string name) {
  const std::lock_guard lock(detail::names_mutex);
  detail::names()[comm] = std::move(name);
}

inline std::string group_name(MPI_Comm comm) {
  {
    const std::lock_guard lock(detail::names_mutex);
    if (auto it = detail::names().find(comm); it != detail::names().end()) return it->second;
  }
  if (comm == MPI_COMM_WORLD) return "world";
  return "unnamed";
}

// Times one wait: started on construction; expired() is cheap (a clock read every
// kPollsPerCheck calls).
class Timer {
 public:
  Timer() : limit_(timeout()) {
    if (limit_ > 0) start_ = std::chrono::steady_clock::now();
  }
  bool expired() {
    if (limit_ <= 0 || ++polls_ % kPollsPerCheck != 0) return false;
    return elapsed() > limit_;
  }
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  double limit_;
  std::uint32_t polls_ = 0;
  std::chrono::steady_clock::time_point start_{};
};

// Reports a wait that timed out and ends the job (does not return). `peer`: the rank in `comm`
// a point-to-point operation waits for, or -1.
[[noreturn]] inline void expire(const char* op, MPI_Comm comm, int peer, double waited) {
  int world_rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  if (comm != MPI_COMM_NULL) MPI_Comm_size(comm, &size);
  const std::int64_t step = detail::current_step.load();
  std::string where = "group '" + group_name(comm) + "' (" + std::to_string(size) + " ranks)";
  if (peer >= 0) where += ", peer " + std::to_string(peer) + " of that group";
  const std::string when = step >= 0 ? "at step " + std::to_string(step) : std::string("outside training");
  std::fprintf(stderr,
               "dpml watchdog: rank %d waited %.1f s in %s on %s %s — a peer is dead or stuck "
               "(--collective-timeout %.1f s); ending the job\n",
               world_rank, waited, op, where.c_str(), when.c_str(), timeout());
  std::fflush(stderr);
  // Let the launcher forward the line before MPI_Abort tears the job (and its pipes) down.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();  // MPI_Abort does not return; should it, nothing may go on
}

}  // namespace dpml::comm::watchdog
