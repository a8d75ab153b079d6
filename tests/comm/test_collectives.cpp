// Every collective of comm::Mpi (and comm::Self on one rank), for float, double and int, at odd
// sizes, checked element by element against values each rank can compute for every other rank.
#include "test.hpp"

#include <dpml/comm/mpi.hpp>
#include <dpml/comm/self.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

using namespace dpml;
using comm::ReduceOp;

namespace {
// The value rank r contributes at index i: distinct per (r, i), exact in float for small sizes.
template <class T>
T value(int r, std::size_t i) {
  return static_cast<T>((static_cast<long long>(i) % 997) * 3 + r * 7 + 1);
}
const std::size_t kSizes[] = {1, 7, 1000003};
}  // namespace

TEMPLATE_TEST_CASE("allreduce sum, avg, max, min (in and out of place)", "[comm]", float, double, std::int32_t) {
  const auto w = test::world();
  const int p = w.size();
  for (std::size_t n : kSizes) {
    CAPTURE(n);
    std::vector<TestType> send(n), out(n);
    for (std::size_t i = 0; i < n; ++i) send[i] = value<TestType>(w.rank(), i);

    w.allreduce(send.data(), out.data(), n, ReduceOp::sum);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      TestType expect = 0;
      for (int r = 0; r < p; ++r) expect += value<TestType>(r, i);
      bad += out[i] != expect;
    }
    CHECK(bad == 0);

    std::vector<TestType> inplace = send;
    w.allreduce(inplace.data(), n, ReduceOp::max);
    bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += inplace[i] != value<TestType>(p - 1, i);
    CHECK(bad == 0);

    w.allreduce(send.data(), out.data(), n, ReduceOp::min);
    bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += out[i] != value<TestType>(0, i);
    CHECK(bad == 0);

    if constexpr (std::is_floating_point_v<TestType>) {
      w.allreduce(send.data(), out.data(), n, ReduceOp::avg);
      bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        double expect = 0;
        for (int r = 0; r < p; ++r) expect += value<double>(r, i);
        expect /= p;
        bad += std::abs(out[i] - expect) > 1e-6 * std::abs(expect);
      }
      CHECK(bad == 0);
    }
  }
  CHECK(w.allreduce(w.rank() + 1, ReduceOp::sum) == p * (p + 1) / 2);
}

TEMPLATE_TEST_CASE("broadcast from every root", "[comm]", float, double, std::int32_t) {
  const auto w = test::world();
  for (std::size_t n : kSizes)
    for (int root = 0; root < w.size(); ++root) {
      std::vector<TestType> buf(n);
      for (std::size_t i = 0; i < n; ++i) buf[i] = value<TestType>(w.rank(), i);
      w.broadcast(buf.data(), n, root);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) bad += buf[i] != value<TestType>(root, i);
      CAPTURE(n, root);
      CHECK(bad == 0);
    }
}

TEST_CASE("broadcast of a string: the root's length and contents, longer or shorter than each rank's", "[comm]") {
  const auto w = test::world();
  for (int root = 0; root < w.size(); ++root) {
    std::string s(static_cast<std::size_t>(3 * w.rank()), static_cast<char>('a' + w.rank()));  // rank 0: empty
    w.broadcast(s, root);
    CAPTURE(root);
    CHECK(s == std::string(static_cast<std::size_t>(3 * root), static_cast<char>('a' + root)));
  }
}

TEST_CASE("allgather of strings: every rank's, of its own length (some empty), in rank order", "[comm]") {
  const auto w = test::world();
  const auto text = [](int r) { return std::string(static_cast<std::size_t>(2 * r), static_cast<char>('a' + r)); };  // rank 0: empty
  const std::vector<std::string> all = w.allgather(text(w.rank()));
  REQUIRE(static_cast<int>(all.size()) == w.size());
  for (int r = 0; r < w.size(); ++r) CHECK(all[static_cast<std::size_t>(r)] == text(r));
}

TEMPLATE_TEST_CASE("allgather and allgatherv (uneven counts)", "[comm]", float, double, std::int32_t) {
  const auto w = test::world();
  const int p = w.size();
  for (std::size_t n : kSizes) {
    CAPTURE(n);
    std::vector<TestType> mine(n), all(n * static_cast<std::size_t>(p));
    for (std::size_t i = 0; i < n; ++i) mine[i] = value<TestType>(w.rank(), i);
    w.allgather(mine.data(), all.data(), n);
    std::size_t bad = 0;
    for (int r = 0; r < p; ++r)
      for (std::size_t i = 0; i < n; ++i) bad += all[static_cast<std::size_t>(r) * n + i] != value<TestType>(r, i);
    CHECK(bad == 0);

    // v-form: rank r holds block r of a length-n array split into p uneven blocks.
    std::vector<int> counts(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) counts[static_cast<std::size_t>(r)] = static_cast<int>(comm::block_count(n, p, r));
    const std::size_t off = comm::block_offset(n, p, w.rank());
    std::vector<TestType> part(static_cast<std::size_t>(counts[static_cast<std::size_t>(w.rank())]));
    for (std::size_t i = 0; i < part.size(); ++i) part[i] = value<TestType>(0, off + i);
    std::vector<TestType> whole(n);
    w.allgatherv(part.data(), whole.data(), counts);
    bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += whole[i] != value<TestType>(0, i);
    CHECK(bad == 0);
  }
}

TEMPLATE_TEST_CASE("reduce_scatter and reduce_scatterv", "[comm]", float, double, std::int32_t) {
  const auto w = test::world();
  const int p = w.size();
  for (std::size_t n : kSizes) {
    CAPTURE(n);
    std::vector<TestType> send(n * static_cast<std::size_t>(p)), mine(n);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = value<TestType>(w.rank(), i);
    w.reduce_scatter(send.data(), mine.data(), n, ReduceOp::sum);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      TestType expect = 0;
      for (int r = 0; r < p; ++r) expect += value<TestType>(r, static_cast<std::size_t>(w.rank()) * n + i);
      bad += mine[i] != expect;
    }
    CHECK(bad == 0);

    std::vector<int> counts(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) counts[static_cast<std::size_t>(r)] = static_cast<int>(comm::block_count(n, p, r));
    std::vector<TestType> full(n), part(static_cast<std::size_t>(counts[static_cast<std::size_t>(w.rank())]));
    for (std::size_t i = 0; i < n; ++i) full[i] = value<TestType>(w.rank(), i);
    w.reduce_scatterv(full.data(), part.data(), counts, ReduceOp::max);
    const std::size_t off = comm::block_offset(n, p, w.rank());
    bad = 0;
    for (std::size_t i = 0; i < part.size(); ++i) bad += part[i] != value<TestType>(p - 1, off + i);
    CHECK(bad == 0);
  }
}

TEMPLATE_TEST_CASE("send/recv around a ring, and non-blocking forms", "[comm]", float, double, std::int32_t) {
  const auto w = test::world();
  const int p = w.size(), me = w.rank();
  for (std::size_t n : kSizes) {
    std::vector<TestType> out(n), in(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = value<TestType>(me, i);
    const int next = (me + 1) % p, prev = (me + p - 1) % p;
    if (p > 1) {
      auto r = w.irecv(in.data(), n, prev, 3);
      auto s = w.isend(out.data(), n, next, 3);
      s.wait();
      r.wait();
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) bad += in[i] != value<TestType>(prev, i);
      CAPTURE(n);
      CHECK(bad == 0);
    }
    // Non-blocking allreduce overlapped with local work, then the average divides on completion.
    std::vector<TestType> buf = out;
    auto req = w.iallreduce(buf.data(), n, ReduceOp::sum);
    volatile double busy = 0;
    for (int i = 0; i < 1000; ++i) busy = busy + i;
    req.wait();
    CHECK_FALSE(req.pending());
    TestType expect0 = 0;
    for (int r = 0; r < p; ++r) expect0 += value<TestType>(r, 0);
    CHECK(buf[0] == expect0);
  }
  w.barrier();
}

TEST_CASE("Self: one-rank collectives copy", "[comm]") {
  comm::Self s;
  std::vector<float> a{1, 2, 3}, b(3);
  s.allreduce(a.data(), b.data(), 3, ReduceOp::sum);
  CHECK(b == a);
  s.allgather(a.data(), b.data(), 3);
  CHECK(b == a);
  std::vector<int> counts{3};
  s.reduce_scatterv(a.data(), b.data(), counts, ReduceOp::avg);
  CHECK(b == a);
  CHECK_THROWS_AS(s.send(a.data(), 3, 1, 0), Error);
  CHECK_THROWS_AS(s.broadcast(a.data(), 3, 1), Error);
}
