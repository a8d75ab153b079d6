#pragma once
// LayerStage<Model, Loss>: this rank's pipeline stage of any Layer model, cut by the library.
//
// The model is a chain of links: the children of a Sequential<L1, …, Ln> (types fixed at compile
// time), the children of a Stack<L> (a run-time count of one type), or — any other Layer — the
// model itself, one link that is never cut. pipeline::partition cuts the chain into pp contiguous
// stages (v·pp under the interleaved schedule, a LayerStage per chunk: chunk c of rank r is
// virtual stage c·pp + r) (balanced by parameter count, or at the user's split points, TrainOptions::partition);
// the stage runs only its links, last link first in backward as Sequential does, and reports
// each link's parameters to ctx.grad_ready after its backward_weight. The last stage ends with
// the loss: forward(logits, targets), then backward() gives the gradient its links start from.
//
// Every rank builds the whole model; its names are global from construction ("3.weight" is the
// fourth child's on every stage), so layers::initialize_all and checkpoints see the same tensors
// in every layout. parameters() lists this stage's links only: the other links' parameters stay
// out of the optimizer and the gradient buckets (their memory is held, never used).
//
// What crosses a stage boundary is a Message, TensorView<const T, Space>; a stage may begin only
// at a link whose input is one (and so is the previous link's output), which cuttable() reports.
//
// The stage's members are those the trainer asks of any model with pipeline stages of its own
// (models::Gpt offers the same): is_first_stage, is_last_stage, forward(ctx, x, received,
// targets) → what to send on, backward_input(ctx, received) → what to send back,
// backward_weight(ctx), take_loss(), parameters().

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/sequential.hpp"
#include "dpml/layers/stack.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/parallel/pipeline/partition.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpml::train {

// The loss a LayerStage ends with (layers/cross_entropy.hpp's API): forward adds this
// micro-batch's Σ loss / ctx.global_batch to a running sum, backward gives its dlogits, take_loss
// returns the sum since the last take.
template <class L, class Space>
concept LossLayer = requires(L& l, layers::Context<Space>& ctx, typename L::Input y, typename L::Target t) {
  l.forward(ctx, y, t);
  { l.backward(ctx) } -> std::convertible_to<typename L::Input>;
  { l.take_loss() } -> std::convertible_to<double>;
};

namespace detail {

// Parameters of one link over the whole model (tensor-parallel shards counted whole), so that
// every rank of every layout cuts the chain alike.
template <class Link>
std::int64_t global_parameters(Link& link, const parallel::ProcessGrid& grid) {
  std::int64_t n = 0;
  for (const ParamBase* p : link.parameters())
    n += p->numel() * (p->sharding().is_replicated() ? 1 : grid.size(p->sharding().axis));
  return n;
}

template <class Link, class List>
void append_parameters(Link& link, List& out) {
  for (auto* p : link.parameters()) out.push_back(p);
}

// The chain of a Sequential (its children) or of any other Layer (itself): links of types fixed
// at compile time. Links [a, b) run on a stage.
template <class Model, class... Links>
class TupleChain {
  static constexpr std::size_t N = sizeof...(Links);
  template <std::size_t I>
  using Link = std::tuple_element_t<I, std::tuple<Links...>>;

 public:
  using T = typename Model::value_type;
  using Space = typename Model::space;
  using Message = TensorView<const T, Space>;
  using Input = typename Link<0>::Input;
  using Output = typename Link<N - 1>::Output;
  using ParamT = Param<T, Space>;

  explicit TupleChain(Model& model) : model_(&model) {}

  std::int64_t size() const noexcept { return N; }
  std::vector<bool> cuttable() const {
    std::vector<bool> out(N);
    [&]<std::size_t... I>(std::index_sequence<I...>) { ((out[I] = cut_ok<I>()), ...); }(std::make_index_sequence<N>{});
    return out;
  }
  std::vector<std::int64_t> weights(const parallel::ProcessGrid& grid) {
    std::vector<std::int64_t> out;
    each([&]<std::size_t I>() { out.push_back(global_parameters(link<I>(), grid)); });
    return out;
  }
  std::vector<ParamT*> parameters(std::int64_t a, std::int64_t b) {
    std::vector<ParamT*> out;
    each([&]<std::size_t I>() {
      if (in(I, a, b)) append_parameters(link<I>(), out);
    });
    return out;
  }

  // Links [a, b) forward, from x (a = 0) or `received`. The last link's result lands in `output`
  // (b = size()) or `message`.
  void forward(layers::Context<Space>& ctx, std::int64_t a, std::int64_t b, const Input& x, Message received,
               Output& output, Message& message) {
    if (a == 0) return forward_from<0>(ctx, x, b, output, message);
    at(a, [&]<std::size_t I>() {
      if constexpr (cut_ok<I>()) forward_from<I>(ctx, typename Link<I>::Input(received), b, output, message);
    });
  }
  // Links b−1 … a backward_input, from dy (b = size()) or `received`; keeps each link's incoming
  // gradient for backward_weight. Returns the gradient of link a's input (empty when a = 0).
  Message backward_input(layers::Context<Space>& ctx, std::int64_t a, std::int64_t b, const Output& dy, Message received) {
    Saved& s = saved_.slot(ctx);
    s.ready = true;
    if (b == static_cast<std::int64_t>(N)) return backward_from<N - 1>(ctx, s, dy, a);
    Message dx;
    at(b - 1, [&]<std::size_t I>() {
      if constexpr (cut_ok<I + 1>()) dx = backward_from<I>(ctx, s, typename Link<I>::Output(received), a);
    });
    return dx;
  }
  void backward_weight(layers::Context<Space>& ctx, std::int64_t a, std::int64_t b) {
    Saved& s = saved_.slot(ctx);
    DPML_REQUIRE(s.ready, "pipeline stage: backward_weight before backward_input for micro-batch " << ctx.micro_batch);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (weight_of<N - 1 - I>(ctx, s, a, b), ...);  // last link first, as backward runs
    }(std::make_index_sequence<N>{});
    s.ready = false;
  }

 private:
  struct Saved {
    std::tuple<typename Links::Output...> dys;  // each link's incoming gradient
    bool ready = false;
  };
  // A stage may begin at link I: a Message enters it, and the gradient of its input leaves as one.
  template <std::size_t I>
  static constexpr bool cut_ok() {
    if constexpr (I == 0 || I >= N) return false;
    else
      return std::is_convertible_v<Message, typename Link<I>::Input> && std::is_convertible_v<typename Link<I>::Input, Message> &&
             std::is_convertible_v<Message, typename Link<I - 1>::Output> &&
             std::is_convertible_v<typename Link<I - 1>::Output, Message>;
  }

  static bool in(std::size_t i, std::int64_t a, std::int64_t b) {
    return static_cast<std::int64_t>(i) >= a && static_cast<std::int64_t>(i) < b;
  }
  template <std::size_t I>
  Link<I>& link() {
    if constexpr (sizeof...(Links) == 1 && std::is_same_v<Link<0>, Model>) return *model_;  // the model itself
    else return model_->template get<I>();
  }
  template <class F>
  static void each(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (f.template operator()<I>(), ...); }(std::make_index_sequence<N>{});
  }
  // f.template operator()<i>() for the run-time index i.
  template <class F>
  static void at(std::int64_t i, F&& f) {
    each([&]<std::size_t I>() {
      if (static_cast<std::int64_t>(I) == i) f.template operator()<I>();
    });
  }

  template <std::size_t I>
  void forward_from(layers::Context<Space>& ctx, typename Link<I>::Input x, std::int64_t b, Output& output, Message& message) {
    auto y = link<I>().forward(ctx, x);
    if constexpr (I + 1 == N) {
      output = y;
    } else {
      if (static_cast<std::int64_t>(I) + 1 == b) {
        if constexpr (cut_ok<I + 1>()) message = y;
      } else {
        forward_from<I + 1>(ctx, y, b, output, message);
      }
    }
  }
  template <std::size_t I>
  Message backward_from(layers::Context<Space>& ctx, Saved& s, typename Link<I>::Output dy, std::int64_t a) {
    std::get<I>(s.dys) = dy;
    auto dx = link<I>().backward_input(ctx, dy);
    if constexpr (I == 0) {
      return Message();
    } else {
      if (static_cast<std::int64_t>(I) > a) return backward_from<I - 1>(ctx, s, dx, a);
      if constexpr (cut_ok<I>()) return dx;
      else return Message();  // not reached: no stage begins at link I
    }
  }
  template <std::size_t I>
  void weight_of(layers::Context<Space>& ctx, Saved& s, std::int64_t a, std::int64_t b) {
    if (!in(I, a, b)) return;
    link<I>().backward_weight(ctx, std::get<I>(s.dys));
    layers::report_grad_ready(ctx, link<I>());
  }

  Model* model_;
  layers::Slots<Saved> saved_;
};

// The chain of a Stack<L>: a run-time count of links of one type.
template <class L>
class StackChain {
 public:
  using T = typename L::value_type;
  using Space = typename L::space;
  using Message = TensorView<const T, Space>;
  using Input = typename L::Input;
  using Output = typename L::Output;
  using ParamT = Param<T, Space>;

  explicit StackChain(layers::Stack<L>& model) : model_(&model) {}

  std::int64_t size() const noexcept { return static_cast<std::int64_t>(model_->size()); }
  std::vector<bool> cuttable() const {
    std::vector<bool> out(model_->size(), kCut);
    if (!out.empty()) out[0] = false;
    return out;
  }
  std::vector<std::int64_t> weights(const parallel::ProcessGrid& grid) {
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < model_->size(); ++i) out.push_back(global_parameters((*model_)[i], grid));
    return out;
  }
  std::vector<ParamT*> parameters(std::int64_t a, std::int64_t b) {
    std::vector<ParamT*> out;
    for (std::int64_t i = a; i < b; ++i) append_parameters(link(i), out);
    return out;
  }

  void forward(layers::Context<Space>& ctx, std::int64_t a, std::int64_t b, const Input& x, Message received,
               Output& output, Message& message) {
    Input h = x;
    if (a > 0) h = from_message<Input>(received);
    for (std::int64_t i = a; i < b; ++i) h = link(i).forward(ctx, h);
    if (b == size()) output = h;
    else message = to_message(h);
  }
  Message backward_input(layers::Context<Space>& ctx, std::int64_t a, std::int64_t b, const Output& dy, Message received) {
    auto& dys = saved_.slot(ctx);
    dys.resize(model_->size());
    Output d = b == size() ? dy : from_message<Output>(received);
    for (std::int64_t i = b; i-- > a;) {
      dys[static_cast<std::size_t>(i)] = d;
      d = link(i).backward_input(ctx, d);
    }
    return a == 0 ? Message() : to_message(d);
  }
  void backward_weight(layers::Context<Space>& ctx, std::int64_t a, std::int64_t b) {
    auto& dys = saved_.slot(ctx);
    DPML_REQUIRE(dys.size() == model_->size(), "pipeline stage: backward_weight before backward_input for micro-batch "
                                                   << ctx.micro_batch);
    for (std::int64_t i = b; i-- > a;) {
      link(i).backward_weight(ctx, dys[static_cast<std::size_t>(i)]);
      layers::report_grad_ready(ctx, link(i));
    }
  }

 private:
  static constexpr bool kCut = std::is_convertible_v<Message, Input> && std::is_convertible_v<Input, Message>;
  // Not reached unless kCut: no stage begins inside the stack then.
  template <class V>
  static V from_message(Message m) {
    if constexpr (kCut) return m;
    else return V();
  }
  static Message to_message(const Input& v) {
    if constexpr (kCut) return v;
    else return Message();
  }
  L& link(std::int64_t i) { return (*model_)[static_cast<std::size_t>(i)]; }

  layers::Stack<L>* model_;
  layers::Slots<std::vector<Output>> saved_;
};

template <class Model>
struct ChainOf {
  using type = TupleChain<Model, Model>;
};
template <class... Ls>
struct ChainOf<layers::Sequential<Ls...>> {
  using type = TupleChain<layers::Sequential<Ls...>, Ls...>;
};
template <class L>
struct ChainOf<layers::Stack<L>> {
  using type = StackChain<L>;
};

}  // namespace detail

template <layers::Layer Model, LossLayer<typename Model::space> Loss>
class LayerStage {
  using Chain = typename detail::ChainOf<Model>::type;

 public:
  using value_type = typename Model::value_type;
  using space = typename Model::space;
  using Input = typename Model::Input;   // the first stage's micro-batch
  using Output = typename Model::Output;  // the last link's: the loss's input
  using Target = typename Loss::Target;   // the loss's targets
  using Message = TensorView<const value_type, space>;
  using ParamT = Param<value_type, space>;

  static_assert(std::is_convertible_v<Output, typename Loss::Input> && std::is_convertible_v<typename Loss::Input, Output>,
                "dpml LayerStage: the model's Output must be the loss's Input (logits) and back (dlogits)");

  // Stage grid.coord(pipeline) of grid.pp() stages of `model`, cut by `partition`; under the
  // interleaved schedule chunk `chunk` of `chunks` (v): virtual stage chunk·pp + rank of v·pp
  // (`partition` then names the v·pp − 1 split points).
  LayerStage(Model& model, Loss loss, const parallel::ProcessGrid& grid, const parallel::pipeline::Partition& partition,
             int chunk = 0, int chunks = 1)
      : chain_(model), loss_(std::move(loss)) {
    const int p = grid.pp(), stages = p * chunks, k = parallel::pipeline::virtual_stage(grid.coord(Axis::pipeline), chunk, p);
    DPML_REQUIRE_EVERYWHERE(stages == 1 || chain_.size() > 1,
                            "--pp " << p << ": this model is one layer; the library cuts a Sequential or a Stack into "
                                       "pipeline stages (or give the model pipeline-stage members of its own)");
    DPML_REQUIRE_EVERYWHERE(chunks == 1 || chain_.size() >= stages,
                            "--num-virtual-stages-per-pipeline-rank " << chunks << " × --pp " << p << " = " << stages
                                                                      << " virtual stages, but the model has " << chain_.size()
                                                                      << " layers to cut (one at least per virtual stage)");
    range_ = parallel::pipeline::partition(chain_.weights(grid), chain_.cuttable(), stages, partition)[static_cast<std::size_t>(k)];
    first_ = k == 0;
    last_ = k == stages - 1;
  }

  bool is_first_stage() const noexcept { return first_; }
  bool is_last_stage() const noexcept { return last_; }
  // This stage's links [first, first + count) of the chain.
  const parallel::pipeline::StageBlocks& links() const noexcept { return range_; }

  // One micro-batch: x on the first stage, `received` on the others; the last stage adds its loss
  // (and calls on_output). Returns what to send to the next stage (empty on the last).
  Message forward(layers::Context<space>& ctx, const Input& x, Message received, const Target& targets) {
    Output y{};
    Message out;
    chain_.forward(ctx, range_.first, end(), x, received, y, out);
    if (!last_) return out;
    if (on_output) on_output(y, targets);
    loss_.forward(ctx, y, targets);
    return Message();
  }
  // From the loss (last stage) or `received`; returns what to send back (empty on the first).
  Message backward_input(layers::Context<space>& ctx, Message received) {
    const Output dy = last_ ? Output(loss_.backward(ctx)) : Output{};
    return chain_.backward_input(ctx, range_.first, end(), dy, received);
  }
  void backward_weight(layers::Context<space>& ctx) { chain_.backward_weight(ctx, range_.first, end()); }

  double take_loss() { return last_ ? static_cast<double>(loss_.take_loss()) : 0.0; }
  std::vector<ParamT*> parameters() { return chain_.parameters(range_.first, end()); }
  Loss& loss() noexcept { return loss_; }

  // Called on the last stage with each micro-batch's output and targets, before the loss (e.g. to
  // count correct predictions).
  std::function<void(const Output&, const Target&)> on_output;

 private:
  std::int64_t end() const noexcept { return range_.first + range_.count; }

  Chain chain_;
  Loss loss_;
  parallel::pipeline::StageBlocks range_;
  bool first_ = true, last_ = true;
};

}  // namespace dpml::train
