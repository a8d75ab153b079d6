// Synchronised BatchNorm2d: K ranks, each with its slice of a global batch, compute exactly what
// one rank computes over the whole batch — outputs, dL/dx, the summed dweight and dbias, and the
// running statistics; also when the slices differ in size (the loader's split of a batch that K
// does not divide: the count travels with the sums), with the fused ReLU.
#include "grad_check.hpp"
#include "test.hpp"

#include <dpml/layers/batch_norm.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/parallel/grid.hpp>

#include <vector>

using namespace dpml;
using Ctx = layers::Context<HostSpace>;

TEST_CASE("BatchNorm2d with synchronised statistics equals one rank over the concatenated batch", "[layers][mpi]") {
  auto world = test::world();
  const auto grid = parallel::ProcessGrid::create(world, {});
  const int K = grid.dp(), r = grid.coord(parallel::Axis::data);
  const std::int64_t N = 12, C = 3, H = 2, W = 3, per = N / K, S = C * H * W;
  REQUIRE(N % K == 0);
  auto gen = test::rng(21);
  auto x = test::random_tensor<double>(Shape{N, C, H, W}, gen, -1, 2);
  auto dy = test::random_tensor<double>(Shape{N, C, H, W}, gen);
  std::vector<double> gamma(C), beta(C);
  test::fill_uniform<double>(gamma.begin(), gamma.end(), gen, 0.5, 1.5);
  test::fill_uniform<double>(beta.begin(), beta.end(), gen);

  auto make = [&](bool sync) {
    layers::BatchNorm2d<double> bn(C, {.sync = sync});
    auto ps = bn.parameters();
    std::copy(gamma.begin(), gamma.end(), ps[0]->value().begin());
    std::copy(beta.begin(), beta.end(), ps[1]->value().begin());
    for (auto* p : ps) std::fill(p->grad().begin(), p->grad().end(), 0.0);
    return bn;
  };
  Ctx one;  // one rank, whole batch
  auto whole = make(false);
  const auto y1 = whole.forward(one, x.cview());
  const auto dx1 = whole.backward_input(one, dy.cview());
  whole.backward_weight(one, dy.cview());

  Ctx ctx;
  ctx.grid = &grid;
  auto part = make(true);
  const auto xs = x.cview().slice(0, r * per, (r + 1) * per), dys = dy.cview().slice(0, r * per, (r + 1) * per);
  const auto yk = part.forward(ctx, xs);
  const auto dxk = part.backward_input(ctx, dys);
  part.backward_weight(ctx, dys);

  const std::vector<double> y1s(y1.begin() + r * per * S, y1.begin() + (r + 1) * per * S);
  const std::vector<double> dx1s(dx1.begin() + r * per * S, dx1.begin() + (r + 1) * per * S);
  CHECK(test::rel_error(yk, y1s) < 1e-13);
  CHECK(test::rel_error(dxk, dx1s) < 1e-12);
  for (int i = 0; i < 2; ++i) {  // the data-parallel reduction sums the ranks' parameter gradients
    auto g = part.parameters()[static_cast<std::size_t>(i)]->grad();
    std::vector<double> sum(g.begin(), g.end());
    world.allreduce(sum.data(), sum.size(), comm::ReduceOp::sum);
    CHECK(test::rel_error(sum, whole.parameters()[static_cast<std::size_t>(i)]->grad()) < 1e-13);
  }
  CHECK(test::rel_error(part.running_mean(), whole.running_mean()) < 1e-14);
  CHECK(test::rel_error(part.running_var(), whole.running_var()) < 1e-14);

  // Without sync, K > 1 ranks see only their own statistics: the test above is not vacuous.
  if (K > 1) {
    auto local = make(false);
    CHECK(test::rel_error(local.forward(ctx, xs), y1s) > 1e-3);
  }
}

TEST_CASE("BatchNorm2d synchronised over slices of different sizes, with its fused ReLU", "[layers][mpi]") {
  auto world = test::world();
  const auto grid = parallel::ProcessGrid::create(world, {});
  const int K = grid.dp(), r = grid.coord(parallel::Axis::data);
  const std::int64_t N = 2 * K + 1, C = 4, H = 3, W = 2, per = C * H * W;
  const std::int64_t lo = r * N / K, hi = (r + 1) * N / K;  // the loader's split: sizes differ by one
  auto gen = test::rng(22);
  auto x = test::random_tensor<double>(Shape{N, C, H, W}, gen, -1, 2);
  auto dy = test::random_tensor<double>(Shape{N, C, H, W}, gen);
  auto make = [&](bool sync) {
    layers::BatchNorm2d<double> bn(C, {.sync = sync, .relu = true});
    auto g2 = test::rng(5);
    test::randomise_parameters(bn, g2);
    for (auto* p : bn.parameters()) layers::zero_grad(*p);
    return bn;
  };
  Ctx one;
  auto whole = make(false);
  const auto y1 = whole.forward(one, x.cview());
  const auto dx1 = whole.backward_input(one, dy.cview());
  whole.backward_weight(one, dy.cview());

  Ctx ctx;
  ctx.grid = &grid;
  auto part = make(true);
  const auto xs = x.cview().slice(0, lo, hi), dys = dy.cview().slice(0, lo, hi);
  CHECK(test::rel_error(part.forward(ctx, xs), std::vector<double>(y1.begin() + lo * per, y1.begin() + hi * per)) < 1e-13);
  CHECK(test::rel_error(part.backward_input(ctx, dys), std::vector<double>(dx1.begin() + lo * per, dx1.begin() + hi * per)) <
        1e-12);
  part.backward_weight(ctx, dys);
  for (std::size_t i = 0; i < 2; ++i) {
    auto g = part.parameters()[i]->grad();
    std::vector<double> sum(g.begin(), g.end());
    world.allreduce(sum.data(), sum.size(), comm::ReduceOp::sum);
    CHECK(test::rel_error(sum, whole.parameters()[i]->grad()) < 1e-13);
  }
  CHECK(test::rel_error(part.running_mean(), whole.running_mean()) < 1e-14);
  CHECK(test::rel_error(part.running_var(), whole.running_var()) < 1e-14);
}
