// Flat buffers and gradient buckets: the layout (aligned offsets, buckets of whole parameters
// splitting into equal shards, zero padding), sums across the data axis, early start as parameters
// are reported, and the ZeRO-1 reduce-scatter / all-gather round trip, checked element by element.
#include "test.hpp"

#include <dpml/parallel/data.hpp>
#include <dpml/core/flat_parameters.hpp>

#include <memory>
#include <vector>

using namespace dpml;
using dpml::Init;
using dpml::Param;

namespace {
struct Model {
  std::vector<std::unique_ptr<Param<double>>> owned;
  std::vector<Param<double>*> params;
  explicit Model(std::vector<std::int64_t> sizes) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      owned.push_back(std::make_unique<Param<double>>("p" + std::to_string(i), Shape{sizes[i]}, Init::constant(0)));
      params.push_back(owned.back().get());
    }
  }
};
double grad_value(int rank, std::size_t param, std::int64_t i) { return rank * 1000.0 + param * 10.0 + i * 0.5; }
}  // namespace

TEST_CASE("buckets: all-reduce sums every gradient, buckets start as soon as they are complete", "[data]") {
  const auto world = test::world();
  const int p = world.size();
  Model m({5, 1, 7, 1000, 3, 64, 120});
  // Buckets of at least 100 doubles, whole parameters, filled from the last parameter.
  FlatParameters<double> flat(m.params, {.bucket_elements = 100});
  parallel::GradientBuckets<double> buckets(flat, &world);
  CHECK(buckets.bucket_count() == 3);  // [120] [64 3 1000] [7 1 5], from the back

  const int micro_batches = 2;
  buckets.begin_step(micro_batches);
  flat.zero_grads();
  for (int mb = 0; mb < micro_batches; ++mb)
    for (std::size_t k = m.params.size(); k-- > 0;) {  // backward order
      auto g = m.params[k]->grad();
      for (std::int64_t i = 0; i < g.numel(); ++i) g[i] += grad_value(world.rank(), k, i) / micro_batches;
      ParamBase* one[] = {m.params[k]};
      buckets.on_grad_ready(one);
      if (mb == 0) CHECK(buckets.buckets_started() == 0);  // not before the last micro-batch
    }
  CHECK(buckets.buckets_started() == buckets.bucket_count());  // all started during "backward"
  buckets.finish();

  std::size_t bad = 0;
  for (std::size_t k = 0; k < m.params.size(); ++k) {
    auto g = m.params[k]->grad();
    for (std::int64_t i = 0; i < g.numel(); ++i) {
      double expect = 0;
      for (int r = 0; r < p; ++r) expect += grad_value(r, k, i);
      bad += std::abs(g[i] - expect) > 1e-9 * std::abs(expect);
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("buckets: a held bucket waits for finish()", "[data]") {
  const auto world = test::world();
  Model m({10, 20});
  FlatParameters<double> flat(m.params, {.bucket_elements = 1});  // one bucket per parameter
  parallel::GradientBuckets<double> buckets(flat, &world);
  REQUIRE(buckets.bucket_count() == 2);
  buckets.hold(m.params[0]);
  buckets.begin_step(1);
  for (auto& x : flat.grads()) x = 1.0;
  ParamBase* both[] = {m.params[1], m.params[0]};
  buckets.on_grad_ready(both);
  CHECK(buckets.buckets_started() == 1);
  for (auto& x : m.params[0]->grad()) x = 2.0;  // e.g. a tied gradient summed in after backward
  buckets.finish();
  for (auto x : m.params[0]->grad()) REQUIRE(x == 2.0 * world.size());
  for (auto x : m.params[1]->grad()) REQUIRE(x == world.size());
}

TEST_CASE("buckets: unreported parameters are reduced by finish() (no hang)", "[data]") {
  const auto world = test::world();
  Model m({10, 20});
  FlatParameters<double> flat(m.params, {.bucket_elements = 1});
  parallel::GradientBuckets<double> buckets(flat, &world);
  buckets.begin_step(1);
  for (auto& x : flat.grads()) x = 1.0;
  buckets.finish();
  for (auto x : flat.grads()) REQUIRE(x == world.size());
}

TEST_CASE("buckets: ZeRO-1 reduce-scatter gives each rank its summed shard; all-gather restores values", "[data][zero]") {
  const auto world = test::world();
  const int p = world.size();
  Model m({13, 1, 250, 7});
  FlatParameters<double> flat(m.params, {.bucket_elements = 40, .shards = p});
  parallel::GradientBuckets<double> buckets(flat, &world, parallel::GradReduction::reduce_scatter);
  buckets.begin_step(1);
  for (std::size_t k = m.params.size(); k-- > 0;) {
    auto g = m.params[k]->grad();
    for (std::int64_t i = 0; i < g.numel(); ++i) g[i] = grad_value(world.rank(), k, i);
    ParamBase* one[] = {m.params[k]};
    buckets.on_grad_ready(one);
  }
  buckets.finish();

  // Expected summed gradient at each flat index (padding: 0).
  std::vector<double> expect(static_cast<std::size_t>(flat.numel()));
  for (std::size_t k = 0; k < m.params.size(); ++k)
    for (std::int64_t i = 0; i < m.params[k]->numel(); ++i)
      for (int r = 0; r < p; ++r) expect[static_cast<std::size_t>(flat.offsets()[k] + i)] += grad_value(r, k, i);

  // The shards of all ranks cover the flat buffer exactly once, in equal parts of each bucket.
  std::int64_t owned = 0;
  std::size_t bad = 0;
  auto shard = buckets.shard_grads();
  for (std::size_t b = 0; b < buckets.own_segments().size(); ++b) {
    const auto& s = buckets.own_segments()[b];
    CHECK(s.count * p == flat.buckets()[b].count);
    CHECK(s.flat_offset == flat.buckets()[b].offset + world.rank() * s.count);
    owned += s.count;
    for (std::int64_t i = 0; i < s.count; ++i)
      bad += std::abs(shard[s.shard_offset + i] - expect[static_cast<std::size_t>(s.flat_offset + i)]) > 1e-9;
  }
  CHECK(bad == 0);
  CHECK(owned == buckets.shard_numel());
  CHECK(world.allreduce(owned, comm::ReduceOp::sum) == flat.numel());

  // "Update" own segments (value = flat index · 2), then all-gather: every rank sees all.
  for (auto& v : flat.values()) v = -1;
  for (const auto& s : buckets.own_segments())
    for (std::int64_t i = 0; i < s.count; ++i) flat.values()[s.flat_offset + i] = 2.0 * static_cast<double>(s.flat_offset + i);
  buckets.all_gather_values();
  bad = 0;
  for (std::int64_t i = 0; i < flat.numel(); ++i) bad += flat.values()[i] != 2.0 * static_cast<double>(i);
  CHECK(bad == 0);
}

TEST_CASE("flat layout: aligned offsets, buckets of whole parameters in equal aligned shards, zero padding", "[data]") {
  Model m({5, 1, 70, 3, 64, 130, 2});
  for (auto* p : m.params) std::fill(p->value().begin(), p->value().end(), 7.0);
  const std::int64_t align = 8, shards = 3;
  FlatParameters<double> flat(m.params, {.align = align, .bucket_elements = 100, .shards = shards});
  // From the back: [2 130] [64 3 70] [1 5].
  REQUIRE(flat.buckets().size() == 3);
  CHECK(flat.buckets()[0].first_param == 5);
  CHECK(flat.buckets()[1].first_param == 2);
  CHECK(flat.buckets()[2].first_param == 0);
  std::int64_t end = 0;
  for (std::size_t b = flat.buckets().size(); b-- > 0;) {
    const auto& bucket = flat.buckets()[b];
    CAPTURE(b);
    CHECK(bucket.offset == end);  // back to back, from the buffer's start
    CHECK(bucket.count % (align * shards) == 0);
    end = bucket.offset + bucket.count;
    for (std::size_t i = bucket.first_param; i < bucket.last_param; ++i) {
      CHECK(flat.bucket_of(i) == b);
      CHECK(flat.offsets()[i] % align == 0);
      CHECK(flat.offsets()[i] + m.params[i]->numel() <= end);
      CHECK(m.params[i]->value().data() == flat.values().data() + flat.offsets()[i]);
    }
  }
  CHECK(end == flat.numel());
  // Values kept, padding zero in both buffers.
  std::vector<char> covered(static_cast<std::size_t>(flat.numel()), 0);
  for (std::size_t i = 0; i < m.params.size(); ++i)
    std::fill_n(covered.begin() + flat.offsets()[i], m.params[i]->numel(), 1);
  std::size_t bad = 0;
  for (std::int64_t i = 0; i < flat.numel(); ++i)
    bad += covered[static_cast<std::size_t>(i)] ? flat.values()[i] != 7.0 : flat.values()[i] != 0.0 || flat.grads()[i] != 0.0;
  CHECK(bad == 0);
  // The default layout is the parameters back to back.
  Model n({5, 1, 70});
  FlatParameters<double> plain(n.params);
  CHECK(plain.numel() == 76);
  CHECK(plain.offsets() == std::vector<std::int64_t>{0, 5, 6});
}
