#pragma once
// Sequential<L1, L2, …>: layers of different types composed at compile time, itself a Layer.
//
//   forward          chains the children: y = Ln(… L2(L1(x)))
//   backward_input   runs them in reverse and keeps, per micro-batch slot, the gradient each
//                    child received (its dy)
//   backward_weight  replays those into each child's backward_weight (last child first) and then
//                    reports that child's parameters as final (report_grad_ready), so gradient
//                    buckets start their all-reduce while earlier children still compute
//   parameters()     the children's, in order; names are prefixed once, at construction, with the
//                    child's index ("0.weight", "2.conv.bias")
//
// Children are checked with check_layer<>, so a type that is not a Layer fails with a message that
// names the missing member; adjacent children must agree on the view passed between them. Any
// space (all children share one): Sequential only chains views and runs no kernel of its own.

#include "dpml/core/error.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/core/parameter.hpp"

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpml::layers {

template <class... Ls>
class Sequential {
  static_assert(sizeof...(Ls) > 0, "dpml Sequential: needs at least one layer");
  static_assert((check_layer<Ls>() && ...));

  static constexpr std::size_t N = sizeof...(Ls);
  template <std::size_t I>
  using Child = std::tuple_element_t<I, std::tuple<Ls...>>;

 public:
  using value_type = typename Child<0>::value_type;
  using space = typename Child<0>::space;
  using Input = typename Child<0>::Input;
  using Output = typename Child<N - 1>::Output;
  using ParamT = Param<value_type, space>;
  static constexpr bool reports_grad_ready = true;

  static_assert((std::is_same_v<typename Ls::value_type, value_type> && ...),
                "dpml Sequential: all layers must have the same value_type");
  static_assert((std::is_same_v<typename Ls::space, space> && ...), "dpml Sequential: all layers must share one space");
  static_assert([]<std::size_t... I>(std::index_sequence<I...>) {
    return (std::is_convertible_v<typename Child<I>::Output, typename Child<I + 1>::Input> && ...) &&
           (std::is_convertible_v<typename Child<I + 1>::Input, typename Child<I>::Output> && ...);
  }(std::make_index_sequence<N - 1>{}), "dpml Sequential: a layer's Output must be the next layer's Input");

  explicit Sequential(Ls... children) : children_(std::move(children)...) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (prefix(std::get<I>(children_), std::to_string(I)), ...);
    }(std::make_index_sequence<N>{});
  }
  Sequential() requires(std::is_default_constructible_v<Ls> && ...) : Sequential(Ls{}...) {}

  template <std::size_t I>
  Child<I>& get() noexcept {
    return std::get<I>(children_);
  }

  Output forward(Context<space>& ctx, Input x) { return forward_from<0>(ctx, x); }

  Input backward_input(Context<space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    s.ready = true;
    return backward_from<N - 1>(ctx, s, dy);
  }

  void backward_weight(Context<space>& ctx, Output) {
    Saved& s = slots_.slot(ctx);
    DPML_REQUIRE(s.ready, "Sequential::backward_weight before backward_input for micro-batch " << ctx.micro_batch);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (weight_of<N - 1 - I>(ctx, s), ...);  // last child first, as backward runs
    }(std::make_index_sequence<N>{});
    s.ready = false;
  }

  std::vector<ParamT*> parameters() {
    std::vector<ParamT*> all;
    std::apply([&](auto&... c) { (append(all, c), ...); }, children_);
    return all;
  }

 private:
  struct Saved {
    std::tuple<typename Ls::Output...> dys;  // each child's incoming gradient
    bool ready = false;                      // backward_input ran, backward_weight not yet
  };

  template <class L>
  static void prefix(L& child, const std::string& name) {
    for (ParamT* p : child.parameters()) p->prefix_name(name);
  }
  template <class L>
  static void append(std::vector<ParamT*>& all, L& child) {
    for (ParamT* p : child.parameters()) all.push_back(p);
  }

  template <std::size_t I>
  Output forward_from(Context<space>& ctx, typename Child<I>::Input x) {
    auto y = std::get<I>(children_).forward(ctx, x);
    if constexpr (I + 1 < N)
      return forward_from<I + 1>(ctx, y);
    else
      return y;
  }
  template <std::size_t I>
  Input backward_from(Context<space>& ctx, Saved& s, typename Child<I>::Output dy) {
    std::get<I>(s.dys) = dy;
    auto dx = std::get<I>(children_).backward_input(ctx, dy);
    if constexpr (I == 0)
      return dx;
    else
      return backward_from<I - 1>(ctx, s, dx);
  }
  template <std::size_t I>
  void weight_of(Context<space>& ctx, Saved& s) {
    auto& child = std::get<I>(children_);
    child.backward_weight(ctx, std::get<I>(s.dys));
    report_grad_ready(ctx, child);
  }

  std::tuple<Ls...> children_;
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
