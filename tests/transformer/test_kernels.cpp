// Transformer building blocks on one rank, in float64: forward against plain references written
// here, both backward halves against central finite differences.
#include "check.hpp"

#include <dpml/kernels/host/attention.hpp>
#include <dpml/kernels/host/softmax.hpp>
#include <dpml/layers/embedding.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/layers/layer_norm.hpp>
#include <dpml/layers/vocab_parallel_cross_entropy.hpp>

#include <cmath>
#include <vector>

using namespace dpml;
namespace kh = dpml::kernels::host;

TEST_CASE("softmax: rows sum to one, huge logits stay finite, backward matches finite differences",
          "[transformer][softmax]") {
  auto gen = test::rng(11);
  const std::int64_t rows = 3, cols = 7;
  auto x = test::random_tensor<double>({rows, cols}, gen, -3, 3);
  x(1, 2) = 1000.0;  // exp(1000) overflows: the max shift must remove it
  Tensor<double> p({rows, cols});
  kh::softmax_forward(x.data(), p.data(), rows, cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    double m = -1e300, s = 0;
    for (std::int64_t c = 0; c < cols; ++c) m = std::max(m, x(r, c));
    for (std::int64_t c = 0; c < cols; ++c) s += std::exp(x(r, c) - m);
    for (std::int64_t c = 0; c < cols; ++c) CHECK(p(r, c) == test::Approx(std::exp(x(r, c) - m) / s).epsilon(1e-14));
  }
  CHECK(p(1, 2) == test::Approx(1.0));

  x(1, 2) = 0.5;
  auto r = test::random_tensor<double>({rows, cols}, gen);
  Tensor<double> dx({rows, cols});
  kh::softmax_forward(x.data(), p.data(), rows, cols);
  kh::softmax_backward(p.data(), r.data(), dx.data(), rows, cols);
  auto loss = [&] {
    kh::softmax_forward(x.data(), p.data(), rows, cols);
    return test::dot(p, r);
  };
  CHECK(test::rel_error(test::to_vector(dx), test::numeric_gradient(loss, x.data(), x.numel())) < 1e-8);
}

TEST_CASE("LayerNorm: forward matches float64 reference; backward_input and backward_weight match finite differences",
          "[transformer][layernorm]") {
  auto gen = test::rng(12);
  const std::int64_t B = 2, Tn = 3, C = 8;
  layers::LayerNorm<double> ln(C, "ln");
  layers::initialize_all(ln.parameters(), 1, nullptr);
  CHECK(ln.parameters()[0]->value()[0] == 1.0);  // weight 1, bias 0
  CHECK(ln.parameters()[1]->value()[0] == 0.0);
  for (auto* p : ln.parameters()) test::fill_uniform<double>(p->value().begin(), p->value().end(), gen);
  auto x = test::random_tensor<double>({B, Tn, C}, gen, -2, 2);
  auto r = test::random_tensor<double>({B, Tn, C}, gen);
  layers::Context<> ctx;
  auto y = ln.forward(ctx, x.cview());

  const auto w = ln.parameters()[0]->value(), b = ln.parameters()[1]->value();
  std::vector<double> ref;
  for (std::int64_t row = 0; row < B * Tn; ++row) {
    double mu = 0, var = 0;
    for (std::int64_t c = 0; c < C; ++c) mu += x[row * C + c] / C;
    for (std::int64_t c = 0; c < C; ++c) var += (x[row * C + c] - mu) * (x[row * C + c] - mu) / C;
    for (std::int64_t c = 0; c < C; ++c) ref.push_back((x[row * C + c] - mu) / std::sqrt(var + 1e-5) * w[c] + b[c]);
  }
  CHECK(test::rel_error(y, ref) < 1e-13);

  const auto dx = test::to_vector(ln.backward_input(ctx, r.cview()));
  ln.backward_weight(ctx, r.cview());
  auto loss = [&] { return test::dot(ln.forward(ctx, x.cview()), r); };
  CHECK(test::rel_error(dx, test::numeric_gradient(loss, x.data(), x.numel())) < 1e-8);
  for (auto* p : ln.parameters()) {
    CAPTURE(p->name());
    CHECK(test::rel_error(p->grad(), test::numeric_gradient(loss, p->value().data(), p->numel())) < 1e-8);
  }
}

namespace {
// Attention written plainly: qkv (B, T, H, 3, D) → (B, T, H, D). Causal, or (keys given)
// bidirectional over the keys j with keys[b·T + j] = 1.
std::vector<double> attention_reference(const Tensor<double>& qkv, std::int64_t B, std::int64_t Tn, std::int64_t H,
                                        std::int64_t D, const std::vector<std::uint8_t>* keys = nullptr) {
  std::vector<double> out(static_cast<std::size_t>(B * Tn * H * D), 0.0);
  auto at = [&](std::int64_t b, std::int64_t t, std::int64_t h, int part, std::int64_t d) {
    return qkv[(((b * Tn + t) * H + h) * 3 + part) * D + d];
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Tn; ++i) {
        auto visible = [&](std::int64_t j) { return keys ? (*keys)[b * Tn + j] != 0 : j <= i; };
        std::vector<double> s(static_cast<std::size_t>(Tn), 0.0);
        double m = -1e300, z = 0;
        for (std::int64_t j = 0; j < Tn; ++j) {
          if (!visible(j)) continue;
          double dotp = 0;
          for (std::int64_t d = 0; d < D; ++d) dotp += at(b, i, h, 0, d) * at(b, j, h, 1, d);
          s[j] = dotp / std::sqrt(double(D));
          m = std::max(m, s[j]);
        }
        for (std::int64_t j = 0; j < Tn; ++j)
          if (visible(j)) z += (s[j] = std::exp(s[j] - m));
        for (std::int64_t j = 0; j < Tn; ++j)
          if (visible(j))
            for (std::int64_t d = 0; d < D; ++d) out[((b * Tn + i) * H + h) * D + d] += s[j] / z * at(b, j, h, 2, d);
      }
  return out;
}
}  // namespace

TEST_CASE("attention: forward matches a plain causal reference; backward matches finite differences",
          "[transformer][attention]") {
  auto gen = test::rng(13);
  const std::int64_t B = 2, Tn = 5, H = 2, D = 3;
  auto qkv = test::random_tensor<double>({B, Tn, H, 3, D}, gen, -2, 2);
  auto r = test::random_tensor<double>({B, Tn, H, D}, gen);
  Tensor<double> out({B, Tn, H, D}), probs({B, H, Tn, Tn}), dqkv({B, Tn, H, 3, D});
  kh::attention_forward(qkv.data(), out.data(), probs.data(), B, Tn, H, D);
  CHECK(test::rel_error(out, attention_reference(qkv, B, Tn, H, D)) < 1e-13);
  for (std::int64_t i = 0; i < Tn; ++i)
    for (std::int64_t j = i + 1; j < Tn; ++j) CHECK(probs(1, 1, i, j) == 0.0);  // masked future

  kh::attention_backward(r.data(), qkv.data(), probs.data(), dqkv.data(), B, Tn, H, D);
  auto loss = [&] {
    kh::attention_forward(qkv.data(), out.data(), probs.data(), B, Tn, H, D);
    return test::dot(out, r);
  };
  CHECK(test::rel_error(dqkv, test::numeric_gradient(loss, qkv.data(), qkv.numel())) < 1e-8);
}

TEST_CASE("bidirectional attention: forward matches a plain reference with and without padded keys; padded keys "
          "get probability 0; backward matches finite differences", "[transformer][attention][bidirectional]") {
  auto gen = test::rng(15);
  const std::int64_t B = 2, Tn = 5, H = 2, D = 3;
  auto qkv = test::random_tensor<double>({B, Tn, H, 3, D}, gen, -2, 2);
  auto r = test::random_tensor<double>({B, Tn, H, D}, gen);
  const std::vector<std::uint8_t> all(B * Tn, 1), padded = {1, 1, 1, 0, 0, /* b = 1 */ 0, 1, 1, 0, 1};
  for (const auto* keys : {&all, &padded}) {
    CAPTURE(keys == &padded);
    const attention::Bidirectional mask{.keys = keys == &all ? nullptr : keys->data()};
    Tensor<double> out({B, Tn, H, D}), probs({B, H, Tn, Tn}), dqkv({B, Tn, H, 3, D});
    kh::attention_forward(qkv.data(), out.data(), probs.data(), B, Tn, H, D, mask);
    CHECK(test::rel_error(out, attention_reference(qkv, B, Tn, H, D, keys)) < 1e-13);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < Tn; ++i)
        for (std::int64_t j = 0; j < Tn; ++j) CHECK((probs(b, 1, i, j) == 0.0) == ((*keys)[b * Tn + j] == 0));

    kh::attention_backward(r.data(), qkv.data(), probs.data(), dqkv.data(), B, Tn, H, D, mask);
    auto loss = [&] {
      kh::attention_forward(qkv.data(), out.data(), probs.data(), B, Tn, H, D, mask);
      return test::dot(out, r);
    };
    CHECK(test::rel_error(dqkv, test::numeric_gradient(loss, qkv.data(), qkv.numel())) < 1e-8);
  }
}

TEST_CASE("attention: changing a future token leaves earlier outputs unchanged", "[transformer][attention]") {
  auto gen = test::rng(14);
  const std::int64_t B = 1, Tn = 6, H = 2, D = 4, t0 = 3;
  auto qkv = test::random_tensor<double>({B, Tn, H, 3, D}, gen);
  Tensor<double> out({B, Tn, H, D}), out2({B, Tn, H, D}), probs({B, H, Tn, Tn});
  kh::attention_forward(qkv.data(), out.data(), probs.data(), B, Tn, H, D);
  for (std::int64_t i = 0; i < H * 3 * D; ++i) qkv[t0 * H * 3 * D + i] += 0.5;  // q, k and v of token t0
  kh::attention_forward(qkv.data(), out2.data(), probs.data(), B, Tn, H, D);
  for (std::int64_t t = 0; t < Tn; ++t) {
    bool same = true;
    for (std::int64_t i = 0; i < H * D; ++i) same = same && out[t * H * D + i] == out2[t * H * D + i];
    CAPTURE(t);
    CHECK(same == (t < t0));
  }
}

TEST_CASE("Embedding: token + position lookup; weight gradients match finite differences; bad tokens refused",
          "[transformer][embedding]") {
  auto gen = test::rng(15);
  const std::int64_t V = 11, B = 2, Tn = 5, C = 4;
  layers::Embedding<double> emb({.vocab = V, .max_seq = 6, .dim = C});
  layers::initialize_all(emb.parameters(), 7, nullptr);
  Tensor<std::int32_t> tokens({B, Tn});
  const std::int32_t ids[] = {3, 0, 10, 3, 3, 7, 1, 10, 2, 3};  // repeats: gradients must add up
  std::copy(std::begin(ids), std::end(ids), tokens.begin());
  auto r = test::random_tensor<double>({B, Tn, C}, gen);
  layers::Context<> ctx;
  auto y = emb.forward(ctx, tokens.cview());
  const auto wte = emb.parameters()[0]->value(), wpe = emb.parameters()[1]->value();
  std::vector<double> ref;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < Tn; ++t)
      for (std::int64_t c = 0; c < C; ++c) ref.push_back(wte(tokens(b, t), c) + wpe(t, c));
  CHECK(test::rel_error(y, ref) == 0.0);

  CHECK(emb.backward_input(ctx, r.cview()).empty());
  emb.backward_weight(ctx, r.cview());
  auto loss = [&] { return test::dot(emb.forward(ctx, tokens.cview()), r); };
  for (auto* p : emb.parameters()) {
    CAPTURE(p->name());
    CHECK(test::rel_error(p->grad(), test::numeric_gradient(loss, p->value().data(), p->numel())) < 1e-9);
  }

  tokens(1, 2) = static_cast<std::int32_t>(V);
  CHECK(test::contains(test::error_of([&] { emb.forward(ctx, tokens.cview()); }), "outside the vocabulary"));
  Tensor<std::int32_t> too_long({1, 7}, 0);
  CHECK(test::contains(test::error_of([&] { emb.forward(ctx, too_long.cview()); }), "exceeds the position table"));
}

namespace {
// Mean-style reference: Σ_n (logsumexp(h_n · Wᵀ) − h_n · W[target]) / divisor.
double cross_entropy_reference(const Tensor<double>& h, const Tensor<double>& W, const Tensor<std::int32_t>& targets,
                               std::int64_t V, double divisor) {
  const std::int64_t N = targets.numel(), C = W.size(1);
  double total = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    std::vector<double> z(static_cast<std::size_t>(V));
    double m = -1e300, s = 0;
    for (std::int64_t v = 0; v < V; ++v) {
      for (std::int64_t c = 0; c < C; ++c) z[v] += h[n * C + c] * W(v, c);
      m = std::max(m, z[v]);
    }
    for (double zv : z) s += std::exp(zv - m);
    total += std::log(s) + m - z[targets[n]];
  }
  return total / divisor;
}
}  // namespace

TEST_CASE("VocabParallelCrossEntropy (tp = 1): loss matches the reference, padding masked, gradients match "
          "finite differences", "[transformer][cross_entropy]") {
  auto gen = test::rng(16);
  const std::int64_t B = 2, Tn = 3, C = 5, V = 13;
  for (std::int64_t pad : {1, 8}) {
    CAPTURE(pad);
    const auto part = layers::VocabPartition::make(V, 1, 0, pad);
    CHECK(part.padded == (pad == 1 ? 13 : 16));
    layers::Param<double> W("wte.weight", Shape{part.padded, C}, layers::Init::normal(0, 1), layers::Sharding::split(0));
    layers::initialize(W, 3, nullptr);
    layers::VocabParallelCrossEntropy<double> ce(W, part);
    auto h = test::random_tensor<double>({B, Tn, C}, gen);
    Tensor<std::int32_t> targets({B, Tn});
    const std::int32_t ids[] = {0, 12, 5, 5, 7, 12};
    std::copy(std::begin(ids), std::end(ids), targets.begin());
    Tensor<double> Wreal({V, C});
    std::copy_n(W.value().data(), V * C, Wreal.data());

    layers::Context<> ctx;
    ctx.global_batch = 10;  // tokens of the whole step
    ce.forward(ctx, h.cview(), targets.cview());
    CHECK(ce.take_loss() == test::Approx(cross_entropy_reference(h, Wreal, targets, V, 10.0)).epsilon(1e-13));

    const auto dh = test::to_vector(ce.backward(ctx));
    for (auto& g : W.grad()) g = 0;
    ce.backward_weight(ctx);
    auto f = [&] {
      ce.forward(ctx, h.cview(), targets.cview());
      return ce.take_loss();
    };
    CHECK(test::rel_error(dh, test::numeric_gradient(f, h.data(), h.numel())) < 1e-8);
    const auto dW = test::to_vector(W.grad());
    CHECK(test::rel_error(dW, test::numeric_gradient(f, W.value().data(), W.numel())) < 1e-8);
    for (std::int64_t i = V * C; i < W.numel(); ++i) CHECK(dW[i] == 0.0);  // padding rows untouched
  }
}

TEST_CASE("VocabParallelCrossEntropy: targets outside the vocabulary are refused", "[transformer][cross_entropy]") {
  const auto part = layers::VocabPartition::make(7, 1, 0, 4);
  layers::Param<double> W("wte.weight", Shape{part.padded, 3}, layers::Init::constant(0.1));
  layers::VocabParallelCrossEntropy<double> ce(W, part);
  Tensor<double> h({1, 2, 3}, 0.5);
  Tensor<std::int32_t> targets({1, 2}, 7);  // a padding row, not a token
  layers::Context<> ctx;
  CHECK(test::contains(test::error_of([&] { ce.forward(ctx, h.cview(), targets.cview()); }),
                       "target 7 at position 0 is outside the vocabulary [0, 7)"));
}
