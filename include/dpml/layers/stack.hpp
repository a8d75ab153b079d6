#pragma once
// Stack<L>: a run-time number of layers of one type applied in order — ResNet stages, the blocks
// of a transformer, the hidden layers of an MLP. Sequential<…> composes different types fixed at
// compile time; Stack composes a count chosen at run time (depth from the command line).
//
// Like Sequential it is itself a Layer: forward chains the children; backward_input runs them in
// reverse and remembers each child's incoming gradient per micro-batch slot; backward_weight
// replays those into each child's backward_weight (last child first) and reports each child's
// parameters as finished (report_grad_ready), so gradient buckets can start early; a child that is
// itself a Container (a fused block reporting inside its backward_input) reports its own. Children
// are named "<index>" + their own names, or "<first_index + i>" when the stack holds a slice of a
// deeper model (a pipeline stage keeps the global block numbers, so names — hence initial weights
// and checkpoints — are the same in every layout). Any space: Stack only chains views and runs no
// kernel of its own.

#include "dpml/core/error.hpp"
#include "dpml/layers/layer.hpp"

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpml::layers {

template <class L>
class Stack {
  static_assert(check_layer<L>());
  static_assert(std::is_same_v<typename L::Input, typename L::Output>, "Stack<L>: L's input and output types must agree");

 public:
  using value_type = typename L::value_type;
  using space = typename L::space;
  using Input = typename L::Input;
  using Output = typename L::Output;
  using ParamT = Param<value_type, space>;
  static constexpr bool reports_grad_ready = true;

  Stack() = default;
  // `children` in order; names get the prefix "<name>.<first_index + i>" (none if name is empty:
  // the children were named already).
  Stack(std::vector<L> children, const std::string& name, std::int64_t first_index = 0) : children_(std::move(children)) {
    for (std::size_t i = 0; i < children_.size() && !name.empty(); ++i)
      for (ParamT* p : children_[i].parameters()) p->prefix_name(name + "." + std::to_string(first_index + static_cast<std::int64_t>(i)));
  }
  Stack(Stack&&) noexcept = default;
  Stack& operator=(Stack&&) noexcept = default;

  std::size_t size() const noexcept { return children_.size(); }
  L& operator[](std::size_t i) { return children_[i]; }

  Output forward(Context<space>& ctx, Input x) {
    for (auto& c : children_) x = c.forward(ctx, x);
    return x;
  }
  Input backward_input(Context<space>& ctx, Output dy) {
    return backward(ctx, dy, [&](std::size_t, L& c, Output d) { return c.backward_input(ctx, d); });
  }
  // The same, the first child's input gradient written into the caller's buffer dx (its
  // backward_input_into: a TransformerBlock's) — e.g. the message a pipeline stage sends back.
  Input backward_input_into(Context<space>& ctx, Output dy, TensorView<value_type, space> dx)
    requires requires(L& l) { l.backward_input_into(ctx, dy, dx); }
  {
    return backward(ctx, dy, [&](std::size_t i, L& c, Output d) {
      return i > 0 ? c.backward_input(ctx, d) : c.backward_input_into(ctx, d, dx);
    });
  }
  // In place: every child's input gradient over its output gradient in `d`, the caller's buffer,
  // which it gives up (a chain of TransformerBlocks on one buffer, as in the fused GPT); the first
  // child's into `dx` when given (a pipeline stage's message). Not with deferred weight gradients
  // (they read each child's dy later).
  Input backward_input_in_place(Context<space>& ctx, TensorView<value_type, space> d, TensorView<value_type, space> dx = {})
    requires requires(L& l) { l.backward_input_into(ctx, d, d); }
  {
    DPML_REQUIRE(!ctx.deferred_weight_gradients, "Stack::backward_input_in_place with deferred weight gradients");
    return backward(ctx, d, [&](std::size_t i, L& c, Output) {
      return c.backward_input_into(ctx, d, i == 0 && dx.data() != nullptr ? dx : d);
    });
  }
  void backward_weight(Context<space>& ctx, Output) {
    auto& dys = incoming_.slot(ctx);
    DPML_REQUIRE(dys.size() == children_.size(), "Stack::backward_weight before backward_input for micro-batch " << ctx.micro_batch);
    for (std::size_t i = children_.size(); i-- > 0;) {
      children_[i].backward_weight(ctx, dys[i]);
      report_grad_ready(ctx, children_[i]);
    }
  }
  std::vector<ParamT*> parameters() {
    std::vector<ParamT*> all;
    for (auto& c : children_)
      for (ParamT* p : c.parameters()) all.push_back(p);
    return all;
  }

 private:
  // Children last to first, each through step(index, child, its dy), which returns its input
  // gradient; each child's dy is kept for backward_weight.
  template <class Step>
  Input backward(Context<space>& ctx, Output dy, Step&& step) {
    auto& dys = incoming_.slot(ctx);
    dys.resize(children_.size());
    for (std::size_t i = children_.size(); i-- > 0;) {
      dys[i] = dy;
      dy = step(i, children_[i], dy);
    }
    return dy;
  }

  std::vector<L> children_;
  Slots<std::vector<Output>> incoming_;
};

}  // namespace dpml::layers
