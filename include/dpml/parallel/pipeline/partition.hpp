#pragma once
// What one pipeline stage holds, read off the layout and the schedule table (schedule.hpp):
//
//   StageBlocks::of(L, p, s)   the contiguous blocks of stage s; when p does not divide L the first
//                              L mod p stages take one block more (L = 14, p = 4: 4 4 3 3)
//   plan_buffers(actions, m, ops)
//                              a buffer per micro-batch in flight, reused once its micro-batch is
//                              done with it: micro-batch mb holds its buffer from its first action
//                              among `ops` to its last, inclusive; each micro-batch gets the lowest
//                              free index, `count` is the most held at once. With {F, B, W} that is
//                              the schedule's peak of micro-batches in flight — GPipe m, 1F1B
//                              min(p − s, m), ZB-H1 min(p, m) on every stage — so a model that
//                              sizes its activation memory from it keeps exactly what the table needs.
//   weight_follows_input(actions)
//                              every W comes right after its own B among the compute actions
//                              (GPipe, 1F1B; ZB-H1 on stage 0): the stage may then form the weight
//                              gradients inside B and keep nothing for W.

#include "dpml/core/error.hpp"
#include "dpml/parallel/pipeline/schedule.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace dpml::parallel::pipeline {

// Blocks [first, first + count) of pipeline stage `stage` of `stages`.
struct StageBlocks {
  std::int64_t first = 0, count = 0;
  static StageBlocks of(std::int64_t layers, int stages, int stage) {
    const std::int64_t base = layers / stages, extra = layers % stages;
    return {stage * base + std::min<std::int64_t>(stage, extra), base + (stage < extra ? 1 : 0)};
  }
};

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

inline bool weight_follows_input(const std::vector<Action>& actions) {
  const Action* previous = nullptr;
  for (const Action& a : actions) {
    if (!is_compute(a.op)) continue;
    if (a.op == Op::BackwardWeight &&
        !(previous && previous->op == Op::BackwardInput && previous->micro_batch == a.micro_batch))
      return false;
    previous = &a;
  }
  return true;
}

}  // namespace dpml::parallel::pipeline
