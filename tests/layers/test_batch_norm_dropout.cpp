// BatchNorm2d (train/eval, running statistics, gradients) and Dropout (reproducible masks, keep
// rate, identity in eval, gradients, the documented Philox rule element by element, masks
// independent of the data-parallel layout), on one rank.
#include "grad_check.hpp"
#include "test.hpp"

#include <dpml/core/philox.hpp>
#include <dpml/layers/batch_norm.hpp>
#include <dpml/layers/dropout.hpp>
#include <dpml/layers/init.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace dpml;
using Ctx = layers::Context<HostSpace>;

namespace {
// Per-channel mean and biased variance of x (N, C, H, W), in float64.
void channel_stats(const Tensor<double>& x, std::vector<double>& mean, std::vector<double>& var) {
  const std::int64_t N = x.size(0), C = x.size(1), S = x.size(2) * x.size(3);
  mean.assign(C, 0.0);
  var.assign(C, 0.0);
  for (std::int64_t c = 0; c < C; ++c) {
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t s = 0; s < S; ++s) mean[c] += x[(n * C + c) * S + s] / static_cast<double>(N * S);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t s = 0; s < S; ++s) {
        const double d = x[(n * C + c) * S + s] - mean[c];
        var[c] += d * d / static_cast<double>(N * S);
      }
  }
}
}  // namespace

TEST_CASE("BatchNorm2d: training normalises with batch statistics and updates running ones", "[layers]") {
  auto gen = test::rng(11);
  layers::BatchNorm2d<double> bn(3, {.momentum = 0.25, .eps = 1e-3});
  layers::initialize_all(bn.parameters(), 1, nullptr);
  CHECK(bn.parameters()[0]->name() == "bn.weight");
  for (double v : bn.parameters()[0]->value()) CHECK(v == 1.0);
  for (double v : bn.parameters()[1]->value()) CHECK(v == 0.0);
  test::randomise_parameters(bn, gen);
  const auto w = bn.parameters()[0]->value(), b = bn.parameters()[1]->value();

  Ctx ctx;
  auto x = test::random_tensor<double>(Shape{4, 3, 2, 3}, gen, -2, 3);
  std::vector<double> mean, var;
  channel_stats(x, mean, var);
  const auto y = bn.forward(ctx, x.cview());
  std::vector<double> ref;
  for (int n = 0; n < 4; ++n)
    for (int c = 0; c < 3; ++c)
      for (int s = 0; s < 6; ++s) ref.push_back((x[(n * 3 + c) * 6 + s] - mean[c]) / std::sqrt(var[c] + 1e-3) * w[c] + b[c]);
  CHECK(test::rel_error(y, ref) < 1e-14);
  for (int c = 0; c < 3; ++c) {
    CHECK(bn.running_mean()[c] == dpml::test::Approx(0.25 * mean[c]).epsilon(1e-12));
    CHECK(bn.running_var()[c] == dpml::test::Approx(0.75 + 0.25 * var[c] * 24 / 23).epsilon(1e-12));
  }

  SECTION("eval uses the running statistics and leaves them alone") {
    ctx.mode = layers::Mode::eval;
    std::vector<double> rm(bn.running_mean().begin(), bn.running_mean().end());
    std::vector<double> rv(bn.running_var().begin(), bn.running_var().end());
    const auto ye = bn.forward(ctx, x.cview());
    std::vector<double> refe;
    for (int n = 0; n < 4; ++n)
      for (int c = 0; c < 3; ++c)
        for (int s = 0; s < 6; ++s) refe.push_back((x[(n * 3 + c) * 6 + s] - rm[c]) / std::sqrt(rv[c] + 1e-3) * w[c] + b[c]);
    CHECK(test::rel_error(ye, refe) < 1e-14);
    CHECK(test::rel_error(bn.running_mean(), rm) == 0.0);
    test::finite_difference_check(bn, ctx, x, gen);
  }
  SECTION("training gradients flow through the batch statistics") {
    test::finite_difference_check(bn, ctx, x, gen);
  }
}

TEST_CASE("BatchNorm2d<float> (lane sums in float) agrees with float64 to float rounding", "[layers]") {
  auto gen = test::rng(13);
  layers::BatchNorm2d<float> bf(4);
  layers::BatchNorm2d<double> bd(4);
  layers::initialize_all(bf.parameters(), 1, nullptr);
  layers::initialize_all(bd.parameters(), 1, nullptr);
  auto xd = test::random_tensor<double>(Shape{8, 4, 9, 11}, gen, 2, 5);  // S = 99: lanes and a tail
  auto dyd = test::random_tensor<double>(xd.shape(), gen);
  Tensor<float> xf(xd.shape()), dyf(xd.shape());
  std::copy(xd.begin(), xd.end(), xf.begin());
  std::copy(dyd.begin(), dyd.end(), dyf.begin());
  Ctx ctx;
  CHECK(test::rel_error(bf.forward(ctx, xf.cview()), bd.forward(ctx, xd.cview())) < 1e-5);
  CHECK(test::rel_error(bf.backward_input(ctx, dyf.cview()), bd.backward_input(ctx, dyd.cview())) < 1e-4);
  bf.backward_weight(ctx, dyf.cview());
  bd.backward_weight(ctx, dyd.cview());
  for (int i = 0; i < 2; ++i)
    CHECK(test::rel_error(bf.parameters()[static_cast<std::size_t>(i)]->grad(), bd.parameters()[static_cast<std::size_t>(i)]->grad()) < 1e-5);
}

TEST_CASE("BatchNorm2d with its fused ReLU and residual: the unfused composition; gradients", "[layers]") {
  auto gen = test::rng(14);
  const std::int64_t C = 3;
  layers::BatchNorm2d<double> fused(C, {.relu = true}), plain(C);
  test::randomise_parameters(fused, gen);
  for (int i = 0; i < 2; ++i) {
    auto src = fused.parameters()[static_cast<std::size_t>(i)]->value(), dst = plain.parameters()[static_cast<std::size_t>(i)]->value();
    std::copy(src.begin(), src.end(), dst.begin());
  }
  Ctx ctx;
  auto x = test::random_tensor<double>(Shape{4, C, 3, 5}, gen), r = test::random_tensor<double>(x.shape(), gen),
       dy = test::random_tensor<double>(x.shape(), gen);
  const auto z = plain.forward(ctx, x.cview());  // bn(x)
  std::vector<double> want(z.begin(), z.end());
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = std::max(want[i] + r[static_cast<std::int64_t>(i)], 0.0);
  const auto y = fused.forward(ctx, x.cview(), r.cview());
  CHECK(test::rel_error(y, want) < 1e-15);
  // backward: g = dy where the output is positive; the residual gets g, bn's input gradient of g
  Tensor<double> g(x.shape());
  for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = y[i] > 0 ? dy[i] : 0.0;
  const auto dx = fused.backward_input(ctx, dy.cview());
  CHECK(test::rel_error(fused.residual_grad(ctx), g) == 0.0);
  CHECK(test::rel_error(dx, plain.backward_input(ctx, g.cview())) < 1e-13);
  for (auto* p : fused.parameters()) layers::zero_grad(*p);
  for (auto* p : plain.parameters()) layers::zero_grad(*p);
  fused.backward_weight(ctx, dy.cview());
  plain.backward_weight(ctx, g.cview());
  for (std::size_t i = 0; i < 2; ++i)
    CHECK(test::rel_error(fused.parameters()[i]->grad(), plain.parameters()[i]->grad()) < 1e-13);
  // and without a residual, against finite differences (ReLU kinks have measure zero)
  layers::BatchNorm2d<double> relu_only(C, {.relu = true});
  test::randomise_parameters(relu_only, gen);
  test::finite_difference_check(relu_only, ctx, x, gen);
  // backward_weight reads what backward_input kept: not before it
  relu_only.forward(ctx, x.cview());
  CHECK(test::error_of([&] { relu_only.backward_weight(ctx, dy.cview()); }).find("before its backward_input") !=
        std::string::npos);
}

TEST_CASE("Dropout: reproducible masks from (seed, step, sample, stream), keep rate, eval identity", "[layers]") {
  auto gen = test::rng(12);
  auto x = test::random_tensor<double>(Shape{200, 500}, gen, 0.5, 1.5);  // no zeros: kept ⇔ y ≠ 0
  Ctx ctx;
  ctx.seed = 42;
  ctx.step = 3;
  layers::Dropout<double> a(0.3, 1), b(0.3, 1), other(0.3, 2);
  auto mask_of = [&](layers::Dropout<double>& d) {
    d.forward(ctx, x.cview());
    const auto m = d.mask(ctx.micro_batch);
    return std::vector<double>(m.begin(), m.end());
  };
  const auto m0 = mask_of(a);
  CHECK(mask_of(b) == m0);  // same seed, step, samples and stream: the same mask
  CHECK(mask_of(other) != m0);
  ctx.micro_batch = 1;
  CHECK(mask_of(a) == m0);  // another slot, the same samples: the same mask
  ctx.sample_offset = 1;
  CHECK(mask_of(a) != m0);
  ctx.micro_batch = 0;
  ctx.sample_offset = 0;
  ctx.step = 4;
  const auto m4 = mask_of(a);
  CHECK(m4 != m0);
  ctx.step = 3;
  CHECK(mask_of(a) == m0);  // nothing carried over from earlier calls

  std::int64_t kept = 0;
  for (double v : m0) {
    CHECK((v == 0.0 || v == dpml::test::Approx(1 / 0.7).epsilon(1e-15)));
    kept += v != 0.0;
  }
  const double rate = static_cast<double>(kept) / static_cast<double>(m0.size());
  CAPTURE(rate);
  CHECK(std::abs(rate - 0.7) < 0.005);  // 100k draws: σ ≈ 0.0015
  const auto y = a.forward(ctx, x.cview());
  for (std::int64_t i = 0; i < x.numel(); ++i) CHECK((y[i] == 0.0) == (m0[static_cast<std::size_t>(i)] == 0.0));

  auto xs = test::random_tensor<double>(Shape{3, 8}, gen);
  test::finite_difference_check(a, ctx, xs, gen);

  ctx.mode = layers::Mode::eval;
  const auto ye = a.forward(ctx, x.cview());
  CHECK(ye.data() == x.data());
  CHECK(a.backward_input(ctx, x.cview()).data() == x.data());
}

// The rule of dropout.hpp's comment, element by element from PhiloxStream::uniform, against the
// mask drawn four words per Philox block (kernels/dropout_rule.hpp, which the device kernel calls
// too): samples of 21 elements (not a multiple of 4), a sample offset, both element types.
TEMPLATE_TEST_CASE("Dropout: the mask is word g·2³² + e of Philox stream (id·φ + step), kept iff ≥ p", "[layers]", float,
                   double) {
  using T = TestType;
  auto gen = test::rng(14);
  auto x = test::random_tensor<T>(Shape{5, 3, 7}, gen);
  Ctx ctx;
  ctx.seed = 0x1234'5678'9abcull;
  ctx.step = 17;
  ctx.sample_offset = 9;
  const double p = 0.35;
  layers::Dropout<T> d(p, 6);
  d.forward(ctx, x.cview());
  const auto m = d.mask(0);
  const PhiloxStream rng(ctx.seed, 6 * 0x9E3779B97F4A7C15ull + ctx.step);
  const T keep = static_cast<T>(1.0 / (1.0 - p));
  for (std::int64_t n = 0; n < 5; ++n)
    for (std::int64_t e = 0; e < 21; ++e) {
      CAPTURE(n, e);
      const bool kept = rng.uniform((static_cast<std::uint64_t>(ctx.sample_offset + n) << 32) + static_cast<std::uint64_t>(e)) >=
                        static_cast<float>(p);
      CHECK(m[n * 21 + e] == (kept ? keep : T(0)));
    }
}

// The mask of a global batch split as the loader splits it — data rank r of K holds samples
// [⌊r·n/K⌋, ⌊(r+1)·n/K⌋), each rank's slice further cut into micro-batches — equals the mask of
// one rank on the whole batch: each rank is a Dropout of its own (another process) whose
// sample_offset is its first global sample.
TEST_CASE("Dropout: the mask of a sample does not depend on the data rank or micro-batch holding it", "[layers]") {
  const std::int64_t n = 7, S = 3 * 5;  // 7 samples of (3, 5): slices 3 + 4 on 2 ranks
  auto gen = test::rng(13);
  auto x = test::random_tensor<float>(Shape{n, 3, 5}, gen, 0.5, 1.5);  // no zeros
  Ctx ctx;
  ctx.seed = 5;
  ctx.step = 11;
  layers::Dropout<float> whole(0.5, 3);
  whole.forward(ctx, x.cview());
  const auto m = whole.mask(0);
  const std::vector<float> expected(m.begin(), m.end());
  for (int ranks : {2, 3})
    for (int micro_batches : {1, 2}) {
      CAPTURE(ranks);
      CAPTURE(micro_batches);
      std::vector<float> got;
      for (int r = 0; r < ranks; ++r) {
        layers::Dropout<float> rank_layer(0.5, 3);
        const std::int64_t lo = r * n / ranks, hi = (r + 1) * n / ranks;
        for (int mb = 0; mb < micro_batches; ++mb) {
          const std::int64_t a = lo + (hi - lo) * mb / micro_batches, b = lo + (hi - lo) * (mb + 1) / micro_batches;
          ctx.micro_batch = mb;
          ctx.sample_offset = a;
          rank_layer.forward(ctx, x.cview().slice(0, a, b));
          const auto part = rank_layer.mask(mb);
          got.insert(got.end(), part.begin(), part.end());
        }
      }
      CHECK(got.size() == static_cast<std::size_t>(n * S));
      CHECK(got == expected);
    }
  // Without the offset every slice would reuse the first samples' masks: the test can tell.
  ctx.micro_batch = 0;
  ctx.sample_offset = 0;
  layers::Dropout<float> unshifted(0.5, 3);
  unshifted.forward(ctx, x.cview().slice(0, 3, 7));
  const auto u = unshifted.mask(0);
  CHECK(std::vector<float>(u.begin(), u.end()) != std::vector<float>(expected.begin() + 3 * S, expected.end()));
}
