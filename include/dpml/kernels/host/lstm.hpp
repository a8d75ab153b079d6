#pragma once
// The LSTM cell's element-wise step on the host: everything of one time step but the two GEMMs
// (the input projection of all steps and the recurrent h_{t-1} · W_hhᵀ, kernels/host/gemm.hpp),
// for a batch of B rows of H units, gates in PyTorch's order (i, f, g, o) along the 4H columns:
//
//   forward    i = σ(a_i), f = σ(a_f), g = tanh(a_g), o = σ(a_o)     a (B, 4H): pre-activations
//              c = f · c_prev + i · g,   h = o · tanh(c)
//   backward   dh = dy + dh_rec (the output's and the next step's gradient of h)
//              dc = dc_next + dh · o · (1 − tanh²c)
//              da_i = dc · g · i(1 − i),   da_f = dc · c_prev · f(1 − f)
//              da_g = dc · i · (1 − g²),   da_o = dh · tanh c · o(1 − o),   dc_prev = dc · f
//
// Forward overwrites the pre-activations with the gate activations (i, f, g, o), which is all
// backward needs of them besides c and c_prev. Arithmetic in accum_t<T> (double for the float64
// tests). kernels/cuda/lstm.hpp is the GPU's twin.

#include "dpml/kernels/device.hpp"

#include <cmath>
#include <cstdint>

namespace dpml::kernels::host {

// gates (B, 4H): pre-activations in, activations out; c_prev (B, H), null at the first step
// (zeros); c, h (B, H) out.
template <class T>
void lstm_cell_forward(T* gates, const T* c_prev, T* c, T* h, std::int64_t B, std::int64_t H) {
  using A = accum_t<T>;
  const auto sigmoid = [](A z) { return A(1) / (A(1) + std::exp(-z)); };
  for (std::int64_t b = 0; b < B; ++b) {
    T* a = gates + b * 4 * H;  // (4H): i, f, g, o
    for (std::int64_t j = 0; j < H; ++j) {
      const A i = sigmoid(A(a[j])), f = sigmoid(A(a[H + j])), g = std::tanh(A(a[2 * H + j])), o = sigmoid(A(a[3 * H + j]));
      const A cp = c_prev ? A(c_prev[b * H + j]) : A(0);
      const A cn = f * cp + i * g;
      a[j] = T(i), a[H + j] = T(f), a[2 * H + j] = T(g), a[3 * H + j] = T(o);
      c[b * H + j] = T(cn);
      h[b * H + j] = T(o * std::tanh(cn));
    }
  }
}

// gates (B, 4H): the forward's activations; c_prev (B, H) or null (first step), c (B, H);
// dy (B, H) the output's gradient, dh_rec (B, H) the next step's recurrent one or null (last
// step); dc (B, H): dL/dc of this step from the next one in (zeros at the last step), dL/dc_prev
// out; dgates (B, 4H): dL/d(pre-activations) out.
template <class T>
void lstm_cell_backward(const T* gates, const T* c_prev, const T* c, const T* dy, const T* dh_rec, T* dc, T* dgates,
                        std::int64_t B, std::int64_t H) {
  using A = accum_t<T>;
  for (std::int64_t b = 0; b < B; ++b) {
    const T* a = gates + b * 4 * H;
    T* d = dgates + b * 4 * H;
    for (std::int64_t j = 0; j < H; ++j) {
      const std::int64_t k = b * H + j;
      const A i = A(a[j]), f = A(a[H + j]), g = A(a[2 * H + j]), o = A(a[3 * H + j]);
      const A tc = std::tanh(A(c[k])), cp = c_prev ? A(c_prev[k]) : A(0);
      const A dh = A(dy[k]) + (dh_rec ? A(dh_rec[k]) : A(0));
      const A dct = A(dc[k]) + dh * o * (A(1) - tc * tc);
      d[j] = T(dct * g * i * (A(1) - i));
      d[H + j] = T(dct * cp * f * (A(1) - f));
      d[2 * H + j] = T(dct * i * (A(1) - g * g));
      d[3 * H + j] = T(dh * tc * o * (A(1) - o));
      dc[k] = T(dct * f);
    }
  }
}

// Ops<HostSpace>'s LSTM family (kernels/ops.hpp).
struct LstmOps {
  using Dev = Device<HostSpace>;
  template <class T>
  static void lstm_cell_forward(Dev&, T* gates, const T* c_prev, T* c, T* h, std::int64_t B, std::int64_t H) {
    host::lstm_cell_forward(gates, c_prev, c, h, B, H);
  }
  template <class T>
  static void lstm_cell_backward(Dev&, const T* gates, const T* c_prev, const T* c, const T* dy, const T* dh_rec, T* dc,
                                 T* dgates, std::int64_t B, std::int64_t H) {
    host::lstm_cell_backward(gates, c_prev, c, dy, dh_rec, dc, dgates, B, H);
  }
};

}  // namespace dpml::kernels::host
