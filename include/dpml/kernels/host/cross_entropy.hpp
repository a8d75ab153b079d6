#pragma once
// Softmax cross-entropy on rows of logits, forward and backward in one pass per row, for the host
// (the maths of kernels/cuda/cross_entropy.hpp, which is the fast form).
//
//   loss_n     = logsumexp(x_n[0, V_real)) − x_n[target_n]
//   dlogits_n  = (softmax(x_n) − onehot(target_n)) · scale · loss_scale
//                                                              over the real columns [0, V_real),
//                0 on the padding [V_real, V)
//
// loss_scale (1 unless fp16 loss scaling: optim/loss_scale.hpp) scales the gradient only: Σ_n
// loss_n · scale is ADDED to *loss_sum (a running sum, in double), so a loss layer sums its
// micro-batches without reading anything back. dlogits may be the logits themselves (each row is
// read before it is written: the in-place form that saves a logits-sized buffer) or null (the loss
// only, for evaluation). A target outside [0, V_real) marks an ignored row: zero loss, zero
// gradient (layers refuse such targets beforehand: kernels/host/id_check.hpp). Row statistics are
// formed in double whatever T is.
//
// Vocabulary-parallel (Megatron's, for a tensor-parallel LM head): each of tp ranks holds the
// logits of its columns [begin, begin + V) of the padded vocabulary, and the full row never exists
// on one rank. Around ONE all-reduce (sum) of a (tp, 3, N) stats buffer over the tensor axis:
//   vocab_parallel_xent_partials  slot `rank` of stats gets this shard's (max m, Σ exp(x − m), the
//                                 target's logit if the shard holds it, else 0) per row, every
//                                 other slot 0 — so the sum gathers every shard's triple, exactly
//   all-reduce (sum)              the conjugate operation, done by the layer
//   vocab_parallel_xent_finish    per row: M = max_k m_k, S = Σ_k s_k · exp(m_k − M), logsumexp
//                                 = M + log S; the loss (the same on every rank) and this shard's
//                                 dlogits as above
//
// count_correct adds a classifier's correct predictions to a running double (a layers::LossSum,
// as the loss): the rows whose largest real logit — the first of equal ones — is the target's.
// vocab_parallel_count_hits does the same from the all-reduced stats of the vocabulary-parallel
// form (any tp, 1 included): the rows with a real target whose logit is the row's largest (M: a
// tie counts as a hit) — a masked LM's masked-token accuracy, the same count on every layout
// (the stats hold exact copies of the logits' values); rows with an ignored target count nothing.
//
// CrossEntropyOps at the end is Ops<HostSpace>'s family; take_loss reads the running sum and
// zeroes it.

#include "dpml/kernels/device.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace dpml::kernels::host {

namespace detail::xent {

// Columns of the shard [begin, begin + V) that are real, of a vocabulary of V_real real columns.
inline std::int64_t real_in_shard(std::int64_t begin, std::int64_t V, std::int64_t V_real) {
  return std::clamp<std::int64_t>(V_real - begin, 0, V);
}

// Row x (V): max over the first `real` columns and Σ exp(x − max) (−inf and 0 when real = 0).
template <class T>
void max_sum(const T* x, std::int64_t real, double& m, double& s) {
  m = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < real; ++j) m = std::max(m, static_cast<double>(x[j]));
  s = 0;
  for (std::int64_t j = 0; j < real; ++j) s += std::exp(static_cast<double>(x[j]) - m);
}

// out (V) = (exp(x − lse) − [j = target]) · scale over the first `real` columns, 0 after; out may be x.
template <class T>
void write_dlogits(const T* x, T* out, std::int64_t V, std::int64_t real, double lse, std::int64_t target,
                   double scale) {
  for (std::int64_t j = 0; j < V; ++j) {
    const double p = j < real ? std::exp(static_cast<double>(x[j]) - lse) : 0.0;
    out[j] = static_cast<T>((p - (j == target ? 1.0 : 0.0)) * scale);
  }
}

}  // namespace detail::xent

// logits (N, V); targets (N); dlogits (N, V) or null, may be logits; *loss_sum += Σ loss · scale.
template <class T>
void softmax_cross_entropy(const T* logits, const std::int32_t* targets, T* dlogits, double* loss_sum, std::int64_t N,
                           std::int64_t V, std::int64_t V_real, double scale, double loss_scale = 1.0) {
  const double seed = scale * loss_scale;
  double total = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    const std::int64_t t = targets[n];
    const bool ignored = t < 0 || t >= V_real;
    double m, s;
    detail::xent::max_sum(x, V_real, m, s);
    const double lse = m + std::log(s);
    if (!ignored) total += lse - static_cast<double>(x[t]);  // read before dlogits may overwrite it
    if (dlogits) detail::xent::write_dlogits(x, dlogits + n * V, V, V_real, lse, t, ignored ? 0.0 : seed);
  }
  *loss_sum += total * scale;
}

// logits (N, V); targets (N); *correct += the rows whose first largest logit among the real
// columns [0, V_real) is at their target.
template <class T>
void count_correct(const T* logits, const std::int32_t* targets, double* correct, std::int64_t N, std::int64_t V,
                   std::int64_t V_real) {
  std::int64_t hits = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    hits += std::max_element(x, x + V_real) - x == targets[n];
  }
  *correct += static_cast<double>(hits);
}

// Pass 1 (header comment): logits (N, V), this rank's columns [begin, begin + V) of a vocabulary of
// V_real real columns; targets (N) global ids; stats (tp, 3, N) written whole.
template <class T, class S>
void vocab_parallel_xent_partials(const T* logits, const std::int32_t* targets, S* stats, std::int64_t N,
                                  std::int64_t V, std::int64_t begin, std::int64_t V_real, int tp, int rank) {
  const std::int64_t real = detail::xent::real_in_shard(begin, V, V_real);
  std::fill_n(stats, static_cast<std::int64_t>(tp) * 3 * N, S(0));
  S* mine = stats + static_cast<std::int64_t>(rank) * 3 * N;  // (3, N)
  for (std::int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    double m, s;
    detail::xent::max_sum(x, real, m, s);
    const std::int64_t t = targets[n] - begin;
    mine[n] = static_cast<S>(m);
    mine[N + n] = static_cast<S>(s);
    mine[2 * N + n] = t >= 0 && t < real ? static_cast<S>(x[t]) : S(0);
  }
}

// Pass 2, after the all-reduce (sum) of stats over the tensor axis: *loss_sum += Σ loss · scale and
// dlogits (N, V) of this shard (or null; may be logits), as softmax_cross_entropy's.
template <class T, class S>
void vocab_parallel_xent_finish(const T* logits, const std::int32_t* targets, const S* stats, T* dlogits,
                                double* loss_sum, std::int64_t N, std::int64_t V, std::int64_t begin,
                                std::int64_t V_real, int tp, double scale, double loss_scale = 1.0) {
  const std::int64_t real = detail::xent::real_in_shard(begin, V, V_real);
  const double seed = scale * loss_scale;
  double total = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    double M = -std::numeric_limits<double>::infinity(), sum = 0, z = 0;
    for (int k = 0; k < tp; ++k) M = std::max(M, static_cast<double>(stats[k * 3 * N + n]));
    for (int k = 0; k < tp; ++k) {
      const double m = stats[k * 3 * N + n];
      if (m != -std::numeric_limits<double>::infinity()) sum += static_cast<double>(stats[(k * 3 + 1) * N + n]) * std::exp(m - M);
      z += static_cast<double>(stats[(k * 3 + 2) * N + n]);
    }
    const double lse = M + std::log(sum);
    const std::int64_t t = targets[n];
    const bool ignored = t < 0 || t >= V_real;
    if (!ignored) total += lse - z;
    if (dlogits)
      detail::xent::write_dlogits(logits + n * V, dlogits + n * V, V, real, lse, t - begin, ignored ? 0.0 : seed);
  }
  *loss_sum += total * scale;
}

// After the all-reduce (sum) of stats (tp, 3, N): *hits += the rows with a target in [0, V_real)
// whose logit (the sum of the slots' third fields: one shard holds it) is the row's max M.
template <class S>
void vocab_parallel_count_hits(const std::int32_t* targets, const S* stats, double* hits, std::int64_t N,
                               std::int64_t V_real, int tp) {
  std::int64_t count = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    if (targets[n] < 0 || targets[n] >= V_real) continue;
    double M = -std::numeric_limits<double>::infinity(), z = 0;
    for (int k = 0; k < tp; ++k) {
      M = std::max(M, static_cast<double>(stats[k * 3 * N + n]));
      z += static_cast<double>(stats[(k * 3 + 2) * N + n]);
    }
    count += z >= M;
  }
  *hits += static_cast<double>(count);
}

// Ops<HostSpace>'s cross-entropy family (the CUDA twin: kernels/cuda/cross_entropy.hpp).
struct CrossEntropyOps {
  using Dev = Device<HostSpace>;
  // logits (N, V), real columns [0, V_real); targets (N); dlogits (N, V) or null, may be logits;
  // *loss_sum += scale · Σ_n loss_n; dlogits scaled by scale · loss_scale
  template <class T>
  static void softmax_xent(Dev&, const T* logits, const std::int32_t* targets, T* dlogits, double* loss_sum,
                           std::int64_t N, std::int64_t V, std::int64_t V_real, double scale, double loss_scale = 1.0) {
    host::softmax_cross_entropy(logits, targets, dlogits, loss_sum, N, V, V_real, scale, loss_scale);
  }
  // Vocabulary-parallel pass 1: stats (tp, 3, N) in accum_t<T>
  template <class T, class S>
  static void vocab_xent_partials(Dev&, const T* logits, const std::int32_t* targets, S* stats, std::int64_t N,
                                  std::int64_t V, std::int64_t begin, std::int64_t V_real, int tp, int rank) {
    host::vocab_parallel_xent_partials(logits, targets, stats, N, V, begin, V_real, tp, rank);
  }
  // Pass 2, after the all-reduce (sum) of stats over the tensor axis
  template <class T, class S>
  static void vocab_xent_finish(Dev&, const T* logits, const std::int32_t* targets, const S* stats, T* dlogits,
                                double* loss_sum, std::int64_t N, std::int64_t V, std::int64_t begin,
                                std::int64_t V_real, int tp, double scale, double loss_scale = 1.0) {
    host::vocab_parallel_xent_finish(logits, targets, stats, dlogits, loss_sum, N, V, begin, V_real, tp, scale, loss_scale);
  }
  // logits (N, V), real columns [0, V_real); targets (N); *correct += the rows predicted right
  template <class T>
  static void count_correct(Dev&, const T* logits, const std::int32_t* targets, double* correct, std::int64_t N,
                            std::int64_t V, std::int64_t V_real) {
    host::count_correct(logits, targets, correct, N, V, V_real);
  }
  // After pass 1's all-reduce: *hits += the rows whose real target has the row's largest logit
  template <class S>
  static void vocab_xent_count_hits(Dev&, const std::int32_t* targets, const S* stats, double* hits, std::int64_t N,
                                    std::int64_t V_real, int tp) {
    host::vocab_parallel_count_hits(targets, stats, hits, N, V_real, tp);
  }
  // The running sum (1), then zeroed.
  static double take_loss(Dev&, double* loss_sum) {
    const double v = *loss_sum;
    *loss_sum = 0;
    return v;
  }
};

}  // namespace dpml::kernels::host
