// A stand-in for libnvidia-ml.so.1 with two GPUs of known answers, so that core/nvml.hpp and
// dpml-info's NVML sections are tested on machines without a GPU (test_nvml, dpml_info_fake_nvml).
// The C declarations are written here again from NVML's API reference, not taken from
// core/nvml.hpp, so that a layout slip on either side shows as wrong values.
//
//   GPU 0: bus 00000000:18:00.0, "Fake GPU 0", 250 W (its energy counter runs at 250 W, moving every 50 ms), limit 700 W
//   GPU 1: bus 00000000:2a:00.0, "Fake GPU 1", 100 W, no energy counter (NOT_SUPPORTED)
//   both: 80 GiB of which 20 GiB used, 42 % / 7 % busy, SM clock 1500 MHz (max 1980), memory
//         clock max 2619 MHz; NVLinks 0-3 active: links 0-1 to the other GPU, links 2-3 to an
//         NVSwitch at bus 0x80 (GPU 1 does not name that end); common ancestor: host bridge (30)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

extern "C" {
typedef int nvmlReturn_t;
enum { SUCCESS = 0, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3 };
struct nvmlDevice_st {
  int index;
};
typedef nvmlDevice_st* nvmlDevice_t;
struct nvmlUtilization_t {
  unsigned int gpu, memory;
};
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
}

namespace {
nvmlDevice_st gpus[2] = {{0}, {1}};
const unsigned int buses[2] = {0x18, 0x2a};
const auto loaded = std::chrono::steady_clock::now();

void fill_pci(nvmlPciInfo_t* p, unsigned int bus) {
  std::memset(p, 0, sizeof *p);
  p->bus = bus;
  std::snprintf(p->busId, sizeof p->busId, "00000000:%02x:00.0", bus);
  std::snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02x:00.0", bus);
}
bool valid(nvmlDevice_t d) { return d == &gpus[0] || d == &gpus[1]; }
}  // namespace

extern "C" {
nvmlReturn_t nvmlInit_v2() { return SUCCESS; }
nvmlReturn_t nvmlShutdown() { return SUCCESS; }
const char* nvmlErrorString(nvmlReturn_t) { return "fake NVML error"; }
nvmlReturn_t nvmlSystemGetDriverVersion(char* v, unsigned int n) {
  std::snprintf(v, n, "999.1.2");
  return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* n) {
  *n = 2;
  return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t* d) {
  if (i > 1) return INVALID_ARGUMENT;
  *d = &gpus[i];
  return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* id, nvmlDevice_t* d) {
  unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4) return INVALID_ARGUMENT;
  for (int i = 0; i < 2; ++i)
    if (domain == 0 && bus == buses[i] && dev == 0) {
      *d = &gpus[i];
      return SUCCESS;
    }
  return INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char* name, unsigned int n) {
  if (!valid(d)) return INVALID_ARGUMENT;
  std::snprintf(name, n, "Fake GPU %d", d->index);
  return SUCCESS;
}
// Queries of power, energy and utilisation so far: a test counts how often a meter reads the GPU.
static long power_queries = 0;
long fake_nvml_power_queries() { return power_queries; }

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int* mw) {
  ++power_queries;
  if (!valid(d)) return INVALID_ARGUMENT;
  *mw = d->index == 0 ? 250000 : 100000;
  return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long* mj) {
  ++power_queries;
  if (!valid(d) || d->index != 0) return NOT_SUPPORTED;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - loaded).count();
  const double ticked = std::floor(s / 0.05) * 0.05;  // moves every 50 ms, as real counters move in steps
  *mj = static_cast<unsigned long long>(ticked * 250.0 * 1000.0);  // 250 W since the library loaded
  return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t* u) {
  ++power_queries;
  if (!valid(d)) return INVALID_ARGUMENT;
  *u = {42, 7};
  return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m) {
  if (!valid(d)) return INVALID_ARGUMENT;
  *m = {80ull << 30, 60ull << 30, 20ull << 30};
  return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int* mw) {
  if (!valid(d)) return INVALID_ARGUMENT;
  *mw = 700000;
  return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int* mhz) {  // 1: SM
  if (!valid(d) || type != 1) return NOT_SUPPORTED;
  *mhz = 1500;
  return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, int type, unsigned int* mhz) {  // 1: SM, 2: memory
  if (!valid(d) || (type != 1 && type != 2)) return NOT_SUPPORTED;
  *mhz = type == 1 ? 1980 : 2619;
  return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int* active) {
  if (!valid(d) || link >= 18) return INVALID_ARGUMENT;
  *active = link < 4 ? 1 : 0;
  return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t* p) {
  if (!valid(d) || link >= 4) return INVALID_ARGUMENT;
  if (link < 2) fill_pci(p, buses[1 - d->index]);
  else if (d->index == 0) fill_pci(p, 0x80);
  else return NOT_SUPPORTED;
  return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t* p) {
  if (!valid(d)) return INVALID_ARGUMENT;
  fill_pci(p, buses[d->index]);
  return SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int* level) {
  if (!valid(a) || !valid(b)) return INVALID_ARGUMENT;
  *level = a == b ? 0 : 30;
  return SUCCESS;
}
}
