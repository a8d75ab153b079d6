#pragma once
// Range checks of the integer ids a layer indexes a table with (tokens, labels, targets): an id
// outside [0, limit) is an Error naming the layer, the id and its position, never a read past a
// table. Ops<Space>::IdCheck is the per-space form, kept by the layer (one per layer):
//
//   host   (this file)                 scan() checks every id at once and throws at the first bad
//   CUDA   (kernels/cuda/id_check.hpp) scan() queues a kernel that keeps the first bad id in a
//                                      device word; it is raised, without a host synchronisation
//                                      in the step, by a later scan that finds an earlier one
//                                      finished, or by raise_if_bad() (a loss's take_loss, which
//                                      synchronises anyway)
//
// So on a GPU a bad id stops training at the latest at the step's loss read, with the same message
// as on the host. IdRange::negative_ignored lets negative ids through: a loss whose targets mark
// positions to ignore so (a masked LM's unmasked positions) checks only the upper bound.

#include "dpml/core/error.hpp"
#include "dpml/kernels/device.hpp"

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

namespace dpml::kernels {

// What an IdCheck says: "<who>: <noun> <id> at position <n> is outside <range> [0, <limit>)".
struct IdRange {
  std::string who;    // "Embedding wte"
  std::string noun;   // "token"
  std::string range;  // "the vocabulary"
  bool negative_ignored = false;  // ids < 0 are ignored rows, not errors

  std::int32_t lowest() const noexcept { return negative_ignored ? std::numeric_limits<std::int32_t>::min() : 0; }

  std::string message(std::int64_t id, std::int64_t position, std::int64_t limit) const {
    std::ostringstream os;
    os << who << ": " << noun << ' ' << id << " at position " << position << " is outside " << range << " [0, " << limit
       << ")";
    return os.str();
  }
};

}  // namespace dpml::kernels

namespace dpml::kernels::host {

class IdCheck {
 public:
  IdCheck() = default;
  explicit IdCheck(IdRange what) : what_(std::move(what)) {}

  // ids (n) in [0, limit), or an Error now.
  void scan(Device<HostSpace>&, const std::int32_t* ids, std::int64_t n, std::int64_t limit) const {
    for (std::int64_t i = 0; i < n; ++i)
      if (ids[i] < what_.lowest() || ids[i] >= limit) throw Error(what_.message(ids[i], i, limit));
  }
  // Nothing is pending on the host: scan() has already thrown.
  void raise_if_bad() const {}

 private:
  IdRange what_;
};

// Ops<HostSpace>'s id-check family.
struct IdCheckOps {
  using IdCheck = host::IdCheck;
};

}  // namespace dpml::kernels::host
