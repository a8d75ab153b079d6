#include "test.hpp"

#include <dpml/core/philox.hpp>

#include <cmath>
#include <set>

using dpml::Philox4x32;
using dpml::PhiloxStream;

// Known-answer vectors of Philox4x32-10 from the Random123 distribution (tests/kat_vectors).
TEST_CASE("philox: Random123 known-answer vectors", "[philox]") {
  struct Kat {
    Philox4x32::Counter ctr;
    Philox4x32::Key key;
    Philox4x32::Counter expected;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& k : kats) CHECK(Philox4x32::block(k.ctr, k.key) == k.expected);
  static_assert(Philox4x32::block({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5u, "usable at compile time");
}

TEST_CASE("philox: streams are counter-addressed and independent", "[philox]") {
  PhiloxStream s(1234, 5);
  // offset maps to (block offset/4, word offset%4)
  const auto b = s.block(10);
  for (int w = 0; w < 4; ++w) CHECK(s.u32(40 + w) == b[w]);
  // different stream or seed → different numbers
  CHECK(PhiloxStream(1234, 6).u32(0) != s.u32(0));
  CHECK(PhiloxStream(1235, 5).u32(0) != s.u32(0));
  // no repeats in a long run of one stream
  std::set<std::uint32_t> seen;
  for (std::uint64_t i = 0; i < 4096; ++i) seen.insert(s.u32(i));
  CHECK(seen.size() == 4096);
}

TEST_CASE("philox: uniform and normal have the right moments", "[philox]") {
  PhiloxStream s(42, 0);
  const int n = 200000;
  double sum = 0, sum2 = 0, nsum = 0, nsum2 = 0;
  for (int i = 0; i < n; ++i) {
    const double u = s.uniform(static_cast<std::uint64_t>(i));
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    sum += u;
    sum2 += u * u;
    const double z = s.normal(static_cast<std::uint64_t>(i));
    REQUIRE(std::isfinite(z));
    nsum += z;
    nsum2 += z * z;
  }
  CHECK(sum / n == dpml::test::Approx(0.5).margin(0.005));
  CHECK(sum2 / n - (sum / n) * (sum / n) == dpml::test::Approx(1.0 / 12).margin(0.002));
  CHECK(nsum / n == dpml::test::Approx(0.0).margin(0.01));
  CHECK(nsum2 / n == dpml::test::Approx(1.0).margin(0.02));
}
