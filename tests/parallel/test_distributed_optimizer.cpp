// DistributedOptimizer equals one process applying the rule (AdamW, SGD with Nesterov momentum;
// with clipping) to the summed gradient, with and without ZeRO-1, on any number of data ranks; the
// norm counts tensor-parallel replicas and duplicates once; a non-finite norm skips the update;
// the optimizer state read and written by name is the same with and without ZeRO.
#include "test.hpp"

#include <dpml/optim/adamw.hpp>
#include <dpml/optim/clip.hpp>
#include <dpml/optim/sgd.hpp>
#include <dpml/parallel/distributed_optimizer.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>
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

template <class Rule>
typename Rule::Options options_of() {
  if constexpr (std::is_same_v<Rule, optim::AdamW>) return {.weight_decay = 0.1};
  else return {.momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
}

// Each rank's gradients of step `step`, reported in backward order; edit(k, grad) may change
// parameter k's before it is reported.
template <class Opt, class Edit = void (*)(std::size_t, TensorView<double>)>
void backward(Opt& opt, Params& ps, int rank, int step, Edit edit = [](std::size_t, TensorView<double>) {}) {
  opt.begin_step(1);
  for (std::size_t k = ps.ptrs.size(); k-- > 0;) {
    auto g = ps.ptrs[k]->grad();
    for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = grad_of(rank, k, i, step);
    edit(k, g);
    ParamBase* one[] = {ps.ptrs[k]};
    opt.on_grad_ready(one);
  }
}
}  // namespace

TEMPLATE_TEST_CASE("distributed optimizer: equals the sequential rule on the summed gradient", "[data][zero]",
                   optim::AdamW, optim::Sgd) {
  using Rule = TestType;
  const auto world = test::world();
  const int p = world.size();
  auto grid = ProcessGrid::create(world, {});
  for (bool zero : {false, true})
    for (double clip : {0.0, 0.5}) {
      CAPTURE(zero, clip);
      Params dist, seq;
      parallel::DistributedOptimizer<Rule, double> opt(dist.ptrs, &grid, options_of<Rule>(),
                                                       {.bucket_bytes = 256, .zero = zero, .clip = clip});
      auto ref = optim::Optimizer<Rule, double>::over(seq.ptrs, options_of<Rule>());
      for (int step = 1; step <= 3; ++step) {
        backward(opt, dist, world.rank(), step);
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
        CHECK_FALSE(report.skipped);
        if (clip > 0) optim::clip_grad_norm(seq.ptrs, clip);
        ref.step(1e-2);
      }
      CHECK(opt.optimizer().step_count() == 3);
      double worst = 0;
      for (std::size_t k = 0; k < seq.ptrs.size(); ++k) worst = std::max(worst, test::rel_error(dist.ptrs[k]->value(), seq.ptrs[k]->value()));
      CHECK(worst < 1e-12);
      // The state by name (collective under ZeRO) equals the sequential optimizer's.
      for (std::size_t k = 0; k < seq.ptrs.size(); ++k) {
        const auto got = opt.read_state(Rule::state_names[0], *dist.ptrs[k]);
        const auto want = ref.state(k, 0);
        CHECK(test::rel_error(got, want) < 1e-12);
      }
    }
}

TEST_CASE("distributed optimizer: the norm counts tensor-parallel replicas and duplicates once", "[data][tp]") {
  const auto world = test::world();
  if (world.size() % 2 != 0) return;  // tp 2
  auto grid = ProcessGrid::create(world, {.tp = 2});
  const int tp = grid.coord(Axis::tensor), dp = grid.coord(Axis::data);
  for (bool zero : {false, true}) {
    CAPTURE(zero);
    // A tensor-parallel shard (different on each tensor rank), a replicated tensor (the same on
    // both: layers sum its gradient over the tensor axis) and a duplicate (counted by its owner).
    Param<double> shard("shard", Shape{37}, Init::constant(0), Sharding::split(0));
    Param<double> replica("replica", Shape{11}, Init::constant(0));
    Param<double> copy("copy", Shape{5}, Init::constant(0));
    copy.mark_duplicate();
    std::vector<Param<double>*> ps{&shard, &replica, &copy};
    parallel::DistributedOptimizer<optim::Sgd, double> opt(ps, &grid, {}, {.bucket_bytes = 64, .zero = zero});
    opt.begin_step(1);
    auto fill = [&](Param<double>& q, double base, int rank) {
      auto g = q.grad();
      for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = base + 0.01 * i + 0.1 * rank;
    };
    fill(shard, 1.0 + tp, dp);
    fill(replica, 2.0, dp);
    fill(copy, 3.0, dp);
    const auto report = opt.finish_step(0.0);
    double sq = 0;  // the global model: both shards, the replica once, no copy; summed over dp
    for (int t = 0; t < 2; ++t)
      for (std::int64_t i = 0; i < 37; ++i) {
        double g = 0;
        for (int d = 0; d < grid.dp(); ++d) g += 1.0 + t + 0.01 * i + 0.1 * d;
        sq += g * g;
      }
    for (std::int64_t i = 0; i < 11; ++i) {
      double g = 0;
      for (int d = 0; d < grid.dp(); ++d) g += 2.0 + 0.01 * i + 0.1 * d;
      sq += g * g;
    }
    CHECK(report.grad_norm == test::Approx(std::sqrt(sq)).epsilon(1e-12));
  }
}

TEST_CASE("distributed optimizer: a non-finite norm skips the update and the step", "[data]") {
  const auto world = test::world();
  auto grid = ProcessGrid::create(world, {});
  for (bool zero : {false, true}) {
    CAPTURE(zero);
    Params ps;
    std::vector<std::vector<double>> before;
    for (auto* q : ps.ptrs) before.emplace_back(q->value().begin(), q->value().end());
    parallel::DistributedOptimizer<optim::AdamW, double> opt(ps.ptrs, &grid, {}, {.bucket_bytes = 256, .zero = zero, .clip = 1.0});
    backward(opt, ps, world.rank(), 1, [&](std::size_t k, TensorView<double> g) {
      if (k == 2 && world.rank() == world.size() - 1) g[5] = std::numeric_limits<double>::infinity();  // one rank overflows
    });
    const auto report = opt.finish_step(1e-2);
    CHECK(report.skipped);
    CHECK_FALSE(std::isfinite(report.grad_norm));
    CHECK(opt.optimizer().step_count() == 0);
    for (std::size_t k = 0; k < ps.ptrs.size(); ++k)
      CHECK(std::vector<double>(ps.ptrs[k]->value().begin(), ps.ptrs[k]->value().end()) == before[k]);
    backward(opt, ps, world.rank(), 2);  // the next, finite step updates
    CHECK_FALSE(opt.finish_step(1e-2).skipped);
    CHECK(opt.optimizer().step_count() == 1);
  }
}

TEST_CASE("distributed optimizer: state written by name is read back alike with and without ZeRO", "[data][zero]") {
  const auto world = test::world();
  auto grid = ProcessGrid::create(world, {});
  Params a, b;
  parallel::DistributedOptimizer<optim::AdamW, double> plain(a.ptrs, &grid, {}, {.bucket_bytes = 256});
  parallel::DistributedOptimizer<optim::AdamW, double> sharded(b.ptrs, &grid, {}, {.bucket_bytes = 256, .zero = true});
  CHECK(plain.state_slots() == std::vector<std::string>{"exp_avg", "exp_avg_sq", "master"});
  for (std::size_t k = 0; k < a.ptrs.size(); ++k) {
    std::vector<double> v(static_cast<std::size_t>(a.ptrs[k]->numel()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 100.0 * static_cast<double>(k) + static_cast<double>(i);
    plain.write_state("exp_avg_sq", *a.ptrs[k], v);  // every rank the same values
    sharded.write_state("exp_avg_sq", *b.ptrs[k], v);
  }
  for (std::size_t k = 0; k < a.ptrs.size(); ++k) {
    const auto x = plain.read_state("exp_avg_sq", *a.ptrs[k]), y = sharded.read_state("exp_avg_sq", *b.ptrs[k]);
    CHECK(x == y);
    CHECK(x.back() == 100.0 * static_cast<double>(k) + static_cast<double>(x.size() - 1));
    CHECK(plain.read_state("master", *a.ptrs[k]) == std::vector<double>(a.ptrs[k]->value().begin(), a.ptrs[k]->value().end()));
  }
  CHECK(test::error_of([&] { (void)plain.read_state("momentum", 0, 1); }).find("slots: exp_avg, exp_avg_sq, master") !=
        std::string::npos);
}

TEST_CASE("distributed optimizer: ZeRO-2 equals the sequential rule with micro-batches reported in any order", "[data][zero]") {
  // Three micro-batches per step, each adding (mb + 1) · grad_of to every parameter, reported
  // micro-batch by micro-batch (1F1B), parameter by parameter (every micro-batch of one parameter
  // first: chunks whose backward passes interleave), or with the micro-batches of the even and
  // odd parameters crossed. A round of a bucket closes once all its parameters reported; what is
  // written after that opens the next round in a slot of its own.
  const auto world = test::world();
  const int p = world.size(), m = 3;
  auto grid = ProcessGrid::create(world, {});
  for (int order = 0; order < 3; ++order) {
    CAPTURE(order);
    Params dist, seq;
    parallel::DistributedOptimizer<optim::AdamW, double> opt(
        dist.ptrs, &grid, options_of<optim::AdamW>(), {.bucket_bytes = 256, .zero = true, .shard_gradients = true, .clip = 0.5});
    auto ref = optim::Optimizer<optim::AdamW, double>::over(seq.ptrs, options_of<optim::AdamW>());
    const std::size_t n = dist.ptrs.size();
    std::vector<std::pair<std::size_t, int>> events;  // (parameter, micro-batch)
    for (int mb = 0; mb < m; ++mb)
      for (std::size_t k = n; k-- > 0;) events.emplace_back(k, mb);
    if (order == 1) std::stable_sort(events.begin(), events.end(), [](auto a, auto b) { return a.first > b.first; });
    if (order == 2)
      for (auto& [k, mb] : events) mb = k % 2 == 0 ? mb : m - 1 - mb;
    for (int step = 1; step <= 3; ++step) {
      opt.begin_step(m);
      for (const auto& [k, mb] : events) {
        auto g = dist.ptrs[k]->grad();
        for (std::int64_t i = 0; i < g.numel(); ++i) g[i] += (mb + 1) * grad_of(world.rank(), k, i, step);
        ParamBase* one[] = {dist.ptrs[k]};
        opt.on_grad_ready(one);
      }
      const auto report = opt.finish_step(1e-2);
      double sq = 0;
      for (std::size_t k = 0; k < n; ++k) {
        auto g = seq.ptrs[k]->grad();
        for (std::int64_t i = 0; i < g.numel(); ++i) {
          g[i] = 0;
          for (int r = 0; r < p; ++r) g[i] += (1 + 2 + 3) * grad_of(r, k, i, step);
          sq += g[i] * g[i];
        }
      }
      CHECK(report.grad_norm == test::Approx(std::sqrt(sq)).epsilon(1e-12));
      optim::clip_grad_norm(seq.ptrs, 0.5);
      ref.step(1e-2);
    }
    double worst = 0;
    for (std::size_t k = 0; k < n; ++k) worst = std::max(worst, test::rel_error(dist.ptrs[k]->value(), seq.ptrs[k]->value()));
    CHECK(worst < 1e-12);
    // No whole gradient buffer; the pool stays small; outside a step there are no gradients.
    CHECK(opt.flat().grads().data() == nullptr);
    std::int64_t largest = 0;
    for (const auto& b : opt.flat().buckets()) largest = std::max(largest, b.count);
    CHECK(opt.buckets().slot_elements() >= largest);
    CHECK(opt.buckets().slot_elements() <= 4 * largest);  // the pool: 4 slots at most here
    CHECK(test::error_of([&] { (void)dist.ptrs[0]->grad(); }).find("has no gradient outside a training step") != std::string::npos);
  }
}

TEST_CASE("distributed optimizer: ZeRO-3 counts its gathers of the weights in the step's bytes", "[data][zero]") {
  // One read of every value inside the step: each bucket gathered once (its 1/p part sent to the
  // p − 1 others), beside the reduce-scatter of its gradient.
  const auto world = test::world();
  const int p = world.size();
  auto grid = ProcessGrid::create(world, {});
  Params dist;
  parallel::DistributedOptimizer<optim::AdamW, double> opt(
      dist.ptrs, &grid, options_of<optim::AdamW>(),
      {.bucket_bytes = 8, .zero = true, .shard_gradients = true, .shard_values = true, .clip = 0.5});
  backward(opt, dist, world.rank(), 1);
  for (auto* q : dist.ptrs) (void)q->value();
  const auto report = opt.finish_step(1e-2);
  std::int64_t want = 0;
  for (const auto& b : opt.flat().buckets())
    want += parallel::wire_bytes::reduce_scatter(b.count, 8, p) + parallel::wire_bytes::allgather(b.count / p, 8, p);
  CHECK(report.wire_bytes == (p > 1 ? want : 0));
  CHECK(report.dense_bytes == report.wire_bytes);
}

TEST_CASE("distributed optimizer: ZeRO-3 equals the sequential rule, its values gathered when read and kept when written", "[data][zero]") {
  // Buckets of one element at least: every parameter a bucket of its own, more than the
  // kZero3Slots a pool gathers at once, so reading them in turn gives slots back.
  const bool prefetch = GENERATE(true, false);  // the next bucket gathered ahead of its read, or not
  CAPTURE(prefetch);
  const auto world = test::world();
  const int p = world.size();
  auto grid = ProcessGrid::create(world, {});
  Params dist, seq;
  const std::size_t n = dist.ptrs.size();
  std::vector<std::vector<double>> last(n);
  {
    parallel::DistributedOptimizer<optim::AdamW, double> opt(
        dist.ptrs, &grid, options_of<optim::AdamW>(),
        {.bucket_bytes = 8, .zero = true, .shard_gradients = true, .shard_values = true, .prefetch_values = prefetch,
         .clip = 0.5});
    REQUIRE(opt.flat().buckets().size() > parallel::kZero3Slots);
    CHECK(opt.flat().values().data() == nullptr);  // no whole values buffer
    auto ref = optim::Optimizer<optim::AdamW, double>::over(seq.ptrs, options_of<optim::AdamW>());
    for (int step = 1; step <= 3; ++step) {
      backward(opt, dist, world.rank(), step);
      (void)opt.finish_step(1e-2);
      for (std::size_t k = 0; k < n; ++k) {
        auto g = seq.ptrs[k]->grad();
        for (std::int64_t i = 0; i < g.numel(); ++i) {
          g[i] = 0;
          for (int r = 0; r < p; ++r) g[i] += grad_of(r, k, i, step);
        }
      }
      optim::clip_grad_norm(seq.ptrs, 0.5);
      ref.step(1e-2);
      double worst = 0;  // every value read: each bucket gathered, the oldest given back
      for (std::size_t k = 0; k < n; ++k) worst = std::max(worst, test::rel_error(dist.ptrs[k]->value(), seq.ptrs[k]->value()));
      CAPTURE(step);
      CHECK(worst < 1e-12);
    }
    // Steps 2 and 3 read the buckets in step 1's order: each read but the first of a step was
    // gathered ahead (one data rank gathers nothing).
    const auto buckets = static_cast<std::int64_t>(opt.flat().buckets().size());
    CHECK(opt.buckets().prefetched_reads() == (prefetch && p > 1 ? 2 * (buckets - 1) : 0));
    // "master" by name is the values (no master copy in double), read from the shards.
    for (std::size_t k = 0; k < n; ++k) {
      const auto gathered = std::vector<double>(dist.ptrs[k]->value().begin(), dist.ptrs[k]->value().end());
      CHECK(opt.read_state("master", *dist.ptrs[k]) == gathered);
    }
    // A write through a value (as a checkpoint's load writes) is kept once its bucket gives its slot back…
    for (std::size_t k = 0; k < n; ++k) dist.ptrs[k]->value()[0] = 1000.0 + static_cast<double>(k);
    for (std::size_t k = 0; k < n; ++k) CHECK(opt.read_state("master", *dist.ptrs[k])[0] == 1000.0 + static_cast<double>(k));
    // … and one by name is what the next read of the value sees.
    std::vector<double> written(static_cast<std::size_t>(dist.ptrs[2]->numel()), -1.5);
    opt.write_state("master", *dist.ptrs[2], written);
    CHECK(std::vector<double>(dist.ptrs[2]->value().begin(), dist.ptrs[2]->value().end()) == written);
    for (std::size_t k = 0; k < n; ++k) last[k].assign(dist.ptrs[k]->value().begin(), dist.ptrs[k]->value().end());
  }
  // The optimizer gone, every parameter holds its whole value again.
  for (std::size_t k = 0; k < n; ++k) CHECK(std::vector<double>(dist.ptrs[k]->value().begin(), dist.ptrs[k]->value().end()) == last[k]);
}

TEST_CASE("distributed optimizer: ZeRO-3 keeps the values one operation reads, whatever the pool gathered before", "[data][zero]") {
  // A linear layer reads its weight and its bias, then runs: two buckets at once. Here w0, w1, w2
  // fill the pool's kZero3Slots slots; then one operation reads w0 (still gathered, gathered
  // first), w3 and w4. Giving back the bucket gathered longest ago would hand w0's slot to w3 while
  // w0's view is still to be used; the bucket read longest ago (w1, then w2) goes instead.
  static_assert(parallel::kZero3Slots == 3, "the reads below fill exactly the pool");
  const bool prefetch = GENERATE(true, false);
  CAPTURE(prefetch);
  const auto world = test::world();
  auto grid = ProcessGrid::create(world, {});
  Params dist, want;
  parallel::DistributedOptimizer<optim::AdamW, double> opt(
      dist.ptrs, &grid, options_of<optim::AdamW>(),
      {.bucket_bytes = 8, .zero = true, .shard_gradients = true, .shard_values = true, .prefetch_values = prefetch});
  REQUIRE(opt.flat().buckets().size() == dist.ptrs.size());  // a bucket each
  for (const std::size_t k : {0, 1, 2}) (void)dist.ptrs[k]->value();
  const TensorView<double> operands[] = {dist.ptrs[0]->value(), dist.ptrs[3]->value(), dist.ptrs[4]->value()};
  const std::size_t read[] = {0, 3, 4};
  for (std::size_t i = 0; i < std::size(read); ++i) {
    CAPTURE(read[i]);
    CHECK(std::vector<double>(operands[i].begin(), operands[i].end()) ==
          std::vector<double>(want.ptrs[read[i]]->value().begin(), want.ptrs[read[i]]->value().end()));
  }
}

TEST_CASE("distributed optimizer: the optimizer offloaded to the host equals it in place, under every ZeRO stage", "[data][zero][offload]") {
  // On CPU ranks offload only adds the copies to and from the mirrors, so the two runs agree bit for
  // bit: values, state by name, and after a write of the weights by name (a checkpoint's load).
  const auto world = test::world();
  auto grid = ProcessGrid::create(world, {});
  for (int zero = 0; zero <= 3; ++zero) {
    CAPTURE(zero);
    Params plain, offloaded;
    const auto options = [&](bool offload) {
      return parallel::DistributedOptimizerOptions{.bucket_bytes = 64, .zero = zero > 0, .shard_gradients = zero >= 2,
                                                   .shard_values = zero == 3, .offload_optimizer = offload, .clip = 0.5};
    };
    parallel::DistributedOptimizer<optim::AdamW, double> a(plain.ptrs, &grid, options_of<optim::AdamW>(), options(false));
    parallel::DistributedOptimizer<optim::AdamW, double> b(offloaded.ptrs, &grid, options_of<optim::AdamW>(), options(true));
    const auto run = [&](int step) {
      backward(a, plain, world.rank(), step);
      backward(b, offloaded, world.rank(), step);
      CHECK(a.finish_step(1e-2).grad_norm == b.finish_step(1e-2).grad_norm);
    };
    run(1);
    run(2);
    std::vector<double> written(static_cast<std::size_t>(plain.ptrs[1]->numel()), 0.75);
    a.write_state("master", *plain.ptrs[1], written);
    b.write_state("master", *offloaded.ptrs[1], written);
    run(3);
    std::size_t differ = 0;
    for (std::size_t k = 0; k < plain.ptrs.size(); ++k) {
      const auto x = plain.ptrs[k]->value(), y = offloaded.ptrs[k]->value();
      differ += !std::equal(x.begin(), x.end(), y.begin());
      for (const char* slot : {"exp_avg", "exp_avg_sq", "master"})
        differ += a.read_state(slot, *plain.ptrs[k]) != b.read_state(slot, *offloaded.ptrs[k]);
    }
    CHECK(differ == 0);
    CHECK(plain.ptrs[1]->value()[0] != 0.75);  // the write was trained on
  }
}
