// core/nvml.hpp without a GPU: a library name that does not load, and a library that loads but is
// not NVML, each leave a clean unavailable Library that says why and answers every query with
// nothing; a Device of such a library and a PowerMeter on it report time and no energy. The
// process's own NVML (Library::instance) is checked against itself where the machine has one.
#include "test.hpp"

#include <dpml/core/nvml.hpp>

#include <cstddef>
#include <string>
#include <thread>

using namespace dpml;

// NVML's documented layouts (API reference: nvmlPciInfo_t, nvmlMemory_t, nvmlUtilization_t).
static_assert(sizeof(nvml::abi::PciInfo) == 16 + 5 * 4 + 32);
static_assert(offsetof(nvml::abi::PciInfo, domain) == 16 && offsetof(nvml::abi::PciInfo, bus_id) == 36);
static_assert(sizeof(nvml::abi::Memory) == 3 * 8 && offsetof(nvml::abi::Memory, used) == 16);
static_assert(sizeof(nvml::abi::Utilization) == 2 * 4 && offsetof(nvml::abi::Utilization, memory) == 4);

namespace {
void check_answers_nothing(const nvml::Library& lib) {
  CHECK_FALSE(lib.available());
  CHECK(lib.device_count() == 0);
  CHECK_FALSE(lib.device(0).has_value());
  CHECK_FALSE(lib.device_by_pci_bus_id("0000:18:00.0").has_value());
  CHECK_FALSE(lib.driver_version().has_value());
}
}  // namespace

TEST_CASE("nvml: a library that does not load is unavailable, naming it", "[core][nvml]") {
  const nvml::Library lib("libdpml-no-such-nvml.so.1");
  check_answers_nothing(lib);
  CAPTURE(lib.why());
  CHECK(lib.why().find("libdpml-no-such-nvml.so.1") != std::string::npos);
}

TEST_CASE("nvml: a library without NVML's functions is unavailable, naming what it lacks", "[core][nvml]") {
  const nvml::Library lib("libz.so.1");  // zlib: dpml links it, it has no nvmlInit_v2
  check_answers_nothing(lib);
  CAPTURE(lib.why());
  CHECK(lib.why().find("libz.so.1 lacks nvmlInit_v2") != std::string::npos);
}

TEST_CASE("nvml: a device that answers nothing gives a meter with time and no energy", "[core][nvml]") {
  const nvml::Library lib("libdpml-no-such-nvml.so.1");
  const nvml::Device gpu(lib, nullptr);
  CHECK_FALSE(gpu.name().has_value());
  CHECK_FALSE(gpu.power_w().has_value());
  CHECK_FALSE(gpu.energy_j().has_value());
  CHECK(gpu.nvlinks().empty());
  CHECK_FALSE(gpu.common_ancestor(gpu).has_value());
  nvml::PowerMeter meter(gpu);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  meter.sample();
  const nvml::Lap lap = meter.lap();
  CHECK(lap.seconds >= 0.019);
  CHECK(lap.seconds < 5.0);
  CHECK_FALSE(lap.from_energy_counter);
  CHECK_FALSE(lap.joules.has_value());
  CHECK_FALSE(lap.watts.has_value());
  CHECK_FALSE(lap.utilization.has_value());
}

TEST_CASE("nvml: the process's NVML is there and consistent, or says why not", "[core][nvml]") {
  const nvml::Library& lib = nvml::Library::instance();
  CHECK(&lib == &nvml::Library::instance());  // loaded once
  if (!lib.available()) {
    CHECK_FALSE(lib.why().empty());
    check_answers_nothing(lib);
    return;
  }
  CHECK(lib.why().empty());
  CHECK(lib.driver_version().has_value());
  for (int i = 0; i < lib.device_count(); ++i) {
    CAPTURE(i);
    const auto gpu = lib.device(i);
    REQUIRE(gpu.has_value());
    CHECK_FALSE(gpu->name().value_or("").empty());
    const auto bus_id = gpu->pci_bus_id();
    REQUIRE(bus_id.has_value());
    const auto same = lib.device_by_pci_bus_id(*bus_id);  // the handle found again by its address
    REQUIRE(same.has_value());
    CHECK(same->pci() == gpu->pci());
    if (const auto m = gpu->memory()) CHECK(m->used <= m->total);
  }
}
