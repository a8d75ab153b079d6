// train::EnergyMeter: a run without GPUs of its own meters nothing (NaN readings, every rank
// alike, no line printed); asked to meter where no GPU answers (CI: no driver), it says once why
// and reads NaN; where it does meter (a GPU machine), a lap of real work reads finite, positive
// joules and watts summed over the ranks.
#include "test.hpp"

#include <dpml/train/energy.hpp>

#include <chrono>
#include <cmath>
#include <thread>

using namespace dpml;

TEST_CASE("EnergyMeter: off reads NaN on every rank; on where it can, finite and positive", "[train][energy]") {
  const auto world = test::world();
  train::EnergyMeter off(world, false);
  CHECK_FALSE(off.metered());
  const train::EnergyReading none = off.lap();
  CHECK((std::isnan(none.joules) && std::isnan(none.watts) && std::isnan(none.gpu_util)));

  train::EnergyMeter asked(world, true);  // every rank agrees whether it meters
  CHECK(world.allreduce(asked.metered() ? 1 : 0, comm::ReduceOp::sum) % world.size() == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // an idle GPU still draws power
  const train::EnergyReading r = asked.lap();
  if (asked.metered()) {
    CHECK(r.joules > 0);
    CHECK(r.watts > 0);
    CHECK(r.watts < 2000.0 * world.size());  // no GPU draws 2 kW
  } else {
    CHECK((std::isnan(r.joules) && std::isnan(r.watts)));
  }
}
