// Forward of every basic layer against a plain float64 reference written here, and both backward
// halves against central finite differences (grad_check.hpp).
#include "grad_check.hpp"
#include "test.hpp"

#include <dpml/core/philox.hpp>
#include <dpml/kernels/host/blas_threads.hpp>
#include <dpml/layers/activation.hpp>
#include <dpml/layers/conv2d.hpp>
#include <dpml/layers/cross_entropy.hpp>
#include <dpml/layers/flatten.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/layers/linear.hpp>
#include <dpml/layers/pool.hpp>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

using namespace dpml;
using layers::Context;
using Ctx = Context<HostSpace>;

TEST_CASE("Linear: forward matches x·Wᵀ + b on (..., in); init bounds; gradients", "[layers]") {
  auto gen = test::rng(1);
  layers::Linear<double> lin(5, 3, {.name = "fc"});
  layers::initialize_all(lin.parameters(), 7, nullptr);
  const auto w = lin.parameters()[0]->value(), b = lin.parameters()[1]->value();
  CHECK(lin.parameters()[0]->name() == "fc.weight");
  CHECK(lin.parameters()[1]->name() == "fc.bias");
  const double bound = 1 / std::sqrt(5.0);
  for (double v : w) CHECK(std::abs(v) <= bound);
  CHECK(w(0, 0) != w(0, 1));

  Ctx ctx;
  auto x = test::random_tensor<double>(Shape{2, 4, 5}, gen);
  const auto y = lin.forward(ctx, x.cview());
  REQUIRE(y.shape() == Shape{2, 4, 3});
  std::vector<double> ref;
  for (int n = 0; n < 8; ++n)
    for (int o = 0; o < 3; ++o) {
      double s = b[o];
      for (int i = 0; i < 5; ++i) s += x[n * 5 + i] * w(o, i);
      ref.push_back(s);
    }
  CHECK(test::rel_error(y, ref) < 1e-14);
  test::finite_difference_check(lin, ctx, x, gen);

  layers::Linear<double> nobias(4, 6, {.bias = false});
  REQUIRE(nobias.parameters().size() == 1);
  test::randomise_parameters(nobias, gen);
  auto x2 = test::random_tensor<double>(Shape{3, 4}, gen);
  test::finite_difference_check(nobias, ctx, x2, gen);

  layers::Linear<float> f(5, 3);
  CHECK(test::error_of([&] { f.forward(ctx, TensorView<const float>(nullptr, Shape{2, 4})); })
            .find("does not end in in=5") != std::string::npos);
}

namespace {
// Direct convolution in float64: y[n, o, ho, wo] = b[o] + Σ w[o, c, i, j] · x[n, c, ho·s − p + i, wo·s − p + j].
std::vector<double> conv_reference(const Tensor<double>& x, TensorView<double> w, TensorView<double> b,
                                   std::int64_t stride, std::int64_t pad) {
  const std::int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), O = w.size(0), k = w.size(2);
  const std::int64_t Ho = (H + 2 * pad - k) / stride + 1, Wo = (W + 2 * pad - k) / stride + 1;
  std::vector<double> y;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t ho = 0; ho < Ho; ++ho)
        for (std::int64_t wo = 0; wo < Wo; ++wo) {
          double s = b[o];
          for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t i = 0; i < k; ++i)
              for (std::int64_t j = 0; j < k; ++j) {
                const std::int64_t h = ho * stride - pad + i, ww = wo * stride - pad + j;
                if (h >= 0 && h < H && ww >= 0 && ww < W) s += w(o, c, i, j) * x(n, c, h, ww);
              }
          y.push_back(s);
        }
  return y;
}
}  // namespace

TEST_CASE("Conv2d: forward matches direct convolution (stride, padding); gradients", "[layers]") {
  auto gen = test::rng(2);
  Ctx ctx;
  struct Case {
    std::int64_t stride, pad, k, H, W;
  };
  for (Case cs : {Case{1, 0, 3, 5, 6}, Case{2, 1, 3, 6, 5}, Case{1, 1, 1, 4, 4}, Case{3, 2, 3, 7, 4}, Case{1, 2, 5, 3, 3}}) {
    CAPTURE(cs.stride, cs.pad, cs.k);
    layers::Conv2d<double> conv(2, 3, cs.k, {.stride = cs.stride, .padding = cs.pad});
    layers::initialize_all(conv.parameters(), 3, nullptr);
    auto x = test::random_tensor<double>(Shape{2, 2, cs.H, cs.W}, gen);
    const auto y = conv.forward(ctx, x.cview());
    const auto ref = conv_reference(x, conv.parameters()[0]->value(), conv.parameters()[1]->value(), cs.stride, cs.pad);
    REQUIRE(y.numel() == static_cast<std::int64_t>(ref.size()));
    CHECK(test::rel_error(y, ref) < 1e-14);
    test::finite_difference_check(conv, ctx, x, gen);
  }
  // float32 (sgemm) agrees with the float64 reference to float rounding
  layers::Conv2d<float> cf(3, 4, 3, {.padding = 1});
  layers::Conv2d<double> cd(3, 4, 3, {.padding = 1});
  layers::initialize_all(cf.parameters(), 5, nullptr);
  layers::initialize_all(cd.parameters(), 5, nullptr);
  auto xd = test::random_tensor<double>(Shape{2, 3, 7, 7}, gen);
  Tensor<float> xf(xd.shape());
  std::copy(xd.begin(), xd.end(), xf.begin());
  CHECK(test::rel_error(cf.forward(ctx, xf.cview()), cd.forward(ctx, xd.cview())) < 1e-6);
  CHECK(test::error_of([&] { cf.forward(ctx, TensorView<const float>(xf.data(), Shape{2, 2, 7, 7})); })
            .find("is not (N, 3, H, W)") != std::string::npos);
}

TEST_CASE("Conv2d with input_gradient = false: no input gradient, the same weight gradients", "[layers]") {
  auto gen = test::rng(4);
  Ctx ctx;
  layers::Conv2d<double> with(2, 3, 3, {.padding = 1}), without(2, 3, 3, {.padding = 1, .input_gradient = false});
  layers::initialize_all(with.parameters(), 6, nullptr);
  layers::initialize_all(without.parameters(), 6, nullptr);
  auto x = test::random_tensor<double>(Shape{2, 2, 5, 4}, gen);
  const auto y = with.forward(ctx, x.cview());
  CHECK(test::rel_error(without.forward(ctx, x.cview()), y) == 0.0);
  const auto dy = test::random_tensor<double>(y.shape(), gen);
  CHECK(with.backward_input(ctx, dy.cview()).data() != nullptr);
  CHECK(without.backward_input(ctx, dy.cview()).data() == nullptr);
  with.backward_weight(ctx, dy.cview());
  without.backward_weight(ctx, dy.cview());
  for (std::size_t i = 0; i < 2; ++i)
    CHECK(test::rel_error(without.parameters()[i]->grad(), with.parameters()[i]->grad()) == 0.0);
}

TEST_CASE("A parameter stored in another order is initialised by its logical index", "[layers]") {
  // A GPU convolution's weight: logical (Cout, Cin, kh, kw), stored (Cout, kh, kw, Cin).
  const Shape shape{3, 4, 2, 5};
  const Init init = Init::uniform(-1, 1);
  Param<double> logical("conv.weight", shape, init), stored("conv.weight", shape, init);
  stored.set_storage_order(StorageOrder(std::array<int, 4>{0, 2, 3, 1}));
  layers::initialize_all(std::vector<Param<double>*>{&logical, &stored}, 9, nullptr);
  std::vector<double> back(static_cast<std::size_t>(shape.numel()));
  to_logical_order(stored, stored.value().data(), back.data());
  CHECK(test::rel_error(logical.value(), back) == 0.0);
  CHECK(test::rel_error(logical.value(), stored.value()) > 0.1);  // the memory order does differ
  std::vector<double> again(back.size());
  to_storage_order(stored, back.data(), again.data());
  CHECK(test::rel_error(stored.value(), again) == 0.0);
  // element (o, c, i, j) of the logical tensor lies at ((o·kh + i)·kw + j)·Cin + c
  CHECK(stored.value()[((1 * 2 + 1) * 5 + 3) * 4 + 2] == logical.value()(1, 2, 1, 3));
  CHECK(test::error_of([&] { stored.set_storage_order(StorageOrder(std::array<int, 4>{0, 2, 2, 1})); })
            .find("not a permutation") != std::string::npos);
}

TEST_CASE("A large parameter is drawn by several threads as by one", "[layers]") {
  // 3.3 M elements: three threads of 1 M or more (layers/init.hpp), split inside a row.
  const Shape shape{3, 1100007};
  const Init init = Init::normal(0.5, 0.02);
  Param<float> one("blk.7.mlp.fc.weight", shape, init), three("blk.7.mlp.fc.weight", shape, init);
  const int before = kernels::host::blas_threads();
  kernels::host::set_blas_threads(1);
  layers::initialize(one, 11, nullptr);
  kernels::host::set_blas_threads(3);
  layers::initialize(three, 11, nullptr);
  kernels::host::set_blas_threads(before);
  CHECK(test::rel_error(one.value(), three.value()) == 0.0);
  // Each element is Philox's normal at its index, from the seed and the name's stream.
  const PhiloxStream rng(11, layers::name_stream("blk.7.mlp.fc.weight"));
  for (std::int64_t i : {std::int64_t{0}, std::int64_t{1100006}, std::int64_t{1100007}, shape.numel() / 3, shape.numel() / 3 + 1,
                         2 * ((shape.numel() + 2) / 3), shape.numel() - 1}) {
    CAPTURE(i);
    CHECK(three.value()[i] == static_cast<float>(0.5 + 0.02 * rng.normal(static_cast<std::uint64_t>(i))));
  }
}

TEST_CASE("MaxPool2d, AvgPool2d, GlobalAvgPool: forward against window loops; gradients", "[layers]") {
  auto gen = test::rng(3);
  Ctx ctx;
  struct Case {
    std::int64_t k, stride, pad;
  };
  for (Case cs : {Case{2, 2, 0}, Case{3, 2, 1}, Case{3, 1, 0}}) {
    CAPTURE(cs.k, cs.stride, cs.pad);
    layers::MaxPool2d<double> mp(cs.k, cs.stride, cs.pad);
    layers::AvgPool2d<double> ap(cs.k, cs.stride, cs.pad);
    auto x = test::random_tensor<double>(Shape{2, 3, 6, 5}, gen);
    const std::int64_t Ho = (6 + 2 * cs.pad - cs.k) / cs.stride + 1, Wo = (5 + 2 * cs.pad - cs.k) / cs.stride + 1;
    std::vector<double> rmax, ravg;
    for (int p = 0; p < 6; ++p)
      for (std::int64_t ho = 0; ho < Ho; ++ho)
        for (std::int64_t wo = 0; wo < Wo; ++wo) {
          double m = -std::numeric_limits<double>::infinity(), s = 0;
          for (std::int64_t i = 0; i < cs.k; ++i)
            for (std::int64_t j = 0; j < cs.k; ++j) {
              const std::int64_t h = ho * cs.stride - cs.pad + i, w = wo * cs.stride - cs.pad + j;
              if (h < 0 || h >= 6 || w < 0 || w >= 5) continue;
              m = std::max(m, x[(p * 6 + h) * 5 + w]);
              s += x[(p * 6 + h) * 5 + w];
            }
          rmax.push_back(m);
          ravg.push_back(s / static_cast<double>(cs.k * cs.k));
        }
    const auto ym = mp.forward(ctx, x.cview());
    REQUIRE(ym.shape() == Shape{2, 3, Ho, Wo});
    CHECK(test::rel_error(ym, rmax) == 0.0);
    CHECK(test::rel_error(ap.forward(ctx, x.cview()), ravg) < 1e-15);
    test::finite_difference_check(mp, ctx, x, gen);
    test::finite_difference_check(ap, ctx, x, gen);
  }
  layers::GlobalAvgPool<double> gp;
  auto x = test::random_tensor<double>(Shape{2, 3, 4, 5}, gen);
  const auto y = gp.forward(ctx, x.cview());
  REQUIRE(y.shape() == Shape{2, 3});
  std::vector<double> ref(6, 0.0);
  for (int p = 0; p < 6; ++p)
    for (int s = 0; s < 20; ++s) ref[p] += x[p * 20 + s] / 20;
  CHECK(test::rel_error(y, ref) < 1e-15);
  test::finite_difference_check(gp, ctx, x, gen);
}

TEST_CASE("ReLU and GELU (tanh): forward against the formulas; gradients", "[layers]") {
  auto gen = test::rng(4);
  Ctx ctx;
  auto x = test::random_tensor<double>(Shape{3, 7}, gen, -3, 3);
  layers::ReLU<double> relu;
  layers::GELU<double> gelu;
  std::vector<double> rr, rg;
  for (double v : x) {
    rr.push_back(v > 0 ? v : 0);
    rg.push_back(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))));
  }
  CHECK(test::rel_error(relu.forward(ctx, x.cview()), rr) == 0.0);
  CHECK(test::rel_error(gelu.forward(ctx, x.cview()), rg) < 1e-15);
  test::finite_difference_check(relu, ctx, x, gen);
  test::finite_difference_check(gelu, ctx, x, gen);
}

TEST_CASE("Flatten: (N, C, H, W) → (N, C·H·W) and back", "[layers]") {
  auto gen = test::rng(5);
  Ctx ctx;
  layers::Flatten<double> flat;
  auto x = test::random_tensor<double>(Shape{2, 3, 2, 2}, gen);
  const auto y = flat.forward(ctx, x.cview());
  CHECK(y.shape() == Shape{2, 12});
  CHECK(y.data() == x.data());
  test::finite_difference_check(flat, ctx, x, gen);
}

TEST_CASE("SoftmaxCrossEntropy: mean over the global batch; dlogits against finite differences", "[layers]") {
  auto gen = test::rng(6);
  Ctx ctx;
  ctx.global_batch = 10;  // this rank's 4 samples are part of a batch of 10
  auto z = test::random_tensor<double>(Shape{4, 5}, gen, -3, 3);
  Tensor<std::int32_t> labels(Shape{4});
  for (int n = 0; n < 4; ++n) labels[n] = (n * 3) % 5;
  layers::SoftmaxCrossEntropy<double> loss;
  auto reference = [&] {
    double sum = 0;
    for (int n = 0; n < 4; ++n) {
      double e = 0;
      for (int j = 0; j < 5; ++j) e += std::exp(z(n, j));
      sum += std::log(e) - z(n, labels[n]);
    }
    return sum / 10;
  };
  loss.forward(ctx, z.cview(), labels.cview());
  CHECK(std::abs(loss.take_loss() - reference()) < 1e-6);
  CHECK(loss.take_loss() == 0.0);  // taken: the running sum starts again
  const auto d = loss.backward(ctx);
  REQUIRE(d.shape() == Shape{4, 5});
  for (std::int64_t i = 0; i < z.numel(); ++i) {
    const double keep = z[i], h = 1e-5;
    z[i] = keep + h;
    const double plus = reference();
    z[i] = keep - h;
    const double minus = reference();
    z[i] = keep;
    CAPTURE(i);
    CHECK(std::abs(d[i] - (plus - minus) / (2 * h)) < 1e-8);
  }
  ctx.global_batch = 0;  // falls back to the local N
  loss.forward(ctx, z.cview(), labels.cview());
  CHECK(std::abs(loss.take_loss() - reference() * 10 / 4) < 1e-6);
  labels[2] = 5;
  CHECK(test::error_of([&] { loss.forward(ctx, z.cview(), labels.cview()); })
            .find("label 5 at position 2 is outside the classes [0, 5)") != std::string::npos);
}

TEST_CASE("SoftmaxCrossEntropy: (B, T, C) logits with (B, T) labels are B·T rows", "[layers]") {
  auto gen = test::rng(8);
  Ctx ctx;
  ctx.global_batch = 6;
  auto z = test::random_tensor<double>(Shape{2, 3, 5}, gen, -3, 3);
  Tensor<std::int32_t> labels(Shape{2, 3}), flat(Shape{6});
  for (int n = 0; n < 6; ++n) labels[n] = flat[n] = (n * 3) % 5;
  layers::SoftmaxCrossEntropy<double> seq, rows;
  seq.forward(ctx, z.cview(), labels.cview());
  rows.forward(ctx, TensorView<const double>(z.data(), Shape{6, 5}), flat.cview());
  CHECK(seq.take_loss() == rows.take_loss());
  const auto d = seq.backward(ctx);
  REQUIRE(d.shape() == Shape{2, 3, 5});
  CHECK(test::rel_error(d, rows.backward(ctx)) == 0.0);
  CHECK(test::error_of([&] { seq.forward(ctx, z.cview(), TensorView<const std::int32_t>(flat.data(), Shape{3, 2})); })
            .find("logits (2, 3, 5) and labels (3, 2) are not (…, C) and (…)") != std::string::npos);
}

TEST_CASE("SoftmaxCrossEntropy: micro-batches add up; in place; padded classes; evaluation forms no dlogits",
          "[layers]") {
  auto gen = test::rng(7);
  Ctx ctx;
  ctx.global_batch = 6;
  auto z = test::random_tensor<double>(Shape{3, 7}, gen, -3, 3);
  Tensor<std::int32_t> labels(Shape{3});
  for (int n = 0; n < 3; ++n) labels[n] = (n * 2) % 5;
  layers::SoftmaxCrossEntropy<double> plain;
  layers::SoftmaxCrossEntropy<double> padded({.valid = 5});  // columns 5 and 6 are padding
  layers::SoftmaxCrossEntropy<double> in_place({.in_place = true, .valid = 5});
  auto reference = [&](std::int64_t valid) {  // Σ over the 3 rows of the first `valid` columns, / 6
    double sum = 0;
    for (int n = 0; n < 3; ++n) {
      double e = 0;
      for (int j = 0; j < valid; ++j) e += std::exp(z(n, j));
      sum += std::log(e) - z(n, labels[n]);
    }
    return sum / 6;
  };
  for (int mb = 0; mb < 2; ++mb) {  // two micro-batches of the same rows: twice the loss
    ctx.micro_batch = mb;
    plain.forward(ctx, z.cview(), labels.cview());
  }
  CHECK(plain.take_loss() == test::Approx(2 * reference(7)).epsilon(1e-12));

  ctx.micro_batch = 0;
  padded.forward(ctx, z.cview(), labels.cview());
  CHECK(padded.take_loss() == test::Approx(reference(5)).epsilon(1e-12));
  const auto dv = padded.backward(ctx);
  const std::vector<double> d(dv.begin(), dv.end());
  for (int n = 0; n < 3; ++n) CHECK((d[n * 7 + 5] == 0.0 && d[n * 7 + 6] == 0.0));  // padding: no gradient

  auto logits = test::random_tensor<double>(Shape{3, 7}, gen);
  std::copy(z.begin(), z.end(), logits.begin());
  in_place.forward(ctx, logits.cview(), labels.cview());
  CHECK(in_place.take_loss() == test::Approx(reference(5)).epsilon(1e-12));
  CHECK(in_place.backward(ctx).data() == logits.data());  // dlogits over the logits
  CHECK(std::vector<double>(logits.begin(), logits.end()) == d);

  ctx.mode = layers::Mode::eval;
  plain.forward(ctx, z.cview(), labels.cview());
  CHECK(plain.take_loss() == test::Approx(reference(7)).epsilon(1e-12));
  CHECK(test::error_of([&] { plain.backward(ctx); }).find("without a training forward") != std::string::npos);
}
