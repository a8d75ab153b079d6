// Embedding and the losses on CudaSpace against the same layers on the host in float64
// (layer_check.hpp): Embedding (tp = 1), SoftmaxCrossEntropy (with and without in_place, padded
// classes, evaluation), VocabParallelCrossEntropy at tp = 1 (logits, loss, dlogits, d hidden, d wte,
// next-token logits), in bf16 and fp32, at sizes that are not multiples of 8 (the streaming kernels)
// and at sizes whose rows are whole 16-byte chunks (the shared-memory kernel). The vocabulary-
// parallel kernels of Ops<CudaSpace> are checked at tp = 2 by running both shards on one GPU and
// summing their stats on the host, as the all-reduce would. Bad ids reach take_loss() / a check.
// The masked-LM head (ignored −1 targets, counted hits) at tp = 1 against the host's.
#include "layer_check.hpp"

#include <dpml/layers/cross_entropy.hpp>
#include <dpml/layers/embedding.hpp>
#include <dpml/layers/vocab_parallel_cross_entropy.hpp>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

using namespace dpml;
using namespace dpml::layers;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Relative error of a scalar.
double rel(double got, double want) { return std::abs(got - want) / std::max(std::abs(want), 1e-300); }

template <class V>
std::vector<double> host_doubles(const V& v) {
  return std::vector<double>(v.begin(), v.end());
}

}  // namespace

TEMPLATE_TEST_CASE("Embedding on the GPU equals the float64 host Embedding", "[cuda][layers][embedding]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(31);
  const std::int64_t V = 37, B = 3, Tn = 7, C = 45;  // T < max_seq
  const EmbeddingOptions o{.vocab = V, .max_seq = 9, .dim = C};
  Embedding<double> host(o);
  Embedding<T, CudaSpace> dev(o);
  check.copy_parameters(host, dev);
  for (auto* p : host.parameters()) std::fill(p->grad().begin(), p->grad().end(), 0.0);

  Tensor<std::int32_t> tokens(Shape{B, Tn});
  std::uniform_int_distribution<int> tok(0, static_cast<int>(V) - 1);
  for (auto& t : tokens) t = tok(check.gen());
  tokens[0] = 0;                                   // both ends of the vocabulary
  tokens[1] = static_cast<std::int32_t>(V - 1);
  tokens[5] = tokens[9] = tokens[17] = 11;        // repeats: their gradients add up
  const auto dtokens = to_space<CudaSpace>(tokens.cview());

  const auto y = host.forward(check.host_context(), tokens.cview());
  const auto yd = dev.forward(check.device_context(), dtokens.cview());
  CHECK(test::rel_l2(test::download_doubles(yd), host_doubles(y)) < test::kLayerTol<T>);

  Tensor<double> dy = test::random_tensor<double>(y.shape(), check.gen());
  test::round_to<T>(dy);
  const auto dyd = test::upload_as<T>(dy);
  CHECK(dev.backward_input(check.device_context(), dyd.cview()).empty());
  host.backward_weight(check.host_context(), dy.cview());
  dev.backward_weight(check.device_context(), dyd.cview());
  check.compare_gradients(host, dev, test::kLayerTol<T>);
  dev.check_tokens();  // every token was in range

  Embedding<T, CudaSpace> bad(o);
  tokens[4] = static_cast<std::int32_t>(V);
  const auto dbad = to_space<CudaSpace>(tokens.cview());
  bad.forward(check.device_context(), dbad.cview());  // found on the device, no waiting here
  CHECK(contains(test::error_of([&] { bad.check_tokens(); }), "token 37 at position 4 is outside the vocabulary [0, 37)"));
}

TEMPLATE_TEST_CASE("SoftmaxCrossEntropy on the GPU equals the float64 host loss", "[cuda][layers][loss]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(32);
  const std::int64_t N = 37;
  // (C, real classes): rows of 29 and 45 elements stream from global memory; 40-element rows (bf16:
  // five 16-byte chunks, fp32: ten) take the shared-memory kernel, with 5 padding classes.
  using Case = std::pair<std::int64_t, std::int64_t>;
  for (auto [C, valid] : std::initializer_list<Case>{{29, 29}, {45, 41}, {40, 35}}) {
    for (bool in_place : {false, true}) {
      CAPTURE(C, valid, in_place);
      const CrossEntropyOptions o{.in_place = in_place, .valid = valid == C ? 0 : valid};
      SoftmaxCrossEntropy<double> host(o);
      SoftmaxCrossEntropy<T, CudaSpace> dev(o);
      auto& hctx = check.host_context();
      auto& dctx = check.device_context();
      hctx.global_batch = dctx.global_batch = 3 * N;

      Tensor<double> z = test::random_tensor<double>(Shape{N, C}, check.gen(), -4, 4);
      test::round_to<T>(z);
      Tensor<std::int32_t> labels(Shape{N});
      std::uniform_int_distribution<int> cls(0, static_cast<int>(valid) - 1);
      for (auto& l : labels) l = cls(check.gen());
      labels[0] = 0;
      labels[1] = static_cast<std::int32_t>(valid - 1);
      const auto dlabels = to_space<CudaSpace>(labels.cview());

      // Two micro-batches of the same rows, one take: twice the loss. Each has logits of its own
      // (in place, they become its dlogits).
      std::vector<Tensor<double>> zh;
      std::vector<Tensor<T, CudaSpace>> zd;
      for (int mb = 0; mb < 2; ++mb) {
        hctx.micro_batch = dctx.micro_batch = mb;
        zh.emplace_back(z.shape());
        std::copy(z.begin(), z.end(), zh.back().begin());
        zd.push_back(test::upload_as<T>(z));
        host.forward(hctx, zh.back().cview(), labels.cview());
        dev.forward(dctx, zd.back().cview(), dlabels.cview());
      }
      const double want = host.take_loss();
      CHECK(rel(dev.take_loss(), want) < 1e-5);
      CHECK(dev.take_loss() == 0.0);

      for (int mb = 0; mb < 2; ++mb) {
        hctx.micro_batch = dctx.micro_batch = mb;
        const auto d = host.backward(hctx);
        const auto dd = dev.backward(dctx);
        if (in_place) CHECK(dd.data() == zd[static_cast<std::size_t>(mb)].data());
        const auto got = test::download_doubles(dd);
        CHECK(test::rel_l2(got, host_doubles(d)) < test::kLayerTol<T>);
        for (std::int64_t n = 0; n < N; ++n)
          for (std::int64_t j = valid; j < C; ++j) CHECK(got[static_cast<std::size_t>(n * C + j)] == 0.0);
      }

      // Evaluation: the loss only, the logits untouched.
      hctx.mode = dctx.mode = Mode::eval;
      const auto ze = test::upload_as<T>(z);
      host.forward(hctx, z.cview(), labels.cview());
      dev.forward(dctx, ze.cview(), dlabels.cview());
      CHECK(rel(dev.take_loss(), host.take_loss()) < 1e-5);
      CHECK(test::download_doubles(ze.cview()) == host_doubles(z));
      hctx.mode = dctx.mode = Mode::train;
      hctx.micro_batch = dctx.micro_batch = 0;
    }
  }
}

TEMPLATE_TEST_CASE("SoftmaxCrossEntropy on the GPU: a label outside the classes stops take_loss", "[cuda][layers][loss]",
                   bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(33);
  SoftmaxCrossEntropy<T, CudaSpace> dev({.valid = 5});
  Tensor<double> z = test::random_tensor<double>(Shape{4, 8}, check.gen());
  Tensor<std::int32_t> labels(Shape{4}, 1);
  labels[2] = 5;  // a padding class, not a label
  const auto zd = test::upload_as<T>(z);
  const auto ld = to_space<CudaSpace>(labels.cview());
  dev.forward(check.device_context(), zd.cview(), ld.cview());
  CHECK(contains(test::error_of([&] { dev.take_loss(); }), "label 5 at position 2 is outside the classes [0, 5)"));
}

TEMPLATE_TEST_CASE("VocabParallelCrossEntropy (tp = 1) on the GPU equals the float64 host head", "[cuda][layers][loss]",
                   bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(34);
  const std::int64_t V = 67, B = 2, Tn = 7, C = 45, N = B * Tn;
  for (std::int64_t pad : {1, 8}) {  // V_pad 67: streaming rows; 72: whole 16-byte chunks (bf16 and fp32)
    CAPTURE(pad);
    const EmbeddingOptions o{.vocab = V, .max_seq = Tn, .dim = C, .pad_multiple = pad};
    Embedding<double> hemb(o);
    Embedding<T, CudaSpace> demb(o);
    check.copy_parameters(hemb, demb);
    for (auto* p : hemb.parameters()) std::fill(p->grad().begin(), p->grad().end(), 0.0);
    VocabParallelCrossEntropy<double> host(hemb);
    VocabParallelCrossEntropy<T, CudaSpace> dev(demb);
    const std::int64_t Vp = host.partition().padded;
    auto& hctx = check.host_context();
    auto& dctx = check.device_context();
    hctx.global_batch = dctx.global_batch = 2 * N;  // tokens of a step of two such micro-batches

    Tensor<double> h = test::random_tensor<double>(Shape{B, Tn, C}, check.gen());
    test::round_to<T>(h);
    const auto hd = test::upload_as<T>(h);
    Tensor<std::int32_t> targets(Shape{B, Tn});
    std::uniform_int_distribution<int> tok(0, static_cast<int>(V) - 1);
    for (auto& t : targets) t = tok(check.gen());
    targets[0] = 0;
    targets[1] = static_cast<std::int32_t>(V - 1);  // the last real row, next to the padding
    const auto td = to_space<CudaSpace>(targets.cview());

    // Evaluation: the logits (padding columns included: the GEMM computes them), the loss.
    hctx.mode = dctx.mode = Mode::eval;
    host.forward(hctx, h.cview(), targets.cview());
    dev.forward(dctx, hd.cview(), td.cview());
    CHECK(test::rel_l2(test::download_doubles(dev.logits(dctx)), host_doubles(host.logits(hctx))) < test::kLayerTol<T>);
    CHECK(rel(dev.take_loss(), host.take_loss()) < test::kLayerTol<T>);
    const TensorView<const double> row(h.data() + 5 * C, Shape{C});
    const TensorView<const T, CudaSpace> row_d(hd.data() + 5 * C, Shape{C});
    const auto next = host.next_token_logits(hctx, row), next_d = dev.next_token_logits(dctx, row_d);
    REQUIRE(next_d.size() == static_cast<std::size_t>(V));
    CHECK(test::rel_l2(next_d, std::vector<double>(next.begin(), next.end())) < test::kLayerTol<T>);

    // Training: loss, dlogits (over the logits), d hidden, d wte.
    hctx.mode = dctx.mode = Mode::train;
    host.forward(hctx, h.cview(), targets.cview());
    dev.forward(dctx, hd.cview(), td.cview());
    CHECK(rel(dev.take_loss(), host.take_loss()) < test::kLayerTol<T>);
    const auto dlogits = test::download_doubles(dev.logits(dctx));
    CHECK(test::rel_l2(dlogits, host_doubles(host.logits(hctx))) < test::kLayerTol<T>);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t j = V; j < Vp; ++j) CHECK(dlogits[static_cast<std::size_t>(n * Vp + j)] == 0.0);
    CHECK(test::rel_l2(test::download_doubles(dev.backward(dctx)), host_doubles(host.backward(hctx))) <
          test::kLayerTol<T>);
    host.backward_weight(hctx);
    dev.backward_weight(dctx);
    check.compare_gradients(hemb, demb, test::kLayerTol<T>);  // wte: the head's gradient (wpe: none yet)
    const auto dwte = test::download_doubles(demb.token_weight().grad());
    for (std::size_t i = static_cast<std::size_t>(V * C); i < dwte.size(); ++i) CHECK(dwte[i] == 0.0);  // padding rows

    targets[3] = static_cast<std::int32_t>(V);  // a padding row, not a token
    const auto bad = to_space<CudaSpace>(targets.cview());
    dev.forward(dctx, hd.cview(), bad.cview());
    CHECK(contains(test::error_of([&] { dev.take_loss(); }), "target 67 at position 3 is outside the vocabulary [0, 67)"));
  }
}

// A masked LM's head (models::Bert): targets −1 are ignored rows (no loss, zero dlogits), and an
// evaluation forward counts the rows whose target has the row's largest logit. Against the float64
// host head: loss, dlogits, d hidden, d wte; the count exactly, except rows whose two largest host
// logits lie closer than T's rounding could move them (a tie the device may break otherwise).
TEMPLATE_TEST_CASE("VocabParallelCrossEntropy (tp = 1) on the GPU: ignored targets and counted hits equal the host",
                   "[cuda][layers][loss]", bf16, float) {
  using T = TestType;
  test::DeviceLayerCheck<T> check(35);
  const std::int64_t V = 67, B = 2, Tn = 7, C = 45, N = B * Tn;
  const EmbeddingOptions o{.vocab = V, .max_seq = Tn, .dim = C, .pad_multiple = 8};
  Embedding<double> hemb(o);
  Embedding<T, CudaSpace> demb(o);
  check.copy_parameters(hemb, demb);
  for (auto* p : hemb.parameters()) std::fill(p->grad().begin(), p->grad().end(), 0.0);
  const VocabHeadOptions masked{.ignore_negative = true, .count_hits = true};
  VocabParallelCrossEntropy<double> host(hemb, masked);
  VocabParallelCrossEntropy<T, CudaSpace> dev(demb, masked);
  auto& hctx = check.host_context();
  auto& dctx = check.device_context();

  Tensor<double> h = test::random_tensor<double>(Shape{B, Tn, C}, check.gen());
  test::round_to<T>(h);
  const auto hd = test::upload_as<T>(h);
  Tensor<std::int32_t> targets(Shape{B, Tn});
  std::uniform_int_distribution<int> tok(0, static_cast<int>(V) - 1);
  for (auto& t : targets) t = tok(check.gen());
  for (const std::int64_t n : {1, 4, 9, 13}) targets[n] = -1;  // unmasked positions: no loss
  const std::int64_t counted = N - 4;
  hctx.global_batch = dctx.global_batch = counted;  // the step's masked tokens

  // Four rows' targets are their row's largest logit (hits by construction; a random target of 67
  // classes hits 1 time in 67), read off the float64 head's logits, which do not depend on targets.
  hctx.mode = dctx.mode = Mode::eval;
  host.forward(hctx, h.cview(), targets.cview());
  (void)host.take_loss(), (void)host.take_hits();
  const auto logits = host_doubles(host.logits(hctx));  // (N, V_pad) of the float64 head
  const std::int64_t Vp = host.partition().padded;
  for (const std::int64_t n : {0, 2, 5, 7})
    targets[n] = static_cast<std::int32_t>(std::max_element(logits.begin() + n * Vp, logits.begin() + n * Vp + V) -
                                           (logits.begin() + n * Vp));
  const auto td = to_space<CudaSpace>(targets.cview());

  // Evaluation: the loss and the hits.
  host.forward(hctx, h.cview(), targets.cview());
  dev.forward(dctx, hd.cview(), td.cview());
  CHECK(rel(dev.take_loss(), host.take_loss()) < test::kLayerTol<T>);
  std::int64_t near_ties = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    if (targets[n] < 0) continue;
    std::vector<double> row(logits.begin() + n * Vp, logits.begin() + n * Vp + V);
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
    near_ties += row[0] - row[1] < 1e-2 * std::max(1.0, std::abs(row[0]));  // bf16 keeps 8 bits
  }
  const double host_hits = host.take_hits(), dev_hits = dev.take_hits();
  CAPTURE(host_hits, dev_hits, near_ties);
  CHECK(host_hits >= 4);
  CHECK(std::abs(dev_hits - host_hits) <= static_cast<double>(near_ties));

  // Training: loss, dlogits (zero on the ignored rows and the padding columns), d hidden, d wte.
  hctx.mode = dctx.mode = Mode::train;
  host.forward(hctx, h.cview(), targets.cview());
  dev.forward(dctx, hd.cview(), td.cview());
  CHECK(rel(dev.take_loss(), host.take_loss()) < test::kLayerTol<T>);
  const auto dlogits = test::download_doubles(dev.logits(dctx));
  CHECK(test::rel_l2(dlogits, host_doubles(host.logits(hctx))) < test::kLayerTol<T>);
  for (const std::int64_t n : {1, 4, 9, 13})
    for (std::int64_t j = 0; j < Vp; ++j) CHECK(dlogits[static_cast<std::size_t>(n * Vp + j)] == 0.0);
  CHECK(test::rel_l2(test::download_doubles(dev.backward(dctx)), host_doubles(host.backward(hctx))) < test::kLayerTol<T>);
  host.backward_weight(hctx);
  dev.backward_weight(dctx);
  check.compare_gradients(hemb, demb, test::kLayerTol<T>);

  targets[3] = static_cast<std::int32_t>(V);  // ignoring negatives still refuses ids past the vocabulary
  const auto bad = to_space<CudaSpace>(targets.cview());
  dev.forward(dctx, hd.cview(), bad.cview());
  CHECK(contains(test::error_of([&] { dev.take_loss(); }), "target 67 at position 3 is outside the vocabulary"));
}

TEMPLATE_TEST_CASE("Vocabulary-parallel cross-entropy kernels: two shards and a summed stats buffer equal one row",
                   "[cuda][kernels][loss]", bf16, float) {
  using T = TestType;
  using Ops = kernels::Ops<CudaSpace>;
  test::DeviceLayerCheck<T> check(35);
  kernels::Device<CudaSpace>& dev = check.device();
  const std::int64_t N = 13, V_real = 53, tp = 2, Vl = 32;  // V_pad = 64: shard 1 holds 21 real columns
  Tensor<double> z = test::random_tensor<double>(Shape{N, tp * Vl}, check.gen(), -5, 5);
  test::round_to<T>(z);
  Tensor<std::int32_t> targets(Shape{N});
  std::uniform_int_distribution<int> tok(0, static_cast<int>(V_real) - 1);
  for (auto& t : targets) t = tok(check.gen());
  targets[0] = 0;
  targets[1] = static_cast<std::int32_t>(V_real - 1);
  targets[2] = 31;  // the last column of shard 0
  targets[3] = 32;  // the first of shard 1
  const auto td = to_space<CudaSpace>(targets.cview());

  // The whole row on one "rank": the reference (the single-pass kernel).
  const auto whole = test::upload_as<T>(z);
  Tensor<double, CudaSpace> sum_whole(Shape{1}), sum_shards(Shape{1});
  Ops::zero(dev, sum_whole.data(), 1);
  Ops::zero(dev, sum_shards.data(), 1);
  Ops::softmax_xent(dev, whole.data(), td.data(), whole.data(), sum_whole.data(), N, tp * Vl, V_real, 0.25);
  const auto want = test::download_doubles(whole.cview());

  // Each shard's columns, pass 1, the sum of the two stats buffers (the all-reduce), pass 2.
  std::vector<Tensor<T, CudaSpace>> shard;
  std::vector<Tensor<float, CudaSpace>> stats;
  Tensor<float> summed(Shape{tp, 3, N}, 0.f);
  for (std::int64_t k = 0; k < tp; ++k) {
    Tensor<double> part(Shape{N, Vl});
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t j = 0; j < Vl; ++j) part(n, j) = z(n, k * Vl + j);
    shard.push_back(test::upload_as<T>(part));
    stats.emplace_back(Shape{tp, 3, N});
    Ops::vocab_xent_partials(dev, shard.back().data(), td.data(), stats.back().data(), N, Vl, k * Vl, V_real,
                             static_cast<int>(tp), static_cast<int>(k));
    Tensor<float> h(Shape{tp, 3, N});
    copy(h.view(), stats.back().cview());
    for (std::int64_t i = 0; i < h.numel(); ++i) summed[i] += h[i];
  }
  for (std::int64_t k = 0; k < tp; ++k) {
    copy(stats[static_cast<std::size_t>(k)].view(), summed.cview());
    Ops::vocab_xent_finish(dev, shard[static_cast<std::size_t>(k)].data(), td.data(),
                           stats[static_cast<std::size_t>(k)].data(), shard[static_cast<std::size_t>(k)].data(),
                           sum_shards.data(), N, Vl, k * Vl, V_real, static_cast<int>(tp), 0.25);
  }
  const double loss_shards = Ops::take_loss(dev, sum_shards.data()) / 2;  // every rank adds the same loss
  CHECK(rel(loss_shards, Ops::take_loss(dev, sum_whole.data())) < 1e-5);
  std::vector<double> got(want.size());
  for (std::int64_t k = 0; k < tp; ++k) {
    const auto d = test::download_doubles(shard[static_cast<std::size_t>(k)].cview());
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t j = 0; j < Vl; ++j)
        got[static_cast<std::size_t>(n * tp * Vl + k * Vl + j)] = d[static_cast<std::size_t>(n * Vl + j)];
  }
  CHECK(test::rel_l2(got, want) < test::kLayerTol<T>);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t j = V_real; j < tp * Vl; ++j) CHECK(got[static_cast<std::size_t>(n * tp * Vl + j)] == 0.0);
}
