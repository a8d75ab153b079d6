// DistributedOptimizer equals one process applying AdamW (with clipping) to the summed gradient,
// with and without ZeRO-1, on any number of data ranks.
#include "test.hpp"

#include <dpml/optim/adamw.hpp>
#include <dpml/optim/clip.hpp>
#include <dpml/parallel/distributed_optimizer.hpp>

#include <memory>
#include <vector>

using namespace dpml;
using dpml::Init;
using dpml::Param;

namespace {
struct Params {
  std::vector<std::unique_ptr<Param<double>>> owned;
  std::vector<Param<double>*> ptrs;
  Params() {
    const std::int64_t sizes[] = {17, 3, 130, 1, 64};
    auto gen = test::rng(11);
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      owned.push_back(std::make_unique<Param<double>>("w" + std::to_string(i), Shape{sizes[i]}, Init::constant(0)));
      test::fill_uniform<double>(owned.back()->value().begin(), owned.back()->value().end(), gen);
      ptrs.push_back(owned.back().get());
    }
  }
};
double grad_of(int rank, std::size_t p, std::int64_t i, int step) { return std::sin(rank + 3.0 * p + 0.1 * i + step); }
}  // namespace

TEST_CASE("distributed optimizer: equals sequential AdamW on the summed gradient", "[data][zero]") {
  const auto world = test::world();
  const int p = world.size();
  auto grid = ProcessGrid::create(world, {});
  for (bool zero : {false, true})
    for (double clip : {0.0, 0.5}) {
      CAPTURE(zero, clip);
      Params dist, seq;
      parallel::DistributedOptimizer<optim::AdamW, double> opt(dist.ptrs, &grid, {.weight_decay = 0.1},
                                                               {.bucket_bytes = 256, .zero = zero, .clip = clip});
      auto ref = optim::Optimizer<optim::AdamW, double>::over(seq.ptrs, {.weight_decay = 0.1});
      for (int step = 1; step <= 3; ++step) {
        opt.begin_step(1);
        for (std::size_t k = dist.ptrs.size(); k-- > 0;) {
          auto g = dist.ptrs[k]->grad();
          for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = grad_of(world.rank(), k, i, step);
          ParamBase* one[] = {dist.ptrs[k]};
          opt.buckets().on_grad_ready(one);
        }
        const auto report = opt.finish_step(1e-2);

        double sq = 0;
        for (std::size_t k = 0; k < seq.ptrs.size(); ++k) {
          auto g = seq.ptrs[k]->grad();
          for (std::int64_t i = 0; i < g.numel(); ++i) {
            g[i] = 0;
            for (int r = 0; r < p; ++r) g[i] += grad_of(r, k, i, step);
            sq += g[i] * g[i];
          }
        }
        const double norm = std::sqrt(sq);
        CHECK(report.grad_norm == test::Approx(norm).epsilon(1e-12));
        if (clip > 0) optim::clip_grad_norm(seq.ptrs, clip);
        ref.step(1e-2);
      }
      double worst = 0;
      for (std::size_t k = 0; k < seq.ptrs.size(); ++k) worst = std::max(worst, test::rel_error(dist.ptrs[k]->value(), seq.ptrs[k]->value()));
      CHECK(worst < 1e-12);
    }
}
