// SGD and AdamW against steps written out by hand (PyTorch's formulas, in double), in double and
// float parameters; Optimizer over parameters and over sub-ranges of a flat buffer (as ZeRO-1 runs it);
// bf16 parameters with fp32 master weights (mixed precision); the gradient scale and the skip on a
// non-finite one; the offloaded optimizer (state and update on the host) and the host update's
// threads against the plain one.
#include "test.hpp"

#include <dpml/core/bf16.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/optim/optimizer.hpp>
#include <dpml/optim/schedule.hpp>
#include <dpml/optim/sgd.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

using namespace dpml;
using dpml::test::Approx;

namespace {

// Three updates of one parameter p0 = 1 with gradients 0.5, -0.25, 1.0 (set, not computed), lr 0.5;
// returns p after each.
template <class T, class Rule>
std::vector<double> run_three(const typename Rule::Options& o, double lr) {
  std::vector<T> value{T(1)}, grad{T(0)};
  optim::Optimizer<Rule, T> opt({{"p", value, grad}}, o);
  std::vector<double> out;
  for (double g : {0.5, -0.25, 1.0}) {
    grad[0] = static_cast<T>(g);
    opt.step(lr);
    out.push_back(static_cast<double>(value[0]));
  }
  CHECK(opt.step_count() == 3);
  return out;
}

template <class T>
void check_steps(const std::vector<double>& got, const std::vector<double>& expected, double tol) {
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i, got[i], expected[i]);
    CHECK(got[i] == Approx(expected[i]).epsilon(tol).margin(tol));
  }
}

}  // namespace

TEMPLATE_TEST_CASE("sgd: three steps by hand", "[optim][sgd]", double, float) {
  const double tol = std::is_same_v<TestType, double> ? 1e-14 : 1e-6;
  SECTION("plain") {  // p -= lr·g
    check_steps<TestType>(run_three<TestType, optim::Sgd>({}, 0.5), {1.0 - 0.5 * 0.5, 0.75 + 0.5 * 0.25, 0.875 - 0.5 * 1.0}, tol);
  }
  SECTION("weight decay") {  // p -= lr·(g + 0.1·p)
    const double p1 = 1.0 - 0.5 * (0.5 + 0.1 * 1.0);     // 0.7
    const double p2 = p1 - 0.5 * (-0.25 + 0.1 * p1);     // 0.7 + 0.09 = 0.79
    const double p3 = p2 - 0.5 * (1.0 + 0.1 * p2);       // 0.79 - 0.5395 = 0.2505
    check_steps<TestType>(run_three<TestType, optim::Sgd>({.weight_decay = 0.1}, 0.5), {p1, p2, p3}, tol);
    CHECK(p3 == Approx(0.2505));
  }
  SECTION("momentum with weight decay") {  // g' = g + 0.1·p; b = 0.9·b + g'; p -= 0.5·b
    const double b1 = 0.5 + 0.1 * 1.0, p1 = 1.0 - 0.5 * b1;                    // b 0.6, p 0.7
    const double b2 = 0.9 * b1 + (-0.25 + 0.1 * p1), p2 = p1 - 0.5 * b2;       // b 0.36, p 0.52
    const double b3 = 0.9 * b2 + (1.0 + 0.1 * p2), p3 = p2 - 0.5 * b3;         // b 1.376, p -0.168
    check_steps<TestType>(run_three<TestType, optim::Sgd>({.momentum = 0.9, .weight_decay = 0.1}, 0.5), {p1, p2, p3}, tol);
    CHECK(p3 == Approx(-0.168));
  }
  SECTION("nesterov with weight decay") {  // g' = g + 0.1·p; b = 0.9·b + g'; p -= 0.5·(g' + 0.9·b)
    const double g1 = 0.5 + 0.1 * 1.0, b1 = g1, p1 = 1.0 - 0.5 * (g1 + 0.9 * b1);   // p 0.43
    const double g2 = -0.25 + 0.1 * p1, b2 = 0.9 * b1 + g2, p2 = p1 - 0.5 * (g2 + 0.9 * b2);  // p 0.38365
    const double g3 = 1.0 + 0.1 * p2, b3 = 0.9 * b2 + g3, p3 = p2 - 0.5 * (g3 + 0.9 * b3);    // p -0.73766175
    check_steps<TestType>(run_three<TestType, optim::Sgd>({.momentum = 0.9, .weight_decay = 0.1, .nesterov = true}, 0.5),
                          {p1, p2, p3}, tol);
    CHECK(p2 == Approx(0.38365));
    CHECK(p3 == Approx(-0.73766175));
  }
}

TEMPLATE_TEST_CASE("adamw: three steps by hand", "[optim][adamw]", double, float) {
  const double tol = std::is_same_v<TestType, double> ? 1e-13 : 2e-6;
  // lr 0.5, betas (0.9, 0.999), eps 1e-8, decoupled weight decay 0.1.
  double p = 1.0, m = 0.0, v = 0.0;
  std::vector<double> expected;
  int t = 0;
  for (double g : {0.5, -0.25, 1.0}) {
    ++t;
    p = p * (1.0 - 0.5 * 0.1);
    m = 0.9 * m + (1.0 - 0.9) * g;
    v = 0.999 * v + (1.0 - 0.999) * g * g;
    p = p - (0.5 / (1.0 - std::pow(0.9, t))) * m / (std::sqrt(v) / std::sqrt(1.0 - std::pow(0.999, t)) + 1e-8);
    expected.push_back(p);
  }
  // Step 1 of Adam moves by lr·sign(g) (up to eps): 0.95 - 0.5.
  CHECK(expected[0] == Approx(0.45).epsilon(1e-7));
  check_steps<TestType>(run_three<TestType, optim::AdamW>({.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1}, 0.5),
                        expected, tol);
}

TEST_CASE("optimizer: over parameters equals over sub-ranges of one flat buffer", "[optim]") {
  auto gen = dpml::test::rng(11);
  Param<float> a("a", Shape{3, 4}, Init::constant(0)), b("b", Shape{5}, Init::constant(0));
  test::fill_uniform<float>(a.value().begin(), a.value().end(), gen);
  test::fill_uniform<float>(b.value().begin(), b.value().end(), gen);
  // The same values in one flat buffer, split into two ranges at an arbitrary point (a ZeRO shard boundary).
  std::vector<float> flat_v(17), flat_g(17);
  std::copy(a.value().begin(), a.value().end(), flat_v.begin());
  std::copy(b.value().begin(), b.value().end(), flat_v.begin() + 12);
  std::vector<Param<float>*> params{&a, &b};
  auto per_param = optim::Optimizer<optim::AdamW, float>::over(params, {.weight_decay = 0.05});
  auto ranges = optim::Optimizer<optim::AdamW, float>(
      {{"shard0", std::span(flat_v).first(7), std::span<const float>(flat_g).first(7)},
       {"shard1", std::span(flat_v).subspan(7), std::span<const float>(flat_g).subspan(7)}},
      {.weight_decay = 0.05});
  const optim::WarmupCosineLR schedule{.max_lr = 0.1, .min_lr = 0.01, .warmup_steps = 1, .decay_steps = 4};
  for (int s = 0; s < 4; ++s) {
    test::fill_uniform<float>(a.grad().begin(), a.grad().end(), gen);
    test::fill_uniform<float>(b.grad().begin(), b.grad().end(), gen);
    std::copy(a.grad().begin(), a.grad().end(), flat_g.begin());
    std::copy(b.grad().begin(), b.grad().end(), flat_g.begin() + 12);
    CHECK(per_param.step(schedule) == ranges.step(schedule));
  }
  for (int i = 0; i < 12; ++i) CHECK(a.value()[i] == flat_v[static_cast<std::size_t>(i)]);
  for (int i = 0; i < 5; ++i) CHECK(b.value()[i] == flat_v[static_cast<std::size_t>(12 + i)]);
  // State access names the slots and exposes the moments (what a checkpoint saves).
  CHECK(std::string(per_param.state_names()[1]) == "exp_avg_sq");
  CHECK(per_param.range(1).name == "b");
  CHECK(per_param.state(1, 0)[2] == ranges.state(1, 0)[7]);  // b[2] is flat element 14 = shard1[7]
  CHECK(per_param.state(0, 1)[3] > 0.0f);
}

TEST_CASE("optimizer: bad options and ranges are errors naming them", "[optim]") {
  std::vector<float> v(3), g(2);
  CHECK(test::error_of([&] { optim::Optimizer<optim::Sgd, float>({{"w", v, g}}, {}); }).find("range 'w'") != std::string::npos);
  std::vector<float> g3(3);
  CHECK(test::error_of([&] { optim::Optimizer<optim::Sgd, float>({{"w", v, g3}}, {.nesterov = true}); }).find("Nesterov") != std::string::npos);
  CHECK(test::error_of([&] { optim::Optimizer<optim::AdamW, float>({{"w", v, g3}}, {.beta2 = 1.0}); }).find("beta2 1") != std::string::npos);
  optim::Optimizer<optim::Sgd, float> opt({{"w", v, g3}}, {});
  CHECK(test::error_of([&] { opt.step(std::nan("")); }).find("learning rate nan at step 1") != std::string::npos);
}

TEST_CASE("optimizer: state and step count restored into a new optimizer continue the same run", "[optim]") {
  auto gen = dpml::test::rng(12);
  std::vector<double> v(6), g(6);
  test::fill_uniform<double>(v.begin(), v.end(), gen);
  std::vector<double> v_resumed;
  std::vector<std::vector<double>> grads(5, std::vector<double>(6));
  for (auto& s : grads) test::fill_uniform<double>(s.begin(), s.end(), gen);
  const optim::StepLR schedule{.lr = 0.05, .step_size = 2, .gamma = 0.5};

  optim::Optimizer<optim::AdamW, double> whole({{"w", v, g}}, {});
  for (int s = 0; s < 3; ++s) {
    g = grads[static_cast<std::size_t>(s)];
    whole.step(schedule);
  }
  // "Checkpoint" after 3 steps: values, both moments and the step count.
  v_resumed = v;
  std::vector<double> g_resumed(6);
  optim::Optimizer<optim::AdamW, double> resumed({{"w", v_resumed, g_resumed}}, {});
  for (std::size_t k = 0; k < 2; ++k) {
    const auto from = whole.state(0, k);
    std::copy(from.begin(), from.end(), resumed.state(0, k).begin());
  }
  resumed.set_step_count(whole.step_count());
  for (int s = 3; s < 5; ++s) {
    g = g_resumed = grads[static_cast<std::size_t>(s)];
    CHECK(whole.step(schedule) == resumed.step(schedule));
  }
  CHECK(v_resumed == v);  // bit for bit
  CHECK(whole.step_count() == 5);
}

TEST_CASE("optimizer: bf16 parameters keep fp32 master weights and state, the values the master rounded", "[optim][mixed]") {
  // One AdamW run on float values and one on bf16 values that start equal, with the same (bf16)
  // gradients: the bf16 run's master weights and moments are the float run's bit for bit, and every
  // bf16 value is its master rounded to nearest even.
  const std::size_t n = 37;
  auto gen = dpml::test::rng(21);
  std::vector<float> vf(n), gf(n);
  std::vector<bf16> vb(n), gb(n);
  test::fill_uniform<float>(vf.begin(), vf.end(), gen);
  for (std::size_t i = 0; i < n; ++i) vf[i] = static_cast<float>(vb[i] = bf16(vf[i]));
  const optim::AdamWOptions o{.weight_decay = 0.1};
  optim::Optimizer<optim::AdamW, float> f({{"w", vf, gf}}, o);
  optim::Optimizer<optim::AdamW, bf16> b({{"w", vb, gb}}, o);
  static_assert(decltype(b)::keeps_master && !decltype(f)::keeps_master);
  static_assert(std::is_same_v<decltype(b)::master_type, float>);
  for (int s = 0; s < 3; ++s) {
    for (std::size_t i = 0; i < n; ++i) gf[i] = static_cast<float>(gb[i] = bf16(static_cast<float>(std::sin(0.3 * i + s))));
    f.step(0.05);
    b.step(0.05);
  }
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    bad += b.master(0)[i] != vf[i] || vb[i].bits != bf16(vf[i]).bits;
    for (std::size_t k = 0; k < 2; ++k) bad += b.state(0, k)[i] != f.state(0, k)[i];
  }
  CHECK(bad == 0);
  // The master again from the values (a checkpoint wrote them).
  vb[3] = bf16(2.5f);
  b.reload_master();
  CHECK(b.master(0)[3] == 2.5f);
}

TEST_CASE("optimizer: a gradient scale multiplies the gradients; a non-finite one skips the update", "[optim]") {
  std::vector<double> v{1.0, -2.0}, g{0.5, 0.25}, w = v, h{0.25, 0.125};
  optim::Optimizer<optim::Sgd, double> scaled({{"w", v, g}}, {.momentum = 0.9}), halved({{"w", w, h}}, {.momentum = 0.9});
  const double half = 0.5, inf = std::numeric_limits<double>::infinity();
  scaled.step(0.1, &half);
  halved.step(0.1);
  CHECK(v == w);
  const auto kept = v;
  scaled.step(0.1, &inf);
  CHECK(v == kept);
  CHECK(scaled.state(0, 0)[0] == halved.state(0, 0)[0]);
}

TEMPLATE_TEST_CASE("optimizer: offloaded (state and update on the host, over mirrors) equals the plain one bit for bit",
                   "[optim][offload]", float, bf16) {
  // Two ranges and an empty one between them, AdamW, a gradient scale, a skipped step, a reload of
  // the master from the values: the offloaded optimizer's values, state and master are the plain
  // one's, with the whole update in one chunk of its pipeline and in chunks of 5 elements (the
  // host update of one chunk at a time; a chunk across the ranges' boundary).
  using T = TestType;
  const std::int64_t chunk = GENERATE(std::int64_t{0}, std::int64_t{5});
  CAPTURE(chunk);
  const std::size_t n = 29, m = 7;
  auto gen = dpml::test::rng(5);
  std::vector<float> init(n + m);
  test::fill_uniform<float>(init.begin(), init.end(), gen);
  std::vector<T> va(init.begin(), init.end()), vb = va, ga(n + m), gb(n + m);
  const auto ranges = [&](std::vector<T>& v, std::vector<T>& g) {
    return std::vector<optim::Range<T>>{{"a", std::span<T>(v.data(), n), std::span<const T>(g.data(), n)},
                                        {"empty", std::span<T>(v.data() + n, 0), std::span<const T>(g.data() + n, 0)},
                                        {"b", std::span<T>(v.data() + n, m), std::span<const T>(g.data() + n, m)}};
  };
  using Opt = optim::Optimizer<optim::AdamW, T>;
  const optim::AdamWOptions o{.weight_decay = 0.1};
  Opt plain(ranges(va, ga), o, kernels::host_device()), offloaded(ranges(vb, gb), o, kernels::host_device(), true);
  CHECK((plain.state_on_host() && offloaded.state_on_host()));  // on the host either way
  if (chunk > 0) offloaded.set_offload_chunk(chunk);
  using M = typename Opt::master_type;
  const M half = M(0.5), inf = std::numeric_limits<M>::infinity();
  for (int s = 0; s < 4; ++s) {
    for (std::size_t i = 0; i < n + m; ++i) ga[i] = gb[i] = T(static_cast<float>(std::cos(0.7 * i + s)));
    const M* scale = s == 1 ? &half : s == 2 ? &inf : nullptr;  // step 3 skips
    plain.step(0.05, scale);
    offloaded.step(0.05, scale);
    if (s == 2) {  // a skipped step does not count (as DistributedOptimizer does)
      plain.set_step_count(plain.step_count() - 1);
      offloaded.set_step_count(offloaded.step_count() - 1);
    }
  }
  vb[2] = va[2] = T(2.5f);  // a checkpoint wrote a value (and, with master weights, reloads them)
  if constexpr (Opt::keeps_master) {
    plain.reload_master();
    offloaded.reload_master();
  }
  for (std::size_t i = 0; i < n + m; ++i) ga[i] = gb[i] = T(0.125f);
  plain.step(0.05);
  offloaded.step(0.05);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n + m; ++i) bad += std::memcmp(&va[i], &vb[i], sizeof(T)) != 0;
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t k = 0; k < Opt::kStates; ++k) {
      const auto x = plain.state(r, k), y = offloaded.state(r, k);
      bad += !std::equal(x.begin(), x.end(), y.begin());
    }
  if constexpr (Opt::keeps_master)
    for (std::size_t r = 0; r < 3; ++r) {
      const auto x = plain.master(r), y = offloaded.master(r);
      bad += !std::equal(x.begin(), x.end(), y.begin());
    }
  CHECK(bad == 0);
  CHECK(offloaded.step_count() == plain.step_count());
  CHECK(va[0] != T(init[0]));  // it trained
}

TEST_CASE("optimizer: the host update over several threads equals one thread bit for bit", "[optim]") {
  // Enough elements for 3 threads (4 Mi each at least), in spans whose ends do not meet the cut.
  const std::int64_t sizes[] = {5'000'001, 3, 7'654'321};
  std::vector<std::vector<float>> v1, g, v3;
  auto gen = dpml::test::rng(9);
  for (auto n : sizes) {
    v1.emplace_back(static_cast<std::size_t>(n));
    g.emplace_back(static_cast<std::size_t>(n));
    test::fill_uniform<float>(v1.back().begin(), v1.back().end(), gen);
    test::fill_uniform<float>(g.back().begin(), g.back().end(), gen);
  }
  v3 = v1;
  const auto ranges = [&](std::vector<std::vector<float>>& v) {
    std::vector<optim::Range<float>> r;
    for (std::size_t i = 0; i < v.size(); ++i) r.push_back({std::to_string(i), v[i], g[i]});
    return r;
  };
  optim::Optimizer<optim::AdamW, float> one(ranges(v1), {.weight_decay = 0.1}), three(ranges(v3), {.weight_decay = 0.1});
  const int before = kernels::host::blas_threads();
  kernels::host::set_blas_threads(1);
  one.step(0.01);
  one.step(0.01);
  kernels::host::set_blas_threads(3);
  three.step(0.01);
  three.step(0.01);
  kernels::host::set_blas_threads(before);
  std::size_t differ = 0;  // (counted: Catch2 would print the vectors)
  for (std::size_t i = 0; i < 3; ++i) {
    differ += !std::equal(v1[i].begin(), v1[i].end(), v3[i].begin());
    differ += !std::equal(one.state(i, 1).begin(), one.state(i, 1).end(), three.state(i, 1).begin());
  }
  CHECK(differ == 0);
  CHECK(v1[2][7'000'000] != g[2][7'000'000]);  // (it updated)
}
