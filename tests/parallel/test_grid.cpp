// ProcessGrid for every factorisation of the launch's world (run with 1..8 ranks): coordinates,
// group sizes, and that each sub-communicator's allreduce reaches exactly its members.
#include "test.hpp"

#include <dpml/parallel/grid.hpp>

#include <cstdint>

using namespace dpml;

namespace {
// Bit mask of the world ranks that share `grid`'s coordinates except on the axes in `free`.
std::uint64_t expected_members(const ProcessGrid& g, std::initializer_list<Axis> free) {
  std::uint64_t mask = 0;
  for (int r = 0; r < g.world_size(); ++r) {
    const Coord c = ProcessGrid::coord_of(r, g.tp(), g.dp());
    bool same = true;
    for (Axis a : parallel::kAxes) {
      bool is_free = false;
      for (Axis f : free) is_free |= f == a;
      if (!is_free && c[a] != g.coord(a)) same = false;
    }
    if (same) mask |= std::uint64_t{1} << r;
  }
  return mask;
}
std::uint64_t reached(const comm::Mpi& c, int world_rank) {
  // Sum of distinct powers of two = bitwise or of the members.
  std::uint64_t bit = std::uint64_t{1} << world_rank;
  c.allreduce(&bit, 1, comm::ReduceOp::sum);
  return bit;
}
int popcount(std::uint64_t m) { return __builtin_popcountll(m); }
}  // namespace

TEST_CASE("grid: every factorisation of the world", "[grid]") {
  const auto world = test::world();
  const int n = world.size();
  for (int tp = 1; tp <= n; ++tp)
    for (int pp = 1; pp <= n; ++pp) {
      if (n % (tp * pp) != 0) {
        CHECK_FALSE(ProcessGrid::check_layout(n, {.tp = tp, .pp = pp}).ok());
        continue;
      }
      CAPTURE(n, tp, pp);
      auto g = ProcessGrid::create(world, {.tp = tp, .pp = pp});
      const int dp = n / (tp * pp);
      CHECK(g.tp() == tp);
      CHECK(g.pp() == pp);
      CHECK(g.dp() == dp);
      // rank = tp_rank + tp · (dp_rank + dp · pp_rank)
      const Coord c = g.coord();
      CHECK(c.tp + tp * (c.dp + dp * c.pp) == world.rank());
      CHECK(g.rank_of(c) == world.rank());
      CHECK(g.is_first_stage() == (c.pp == 0));
      CHECK(g.is_last_stage() == (c.pp == pp - 1));

      for (Axis a : parallel::kAxes) {
        CAPTURE(parallel::axis_name(a));
        CHECK(g.comm(a).size() == g.size(a));
        CHECK(g.comm(a).rank() == g.coord(a));
        const auto mask = expected_members(g, {a});
        CHECK(popcount(mask) == g.size(a));
        CHECK(reached(g.comm(a), world.rank()) == mask);
      }
      const std::pair<Axis, Axis> pairs[] = {
          {Axis::tensor, Axis::data}, {Axis::tensor, Axis::pipeline}, {Axis::data, Axis::pipeline}};
      for (auto [a, b] : pairs) {
        CHECK(g.comm(a, b).size() == g.size(a) * g.size(b));
        CHECK(reached(g.comm(a, b), world.rank()) == expected_members(g, {a, b}));
      }
    }
}

TEST_CASE("grid: explicit dp must match the world", "[grid]") {
  const int n = test::world().size();
  CHECK(ProcessGrid::check_layout(n, {.tp = 1, .pp = 1, .dp = n}).ok());
  CHECK_FALSE(ProcessGrid::check_layout(n, {.tp = 1, .pp = 1, .dp = n + 1}).ok());
  CHECK_FALSE(ProcessGrid::check_layout(n, {.tp = 0, .pp = 1}).ok());
  const auto msg = ProcessGrid::check_layout(n, {.tp = n + 1, .pp = 1}).message();
  CHECK(msg.find("does not divide") != std::string::npos);
}
