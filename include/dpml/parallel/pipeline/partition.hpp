#pragma once
// What one pipeline stage holds, read off the layout and the schedule table (schedule.hpp):
//
//   StageBlocks::of(L, p, s)   the contiguous blocks of stage s; when p does not divide L the first
//                              L mod p stages take one block more (L = 14, p = 4: 4 4 3 3);
//                              of(L, p, s, first, last) sets the ends' counts (a head's stage lighter)
//   partition(weights, cuttable, p, policy)
//                              a chain of layers of any weights (their parameter counts) cut into p
//                              contiguous stages: at the user's split points (Partition::at), or
//                              balanced — the largest stage's weight as small as it can be, ties
//                              going to the cut whose largest stage has the fewest layers, then to
//                              the earliest cut. A stage may begin only where cuttable says so
//                              (where a tensor can cross between stages).
//   plan_buffers(actions, m, ops)
//                              a buffer per micro-batch in flight, reused once its micro-batch is
//                              done with it: micro-batch mb holds its buffer from its first action
//                              among `ops` to its last, inclusive; each micro-batch gets the lowest
//                              free index, `count` is the most held at once. With {F, B, W} that is
//                              the schedule's peak of micro-batches in flight — GPipe m, 1F1B
//                              min(p − s, m), ZB-H1 min(p, m) on every stage — so a model that
//                              sizes its activation memory from it keeps exactly what the table needs.
//   of_chunk(actions, c)       the actions of model chunk c (interleaved schedules): a chunk's layers
//                              plan their buffers over its own micro-batches
//   weight_follows_input(actions)
//                              every W comes right after its own B among the compute actions
//                              (GPipe, 1F1B; ZB-H1 on stage 0): the stage may then form the weight
//                              gradients inside B and keep nothing for W.

#include "dpml/core/error.hpp"
#include "dpml/parallel/pipeline/schedule.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <utility>
#include <vector>

namespace dpml::parallel::pipeline {

// Blocks [first, first + count) of pipeline stage `stage` of `stages`.
struct StageBlocks {
  std::int64_t first = 0, count = 0;
  static StageBlocks of(std::int64_t layers, int stages, int stage) {
    const std::int64_t base = layers / stages, extra = layers % stages;
    return {stage * base + std::min<std::int64_t>(stage, extra), base + (stage < extra ? 1 : 0)};
  }
  // An uneven cut: `first_count` blocks on stage 0 and `last_count` on stage p − 1 (0: that end is
  // one of the others), the blocks between spread over the other stages as of() does (L = 12,
  // p = 4, last 1: 4 4 3 1). The caller checks that every stage gets a block.
  static StageBlocks of(std::int64_t layers, int stages, int stage, std::int64_t first_count, std::int64_t last_count) {
    if (stages == 1) return {0, layers};
    if (first_count > 0 && stage == 0) return {0, first_count};
    if (last_count > 0 && stage == stages - 1) return {layers - last_count, last_count};
    const int lo = first_count > 0 ? 1 : 0, others = stages - lo - (last_count > 0 ? 1 : 0);
    const StageBlocks b = of(layers - first_count - last_count, others, stage - lo);
    return {first_count + b.first, b.count};
  }
};

// How a chain of layers is cut into pipeline stages: the first layer of stages 1 … p−1, increasing
// (Partition::at({3}) with p = 2: layers 0–2 on stage 0, the rest on stage 1); none given: balanced
// by parameter count.
struct Partition {
  std::vector<std::int64_t> starts;
  static Partition balanced() { return {}; }
  static Partition at(std::vector<std::int64_t> starts) { return {std::move(starts)}; }
};

// The layers of each of `stages` stages. weights: (layers) parameters of each layer; cuttable:
// (layers) whether a stage may begin at that layer (entry 0 is not read). Every stage holds at
// least one layer. Raised on every rank alike: a split that is not increasing, out of range, at a
// layer where no stage may begin, or more stages than places to cut.
inline std::vector<StageBlocks> partition(const std::vector<std::int64_t>& weights, const std::vector<bool>& cuttable,
                                          int stages, const Partition& policy = {}) {
  const auto n = static_cast<std::int64_t>(weights.size());
  DPML_REQUIRE_EVERYWHERE(cuttable.size() == weights.size(), "pipeline partition: " << cuttable.size()
                                                                << " cut flags for " << n << " layers");
  DPML_REQUIRE_EVERYWHERE(stages >= 1 && stages <= n, "pipeline partition: " << n << " layers cannot make " << stages
                                                                              << " stages (each stage needs a layer)");
  std::vector<std::int64_t> starts = policy.starts;
  if (starts.empty() && stages > 1) {
    // best[k][i]: the least cost of layers [0, i) as k stages; a stage's cost is its weight, then
    // its layer count (weight · (n + 1) + layers: weight decides, layers break ties).
    std::vector<std::int64_t> prefix(static_cast<std::size_t>(n) + 1, 0);
    for (std::int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weights[static_cast<std::size_t>(i)];
    auto cost = [&](std::int64_t j, std::int64_t i) { return (prefix[i] - prefix[j]) * (n + 1) + (i - j); };
    constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
    const auto p = static_cast<std::size_t>(stages);
    std::vector<std::vector<std::int64_t>> best(p + 1, std::vector<std::int64_t>(static_cast<std::size_t>(n) + 1, none));
    std::vector<std::vector<std::int64_t>> cut = best;  // the start of the k-th stage in best[k][i]
    for (std::int64_t i = 1; i <= n; ++i) best[1][i] = cost(0, i);
    for (std::size_t k = 2; k <= p; ++k)
      for (std::int64_t i = static_cast<std::int64_t>(k); i <= n; ++i)
        for (std::int64_t j = static_cast<std::int64_t>(k) - 1; j < i; ++j) {
          if (!cuttable[static_cast<std::size_t>(j)] || best[k - 1][j] == none) continue;
          const std::int64_t c = std::max(best[k - 1][j], cost(j, i));
          if (c < best[k][i]) best[k][i] = c, cut[k][i] = j;
        }
    DPML_REQUIRE_EVERYWHERE(best[p][n] != none, "pipeline partition: " << n << " layers have too few places where a "
                                                                       << "tensor crosses between them for " << stages << " stages");
    starts.assign(p - 1, 0);
    for (std::int64_t k = stages, i = n; k > 1; --k) i = starts[static_cast<std::size_t>(k - 2)] = cut[static_cast<std::size_t>(k)][i];
  }
  DPML_REQUIRE_EVERYWHERE(static_cast<int>(starts.size()) == stages - 1,
                          "pipeline partition: " << starts.size() << " split points for " << stages << " stages (need "
                                                 << stages - 1 << ")");
  std::vector<StageBlocks> out;
  std::int64_t first = 0;
  for (int s = 0; s < stages; ++s) {
    const std::int64_t end = s + 1 < stages ? starts[static_cast<std::size_t>(s)] : n;
    DPML_REQUIRE_EVERYWHERE(end > first && (end < n || s + 1 == stages),
                            "pipeline partition: stage " << s << " would hold layers [" << first << ", " << end << ") of " << n
                                                         << (s + 1 < stages ? ", none left for the next" : ""));
    DPML_REQUIRE_EVERYWHERE(s + 1 == stages || cuttable[static_cast<std::size_t>(end)],
                            "pipeline partition: no stage may begin at layer " << end
                                                                               << " (what enters it is not a tensor of the model's type)");
    out.push_back({first, end - first});
    first = end;
  }
  return out;
}

struct BufferPlan {
  std::vector<int> index;  // (micro-batches) the buffer of each micro-batch; −1: it never holds one
  int count = 0;           // buffers needed: the most micro-batches holding one at once
};

inline BufferPlan plan_buffers(const std::vector<Action>& actions, int micro_batches, std::initializer_list<Op> ops) {
  DPML_REQUIRE(micro_batches >= 1, "plan_buffers: " << micro_batches << " micro-batches");
  const auto m = static_cast<std::size_t>(micro_batches);
  auto counts = [&](Op op) { return std::find(ops.begin(), ops.end(), op) != ops.end(); };
  std::vector<std::size_t> last(m, 0);  // each micro-batch's last action among `ops`
  for (std::size_t i = 0; i < actions.size(); ++i)
    if (counts(actions[i].op)) {
      const auto mb = static_cast<std::size_t>(actions[i].micro_batch);
      DPML_REQUIRE(mb < m, "plan_buffers: action #" << i << " names micro-batch " << mb << " of " << m);
      last[mb] = i;
    }
  BufferPlan plan;
  plan.index.assign(m, -1);
  std::vector<bool> busy;
  for (std::size_t i = 0; i < actions.size(); ++i) {
    if (!counts(actions[i].op)) continue;
    const auto mb = static_cast<std::size_t>(actions[i].micro_batch);
    int& at = plan.index[mb];
    if (at < 0) {  // first action of mb: the lowest free buffer
      const auto free = std::find(busy.begin(), busy.end(), false);
      at = static_cast<int>(free - busy.begin());
      if (free == busy.end()) busy.push_back(true);
      else *free = true;
      plan.count = std::max(plan.count, at + 1);
    }
    if (i == last[mb]) busy[static_cast<std::size_t>(at)] = false;  // free for later actions
  }
  return plan;
}

inline std::vector<Action> of_chunk(const std::vector<Action>& actions, int chunk) {
  std::vector<Action> out;
  std::copy_if(actions.begin(), actions.end(), std::back_inserter(out), [&](const Action& a) { return a.chunk == chunk; });
  return out;
}

inline bool weight_follows_input(const std::vector<Action>& actions) {
  const Action* previous = nullptr;
  for (const Action& a : actions) {
    if (!is_compute(a.op)) continue;
    if (a.op == Op::BackwardWeight &&
        !(previous && previous->op == Op::BackwardInput && previous->micro_batch == a.micro_batch && previous->chunk == a.chunk))
      return false;
    previous = &a;
  }
  return true;
}

}  // namespace dpml::parallel::pipeline
