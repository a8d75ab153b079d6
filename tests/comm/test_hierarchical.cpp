// comm::Hierarchical<comm::Mpi> against the flat comm::Mpi collectives of the same group: equal bit
// for bit on integers, within rounding on floats, for every node size that divides the launch
// (4 ranks as 2 nodes of 2, 8 ranks as 2 nodes of 4 and 4 of 2, …), at lengths that do not divide
// the node, shorter than the node, and empty; several started at once and waited for out of order;
// nodes from the launch's hosts; a node size that does not divide the group refused.
#include "test.hpp"

#include <dpml/comm/hierarchical.hpp>
#include <dpml/comm/mpi.hpp>
#include <dpml/core/error.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

using namespace dpml;
using comm::ReduceOp;
using Hier = comm::Hierarchical<comm::Mpi>;

namespace {
// The value rank r contributes at index i (distinct per (r, i); integers exact).
template <class T>
T value(int r, std::size_t i) {
  if constexpr (std::is_floating_point_v<T>) return static_cast<T>(std::sin(0.37 * static_cast<double>(i) + 1.3 * r)) * T(1e3);
  else return static_cast<T>((static_cast<long long>(i) % 9973) * 1000003 + r * 7919 + 1);
}
// Node sizes that divide the launch, the node of one rank and the whole group included.
std::vector<int> node_sizes(int p) {
  std::vector<int> out;
  for (int k = 1; k <= p; ++k)
    if (p % k == 0) out.push_back(k);
  return out;
}
const std::size_t kLengths[] = {0, 1, 3, 7, 1000, 4099};
}  // namespace

TEMPLATE_TEST_CASE("hierarchical all-reduce equals the flat one", "[comm]", std::int64_t, float) {
  const auto w = test::world();
  for (int k : node_sizes(w.size())) {
    const Hier h = Hier::from(w, k);
    CAPTURE(k, h.nodes());
    REQUIRE(h.size() == w.size());
    for (std::size_t n : kLengths) {
      CAPTURE(n);
      std::vector<TestType> flat(n), hier(n);
      for (std::size_t i = 0; i < n; ++i) flat[i] = hier[i] = value<TestType>(w.rank(), i);
      w.allreduce(flat.data(), n, ReduceOp::sum);
      h.allreduce(hier.data(), n, ReduceOp::sum);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if constexpr (std::is_integral_v<TestType>) bad += hier[i] != flat[i];
        else bad += std::abs(hier[i] - flat[i]) > 1e-6f * static_cast<float>(w.size()) * 1e3f;  // rounding of p terms of ≤ 1e3
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("hierarchical reduce-scatter and all-gather follow its rank order", "[comm]") {
  const auto w = test::world();
  for (int k : node_sizes(w.size())) {
    const Hier h = Hier::from(w, k);
    const int p = h.size(), me = h.rank();
    CAPTURE(k, me);
    for (std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{333}}) {
      CAPTURE(n);
      // Reduce-scatter: block me of the flat sum (data is scratch afterwards).
      std::vector<std::int64_t> data(n * static_cast<std::size_t>(p)), flat(n), mine(n);
      for (std::size_t i = 0; i < data.size(); ++i) data[i] = value<std::int64_t>(w.rank(), i);
      std::vector<std::int64_t> sum = data;
      w.allreduce(sum.data(), sum.size(), ReduceOp::sum);
      h.reduce_scatter(data.data(), mine.data(), n, ReduceOp::sum);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) bad += mine[i] != sum[static_cast<std::size_t>(me) * n + i];
      CHECK(bad == 0);
      // All-gather, out of place and in place: block r is what hierarchical rank r sent.
      std::vector<std::int64_t> send(n), out(n * static_cast<std::size_t>(p)), in_place(out.size());
      for (std::size_t i = 0; i < n; ++i) send[i] = in_place[static_cast<std::size_t>(me) * n + i] = value<std::int64_t>(me, i);
      h.allgather(send.data(), out.data(), n);
      h.allgather(in_place.data() + static_cast<std::size_t>(me) * n, in_place.data(), n);
      bad = 0;
      for (int r = 0; r < p; ++r)
        for (std::size_t i = 0; i < n; ++i) {
          const std::size_t at = static_cast<std::size_t>(r) * n + i;
          bad += (out[at] != value<std::int64_t>(r, i)) + (in_place[at] != value<std::int64_t>(r, i));
        }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("started hierarchical all-reduces complete in any order of waiting", "[comm]") {
  const auto w = test::world();
  const int k = w.size() % 2 == 0 ? 2 : 1;
  const Hier h = Hier::from(w, k);
  const std::size_t lengths[] = {3, 4099, 17, 1000};
  std::vector<std::vector<std::int64_t>> bufs, expect;
  for (std::size_t n : lengths) {
    bufs.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i) bufs.back()[i] = value<std::int64_t>(w.rank(), i);
    expect.push_back(bufs.back());
    w.allreduce(expect.back().data(), n, ReduceOp::sum);
  }
  std::vector<Hier::Request> started;
  for (auto& b : bufs) started.push_back(h.iallreduce(b.data(), b.size(), ReduceOp::sum));
  (void)started[1].test();
  for (std::size_t j = started.size(); j-- > 0;) started[j].wait();
  for (std::size_t j = 0; j < bufs.size(); ++j) CHECK(bufs[j] == expect[j]);
}

TEST_CASE("an in-place MPI reduce-scatter leaves the block at its place", "[comm]") {
  const auto w = test::world();
  const std::size_t p = static_cast<std::size_t>(w.size()), me = static_cast<std::size_t>(w.rank());
  std::vector<int> counts;
  for (int r = 0; r < w.size(); ++r) counts.push_back(r + 2);
  std::size_t total = 0, at = 0;
  for (std::size_t r = 0; r < p; ++r) (r < me ? at : total) += static_cast<std::size_t>(counts[r]);
  total += at;
  std::vector<std::int64_t> data(total), sum(total);
  for (std::size_t i = 0; i < total; ++i) data[i] = sum[i] = value<std::int64_t>(w.rank(), i);
  w.allreduce(sum.data(), total, ReduceOp::sum);
  w.reduce_scatterv(data.data(), data.data() + at, counts, ReduceOp::sum);
  for (std::size_t i = 0; i < static_cast<std::size_t>(counts[me]); ++i) CHECK(data[at + i] == sum[at + i]);
}

TEST_CASE("nodes from the launch's hosts", "[comm]") {
  const auto w = test::world();
  const Hier h = Hier::from(w, 0);  // one host here: one node of every rank
  CHECK(h.nodes() * h.ranks_per_node() == w.size());
  std::vector<std::int64_t> a(11, w.rank() + 1);
  h.allreduce(a.data(), a.size(), ReduceOp::sum);
  CHECK(a[10] == static_cast<std::int64_t>(w.size()) * (w.size() + 1) / 2);
}

TEST_CASE("a node size that does not divide the group is refused on every rank", "[comm]") {
  const auto w = test::world();
  if (w.size() < 2) return;
  CHECK_THROWS_AS(Hier::from(w, w.size() + 1), Error);
}
