#pragma once
// The Layer concept — the only contract between a layer and the rest of dpml.
//
//   forward(ctx, x) -> y            saves what backward needs, in the slot ctx.micro_batch
//   backward_input(ctx, dy) -> dx   dL/dx for the same slot
//   backward_weight(ctx, dy)        dL/dW += …, for the same slot; may run later than
//                                   backward_input (zero-bubble pipeline schedules), so both
//                                   halves read only what forward saved and dy
//   parameters() -> range of Param<T, Space>*: every trainable tensor, in registration order
//                                   (std::vector<Param<T, Space>*>; empty for parameter-free layers)
//
// Every kernel a layer runs goes through kernels::Ops<Space> (kernels/ops.hpp) with ctx.dev(), so
// one layer serves HostSpace and CudaSpace; a type of its own may call anything it likes.
//
// Input and Output are view types (TensorView<const T, Space>, or another view a layer defines);
// the returned views point into buffers the layer owns, one per micro-batch slot, valid until
// the same slot's next forward. There is no autograd tape: containers (Sequential, Residual)
// chain these calls and, after each child's backward_weight, tell ctx.on_grad_ready which of its
// parameters now hold their final gradient (gradient buckets start their all-reduce from there).
//
// A type that misses part of the concept is rejected by static_assert(Layer<L>) inside the
// containers, and check_layer<L>() spells out which member is missing.

#include "dpml/core/arena.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/parallel/grid.hpp"

#include <concepts>
#include <cstdint>
#include <functional>
#include <ranges>
#include <span>
#include <type_traits>
#include <vector>

namespace dpml::layers {

using dpml::Init;  // core/parameter.hpp: parameters sit below layers/, the names stay here too
using dpml::Param;
using dpml::ParamBase;
using dpml::Sharding;

enum class Mode { train, eval };

template <class Space = HostSpace>
struct Context {
  Mode mode = Mode::train;
  int micro_batch = 0;                 // activation slot used by forward and both backward halves
  std::uint64_t seed = 0;              // run seed: dropout and other randomness (Philox)
  std::uint64_t step = 0;              // optimizer step, part of every random offset
  std::int64_t sample_offset = 0;      // global index of this micro-batch's first sample (dropout,
                                       // other per-sample randomness)
  std::int64_t global_batch = 0;       // samples in the whole step (all data ranks, all micro-batches):
                                       // losses divide by it, so gradients are summed, never averaged
  double loss_scale = 1.0;             // S: the loss layers' gradient seed is S times dL/dlogits (fp16
                                       // loss scaling, optim/loss_scale.hpp); the loss they report is not
  const parallel::ProcessGrid* grid = nullptr;  // communicators (tensor/data axes); null = one rank
  kernels::Device<Space>* device = nullptr;     // the space's stream, handles and workspace (CudaSpace:
                                                // required; HostSpace: optional, a process-wide one
                                                // otherwise)
  // Whether a micro-batch's backward_weight may run after other micro-batches' backward_input
  // (zero-bubble schedules split W from B). When false, backward_weight follows backward_input of
  // the same micro-batch before anything else runs, so a layer (a fused block) may form its weight
  // gradients inside backward_input, from scratch shared with its neighbours, report them there and
  // leave backward_weight nothing to do; when true it keeps per slot what W reads.
  bool deferred_weight_gradients = false;
  // Called by containers once a child's backward_weight has finished, with that child's params.
  std::function<void(std::span<ParamBase* const>)> on_grad_ready;

  bool training() const noexcept { return mode == Mode::train; }

  // What every kernels::Ops<Space> call takes first.
  kernels::Device<Space>& dev() const {
    if constexpr (std::is_same_v<Space, HostSpace>) {
      static kernels::Device<HostSpace> host;  // its scratch and shared buffers serve every such context
      return device ? *device : host;
    } else {
      DPML_REQUIRE(device != nullptr, "layers::Context<" << Space::name << ">: no kernels::Device set (ctx.device): "
                                                         "the stream and handles the kernels run on");
      return *device;
    }
  }

  void grad_ready(std::span<ParamBase* const> params) const {
    if (on_grad_ready) on_grad_ready(params);
  }
};

template <class L>
concept Layer = requires(L& l, Context<typename L::space>& ctx, typename L::Input x,
                         typename L::Output dy) {
  typename L::value_type;
  typename L::space;
  typename L::Input;
  typename L::Output;
  { l.forward(ctx, x) } -> std::same_as<typename L::Output>;
  { l.backward_input(ctx, dy) } -> std::same_as<typename L::Input>;
  { l.backward_weight(ctx, dy) };
  { l.parameters() } -> std::ranges::forward_range;
};

// Spells out, one static_assert per requirement, why L is not a Layer.
template <class L>
constexpr bool check_layer() {
  static_assert(requires { typename L::value_type; }, "dpml Layer: missing `using value_type = T;`");
  static_assert(requires { typename L::space; }, "dpml Layer: missing `using space = HostSpace;` (or CudaSpace)");
  static_assert(requires { typename L::Input; }, "dpml Layer: missing `using Input = …;` (the forward input view)");
  static_assert(requires { typename L::Output; }, "dpml Layer: missing `using Output = …;` (the forward output view)");
  if constexpr (requires {
                  typename L::space;
                  typename L::Input;
                  typename L::Output;
                }) {
    static_assert(requires(L& l, Context<typename L::space>& c, typename L::Input x) {
      { l.forward(c, x) } -> std::same_as<typename L::Output>;
    }, "dpml Layer: missing `Output forward(Context<space>&, Input)`");
    static_assert(requires(L& l, Context<typename L::space>& c, typename L::Output dy) {
      { l.backward_input(c, dy) } -> std::same_as<typename L::Input>;
    }, "dpml Layer: missing `Input backward_input(Context<space>&, Output dy)`");
    static_assert(requires(L& l, Context<typename L::space>& c, typename L::Output dy) { l.backward_weight(c, dy); },
                  "dpml Layer: missing `void backward_weight(Context<space>&, Output dy)`");
  }
  static_assert(requires(L& l) {
    { l.parameters() } -> std::ranges::forward_range;
  }, "dpml Layer: missing `parameters()` returning a range of Param<T, Space>*");
  return Layer<L>;
}

// Containers (Sequential, Stack, Residual, blocks) declare `static constexpr bool
// reports_grad_ready = true;`: they report their children's parameters themselves. A parent calls
// report_grad_ready(ctx, child) after child.backward_weight: it reports the child's parameters,
// unless the child is a container that already did — so every parameter is reported exactly
// once per micro-batch, however deeply containers nest.
template <class L>
concept Container = requires { L::reports_grad_ready; } && L::reports_grad_ready;

template <class Child, class Space>
void report_grad_ready(Context<Space>& ctx, Child& child) {
  if constexpr (!Container<Child>) {
    std::vector<ParamBase*> list;
    for (ParamBase* p : child.parameters()) list.push_back(p);
    ctx.grad_ready(std::span<ParamBase* const>(list.data(), list.size()));
  }
}

// Per-micro-batch storage: slot(ctx) is the entry of ctx.micro_batch, created on first use.
template <class V>
class Slots {
 public:
  V& operator[](int micro_batch) {
    if (static_cast<std::size_t>(micro_batch) >= slots_.size()) slots_.resize(static_cast<std::size_t>(micro_batch) + 1);
    return slots_[static_cast<std::size_t>(micro_batch)];
  }
  template <class Space>
  V& slot(const Context<Space>& ctx) {
    return (*this)[ctx.micro_batch];
  }
  std::size_t size() const noexcept { return slots_.size(); }

 private:
  std::vector<V> slots_;
};

// `buffer` reshaped to `shape` (reallocated only when it grows), as a view.
template <class T, class Space>
TensorView<T, Space> ensure(Tensor<T, Space>& buffer, Shape shape) {
  buffer.resize(shape);
  return buffer.view();
}

}  // namespace dpml::layers
