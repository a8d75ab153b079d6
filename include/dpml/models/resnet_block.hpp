#pragma once
// The layers a ResNet is made of beyond the generic ones, on any space, with the fusions and
// backward memory of the hand-fused GPU ResNet they replaced (Step 8): ResNetBlock, one residual block, and
// ResNetStem, the network's first convolution, BatchNorm + ReLU and optional max pool — the parts
// of both models::ResNet (resnet.hpp) and models::BottleneckResNet (bottleneck_resnet.hpp).
//
// ResNetBlock
//   units      conv_i (k_i × k_i, stride s_i, padding k_i / 2, no bias), then bn_i; i = 1..n
//              basic (He et al. 2016): 3×3 stride s, 3×3; bottleneck (torchvision's v1.5):
//              1×1, 3×3 stride s, 1×1 to 4× the width
//   forward    h_0 = x, h_i = relu(bn_i(conv_i(h_{i−1}))) for i < n — BatchNorm's fused ReLU — and
//              y = relu(bn_n(conv_n(h_{n−1})) + shortcut(x)) in bn_n's one pass (its fused residual);
//              shortcut(x) = x, or bn_p(conv_p(x)), a 1×1 projection with the block's stride, where
//              the block changes the channels or the resolution. Kept per micro-batch slot by the
//              children: each convolution's output and each BatchNorm's, as the fused model keeps;
//              the projection's normalised output, read only by bn_n's forward, is a temporary in
//              the shared scratch below (bn_p has no ReLU, so its backward does not read it).
//   backward   the gradients inside the block live in three buffers shared by all blocks and the
//              stem on the Device (Device::shared: the 2-entry ring "resnet.dx0"/"resnet.dx1" and
//              "resnet.tmp"), each as large as the largest gradient of any of them: the forwards
//              ask for their sizes, and they all run before any backward, so a backward never grows
//              (moves) them. The block's input gradient goes into the ring entry that does not hold
//              dy (the next block's gradient); the other entry — dy itself when dy is that gradient,
//              which no one reads after bn_n's backward, so bn_n works in place over it, as the
//              fused model does — and "resnet.tmp" take the units' gradients in turn (conv_i reads
//              one, writes the other; bn_i works in place). The shortcut's gradient goes into the
//              returned entry, and the input gradient is added there last. Each child's weight
//              gradient follows its input gradient at once (while that gradient is still in the
//              scratch), and the child's parameters are reported (ctx.grad_ready) right after:
//              data-parallel buckets start block by block, and backward_weight has nothing left
//              to do. The returned input gradient is valid until the next backward_input of a
//              block or stem (which works in it): a caller that keeps it longer copies it.
//   deferred   when ctx.deferred_weight_gradients (zero-bubble schedules: W long after B), the
//   W          gradients the children's weight gradients read live per slot instead, and
//              backward_weight forms them and reports the parameters.
//   parameters conv1, bn1 (weight, bias), …, conv_n, bn_n, then, in a projected block,
//              downsample.0 (the projection's convolution) and downsample.1 (its BatchNorm):
//              torchvision's names and order
//
// ResNetStem
//   forward    y = maxpool(relu(bn1(conv1(x)))) (3×3, stride 2, padding 1; ImageNet's stem) or
//              y = relu(bn1(conv1(x))) without the pool. With the pool, relu(bn1(·)) — the largest
//              activation of an ImageNet ResNet, 4× the pool's output — is a temporary in
//              "resnet.tmp", read only by the pool (as the fused model keeps it): the backward needs
//              only where it is positive at each window's maximum, which is where the pool's
//              output (kept by the pool, and by the next block as its input) is positive
//   backward   conv1 computes no input gradient (the image needs none: backward_input returns an
//              empty view); with the pool, dy masked by [y > 0] (the ReLU's backward, before the
//              pool's) into "resnet.tmp", the pool's input gradient from it into the ring entry
//              that does not hold dy, BatchNorm (told that dy comes masked) in place there; without
//              the pool, BatchNorm masks by its saved output. conv1's weight gradient follows — in
//              the block's scratch, or per slot when deferred, reported as the block's are
//
// Both are containers (reports_grad_ready): they report their children themselves. Element types
// and spaces: those of Conv2d and BatchNorm2d (float or double on the host; bf16 on a GPU, where
// the convolutions are bf16 kernels). Comm is BatchNorm2d's data-axis communicator (synchronised
// statistics), ConvPolicy Conv2d's convolution kernels.

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/batch_norm.hpp"
#include "dpml/layers/conv2d.hpp"
#include "dpml/layers/layer.hpp"
#include "dpml/layers/pool.hpp"
#include "dpml/parallel/tensor.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dpml::models {

namespace detail::resnet {
// The keys of the backward's scratch shared by the blocks and the stem on the Device.
inline constexpr std::string_view kRing[2] = {"resnet.dx0", "resnet.dx1"};  // input gradients
inline constexpr std::string_view kTmp = "resnet.tmp";                         // one more

// Every scratch buffer grown to at least n elements: each forward asks, before any backward runs.
template <class T, class Space>
void reserve_scratch(layers::Context<Space>& ctx, std::int64_t n) {
  for (std::string_view key : kRing) ctx.dev().template shared<T>(key, n);
  ctx.dev().template shared<T>(kTmp, n);
}
// The ring entry that does not hold dy (either, when dy is no ring entry), and the other one.
template <class T, class Space>
std::pair<T*, T*> ring(layers::Context<Space>& ctx, std::int64_t n, const T* dy) {
  T* const a = ctx.dev().template shared<T>(kRing[0], n);
  T* const b = ctx.dev().template shared<T>(kRing[1], n);
  return a == dy ? std::pair{b, a} : std::pair{a, b};
}
// A child's weight gradients from dy (its output's gradient), then its report.
template <class Space, class Child, class View>
void weight_gradients(layers::Context<Space>& ctx, Child& child, View dy) {
  child.backward_weight(ctx, dy);
  layers::report_grad_ready(ctx, child);
}
}  // namespace detail::resnet

// One convolution of a block's body: its output channels, square kernel and stride.
struct ConvUnit {
  std::int64_t channels = 0;
  std::int64_t kernel = 1;
  std::int64_t stride = 1;
};

struct ResNetBlockOptions {
  std::int64_t in = 0;          // input channels
  std::vector<ConvUnit> units;  // conv_1 … conv_n
  bool sync_batch_norm = false; // BatchNorm statistics over the data axis

  // He et al.'s basic block: 3×3 (stride s) and 3×3, both `out` channels.
  static ResNetBlockOptions basic(std::int64_t in, std::int64_t out, std::int64_t stride, bool sync = false) {
    return {.in = in, .units = {{out, 3, stride}, {out, 3, 1}}, .sync_batch_norm = sync};
  }
  // The bottleneck (torchvision's v1.5): 1×1 to `width`, 3×3 (stride s), 1×1 to 4 · width.
  static ResNetBlockOptions bottleneck(std::int64_t in, std::int64_t width, std::int64_t stride, bool sync = false) {
    return {.in = in, .units = {{width, 1, 1}, {width, 3, stride}, {4 * width, 1, 1}}, .sync_batch_norm = sync};
  }
};

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>,
          class ConvPolicy = typename kernels::Ops<Space>::DefaultConvPolicy>
class ResNetBlock {
  using Ops = kernels::Ops<Space>;
  using Conv = layers::Conv2d<T, Space, ConvPolicy>;
  using BN = layers::BatchNorm2d<T, Space, Comm>;
  using View = TensorView<T, Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (N, Cin, H, W) in the space's image layout
  using Output = TensorView<const T, Space>;  // (N, Cout, H / s, W / s) in the space's image layout
  static constexpr bool reports_grad_ready = true;

  // data_comm: the data axis' communicator of the BatchNorms when synchronised (BatchNorm2d's).
  explicit ResNetBlock(const ResNetBlockOptions& o, const Comm* data_comm = nullptr) {
    DPML_REQUIRE(o.in > 0 && !o.units.empty(), "ResNetBlock: " << o.in << " input channels and " << o.units.size()
                                                               << " convolutions (at least one)");
    std::int64_t in = o.in, stride = 1;
    for (std::size_t i = 0; i < o.units.size(); ++i) {
      const ConvUnit& u = o.units[i];
      const std::string k = std::to_string(i + 1);
      convs_.emplace_back(in, u.channels, u.kernel,
                          layers::Conv2dOptions{.stride = u.stride, .padding = u.kernel / 2, .bias = false,
                                                .name = "conv" + k});
      bns_.emplace_back(u.channels, layers::BatchNormOptions{.sync = o.sync_batch_norm, .relu = true, .name = "bn" + k},
                        data_comm);
      in = u.channels;
      stride *= u.stride;
    }
    if (in != o.in || stride != 1) {
      proj_.emplace(o.in, in, 1, layers::Conv2dOptions{.stride = stride, .bias = false, .name = "downsample.0"});
      proj_bn_.emplace(in, layers::BatchNormOptions{.sync = o.sync_batch_norm, .name = "downsample.1"}, data_comm);
    }
  }

  Output forward(layers::Context<Space>& ctx, Input x) {
    Saved& s = saved_.slot(ctx);
    s.x = x;
    s.unit.clear();
    const std::size_t n = convs_.size();
    Input h = x;
    for (std::size_t i = 0; i + 1 < n; ++i) {
      const Input c = convs_[i].forward(ctx, h);
      s.unit.push_back(c.shape());
      h = bns_[i].forward(ctx, c);
    }
    const Input c = convs_[n - 1].forward(ctx, h);
    s.unit.push_back(c.shape());
    Input shortcut = x;
    if (proj_) {  // bn_p(conv_p(x)) into the scratch: bn_n's forward reads it, nothing after
      const Input p = proj_->forward(ctx, x);
      const View tmp(ctx.dev().template shared<T>(detail::resnet::kTmp, p.numel()), p.shape());
      shortcut = proj_bn_->forward_into(ctx, p, Input(), tmp);
    }
    const Output y = bns_[n - 1].forward(ctx, c, shortcut);  // relu(bn_n(c) + shortcut)
    if (!ctx.deferred_weight_gradients) detail::resnet::reserve_scratch<T>(ctx, largest(s));
    return y;
  }

  Input backward_input(layers::Context<Space>& ctx, Output dy) {
    Saved& s = saved_.slot(ctx);
    DPML_REQUIRE(!s.unit.empty() && dy.shape() == s.unit.back() && dy.is_contiguous(),
                 "ResNetBlock: dy " << dy.shape().str() << " differs from the output "
                                    << (s.unit.empty() ? std::string("(no forward)") : s.unit.back().str())
                                    << " of micro-batch " << ctx.micro_batch);
    s.weights_pending = ctx.deferred_weight_gradients;
    const bool now = !s.weights_pending;
    if (s.weights_pending) s.grads = kept_grads(s);
    const Grads g = s.weights_pending ? s.grads : shared_grads(ctx, s, dy);
    const std::size_t n = convs_.size();
    bns_[n - 1].backward_input_into(ctx, dy, g.unit[n - 1], g.shortcut);
    if (now) detail::resnet::weight_gradients(ctx, bns_[n - 1], g.unit[n - 1]);
    for (std::size_t i = n; i-- > 0;) {
      convs_[i].backward_input_into(ctx, g.unit[i], i > 0 ? g.unit[i - 1] : g.body_dx);
      if (now) detail::resnet::weight_gradients(ctx, convs_[i], g.unit[i]);
      if (i == 0) break;
      bns_[i - 1].backward_input_into(ctx, g.unit[i - 1], g.unit[i - 1], View());  // in place
      if (now) detail::resnet::weight_gradients(ctx, bns_[i - 1], g.unit[i - 1]);
    }
    View through_shortcut = g.shortcut;
    if (proj_) {
      proj_bn_->backward_input_into(ctx, g.shortcut, g.shortcut, View());  // in place
      if (now) detail::resnet::weight_gradients(ctx, *proj_bn_, g.shortcut);
      proj_->backward_input_into(ctx, g.shortcut, g.shortcut_dx);
      if (now) detail::resnet::weight_gradients(ctx, *proj_, g.shortcut);
      through_shortcut = g.shortcut_dx;
    }
    Ops::add(ctx.dev(), through_shortcut.data(), g.body_dx.data(), g.dx.data(), g.dx.numel());
    return g.dx;
  }

  // Deferred (zero-bubble) only: the weight gradients from what backward_input kept, and the
  // reports, in backward_input's order. Otherwise backward_input formed and reported them already.
  void backward_weight(layers::Context<Space>& ctx, Output) {
    Saved& s = saved_.slot(ctx);
    if (!s.weights_pending) return;
    const Grads& g = s.grads;
    const std::size_t n = convs_.size();
    detail::resnet::weight_gradients(ctx, bns_[n - 1], g.unit[n - 1]);
    for (std::size_t i = n; i-- > 0;) {
      detail::resnet::weight_gradients(ctx, convs_[i], g.unit[i]);
      if (i > 0) detail::resnet::weight_gradients(ctx, bns_[i - 1], g.unit[i - 1]);
    }
    if (proj_) {
      detail::resnet::weight_gradients(ctx, *proj_bn_, g.shortcut);
      detail::resnet::weight_gradients(ctx, *proj_, g.shortcut);
    }
    s.weights_pending = false;
  }

  // conv1, bn1, …, conv_n, bn_n [, downsample.0, downsample.1]: each its weight, then its bias.
  std::vector<Param<T, Space>*> parameters() {
    std::vector<Param<T, Space>*> p;
    for (std::size_t i = 0; i < convs_.size(); ++i) {
      for (auto* q : convs_[i].parameters()) p.push_back(q);
      for (auto* q : bns_[i].parameters()) p.push_back(q);
    }
    if (proj_) {
      for (auto* q : proj_->parameters()) p.push_back(q);
      for (auto* q : proj_bn_->parameters()) p.push_back(q);
    }
    return p;
  }

  bool projected() const noexcept { return proj_.has_value(); }

 private:
  // The gradients of one backward, in the space's image layout.
  struct Grads {
    std::vector<View> unit;  // (N, C_i, H_i, W_i) at conv_i's output: bn_i's input gradient, i = 1..n
    View shortcut;           // (N, C_n, Ho, Wo) at the shortcut's output (bn_n's residual gradient)
    View body_dx;            // (N, Cin, H, W): x's gradient through the units
    View shortcut_dx;        // (N, Cin, H, W): x's gradient through the projection (projected blocks)
    View dx;                 // (N, Cin, H, W): the two added, returned
  };
  struct Saved {                   // per micro-batch slot
    Input x;                       // (N, Cin, H, W), the caller's buffer
    std::vector<Shape> unit;       // conv_i's output shape, i = 1..n
    bool weights_pending = false;  // backward_input left the weight gradients to backward_weight
    Grads grads;                   // deferred: what backward_weight reads, in `kept`
    std::vector<Tensor<T, Space>> kept;
  };

  // Elements of the largest gradient of this block: every scratch buffer holds at least this many.
  static std::int64_t largest(const Saved& s) {
    std::int64_t n = s.x.numel();
    for (const Shape& u : s.unit) n = std::max(n, u.numel());
    return n;
  }

  // The scratch shared by all blocks (see the top of the file). d: the ring entry not holding dy,
  // for the shortcut's and the input's gradients; the units alternate between the other entry
  // (dy's own when dy is the next block's gradient: bn_n then works in place) and "resnet.tmp",
  // unit n first, so conv_1 writes x's gradient into the one unit 1 does not occupy, and the
  // projection into unit 1's, free once conv_1's weight gradient is formed.
  static Grads shared_grads(layers::Context<Space>& ctx, const Saved& s, Output dy) {
    const std::int64_t size = largest(s);
    const auto [d, other] = detail::resnet::ring<T>(ctx, size, dy.data());
    T* const turn[2] = {other, ctx.dev().template shared<T>(detail::resnet::kTmp, size)};
    const std::size_t n = s.unit.size();
    Grads g;
    g.unit.resize(n);
    for (std::size_t i = 0; i < n; ++i) g.unit[i] = View(turn[(n - 1 - i) % 2], s.unit[i]);
    g.shortcut = View(d, s.unit.back());
    g.body_dx = View(turn[n % 2], s.x.shape());
    g.shortcut_dx = View(turn[(n - 1) % 2], s.x.shape());
    g.dx = View(d, s.x.shape());
    return g;
  }
  // Per slot, for weight gradients formed later: every gradient its own buffer.
  Grads kept_grads(Saved& s) const {
    const std::size_t n = s.unit.size();
    s.kept.resize(n + 4);
    Grads g;
    for (std::size_t i = 0; i < n; ++i) g.unit.push_back(layers::ensure(s.kept[i], s.unit[i]));
    g.shortcut = layers::ensure(s.kept[n], s.unit.back());
    g.body_dx = layers::ensure(s.kept[n + 1], s.x.shape());
    if (proj_) g.shortcut_dx = layers::ensure(s.kept[n + 2], s.x.shape());
    g.dx = layers::ensure(s.kept[n + 3], s.x.shape());
    return g;
  }

  std::vector<Conv> convs_;
  std::vector<BN> bns_;
  std::optional<Conv> proj_;
  std::optional<BN> proj_bn_;
  layers::Slots<Saved> saved_;
};

struct ResNetStemOptions {
  std::int64_t in = 0;          // image channels
  std::int64_t out = 0;         // conv1's output channels
  std::int64_t kernel = 3;      // conv1: kernel × kernel, padding kernel / 2
  std::int64_t stride = 1;
  bool pool = false;            // a 3×3, stride-2 max pool (padding 1) after the ReLU
  bool sync_batch_norm = false; // BatchNorm statistics over the data axis
};

template <class T = float, class Space = HostSpace, class Comm = parallel::default_comm_t<Space>,
          class ConvPolicy = typename kernels::Ops<Space>::DefaultConvPolicy>
class ResNetStem {
  using Ops = kernels::Ops<Space>;
  using Conv = layers::Conv2d<T, Space, ConvPolicy>;
  using BN = layers::BatchNorm2d<T, Space, Comm>;
  using View = TensorView<T, Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (N, in, H, W) in the space's image layout
  using Output = TensorView<const T, Space>;  // (N, out, H', W'): after the stride (and the pool)
  static constexpr bool reports_grad_ready = true;

  explicit ResNetStem(const ResNetStemOptions& o, const Comm* data_comm = nullptr)
      : conv_(o.in, o.out, o.kernel,
              {.stride = o.stride, .padding = o.kernel / 2, .bias = false, .input_gradient = false, .name = "conv1"}),
        bn_(o.out, {.sync = o.sync_batch_norm, .relu = true, .name = "bn1"}, data_comm) {
    if (o.pool) pool_.emplace(3, 2, 1);
  }

  Output forward(layers::Context<Space>& ctx, Input x) {
    Saved& s = saved_.slot(ctx);
    const Input c = conv_.forward(ctx, x);
    s.conv = c.shape();
    if (pool_) {  // relu(bn1(c)) into the scratch: the pool reads it, nothing after (see the top of the file)
      const View h(ctx.dev().template shared<T>(detail::resnet::kTmp, c.numel()), c.shape());
      s.y = pool_->forward(ctx, bn_.forward_into(ctx, c, Input(), h));
    } else {
      s.y = bn_.forward(ctx, c);
    }
    if (!ctx.deferred_weight_gradients) detail::resnet::reserve_scratch<T>(ctx, std::max(c.numel(), s.y.numel()));
    return s.y;
  }

  // Weight gradients (formed here unless deferred); no input gradient: an empty view.
  Input backward_input(layers::Context<Space>& ctx, Output dy) {
    Saved& s = saved_.slot(ctx);
    DPML_REQUIRE(s.y.rank() == 4 && dy.shape() == s.y.shape() && dy.is_contiguous(),
                 "ResNetStem: dy " << dy.shape().str() << " differs from the output " << s.y.shape().str()
                                   << " of micro-batch " << ctx.micro_batch);
    s.weights_pending = ctx.deferred_weight_gradients;
    const View d = s.weights_pending ? layers::ensure(s.kept, s.conv)
                                     : View(detail::resnet::ring<T>(ctx, s.conv.numel(), dy.data()).first, s.conv);
    if (pool_) {  // the ReLU's backward before the pool's (see the top of the file), then BatchNorm in place
      const View masked(ctx.dev().template shared<T>(detail::resnet::kTmp, dy.numel()), dy.shape());
      Ops::relu_backward(ctx.dev(), s.y.data(), dy.data(), masked.data(), dy.numel());
      bn_.backward_input_masked_into(ctx, pool_->backward_input_into(ctx, masked, d), d, View());
    } else {
      bn_.backward_input_into(ctx, dy, d, View());
    }
    if (!s.weights_pending) weight_gradients(ctx, d);
    return Input();
  }

  // Deferred (zero-bubble) only: the weight gradients from the gradient backward_input kept.
  void backward_weight(layers::Context<Space>& ctx, Output) {
    Saved& s = saved_.slot(ctx);
    if (!s.weights_pending) return;
    weight_gradients(ctx, s.kept.view());
    s.weights_pending = false;
  }

  // conv1's weight, bn1's weight and bias.
  std::vector<Param<T, Space>*> parameters() {
    std::vector<Param<T, Space>*> p = conv_.parameters();
    for (auto* q : bn_.parameters()) p.push_back(q);
    return p;
  }

 private:
  struct Saved {                   // per micro-batch slot
    Shape conv;                    // conv1's output (N, out, H', W')
    Output y;                      // the stem's output: the pool's (or BatchNorm's) buffer
    bool weights_pending = false;  // backward_input left the weight gradients to backward_weight
    Tensor<T, Space> kept;         // deferred: conv1's output gradient
  };

  // bn1's, then conv1's, each reported; d: conv1's output gradient.
  void weight_gradients(layers::Context<Space>& ctx, View d) {
    detail::resnet::weight_gradients(ctx, bn_, d);
    detail::resnet::weight_gradients(ctx, conv_, d);
  }

  Conv conv_;
  BN bn_;
  std::optional<layers::MaxPool2d<T, Space>> pool_;
  layers::Slots<Saved> saved_;
};

}  // namespace dpml::models
