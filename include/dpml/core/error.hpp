#pragma once
// Errors in dpml: one exception type, dpml::Error, that carries the message, the rank that raised
// it and where (file:line), and checked-call macros for MPI (here) and for CUDA, NCCL and cuBLAS
// (core/cuda_error.hpp, only in CUDA builds). A Status is the non-throwing form for code that
// wants to collect a failure and decide later (e.g. agree across ranks before raising).
//
// An Error marked `everywhere` is one that every rank detects by itself (a layout that does not
// divide, a bad flag): dpml::run prints it once, from the lowest rank, and every rank exits 1.
// Any other Error is local: the rank that raised it prints it and aborts the whole job, so no
// rank is left waiting in a collective.

#include <mpi.h>

#include <atomic>
#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dpml {

namespace detail {
// The world rank, cached once MPI is up (remember_world_rank), so that an Error raised on a
// background thread (data loader, checkpoint writer) makes no MPI call: MPI runs with
// MPI_THREAD_SERIALIZED and belongs to the main thread.
inline std::atomic<int> cached_world_rank{-1};

// Call on the main thread right after MPI_Init (MpiSession and the test main do).
inline void remember_world_rank() noexcept {
  int initialized = 0, rank = -1;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  cached_world_rank.store(rank);
}
inline void forget_world_rank() noexcept { cached_world_rank.store(-1); }

// This process's rank in MPI_COMM_WORLD, or -1 when MPI is not (or no longer) running.
inline int world_rank_or_minus_one() noexcept { return cached_world_rank.load(); }
}  // namespace detail

enum class Scope { local, everywhere };

class Error : public std::runtime_error {
 public:
  explicit Error(std::string message, Scope scope = Scope::local,
                 std::source_location where = std::source_location::current())
      : std::runtime_error(format(message, detail::world_rank_or_minus_one(), where)),
        message_(std::move(message)),
        rank_(detail::world_rank_or_minus_one()),
        scope_(scope),
        where_(where) {}

  const std::string& message() const noexcept { return message_; }
  int rank() const noexcept { return rank_; }
  Scope scope() const noexcept { return scope_; }
  const std::source_location& where() const noexcept { return where_; }

 private:
  static std::string format(const std::string& message, int rank, const std::source_location& w) {
    std::ostringstream os;
    os << "dpml error";
    if (rank >= 0) os << " on rank " << rank;
    os << ": " << message << " [" << w.file_name() << ':' << w.line() << ']';
    return os.str();
  }
  std::string message_;
  int rank_;
  Scope scope_;
  std::source_location where_;
};

// A result without a value: ok, or a message. Raise it with throw_if_error().
class Status {
 public:
  Status() = default;
  static Status failure(std::string message) { return Status(std::move(message)); }
  bool ok() const noexcept { return message_.empty(); }
  explicit operator bool() const noexcept { return ok(); }
  const std::string& message() const noexcept { return message_; }
  void throw_if_error(Scope scope = Scope::local,
                      std::source_location where = std::source_location::current()) const {
    if (!ok()) throw Error(message_, scope, where);
  }

 private:
  explicit Status(std::string m) : message_(m.empty() ? std::string("unknown error") : std::move(m)) {}
  std::string message_;
};

namespace detail {
inline std::string mpi_error_text(int code, const char* call) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return std::string(call) + " failed: " + std::string(text, static_cast<std::size_t>(len));
}
}  // namespace detail

}  // namespace dpml

// Throws dpml::Error when `condition` is false; the message is streamed: DPML_REQUIRE(n > 0, "n=" << n).
#define DPML_REQUIRE(condition, message_stream)                          \
  do {                                                                   \
    if (!(condition)) {                                                  \
      std::ostringstream dpml_require_os_;                               \
      dpml_require_os_ << message_stream;                                \
      throw ::dpml::Error(dpml_require_os_.str());                       \
    }                                                                    \
  } while (0)

// The same, for a condition every rank evaluates alike (a flag, a layout, a shared file): the
// Error has Scope::everywhere, so dpml::run reports it once and all ranks exit 1 without MPI_Abort.
#define DPML_REQUIRE_EVERYWHERE(condition, message_stream)                               \
  do {                                                                                   \
    if (!(condition)) {                                                                  \
      std::ostringstream dpml_require_os_;                                               \
      dpml_require_os_ << message_stream;                                                \
      throw ::dpml::Error(dpml_require_os_.str(), ::dpml::Scope::everywhere);            \
    }                                                                                    \
  } while (0)

#define DPML_CHECK_MPI(call)                                                       \
  do {                                                                             \
    const int dpml_mpi_rc_ = (call);                                               \
    if (dpml_mpi_rc_ != MPI_SUCCESS)                                               \
      throw ::dpml::Error(::dpml::detail::mpi_error_text(dpml_mpi_rc_, #call));   \
  } while (0)
