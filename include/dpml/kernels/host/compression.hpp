#pragma once
// The kernels of gradient compression (parallel/compression/*.hpp) for the host: the pieces of
// PowerSGD and top-k that are neither a GEMM nor a collective. Ops<CudaSpace>'s twin is
// kernels/cuda/compression.hpp; both compute the same definitions:
//
//   subtract               y = a − b
//   orthonormalise_columns modified Gram–Schmidt on the r columns of P (n, r), in double
//   redraw_zero_rows       a row of Qt (r, m) that is all zero gets fresh Philox normals
//   take_top_magnitude     the k entries of largest |x| (an order on |x|'s bits: NaN above ∞, ties
//                          to the lower index), moved out of x into (idx, val)
//   scatter_add            y[idx[i]] += val[i] (distinct indices)

#include "dpml/core/philox.hpp"
#include "dpml/kernels/device.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

namespace dpml::kernels {

// The key top-k orders by: |x|'s bits as an unsigned integer (sign cleared), for any IEEE-style
// type of 2, 4 or 8 bytes (bf16, fp16, float, double). For finite values and infinities the order
// is |x|'s; a NaN is above every number (it is sent, so the receiving step sees it and skips as
// with any non-finite gradient).
template <class T>
using MagnitudeKey = std::conditional_t<sizeof(T) == 8, std::uint64_t, std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>>;
template <class T>
constexpr MagnitudeKey<T> magnitude_key(T x) {
  using U = MagnitudeKey<T>;
  static_assert(sizeof(T) == sizeof(U), "magnitude_key: a floating-point type of 2, 4 or 8 bytes");
  constexpr U sign_cleared = static_cast<U>(static_cast<U>(~U{0}) >> 1);  // (no int promotion of ~ on 16 bits)
  return static_cast<U>(std::bit_cast<U>(x) & sign_cleared);
}

// The Gram–Schmidt threshold: a column keeps its direction when its squared norm after the
// projections exceeds this fraction of its squared norm before them.
inline constexpr double kOrthoKeep = 1e-24;

}  // namespace dpml::kernels

namespace dpml::kernels::host {

struct CompressionOps {
  using Dev = Device<HostSpace>;

  // y (n) = a − b; y may alias a or b.
  template <class T>
  static void subtract(Dev&, const T* a, const T* b, T* y, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] - b[i];
  }

  // P (n, r), row-major, in place: column c minus its projections on the columns before it, then
  // scaled to norm 1, in double; a column with nothing left (norm² ≤ kOrthoKeep · its norm² before
  // the projections, zero, or not finite) becomes zero.
  template <class T>
  static void orthonormalise_columns(Dev&, T* P, std::int64_t n, int r) {
    std::vector<double> a(static_cast<std::size_t>(n * r));
    for (std::int64_t i = 0; i < n * r; ++i) a[static_cast<std::size_t>(i)] = static_cast<double>(P[i]);
    auto at = [&](std::int64_t i, int c) -> double& { return a[static_cast<std::size_t>(i * r + c)]; };
    for (int c = 0; c < r; ++c) {
      double before = 0.0;
      for (std::int64_t i = 0; i < n; ++i) before += at(i, c) * at(i, c);
      for (int k = 0; k < c; ++k) {
        double dot = 0.0;
        for (std::int64_t i = 0; i < n; ++i) dot += at(i, k) * at(i, c);
        for (std::int64_t i = 0; i < n; ++i) at(i, c) -= dot * at(i, k);
      }
      double norm = 0.0;
      for (std::int64_t i = 0; i < n; ++i) norm += at(i, c) * at(i, c);
      const bool keep = norm > 0.0 && norm > kOrthoKeep * before && std::isfinite(norm);
      const double inv = keep ? 1.0 / std::sqrt(norm) : 0.0;
      for (std::int64_t i = 0; i < n; ++i) at(i, c) *= inv;
    }
    for (std::int64_t i = 0; i < n * r; ++i) P[i] = static_cast<T>(a[static_cast<std::size_t>(i)]);
  }

  // Qt (r, m): every row that is all zero becomes Qt[c][j] = PhiloxStream(seed, stream).normal(offset
  // + c·m + j); the other rows are left as they are.
  template <class T>
  static void redraw_zero_rows(Dev&, T* Qt, int r, std::int64_t m, std::uint64_t seed, std::uint64_t stream,
                               std::uint64_t offset) {
    const PhiloxStream rng(seed, stream);
    for (int c = 0; c < r; ++c) {
      T* row = Qt + static_cast<std::int64_t>(c) * m;
      if (std::any_of(row, row + m, [](T v) { return v != T(0); })) continue;
      for (std::int64_t j = 0; j < m; ++j)
        row[j] = static_cast<T>(rng.normal(offset + static_cast<std::uint64_t>(c * m + j)));
    }
  }

  // idx (k): the indices of the k entries of x (n) with the largest magnitude_key (ties: the lower
  // index), ascending; val (k): those entries; then they are zeroed in x. 1 ≤ k ≤ n.
  template <class T>
  static void take_top_magnitude(Dev&, T* x, std::int64_t n, std::int64_t k, std::int32_t* idx, T* val) {
    std::vector<std::int32_t> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), std::int32_t{0});
    const auto larger = [x](std::int32_t a, std::int32_t c) {
      const auto ka = magnitude_key(x[a]), kc = magnitude_key(x[c]);
      return ka > kc || (ka == kc && a < c);  // a strict total order: the same choice on every machine
    };
    if (k < n) std::nth_element(order.begin(), order.begin() + k, order.end(), larger);
    std::sort(order.begin(), order.begin() + k);
    for (std::int64_t j = 0; j < k; ++j) {
      idx[j] = order[static_cast<std::size_t>(j)];
      val[j] = x[idx[j]];
      x[idx[j]] = T(0);
    }
  }

  // y[idx[i]] += val[i], i < k; the indices are distinct.
  template <class T>
  static void scatter_add(Dev&, const std::int32_t* idx, const T* val, std::int64_t k, T* y) {
    for (std::int64_t i = 0; i < k; ++i) y[idx[i]] += val[i];
  }
};

}  // namespace dpml::kernels::host
