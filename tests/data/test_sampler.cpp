// DistributedSampler: per epoch a permutation; for K ranks the slices of a step are disjoint,
// contiguous and their union (in rank order) is the global batch one process takes; reshuffled per
// epoch, identical for a seed; drop_last both ways.
#include "test.hpp"

#include <dpml/data/sampler.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

using namespace dpml;

namespace {
std::vector<std::int64_t> as_vector(std::span<const std::int64_t> s) { return {s.begin(), s.end()}; }
}  // namespace

TEST_CASE("sampler: a permutation per epoch, the same for a seed, different across epochs and seeds", "[data][sampler]") {
  const data::SamplerOptions o{.global_batch = 8, .seed = 42};
  data::DistributedSampler a(103, o), b(103, o), other_seed(103, {.global_batch = 8, .seed = 43});
  auto sorted = as_vector(a.order());
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < 103; ++i) CHECK(sorted[static_cast<std::size_t>(i)] == i);
  CHECK(as_vector(a.order()) == as_vector(b.order()));
  CHECK(as_vector(a.order()) != as_vector(other_seed.order()));
  const auto epoch0 = as_vector(a.order());
  a.set_epoch(1);
  CHECK(as_vector(a.order()) != epoch0);
  a.set_epoch(0);
  CHECK(as_vector(a.order()) == epoch0);
  // Not the identity, nor nearly: few fixed points.
  int fixed = 0;
  for (std::int64_t i = 0; i < 103; ++i) fixed += epoch0[static_cast<std::size_t>(i)] == i;
  CHECK(fixed < 10);
  data::DistributedSampler plain(10, {.global_batch = 4, .shuffle = false});
  CHECK(as_vector(plain.global_batch(1)) == std::vector<std::int64_t>{4, 5, 6, 7});
}

TEST_CASE("sampler: rank slices are disjoint and make up the sequential batch", "[data][sampler]") {
  for (int ranks : {1, 2, 3, 4, 8}) {
    for (bool drop_last : {true, false}) {
      CAPTURE(ranks, drop_last);
      const data::SamplerOptions o{.global_batch = 12, .seed = 9, .drop_last = drop_last};
      const std::int64_t n = 100;  // 8 full batches and 4 left over
      data::DistributedSampler sequential(n, o);
      std::vector<data::DistributedSampler> rank;
      for (int r = 0; r < ranks; ++r) rank.emplace_back(n, o, r, ranks);
      for (std::int64_t epoch : {0, 5}) {
        sequential.set_epoch(epoch);
        for (auto& s : rank) s.set_epoch(epoch);
        REQUIRE(sequential.batches_per_epoch() == (drop_last ? 8 : 9));
        std::vector<std::int64_t> all;
        for (std::int64_t b = 0; b < sequential.batches_per_epoch(); ++b) {
          std::vector<std::int64_t> joined;
          for (int r = 0; r < ranks; ++r) {
            const auto mine = rank[static_cast<std::size_t>(r)].local_batch(b);
            const std::int64_t size = static_cast<std::int64_t>(sequential.global_batch(b).size());
            CHECK(static_cast<std::int64_t>(mine.size()) >= size / ranks);  // balanced to one sample
            CHECK(static_cast<std::int64_t>(mine.size()) <= size / ranks + 1);
            joined.insert(joined.end(), mine.begin(), mine.end());
          }
          CHECK(joined == as_vector(sequential.global_batch(b)));
          all.insert(all.end(), joined.begin(), joined.end());
        }
        std::sort(all.begin(), all.end());
        CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());  // no sample twice in an epoch
        CHECK(all.size() == (drop_last ? 96u : 100u));
      }
    }
  }
  CHECK_THROWS_AS(data::DistributedSampler(5, {.global_batch = 8}), Error);  // drop_last: no batch at all
  CHECK_THROWS_AS(data::DistributedSampler(100, {.global_batch = 8}, 2, 2), Error);
}
