#include "test.hpp"

#include <dpml/core/arena.hpp>

#include <cstdint>

using namespace dpml;

TEST_CASE("arena: aligned, non-overlapping, stable pointers; reset keeps one block", "[arena]") {
  Arena<> arena(1024);
  auto a = arena.allocate<float>(Shape{10});
  auto b = arena.allocate<double>(Shape{3, 3});
  CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 64 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 64 == 0);
  for (int i = 0; i < 10; ++i) a[i] = static_cast<float>(i);
  for (int i = 0; i < 9; ++i) b[i] = -1.0;
  CHECK(a[9] == 9.0f);  // b did not overwrite a

  // Past the first block: a new block is chained, old pointers still valid.
  auto big = arena.allocate<float>(Shape{10000});
  big[9999] = 1.0f;
  CHECK(a[3] == 3.0f);
  CHECK(arena.high_water() >= 40000);
  const auto hw = arena.high_water();

  arena.reset();
  CHECK(arena.bytes_in_use() == 0);
  CHECK(arena.capacity() >= hw);
  // The steady state fits in one block: the same sequence allocates no new block.
  const auto cap = arena.capacity();
  (void)arena.allocate<float>(Shape{10});
  (void)arena.allocate<double>(Shape{3, 3});
  (void)arena.allocate<float>(Shape{10000});
  CHECK(arena.capacity() == cap);
}
