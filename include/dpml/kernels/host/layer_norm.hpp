#pragma once
// Layer normalisation over the last dimension (Ba et al. 2016), host kernels.
//
//   forward   x̂ = (x − μ) · rstd,  rstd = 1 / √(σ² + eps),  y = x̂ · w + b      per row of C
//   backward  g = dy · w;   dx = rstd · (g − mean(g) − x̂ · mean(g · x̂))
//             dw += Σ_rows dy · x̂;   db += Σ_rows dy
//
// Forward saves μ and rstd per row (two numbers instead of the (rows, C) normalised x̂), and the
// backward recomputes x̂ from x. The two backward halves are separate functions: dx for
// backward_input, dw/db for backward_weight (which may run later). Row statistics accumulate in
// double for float inputs.

#include "dpml/kernels/device.hpp"
#include "dpml/kernels/host/softmax.hpp"  // detail::Accum

#include <cmath>
#include <cstdint>

namespace dpml::kernels::host {

// x, y (rows, C); w, b (C); mean, rstd (rows).
template <class T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, std::int64_t rows,
                        std::int64_t C, double eps) {
  using A = detail::Accum<T>;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * C;
    A s = 0;
    for (std::int64_t c = 0; c < C; ++c) s += xr[c];
    const A mu = s / static_cast<A>(C);
    A v = 0;
    for (std::int64_t c = 0; c < C; ++c) v += (xr[c] - mu) * (xr[c] - mu);
    const A rs = 1 / std::sqrt(v / static_cast<A>(C) + static_cast<A>(eps));
    T* yr = y + r * C;
    for (std::int64_t c = 0; c < C; ++c) yr[c] = static_cast<T>((xr[c] - mu) * rs) * w[c] + b[c];
    mean[r] = static_cast<T>(mu);
    rstd[r] = static_cast<T>(rs);
  }
}

// dx (rows, C) = dres + dL/dx, overwritten (dres null: none; a residual branch's gradient joined
// in the same pass, as the device kernel does). dx may alias dres.
template <class T>
void layer_norm_backward_input(const T* dy, const T* x, const T* w, const T* mean, const T* rstd, T* dx,
                               std::int64_t rows, std::int64_t C, const T* dres = nullptr) {
  using A = detail::Accum<T>;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T *dyr = dy + r * C, *xr = x + r * C;
    A g_mean = 0, gx_mean = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const T g = dyr[c] * w[c], xh = (xr[c] - mean[r]) * rstd[r];
      g_mean += g;
      gx_mean += g * xh;
    }
    g_mean /= static_cast<A>(C);
    gx_mean /= static_cast<A>(C);
    T* dxr = dx + r * C;
    for (std::int64_t c = 0; c < C; ++c) {
      const T g = dyr[c] * w[c], xh = (xr[c] - mean[r]) * rstd[r];
      dxr[c] = rstd[r] * static_cast<T>(g - g_mean - xh * gx_mean) + (dres ? dres[r * C + c] : T(0));
    }
  }
}

// dw, db (C) += the weight and bias gradients.
template <class T>
void layer_norm_backward_weight(const T* dy, const T* x, const T* mean, const T* rstd, T* dw, T* db,
                                std::int64_t rows, std::int64_t C) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T *dyr = dy + r * C, *xr = x + r * C;
    for (std::int64_t c = 0; c < C; ++c) {
      dw[c] += dyr[c] * (xr[c] - mean[r]) * rstd[r];
      db[c] += dyr[c];
    }
  }
}

// Ops<HostSpace>'s LayerNorm family; statistics (mean, rstd) in accum_t<T> (= T on the host).
struct LayerNormOps {
  using Dev = Device<HostSpace>;
  template <class T>
  static void layer_norm_forward(Dev&, const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, std::int64_t rows,
                                 std::int64_t C, double eps) {
    host::layer_norm_forward(x, w, b, y, mean, rstd, rows, C, eps);
  }
  template <class T>
  static void layer_norm_backward_input(Dev&, const T* dy, const T* x, const T* w, const T* mean, const T* rstd, T* dx,
                                        std::int64_t rows, std::int64_t C, const T* dres = nullptr) {
    host::layer_norm_backward_input(dy, x, w, mean, rstd, dx, rows, C, dres);
  }
  template <class T>
  static void layer_norm_backward_weight(Dev&, const T* dy, const T* x, const T* mean, const T* rstd, T* dw, T* db,
                                         std::int64_t rows, std::int64_t C) {
    host::layer_norm_backward_weight(dy, x, mean, rstd, dw, db, rows, C);
  }
};

}  // namespace dpml::kernels::host
