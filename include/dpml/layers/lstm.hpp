#pragma once
// Lstm: one LSTM layer over a batch of sequences, batch first as the framework's other sequence
// layers, x (B, T, I) → y (B, T, H), the states starting at zero — PyTorch's nn.LSTM(I, H,
// batch_first=True) with one layer and one bias (PyTorch's bias_ih + bias_hh). Parameters as
// PyTorch names them, gates in its order (i, f, g, o) along the 4H rows:
//
//   weight_ih (4H, I), weight_hh (4H, H), bias (4H), all U(−1/√H, 1/√H) as PyTorch's; with
//   LstmOptions::forget_bias the forget quarter of the bias [H, 2H) starts at that value instead
//   (1.0: Jozefowicz et al. 2015), drawn like every parameter from (seed, name, global index)
//
// As cuDNN and PyTorch do, the input projection of all T steps is ONE GEMM up front, and each step
// runs ONE recurrent GEMM and one element-wise cell update (kernels/host/lstm.hpp):
//
//   forward          a (T, B, 4H) = x · W_ihᵀ + b                     one GEMM, (T·B, I) × (I, 4H)
//                    per step t: a_t += h_{t−1} · W_hhᵀ (B, H) × (H, 4H); the cell turns a_t into
//                    the gates and gives c_t, h_t
//   backward_input   per step t, last first: the cell's backward gives da_t (dL/d pre-activations)
//                    and dL/dc_{t−1}; dL/dh_{t−1} = da_t · W_hh    (B, 4H) × (4H, H)
//                    dx = da · W_ih                                  one GEMM, (T·B, 4H) × (4H, I)
//   backward_weight  dW_ih += daᵀ · x,  db += Σ da                   one GEMM over all steps
//                    dW_hh += Σ_{t≥1} da_tᵀ · h_{t−1}                one GEMM: steps 1…T−1 against
//                                                                    the states 0…T−2
//
// Inside, everything is time major (T, B, ·), so that a step's rows, and the steps 1…T−1 and
// 0…T−2 of the last GEMM, are contiguous; x is transposed in and y out with T strided copies each
// (Ops::copy_columns). backward_input keeps da per micro-batch slot, with x (transposed) and the
// states from forward, so backward_weight may run later (zero-bubble schedules).
//
// Any space through kernels::Ops<Space> (linear family, copy_columns, the LSTM family: the cell's
// kernels in kernels/host/lstm.hpp and kernels/cuda/lstm.hpp).

#include "dpml/core/error.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/layers/layer.hpp"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dpml::layers {

struct LstmOptions {
  std::string name = "lstm";
  std::optional<double> forget_bias;  // the forget gate's bias at the start; none: drawn like the rest
};

template <class T = float, class Space = HostSpace>
class Lstm {
  using Ops = kernels::Ops<Space>;

 public:
  using value_type = T;
  using space = Space;
  using Input = TensorView<const T, Space>;   // (B, T, I)
  using Output = TensorView<const T, Space>;  // (B, T, H)

  Lstm(std::int64_t input_size, std::int64_t hidden_size, LstmOptions opts = {})
      : I_(input_size), H_(hidden_size), name_(opts.name),
        weight_ih_(opts.name + ".weight_ih", Shape{4 * hidden_size, input_size}, uniform(hidden_size)),
        weight_hh_(opts.name + ".weight_hh", Shape{4 * hidden_size, hidden_size}, uniform(hidden_size)),
        bias_(opts.name + ".bias", Shape{4 * hidden_size},
              opts.forget_bias ? uniform(hidden_size).with_fill(hidden_size, 2 * hidden_size, *opts.forget_bias)
                               : uniform(hidden_size)) {
    DPML_REQUIRE(input_size > 0 && hidden_size > 0,
                 "Lstm " << opts.name << ": sizes input=" << input_size << ", hidden=" << hidden_size << " must be positive");
  }

  Output forward(Context<Space>& ctx, Input x) {
    DPML_REQUIRE(x.rank() == 3 && x.size(2) == I_ && x.is_contiguous(),
                 "Lstm " << name_ << ": input " << x.shape().str() << " is not (B, T, " << I_ << ")");
    const std::int64_t B = x.size(0), Tn = x.size(1), H = H_;
    auto& dev = ctx.dev();
    Saved& s = slots_.slot(ctx);
    s.x = x;
    auto xt = ensure(s.xt, Shape{Tn, B, I_});     // x time major
    auto a = ensure(s.gates, Shape{Tn, B, 4 * H});  // pre-activations, then the gates (i, f, g, o)
    auto c = ensure(s.c, Shape{Tn, B, H});
    auto h = ensure(s.h, Shape{Tn, B, H});
    auto y = ensure(s.y, Shape{B, Tn, H});
    transpose_bt(dev, x.data(), xt.data(), B, Tn, I_);
    Ops::linear_forward(dev, xt.data(), weight_ih_.value().data(), bias_.value().data(), a.data(), Tn * B, I_, 4 * H);
    for (std::int64_t t = 0; t < Tn; ++t) {
      T* at = a.data() + t * B * 4 * H;  // (B, 4H)
      const T* c_prev = t > 0 ? c.data() + (t - 1) * B * H : nullptr;
      if (t > 0)  // a_t += h_{t−1} · W_hhᵀ
        Ops::linear_forward(dev, h.data() + (t - 1) * B * H, weight_hh_.value().data(), static_cast<const T*>(nullptr), at, B,
                            H, 4 * H, /*accumulate=*/true);
      Ops::lstm_cell_forward(dev, at, c_prev, c.data() + t * B * H, h.data() + t * B * H, B, H);
    }
    transpose_bt(dev, h.data(), y.data(), Tn, B, H);
    return y;
  }

  Input backward_input(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    check_dy(ctx, s, dy);
    const std::int64_t B = s.x.size(0), Tn = s.x.size(1), H = H_;
    auto& dev = ctx.dev();
    auto dyt = ensure(dyt_, Shape{Tn, B, H});   // dy time major
    auto dh = ensure(dh_, Shape{B, H});         // dL/dh_t from step t + 1
    auto dc = ensure(dc_, Shape{B, H});         // dL/dc_t from step t + 1
    auto da = ensure(s.dgates, Shape{Tn, B, 4 * H});
    auto dxt = ensure(dxt_, Shape{Tn, B, I_});
    auto dx = ensure(s.dx, s.x.shape());
    transpose_bt(dev, dy.data(), dyt.data(), B, Tn, H);
    Ops::zero(dev, dc.data(), B * H);
    for (std::int64_t t = Tn - 1; t >= 0; --t) {
      const T* dh_rec = nullptr;
      if (t + 1 < Tn) {  // dL/dh_t through step t + 1 = da_{t+1} · W_hh
        Ops::linear_backward_input(dev, da.data() + (t + 1) * B * 4 * H, weight_hh_.value().data(), dh.data(), B, H, 4 * H);
        dh_rec = dh.data();
      }
      Ops::lstm_cell_backward(dev, s.gates.data() + t * B * 4 * H, t > 0 ? s.c.data() + (t - 1) * B * H : nullptr,
                              s.c.data() + t * B * H, dyt.data() + t * B * H, dh_rec, dc.data(), da.data() + t * B * 4 * H, B,
                              H);
    }
    Ops::linear_backward_input(dev, da.data(), weight_ih_.value().data(), dxt.data(), Tn * B, I_, 4 * H);
    transpose_bt(dev, dxt.data(), dx.data(), Tn, B, I_);
    return dx;
  }

  void backward_weight(Context<Space>& ctx, Output dy) {
    Saved& s = slots_.slot(ctx);
    check_dy(ctx, s, dy);
    DPML_REQUIRE(s.dgates.numel() == s.gates.numel(),
                 "Lstm " << name_ << ": backward_weight before backward_input for micro-batch " << ctx.micro_batch);
    const std::int64_t B = s.x.size(0), Tn = s.x.size(1), H = H_;
    auto& dev = ctx.dev();
    Ops::linear_backward_weight(dev, s.dgates.data(), s.xt.data(), weight_ih_.grad().data(), bias_.grad().data(), Tn * B,
                                I_, 4 * H, weight_ih_.take_grad_zero());
    if (Tn > 1)  // dW_hh += da[1:]ᵀ · h[:−1]
      Ops::linear_backward_weight(dev, s.dgates.data() + B * 4 * H, s.h.data(), weight_hh_.grad().data(),
                                  static_cast<T*>(nullptr), (Tn - 1) * B, H, 4 * H, weight_hh_.take_grad_zero());
  }

  // weight_ih (4H, I), weight_hh (4H, H), bias (4H)
  std::vector<Param<T, Space>*> parameters() { return {&weight_ih_, &weight_hh_, &bias_}; }

  std::int64_t hidden_size() const noexcept { return H_; }

 private:
  struct Saved {
    Input x;                       // (B, T, I), the caller's buffer
    Tensor<T, Space> xt;           // (T, B, I)
    Tensor<T, Space> gates;        // (T, B, 4H): the activations i, f, g, o
    Tensor<T, Space> c, h;         // (T, B, H)
    Tensor<T, Space> y;            // (B, T, H)
    Tensor<T, Space> dgates;       // (T, B, 4H): dL/d pre-activations, for backward_weight
    Tensor<T, Space> dx;           // (B, T, I)
  };
  static Init uniform(std::int64_t hidden) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
    return Init::uniform(-bound, bound);
  }
  // dst (n1, n0, C) = src (n0, n1, C) with the first two dimensions swapped: n1 strided copies.
  static void transpose_bt(kernels::Device<Space>& dev, const T* src, T* dst, std::int64_t n0, std::int64_t n1,
                           std::int64_t C) {
    for (std::int64_t j = 0; j < n1; ++j) Ops::copy_columns(dev, src + j * C, n1 * C, dst + j * n0 * C, C, n0, C);
  }
  void check_dy(const Context<Space>& ctx, const Saved& s, const Output& dy) const {
    DPML_REQUIRE(s.x.rank() == 3, "Lstm " << name_ << ": backward before forward for micro-batch " << ctx.micro_batch);
    DPML_REQUIRE(dy.is_contiguous() && dy.shape() == s.y.shape(),
                 "Lstm " << name_ << ": dy " << dy.shape().str() << " is not the output's " << s.y.shape().str()
                         << " (micro-batch " << ctx.micro_batch << ")");
  }

  std::int64_t I_, H_;
  std::string name_;
  Param<T, Space> weight_ih_, weight_hh_, bias_;
  Tensor<T, Space> dyt_, dh_, dc_, dxt_;  // backward_input's scratch, any slot: (T, B, H), (B, H), (B, H), (T, B, I)
  Slots<Saved> slots_;
};

}  // namespace dpml::layers
