// CNN kernels over NHWC (kernels/cuda/conv): Conv2d forward, backward_input and backward_weight
// (implicit GEMM), BatchNorm2d training and eval with the fused residual and ReLU, max pooling and
// global average pooling — each against a float64 loop written here from the definition, the
// backward passes against the float64 gradient (not against our forward). Fresh random inputs at
// several shapes: 1×1, 3×3, 5×5 and 7×7 kernels, strides 1, 2 and 3, paddings 0 to 3, channel
// counts that are not multiples of the tiles, the RGB stem (Cin = 3: the scalar loaders), batch > 1.
// Outputs are poisoned (all bytes 0xFF: NaN) before each run. Tolerances: relative L2 ≤ 1e-2 for
// bf16 outputs, ≤ 1e-5 for fp32 ones. Determinism: each backward pass run twice gives the same bits.
// BatchNorm's synchronised statistics: two slices of a batch whose sums are exchanged by hand (as
// an all-reduce would) against the float64 reference on the whole batch.
#include "device.hpp"

#include <dpml/core/error.hpp>
#include <dpml/kernels/cuda/conv/batch_norm.hpp>
#include <dpml/kernels/cuda/conv/conv2d.hpp>
#include <dpml/kernels/cuda/conv/pool.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

using namespace dpml;
namespace kc = dpml::kernels::cuda;
namespace kh = dpml::kernels::host;

namespace {

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// ---- Conv2d float64 references, NHWC: x (N, H, W, Cin), w (Cout, kh, kw, Cin), y (N, Ho, Wo, Cout) ----

// Calls f(n, ho, wo, i, j, h, w) for every output pixel and kernel tap that lands inside the image.
template <class F>
void for_each_tap(const kc::Conv2dShape& s, F f) {
  const auto& g = s.in;
  for (std::int64_t n = 0; n < s.N; ++n)
    for (std::int64_t ho = 0; ho < s.out_h(); ++ho)
      for (std::int64_t wo = 0; wo < s.out_w(); ++wo)
        for (std::int64_t i = 0; i < g.kh; ++i)
          for (std::int64_t j = 0; j < g.kw; ++j) {
            const std::int64_t h = ho * g.stride - g.pad + i, w = wo * g.stride - g.pad + j;
            if (h >= 0 && h < g.H && w >= 0 && w < g.W) f(n, ho, wo, i, j, h, w);
          }
}

std::vector<double> conv_forward_ref(const std::vector<double>& x, const std::vector<double>& w,
                                     const std::vector<double>& bias, const kc::Conv2dShape& s) {
  const auto& g = s.in;
  std::vector<double> y(static_cast<std::size_t>(s.pixels() * s.Cout), 0.0);
  for_each_tap(s, [&](auto n, auto ho, auto wo, auto i, auto j, auto h, auto ww) {
    const double* xp = &x[static_cast<std::size_t>(((n * g.H + h) * g.W + ww) * g.C)];
    double* yp = &y[static_cast<std::size_t>(((n * s.out_h() + ho) * s.out_w() + wo) * s.Cout)];
    for (std::int64_t co = 0; co < s.Cout; ++co) {
      const double* wp = &w[static_cast<std::size_t>(((co * g.kh + i) * g.kw + j) * g.C)];
      double acc = 0;
      for (std::int64_t c = 0; c < g.C; ++c) acc += xp[c] * wp[c];
      yp[co] += acc;
    }
  });
  if (!bias.empty())
    for (std::int64_t p = 0; p < s.pixels(); ++p)
      for (std::int64_t co = 0; co < s.Cout; ++co)
        y[static_cast<std::size_t>(p * s.Cout + co)] += bias[static_cast<std::size_t>(co)];
  return y;
}

// dx = ∂(Σ y·dy)/∂x: every (pixel, tap) pair adds dy·w onto the input element it read.
std::vector<double> conv_backward_input_ref(const std::vector<double>& dy, const std::vector<double>& w,
                                            const kc::Conv2dShape& s) {
  const auto& g = s.in;
  std::vector<double> dx(static_cast<std::size_t>(s.N * g.H * g.W * g.C), 0.0);
  for_each_tap(s, [&](auto n, auto ho, auto wo, auto i, auto j, auto h, auto ww) {
    double* xp = &dx[static_cast<std::size_t>(((n * g.H + h) * g.W + ww) * g.C)];
    const double* dyp = &dy[static_cast<std::size_t>(((n * s.out_h() + ho) * s.out_w() + wo) * s.Cout)];
    for (std::int64_t co = 0; co < s.Cout; ++co) {
      const double* wp = &w[static_cast<std::size_t>(((co * g.kh + i) * g.kw + j) * g.C)];
      for (std::int64_t c = 0; c < g.C; ++c) xp[c] += dyp[co] * wp[c];
    }
  });
  return dx;
}

// dw = ∂(Σ y·dy)/∂w + beta·dw0.
std::vector<double> conv_backward_weight_ref(const std::vector<double>& dy, const std::vector<double>& x,
                                             const std::vector<double>& dw0, double beta, const kc::Conv2dShape& s) {
  const auto& g = s.in;
  std::vector<double> dw(dw0.size());
  for (std::size_t e = 0; e < dw.size(); ++e) dw[e] = beta * dw0[e];
  for_each_tap(s, [&](auto n, auto ho, auto wo, auto i, auto j, auto h, auto ww) {
    const double* xp = &x[static_cast<std::size_t>(((n * g.H + h) * g.W + ww) * g.C)];
    const double* dyp = &dy[static_cast<std::size_t>(((n * s.out_h() + ho) * s.out_w() + wo) * s.Cout)];
    for (std::int64_t co = 0; co < s.Cout; ++co) {
      double* wp = &dw[static_cast<std::size_t>(((co * g.kh + i) * g.kw + j) * g.C)];
      for (std::int64_t c = 0; c < g.C; ++c) wp[c] += dyp[co] * xp[c];
    }
  });
  return dw;
}

struct ConvCase {
  std::int64_t N, H, W, Cin, Cout, k, stride, pad;
  bool bias;
  float beta;  // backward_weight: 0 overwrites (dw poisoned), else accumulates onto random dw
};

}  // namespace

TEST_CASE("conv2d: implicit-GEMM forward, backward_input, backward_weight against float64", "[conv][gpu]") {
  const ConvCase cases[] = {
      {2, 9, 11, 16, 24, 1, 1, 0, true, 1.f},     // 1×1; one split, beta through the GEMM epilogue
      {2, 14, 14, 32, 40, 1, 2, 0, false, 0.f},   // 1×1 stride 2 (a downsample): odd phases have no taps
      {4, 20, 20, 32, 136, 3, 1, 1, false, 0.f},  // many tiles in M and N, split-K (6 splits)
      {3, 15, 13, 24, 72, 3, 2, 1, true, 1.f},    // 3×3 stride 2, odd sizes
      {1, 7, 7, 16, 8, 3, 2, 0, false, 0.f},      // padding 0, stride 2
      {2, 12, 12, 8, 16, 7, 1, 3, true, 0.5f},    // 7×7, padding 3
      {2, 11, 11, 8, 8, 5, 3, 2, false, 1.f},     // stride 3: nine phases
      {2, 1, 3, 8, 8, 1, 2, 0, false, 0.f},       // a phase past the image (H = 1 < stride)
      {2, 32, 32, 3, 64, 7, 2, 3, false, 0.5f},   // the RGB stem: Cin = 3, scalar loaders, odd K = 147
      {2, 10, 9, 5, 7, 3, 1, 1, true, 0.f},       // odd Cin and Cout: scalar loaders, single stores
  };
  for (const ConvCase& cs : cases) {
    const kc::Conv2dShape s{cs.N, cs.Cout, kh::ConvGeometry{cs.Cin, cs.H, cs.W, cs.k, cs.k, cs.stride, cs.pad}};
    CAPTURE(cs.N, cs.H, cs.W, cs.Cin, cs.Cout, cs.k, cs.stride, cs.pad, cs.bias, cs.beta);
    auto gen = test::rng(static_cast<std::uint64_t>(cs.N * 1000003 + cs.H * 1009 + cs.Cin * 31 + cs.Cout * 7 + cs.k));
    const auto nx = static_cast<std::size_t>(cs.N * cs.H * cs.W * cs.Cin),
               nw = static_cast<std::size_t>(cs.Cout * s.taps()), ny = static_cast<std::size_t>(s.pixels() * cs.Cout);
    auto hx = test::random_vec<bf16>(nx, gen), hw = test::random_vec<bf16>(nw, gen),
         hdy = test::random_vec<bf16>(ny, gen);
    auto hbias = test::random_vec<bf16>(static_cast<std::size_t>(cs.Cout), gen);
    auto hdw0 = test::random_vec<float>(nw, gen);
    test::DeviceVec<bf16> x(hx), w(hw), dy(hdy), bias(hbias), y(ny), dx(nx);
    test::DeviceVec<float> dw(nw);
    const std::int64_t scratch_floats = kc::conv2d_weight_scratch(s);
    test::DeviceVec<float> scratch(static_cast<std::size_t>(std::max<std::int64_t>(scratch_floats, 1)));
    const auto dX = test::to_double(hx), dW = test::to_double(hw), dDY = test::to_double(hdy);

    y.poison();
    kc::conv2d_forward(x.ptr, w.ptr, cs.bias ? bias.ptr : nullptr, y.ptr, s, nullptr);
    const auto ry = conv_forward_ref(dX, dW, cs.bias ? test::to_double(hbias) : std::vector<double>{}, s);
    CHECK(test::rel_l2(y.download(), ry) <= test::kBf16Tol);

    dx.poison();
    kc::conv2d_backward_input(dy.ptr, w.ptr, dx.ptr, s, nullptr);
    const auto got_dx = dx.download();
    CHECK(test::rel_l2(got_dx, conv_backward_input_ref(dDY, dW, s)) <= test::kBf16Tol);

    auto run_dw = [&] {
      if (cs.beta == 0.f) dw.poison();
      else dw.upload(hdw0);
      scratch.poison();
      kc::conv2d_backward_weight(dy.ptr, x.ptr, dw.ptr, cs.beta, scratch.ptr, scratch_floats, s, nullptr);
      return dw.download();
    };
    const auto got_dw = run_dw();
    CHECK(test::rel_l2(got_dw, conv_backward_weight_ref(dDY, dX, test::to_double(hdw0), cs.beta, s)) <= test::kFp32Tol);

    // Deterministic: both backward passes again give the same bits.
    dx.poison();
    kc::conv2d_backward_input(dy.ptr, w.ptr, dx.ptr, s, nullptr);
    CHECK(same_bits(dx.download(), got_dx));
    CHECK(same_bits(run_dw(), got_dw));

    // Too little scratch for a split reduction is refused with a message, not written past.
    if (scratch_floats > 0)
      CHECK_THROWS_AS(
          kc::conv2d_backward_weight(dy.ptr, x.ptr, dw.ptr, cs.beta, scratch.ptr, scratch_floats - 1, s, nullptr),
          dpml::Error);
  }
}

namespace {

struct BnCase {
  std::int64_t N, H, W, C;
};
struct BnMode {
  bool training, relu, residual;
};

// float64 BatchNorm2d over NHWC (rows = N·H·W, C), forward and backward, from the definition.
struct BnRef {
  std::vector<double> mean, rstd, running_mean, running_var, y, dx, dres, dgamma, dbeta;
};
BnRef bn_ref(const std::vector<double>& x, const std::vector<double>& res, const std::vector<double>& gamma,
             const std::vector<double>& beta, const std::vector<double>& rm, const std::vector<double>& rv,
             const std::vector<double>& dy, const std::vector<double>& dg0, const std::vector<double>& db0,
             std::int64_t rows, std::int64_t C, const BnMode& mode, const kc::BatchNormConfig& cfg) {
  const auto uc = static_cast<std::size_t>(C), n = static_cast<std::size_t>(rows) * uc;
  const double M = static_cast<double>(rows), m = cfg.momentum;
  BnRef r{std::vector<double>(uc), std::vector<double>(uc), rm, rv, std::vector<double>(n), std::vector<double>(n),
          std::vector<double>(n), dg0, db0};
  for (std::size_t c = 0; c < uc; ++c) {
    if (mode.training) {
      double sum = 0, sq = 0;
      for (std::size_t i = c; i < n; i += uc) sum += x[i];
      r.mean[c] = sum / M;
      for (std::size_t i = c; i < n; i += uc) sq += (x[i] - r.mean[c]) * (x[i] - r.mean[c]);
      const double var = sq / M;
      r.rstd[c] = 1.0 / std::sqrt(var + cfg.eps);
      r.running_mean[c] = (1 - m) * rm[c] + m * r.mean[c];
      r.running_var[c] = (1 - m) * rv[c] + m * var * M / (M - 1);
    } else {
      r.mean[c] = rm[c];
      r.rstd[c] = 1.0 / std::sqrt(rv[c] + cfg.eps);
    }
    double sg = 0, sgx = 0;
    std::vector<double> g(static_cast<std::size_t>(rows));
    for (std::size_t i = c, k = 0; i < n; i += uc, ++k) {
      const double xhat = (x[i] - r.mean[c]) * r.rstd[c];
      const double z = xhat * gamma[c] + beta[c] + (mode.residual ? res[i] : 0.0);
      r.y[i] = mode.relu ? std::max(z, 0.0) : z;
      g[k] = mode.relu && !(z > 0) ? 0.0 : dy[i];
      r.dres[i] = g[k];
      sg += g[k];
      sgx += g[k] * xhat;
    }
    r.dbeta[c] += sg;
    r.dgamma[c] += sgx;
    for (std::size_t i = c, k = 0; i < n; i += uc, ++k) {
      const double xhat = (x[i] - r.mean[c]) * r.rstd[c], kk = gamma[c] * r.rstd[c];
      r.dx[i] = mode.training ? kk * (g[k] - sg / M - xhat * sgx / M) : kk * g[k];
    }
  }
  return r;
}

// Random inputs of one BatchNorm case: activations (n) bf16, per-channel (uc) γ, β, their incoming
// gradients in P, and fp32 running statistics, drawn in this order from gen.
template <class P>
struct BnInputs {
  std::vector<bf16> x, res, dy;
  std::vector<P> gamma, beta, dgamma, dbeta;
  std::vector<float> running_mean, running_var;
  BnInputs(std::size_t n, std::size_t uc, std::mt19937_64& gen)
      : x(test::random_vec<bf16>(n, gen, -1.0, 3.0)), res(test::random_vec<bf16>(n, gen)),
        dy(test::random_vec<bf16>(n, gen)), gamma(test::random_vec<P>(uc, gen, 0.5, 1.5)),
        beta(test::random_vec<P>(uc, gen, -0.5, 0.5)), dgamma(test::random_vec<P>(uc, gen)),
        dbeta(test::random_vec<P>(uc, gen)), running_mean(test::random_vec<float>(uc, gen, -0.5, 0.5)),
        running_var(test::random_vec<float>(uc, gen, 0.5, 2.0)) {}
};

}  // namespace

TEMPLATE_TEST_CASE("batch_norm: NHWC training/eval, fused residual + ReLU, forward and backward against float64",
                   "[batch_norm][gpu]", float, bf16) {
  using P = TestType;  // γ, β and their gradients; activations are bf16
  constexpr double ptol = std::is_same_v<P, float> ? test::kFp32Tol : test::kBf16Tol;
  const BnMode modes[] = {{true, false, false}, {true, true, true}, {false, true, false}, {false, false, true}};
  for (const BnCase cs : {BnCase{2, 5, 7, 16}, BnCase{3, 4, 4, 5}, BnCase{8, 14, 14, 64}, BnCase{2, 3, 3, 200}}) {
    for (const BnMode& mode : modes) {
      const std::int64_t rows = cs.N * cs.H * cs.W, C = cs.C;
      CAPTURE(cs.N, cs.H, cs.W, cs.C, mode.training, mode.relu, mode.residual);
      auto gen = test::rng(static_cast<std::uint64_t>(rows * 131 + C * 7 + mode.training * 2 + mode.relu));
      const auto n = static_cast<std::size_t>(rows * C), uc = static_cast<std::size_t>(C);
      const BnInputs<P> in(n, uc, gen);
      const auto &hx = in.x, &hres = in.res, &hdy = in.dy;
      const auto &hgamma = in.gamma, &hbeta = in.beta, &hdg = in.dgamma, &hdb = in.dbeta;
      const auto &hrm = in.running_mean, &hrv = in.running_var;
      test::DeviceVec<bf16> x(hx), res(hres), dy(hdy), y(n), dx(n), dres(n);
      test::DeviceVec<P> gamma(hgamma), beta(hbeta), dgamma(hdg), dbeta(hdb);
      test::DeviceVec<float> rm(hrm), rv(hrv), mean(uc), rstd(uc),
          scratch(static_cast<std::size_t>(kc::batch_norm_scratch(rows, C)));
      const kc::BatchNormConfig cfg{mode.training, mode.relu, 0.1f, 1e-5f};
      for (auto* v : {&y, &dx, &dres}) v->poison();
      mean.poison();
      rstd.poison();
      scratch.poison();
      const bf16* residual = mode.residual ? res.ptr : nullptr;
      bf16* dresidual = mode.residual ? dres.ptr : nullptr;
      kc::batch_norm_forward(x.ptr, residual, gamma.ptr, beta.ptr, y.ptr, mean.ptr, rstd.ptr, rm.ptr, rv.ptr, rows, C,
                             cfg, scratch.ptr, nullptr);
      kc::batch_norm_backward(dy.ptr, y.ptr, x.ptr, mean.ptr, rstd.ptr, gamma.ptr, dx.ptr, dresidual, dgamma.ptr,
                              dbeta.ptr, rows, C, cfg, scratch.ptr, nullptr);

      const auto r = bn_ref(test::to_double(hx), test::to_double(hres), test::to_double(hgamma), test::to_double(hbeta),
                            test::to_double(hrm), test::to_double(hrv), test::to_double(hdy), test::to_double(hdg),
                            test::to_double(hdb), rows, C, mode, cfg);
      CHECK(test::rel_l2(y.download(), r.y) <= test::kBf16Tol);
      CHECK(test::rel_l2(mean.download(), r.mean) <= test::kFp32Tol);
      CHECK(test::rel_l2(rstd.download(), r.rstd) <= test::kFp32Tol);
      CHECK(test::rel_l2(rm.download(), r.running_mean) <= test::kFp32Tol);  // unchanged in eval
      CHECK(test::rel_l2(rv.download(), r.running_var) <= test::kFp32Tol);
      const auto got_dx = dx.download();
      const auto got_dg = dgamma.download();
      CHECK(test::rel_l2(got_dx, r.dx) <= test::kBf16Tol);
      CHECK(test::rel_l2(got_dg, r.dgamma) <= ptol);
      CHECK(test::rel_l2(dbeta.download(), r.dbeta) <= ptol);
      if (mode.residual) CHECK(test::rel_l2(dres.download(), r.dres) <= test::kBf16Tol);

      // Deterministic: the backward again (from the same dγ) gives the same bits.
      dgamma.upload(hdg);
      dbeta.upload(hdb);
      dx.poison();
      kc::batch_norm_backward(dy.ptr, y.ptr, x.ptr, mean.ptr, rstd.ptr, gamma.ptr, dx.ptr, dresidual, dgamma.ptr,
                              dbeta.ptr, rows, C, cfg, scratch.ptr, nullptr);
      CHECK(same_bits(dx.download(), got_dx));
      CHECK(same_bits(dgamma.download(), got_dg));
    }
  }
}

namespace {

// Rows [first, first + count) of a (rows, C) host tensor, or of a float64 reference.
template <class T>
std::vector<T> row_slice(const std::vector<T>& v, std::int64_t first, std::int64_t count, std::int64_t C) {
  return {v.begin() + first * C, v.begin() + (first + count) * C};
}

// One "rank" of a synchronised BatchNorm in one process: rows [first, first + rows) of the batch,
// with its own copies of γ, β, their gradients and the running statistics (equal on the ranks).
template <class P>
struct BnRank {
  std::int64_t first, rows;
  test::DeviceVec<bf16> x, res, dy, y, dx, dres;
  test::DeviceVec<P> gamma, beta, dgamma, dbeta;
  test::DeviceVec<float> rm, rv, mean, rstd, scratch;
  std::vector<float> own_sums;  // (2, C): this rank's sums of the current pass, before the exchange
  BnRank(std::int64_t first_row, std::int64_t count, std::int64_t C, const BnInputs<P>& in)
      : first(first_row), rows(count), x(row_slice(in.x, first, rows, C)), res(row_slice(in.res, first, rows, C)),
        dy(row_slice(in.dy, first, rows, C)), y(static_cast<std::size_t>(rows * C)), dx(static_cast<std::size_t>(rows * C)),
        dres(static_cast<std::size_t>(rows * C)), gamma(in.gamma), beta(in.beta), dgamma(in.dgamma), dbeta(in.dbeta),
        rm(in.running_mean), rv(in.running_var),
        mean(static_cast<std::size_t>(C)), rstd(static_cast<std::size_t>(C)),
        scratch(static_cast<std::size_t>(kc::batch_norm_scratch(rows, C))) {
    for (auto* v : {&y, &dx, &dres}) v->poison();
    mean.poison();
    rstd.poison();
    scratch.poison();
  }
};

}  // namespace

// Synchronised statistics (the `across` argument) without a communicator: two "ranks" hold the
// two slices of a batch (unequal ones where N is odd). Each pass runs twice per rank: first with an
// `across` that records the rank's own (2, C) sums and answers its own rows, then — the running
// statistics and gradients restored — with one that adds the other rank's recorded sums, as an
// all-reduce would, and answers both ranks' rows. Every rank's mean, rstd, running statistics, y,
// dx, d_residual (its rows) must then be those of the float64 reference on the whole batch, and
// dγ, dβ this rank's share: the two ranks' increments add up to the whole batch's. In eval mode
// `across` must not be called. Tolerances as above.
TEMPLATE_TEST_CASE("batch_norm: synchronised statistics over two slices of a batch equal float64 on the whole batch",
                   "[batch_norm][gpu]", float, bf16) {
  using P = TestType;
  constexpr double ptol = std::is_same_v<P, float> ? test::kFp32Tol : test::kBf16Tol;
  const BnMode modes[] = {{true, false, false}, {true, true, true}, {false, true, true}};
  for (const BnCase cs : {BnCase{2, 5, 7, 16}, BnCase{3, 4, 4, 5}, BnCase{8, 14, 14, 64}, BnCase{3, 3, 3, 200}}) {
    for (const BnMode& mode : modes) {
      const std::int64_t rows = cs.N * cs.H * cs.W, C = cs.C, split = cs.N / 2 * cs.H * cs.W;
      CAPTURE(cs.N, cs.H, cs.W, cs.C, mode.training, mode.relu, mode.residual);
      auto gen = test::rng(static_cast<std::uint64_t>(rows * 137 + C * 11 + mode.training * 2 + mode.relu));
      const auto n = static_cast<std::size_t>(rows * C), uc = static_cast<std::size_t>(C);
      const BnInputs<P> in(n, uc, gen);
      const auto &hx = in.x, &hres = in.res, &hdy = in.dy;
      const auto &hgamma = in.gamma, &hbeta = in.beta, &hdg = in.dgamma, &hdb = in.dbeta;
      const auto &hrm = in.running_mean, &hrv = in.running_var;
      std::array<BnRank<P>, 2> ranks{BnRank<P>(0, split, C, in), BnRank<P>(split, rows - split, C, in)};
      const kc::BatchNormConfig cfg{mode.training, mode.relu, 0.1f, 1e-5f};
      int calls = 0;
      auto record = [&calls](BnRank<P>* r) {
        return [&calls, r](float* sums, std::int64_t c, std::int64_t local) -> std::int64_t {
          ++calls;
          r->own_sums.resize(static_cast<std::size_t>(2 * c));
          DPML_CHECK_CUDA(cudaMemcpy(r->own_sums.data(), sums, r->own_sums.size() * sizeof(float), cudaMemcpyDeviceToHost));
          return local;
        };
      };
      auto exchange = [&calls](const BnRank<P>* r, const BnRank<P>* other) {
        return [&calls, r, other](float* sums, std::int64_t c, std::int64_t local) -> std::int64_t {
          ++calls;
          std::vector<float> total(static_cast<std::size_t>(2 * c));
          DPML_CHECK_CUDA(cudaMemcpy(total.data(), sums, total.size() * sizeof(float), cudaMemcpyDeviceToHost));
          CHECK(total == r->own_sums);  // the same sums as the recording pass
          for (std::size_t i = 0; i < total.size(); ++i) total[i] += other->own_sums[i];
          DPML_CHECK_CUDA(cudaMemcpy(sums, total.data(), total.size() * sizeof(float), cudaMemcpyHostToDevice));
          return local + other->rows;
        };
      };
      auto forward = [&](BnRank<P>& r, const auto& across) {
        kc::batch_norm_forward(r.x.ptr, mode.residual ? r.res.ptr : nullptr, r.gamma.ptr, r.beta.ptr, r.y.ptr,
                               r.mean.ptr, r.rstd.ptr, r.rm.ptr, r.rv.ptr, r.rows, C, cfg, r.scratch.ptr, nullptr, across);
      };
      auto backward = [&](BnRank<P>& r, const auto& across) {
        kc::batch_norm_backward(r.dy.ptr, r.y.ptr, r.x.ptr, r.mean.ptr, r.rstd.ptr, r.gamma.ptr, r.dx.ptr,
                                mode.residual ? r.dres.ptr : nullptr, r.dgamma.ptr, r.dbeta.ptr, r.rows, C, cfg,
                                r.scratch.ptr, nullptr, across);
      };
      for (auto& r : ranks) forward(r, record(&r));
      for (auto& r : ranks) {  // the recording pass moved them
        r.rm.upload(hrm);
        r.rv.upload(hrv);
      }
      for (std::size_t i = 0; i < 2; ++i) forward(ranks[i], exchange(&ranks[i], &ranks[1 - i]));
      for (auto& r : ranks) backward(r, record(&r));
      for (auto& r : ranks) {
        r.dgamma.upload(hdg);
        r.dbeta.upload(hdb);
      }
      for (std::size_t i = 0; i < 2; ++i) backward(ranks[i], exchange(&ranks[i], &ranks[1 - i]));
      CHECK(calls == (mode.training ? 8 : 0));

      const auto ref = bn_ref(test::to_double(hx), test::to_double(hres), test::to_double(hgamma), test::to_double(hbeta),
                              test::to_double(hrm), test::to_double(hrv), test::to_double(hdy), test::to_double(hdg),
                              test::to_double(hdb), rows, C, mode, cfg);
      std::vector<double> dgamma_sum = test::to_double(hdg), dbeta_sum = test::to_double(hdb);  // dγ0 + Σ increments
      for (auto& r : ranks) {
        CAPTURE(r.first, r.rows);
        CHECK(test::rel_l2(r.y.download(), row_slice(ref.y, r.first, r.rows, C)) <= test::kBf16Tol);
        CHECK(test::rel_l2(r.mean.download(), ref.mean) <= test::kFp32Tol);
        CHECK(test::rel_l2(r.rstd.download(), ref.rstd) <= test::kFp32Tol);
        CHECK(test::rel_l2(r.rm.download(), ref.running_mean) <= test::kFp32Tol);
        CHECK(test::rel_l2(r.rv.download(), ref.running_var) <= test::kFp32Tol);
        CHECK(test::rel_l2(r.dx.download(), row_slice(ref.dx, r.first, r.rows, C)) <= test::kBf16Tol);
        if (mode.residual) CHECK(test::rel_l2(r.dres.download(), row_slice(ref.dres, r.first, r.rows, C)) <= test::kBf16Tol);
        const auto dg = test::to_double(r.dgamma.download()), db = test::to_double(r.dbeta.download());
        for (std::size_t c = 0; c < uc; ++c) {
          dgamma_sum[c] += dg[c] - test::as_double(hdg[c]);
          dbeta_sum[c] += db[c] - test::as_double(hdb[c]);
        }
      }
      CHECK(test::rel_l2(dgamma_sum, ref.dgamma) <= ptol);
      CHECK(test::rel_l2(dbeta_sum, ref.dbeta) <= ptol);
    }
  }
}

TEST_CASE("max_pool: NHWC forward (value and argmax) and deterministic gather backward against float64",
          "[pool][gpu]") {
  struct Case {
    std::int64_t N, H, W, C, k, stride, pad;
  };
  for (const Case cs : {Case{2, 9, 11, 5, 3, 2, 1}, Case{2, 16, 16, 64, 3, 2, 1}, Case{3, 8, 8, 8, 2, 2, 0},
                        Case{1, 7, 10, 3, 3, 1, 1}, Case{2, 12, 9, 16, 5, 3, 2}}) {
    CAPTURE(cs.N, cs.H, cs.W, cs.C, cs.k, cs.stride, cs.pad);
    const kh::PoolGeometry g{cs.H, cs.W, cs.k, cs.k, cs.stride, cs.pad};
    const std::int64_t Ho = g.out_h(), Wo = g.out_w();
    const auto nx = static_cast<std::size_t>(cs.N * cs.H * cs.W * cs.C),
               ny = static_cast<std::size_t>(cs.N * Ho * Wo * cs.C);
    auto gen = test::rng(static_cast<std::uint64_t>(nx + cs.k));
    auto hx = test::random_vec<bf16>(nx, gen), hdy = test::random_vec<bf16>(ny, gen);
    test::DeviceVec<bf16> x(hx), dy(hdy), y(ny), dx(nx);
    test::DeviceVec<std::int32_t> argmax(ny);
    y.poison();
    argmax.poison();
    dx.poison();
    kc::max_pool_forward(x.ptr, y.ptr, argmax.ptr, cs.N, cs.C, g, nullptr);
    kc::max_pool_backward(dy.ptr, argmax.ptr, dx.ptr, cs.N, cs.C, g, nullptr);

    const auto dX = test::to_double(hx), dDY = test::to_double(hdy);
    std::vector<double> ry(ny), rdx(nx, 0.0);
    std::vector<std::int32_t> rarg(ny);
    for (std::int64_t n = 0; n < cs.N; ++n)
      for (std::int64_t ho = 0; ho < Ho; ++ho)
        for (std::int64_t wo = 0; wo < Wo; ++wo)
          for (std::int64_t c = 0; c < cs.C; ++c) {
            const auto win = g.window(ho, wo);
            auto at = [&](std::int64_t h, std::int64_t w) {
              return static_cast<std::size_t>(((n * cs.H + h) * cs.W + w) * cs.C + c);
            };
            std::int64_t bh = win.h0, bw = win.w0;
            for (std::int64_t h = win.h0; h < win.h1; ++h)
              for (std::int64_t w = win.w0; w < win.w1; ++w)
                if (dX[at(h, w)] > dX[at(bh, bw)]) {
                  bh = h;
                  bw = w;
                }
            const auto o = static_cast<std::size_t>(((n * Ho + ho) * Wo + wo) * cs.C + c);
            ry[o] = dX[at(bh, bw)];
            rarg[o] = static_cast<std::int32_t>(bh * cs.W + bw);
            rdx[at(bh, bw)] += dDY[o];
          }
    CHECK(test::rel_l2(y.download(), ry) <= test::kBf16Tol);
    CHECK(argmax.download() == rarg);
    const auto got_dx = dx.download();
    CHECK(test::rel_l2(got_dx, rdx) <= test::kBf16Tol);
    dx.poison();
    kc::max_pool_backward(dy.ptr, argmax.ptr, dx.ptr, cs.N, cs.C, g, nullptr);
    CHECK(same_bits(dx.download(), got_dx));
  }
}

TEST_CASE("global_avg_pool: NHWC forward and backward against float64", "[pool][gpu]") {
  struct Case {
    std::int64_t N, H, W, C;
  };
  for (const Case cs : {Case{2, 7, 7, 64}, Case{3, 5, 3, 37}, Case{1, 1, 1, 8}, Case{4, 14, 14, 100}}) {
    CAPTURE(cs.N, cs.H, cs.W, cs.C);
    const std::int64_t S = cs.H * cs.W;
    const auto nx = static_cast<std::size_t>(cs.N * S * cs.C), ny = static_cast<std::size_t>(cs.N * cs.C);
    auto gen = test::rng(static_cast<std::uint64_t>(nx + 3));
    auto hx = test::random_vec<bf16>(nx, gen, -1.0, 2.0), hdy = test::random_vec<bf16>(ny, gen);
    test::DeviceVec<bf16> x(hx), dy(hdy), y(ny), dx(nx);
    y.poison();
    dx.poison();
    kc::global_avg_pool_forward(x.ptr, y.ptr, cs.N, S, cs.C, nullptr);
    kc::global_avg_pool_backward(dy.ptr, dx.ptr, cs.N, S, cs.C, nullptr);
    std::vector<double> ry(ny, 0.0), rdx(nx);
    for (std::int64_t n = 0; n < cs.N; ++n)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t c = 0; c < cs.C; ++c) {
          const auto i = static_cast<std::size_t>((n * S + s) * cs.C + c), o = static_cast<std::size_t>(n * cs.C + c);
          ry[o] += test::as_double(hx[i]) / static_cast<double>(S);
          rdx[i] = test::as_double(hdy[o]) / static_cast<double>(S);
        }
    CHECK(test::rel_l2(y.download(), ry) <= test::kBf16Tol);
    CHECK(test::rel_l2(dx.download(), rdx) <= test::kBf16Tol);
  }
}
