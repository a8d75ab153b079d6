#pragma once
// Softmax cross-entropy on rows of logits, for the host.
//
//   forward   p = softmax(z) per row; returns Σ_rows −log p[label]   (log-sum-exp form, in double)
//   backward  dz = (p − onehot(label)) · scale                        (scale = 1 / global batch)
//
// Labels must lie in [0, C); the layer checks them before calling.

#include "dpml/kernels/host/softmax.hpp"

#include <cmath>
#include <cstdint>

namespace dpml::kernels::host {

// probs (N, C) from logits (N, C); returns the summed loss.
template <class T>
double softmax_cross_entropy_forward(const T* logits, const std::int32_t* labels, std::int64_t N, std::int64_t C,
                                     T* probs) {
  double loss = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    const T* z = logits + n * C;
    softmax_row(z, probs + n * C, C);
    double m = z[0];
    for (std::int64_t j = 1; j < C; ++j) m = z[j] > m ? z[j] : m;
    double sum = 0;
    for (std::int64_t j = 0; j < C; ++j) sum += std::exp(static_cast<double>(z[j]) - m);
    loss += m + std::log(sum) - static_cast<double>(z[labels[n]]);
  }
  return loss;
}

// dlogits (N, C) = (probs − onehot) · scale.
template <class T>
void softmax_cross_entropy_backward(const T* probs, const std::int32_t* labels, std::int64_t N, std::int64_t C,
                                    T scale, T* dlogits) {
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t j = 0; j < C; ++j) dlogits[n * C + j] = probs[n * C + j] * scale;
    dlogits[n * C + labels[n]] -= scale;
  }
}

}  // namespace dpml::kernels::host
