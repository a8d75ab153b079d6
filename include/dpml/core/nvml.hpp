#pragma once
// NVML (the NVIDIA Management Library behind nvidia-smi), loaded at run time. nvml::Library
// dlopens libnvidia-ml.so.1 and looks up the few functions dpml uses with dlsym, so a build needs
// neither the driver nor nvml.h (CI compiles this without either), and on a machine without the
// library (or with one lacking a required function) it is an unavailable Library that says why
// (why()) and answers every query with nothing: a program reports "no NVML" once and goes on.
// The types in `abi` are the parts of NVML's C API these functions take, declared here with the
// layouts and enum values of NVML's API reference (nvmlPciInfo_t, nvmlMemory_t, nvmlUtilization_t,
// nvmlClockType_t, nvmlGpuTopologyLevel_t). Host code only: no CUDA runtime is needed.
//
// nvml::Device is one GPU: name, memory, power and its enforced limit (W), the total-energy counter
// (J), utilisation (%), clocks (MHz), PCI address, active NVLinks and their far ends, the PCIe level
// two GPUs share. nvml::PowerMeter gives the energy (J) and mean power (W) of each lap: from the
// energy counter where the GPU has one (Volta and later; its mean over the last seconds, as the
// counter moves in ~100 ms steps), else from power samples integrated over time (trapezoids
// between the constructor, sample() and lap() calls).
//
// A CUDA device maps to its NVML handle by PCI bus id — CUDA_VISIBLE_DEVICES renumbers CUDA's
// devices, not NVML's — through device_of_cuda() (dpml::cuda builds: DPML_WITH_CUDA).
//
//   const nvml::Library& nvml = nvml::Library::instance();      // loaded once (DPML_NVML_LIBRARY: another)
//   if (!nvml.available()) std::printf("no NVML (%s)\n", nvml.why().c_str());
//   if (auto gpu = nvml.device(0)) {
//     nvml::PowerMeter meter(*gpu);
//     work();
//     const nvml::Lap l = meter.lap();                            // l.seconds, *l.joules, *l.watts
//   }

#include <dlfcn.h>

#ifdef DPML_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include <chrono>
#include <compare>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace dpml::nvml {

namespace abi {
using Return = int;                    // nvmlReturn_t: 0 is NVML_SUCCESS
using Handle = struct nvmlDevice_st*;  // nvmlDevice_t, opaque

struct Utilization {  // nvmlUtilization_t: percent of the last sample period (1/6 s to 1 s)
  unsigned int gpu;     // time a kernel was running
  unsigned int memory;  // time device memory was read or written
};
struct Memory {  // nvmlMemory_t (v1), bytes
  unsigned long long total, free, used;
};
struct PciInfo {  // nvmlPciInfo_t, filled by nvmlDeviceGetPciInfo_v3 and ..RemotePciInfo_v2
  char bus_id_legacy[16];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
  unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE: "00000000:18:00.0"
};
constexpr unsigned int kMaxNvLinks = 18;      // NVML_NVLINK_MAX_LINKS
constexpr unsigned int kNameBytes = 96;       // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned int kDriverBytes = 80;     // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
}  // namespace abi

enum class Clock { graphics = 0, sm = 1, memory = 2 };  // nvmlClockType_t

// How close two GPUs sit on PCIe (nvmlGpuTopologyLevel_t), nearest first.
enum class Topology { internal = 0, single_switch = 10, multiple_switches = 20, host_bridge = 30, numa_node = 40, system = 50 };
inline const char* topology_name(Topology t) {
  switch (t) {
    case Topology::internal: return "same board";
    case Topology::single_switch: return "PCIe, one switch";
    case Topology::multiple_switches: return "PCIe, several switches";
    case Topology::host_bridge: return "PCIe, one host bridge";
    case Topology::numa_node: return "PCIe, one NUMA node";
    case Topology::system: return "PCIe across NUMA nodes";
  }
  return "unknown";
}

struct PciAddress {
  unsigned int domain = 0, bus = 0, device = 0;
  auto operator<=>(const PciAddress&) const = default;
};

struct NvLink {
  unsigned int link = 0;             // this GPU's link number
  std::optional<PciAddress> remote;  // the far end (a GPU, an NVSwitch), where NVML names it
};

class Library;

// One GPU; cheap to copy. Every query returns nothing where NVML does not answer (an older
// driver without the function, a GPU without the counter, no permission).
class Device {
 public:
  Device(const Library& lib, abi::Handle h) : lib_(&lib), h_(h) {}
  std::optional<std::string> name() const;
  std::optional<abi::Memory> memory() const;
  std::optional<double> power_w() const;        // now
  std::optional<double> power_limit_w() const;  // enforced
  std::optional<double> energy_j() const;       // since the driver loaded
  std::optional<abi::Utilization> utilization() const;
  std::optional<unsigned int> clock_mhz(Clock c) const;
  std::optional<unsigned int> max_clock_mhz(Clock c) const;
  std::optional<PciAddress> pci() const;
  std::optional<std::string> pci_bus_id() const;
  std::vector<NvLink> nvlinks() const;  // the active ones
  std::optional<Topology> common_ancestor(const Device& other) const;

 private:
  const Library* lib_;
  abi::Handle h_;
};

class Library {
 public:
  // Loads `soname` (another name only in tests) and initialises NVML; never throws.
  explicit Library(const std::string& soname = "libnvidia-ml.so.1") {
    lib_ = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib_) {
      const char* e = dlerror();
      why_ = e ? e : soname + ": cannot be loaded";
      return;
    }
    bind(f_.init, "nvmlInit_v2");
    bind(f_.shutdown, "nvmlShutdown");
    bind(f_.error_string, "nvmlErrorString");
    bind(f_.count, "nvmlDeviceGetCount_v2");
    bind(f_.by_index, "nvmlDeviceGetHandleByIndex_v2");
    if (!f_.init || !f_.shutdown || !f_.error_string || !f_.count || !f_.by_index) {
      why_ = soname + " lacks nvmlInit_v2, nvmlShutdown, nvmlErrorString or nvmlDeviceGetCount_v2/HandleByIndex_v2";
      close();
      return;
    }
    bind(f_.by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
    bind(f_.driver_version, "nvmlSystemGetDriverVersion");
    bind(f_.name, "nvmlDeviceGetName");
    bind(f_.power, "nvmlDeviceGetPowerUsage");
    bind(f_.energy, "nvmlDeviceGetTotalEnergyConsumption");
    bind(f_.utilization, "nvmlDeviceGetUtilizationRates");
    bind(f_.memory, "nvmlDeviceGetMemoryInfo");
    bind(f_.power_limit, "nvmlDeviceGetEnforcedPowerLimit");
    bind(f_.clock, "nvmlDeviceGetClockInfo");
    bind(f_.max_clock, "nvmlDeviceGetMaxClockInfo");
    bind(f_.nvlink_state, "nvmlDeviceGetNvLinkState");
    bind(f_.nvlink_remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    bind(f_.pci_info, "nvmlDeviceGetPciInfo_v3");
    bind(f_.common_ancestor, "nvmlDeviceGetTopologyCommonAncestor");
    if (const abi::Return r = f_.init(); r != 0) {
      why_ = std::string("nvmlInit_v2 failed: ") + f_.error_string(r);
      close();
      return;
    }
    initialised_ = true;
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  ~Library() {
    if (initialised_) f_.shutdown();
    close();
  }

  // The process's NVML, loaded on first use: libnvidia-ml.so.1, or the library DPML_NVML_LIBRARY
  // names (tests: a stand-in with known answers).
  static const Library& instance() {
    static const char* const name = std::getenv("DPML_NVML_LIBRARY");
    static const Library lib(name && *name ? name : "libnvidia-ml.so.1");
    return lib;
  }

  bool available() const noexcept { return initialised_; }
  const std::string& why() const noexcept { return why_; }  // why not available ("" when it is)

  std::optional<std::string> driver_version() const {
    char v[abi::kDriverBytes] = {};
    if (!available() || !ok(f_.driver_version, v, abi::kDriverBytes)) return std::nullopt;
    return std::string(v);
  }
  int device_count() const {
    unsigned int n = 0;
    return available() && f_.count(&n) == 0 ? static_cast<int>(n) : 0;
  }
  // NVML's own numbering (all GPUs of the node, whatever CUDA_VISIBLE_DEVICES says).
  std::optional<Device> device(int index) const {
    abi::Handle h = nullptr;
    if (!available() || index < 0 || f_.by_index(static_cast<unsigned int>(index), &h) != 0) return std::nullopt;
    return Device(*this, h);
  }
  // "0000:18:00.0" (CUDA's form) or "00000000:18:00.0" (NVML's).
  std::optional<Device> device_by_pci_bus_id(const std::string& bus_id) const {
    abi::Handle h = nullptr;
    if (!available() || !ok(f_.by_pci_bus_id, bus_id.c_str(), &h)) return std::nullopt;
    return Device(*this, h);
  }

 private:
  friend class Device;
  struct Functions {
    abi::Return (*init)() = nullptr;
    abi::Return (*shutdown)() = nullptr;
    const char* (*error_string)(abi::Return) = nullptr;
    abi::Return (*count)(unsigned int*) = nullptr;
    abi::Return (*by_index)(unsigned int, abi::Handle*) = nullptr;
    abi::Return (*by_pci_bus_id)(const char*, abi::Handle*) = nullptr;
    abi::Return (*driver_version)(char*, unsigned int) = nullptr;
    abi::Return (*name)(abi::Handle, char*, unsigned int) = nullptr;
    abi::Return (*power)(abi::Handle, unsigned int*) = nullptr;             // mW
    abi::Return (*energy)(abi::Handle, unsigned long long*) = nullptr;      // mJ
    abi::Return (*utilization)(abi::Handle, abi::Utilization*) = nullptr;
    abi::Return (*memory)(abi::Handle, abi::Memory*) = nullptr;
    abi::Return (*power_limit)(abi::Handle, unsigned int*) = nullptr;       // mW
    abi::Return (*clock)(abi::Handle, int, unsigned int*) = nullptr;        // MHz
    abi::Return (*max_clock)(abi::Handle, int, unsigned int*) = nullptr;    // MHz
    abi::Return (*nvlink_state)(abi::Handle, unsigned int, int*) = nullptr;  // nvmlEnableState_t: 1 active
    abi::Return (*nvlink_remote_pci)(abi::Handle, unsigned int, abi::PciInfo*) = nullptr;
    abi::Return (*pci_info)(abi::Handle, abi::PciInfo*) = nullptr;
    abi::Return (*common_ancestor)(abi::Handle, abi::Handle, int*) = nullptr;  // nvmlGpuTopologyLevel_t
  };
  template <class F>
  void bind(F& fn, const char* symbol) {
    fn = reinterpret_cast<F>(dlsym(lib_, symbol));
  }
  // fn(args...) where the library has fn and it succeeds.
  template <class F, class... A>
  static bool ok(F fn, A... args) {
    return fn && fn(args...) == 0;
  }
  void close() {
    if (lib_) dlclose(lib_);
    lib_ = nullptr;
    initialised_ = false;
  }

  void* lib_ = nullptr;
  bool initialised_ = false;
  std::string why_;
  Functions f_;
};

inline std::optional<std::string> Device::name() const {
  char n[abi::kNameBytes] = {};
  if (!Library::ok(lib_->f_.name, h_, n, abi::kNameBytes)) return std::nullopt;
  return std::string(n);
}
inline std::optional<abi::Memory> Device::memory() const {
  abi::Memory m{};
  return Library::ok(lib_->f_.memory, h_, &m) ? std::optional(m) : std::nullopt;
}
inline std::optional<double> Device::power_w() const {
  unsigned int mw = 0;
  return Library::ok(lib_->f_.power, h_, &mw) ? std::optional(mw * 1e-3) : std::nullopt;
}
inline std::optional<double> Device::power_limit_w() const {
  unsigned int mw = 0;
  return Library::ok(lib_->f_.power_limit, h_, &mw) ? std::optional(mw * 1e-3) : std::nullopt;
}
inline std::optional<double> Device::energy_j() const {
  unsigned long long mj = 0;
  return Library::ok(lib_->f_.energy, h_, &mj) ? std::optional(static_cast<double>(mj) * 1e-3) : std::nullopt;
}
inline std::optional<abi::Utilization> Device::utilization() const {
  abi::Utilization u{};
  return Library::ok(lib_->f_.utilization, h_, &u) ? std::optional(u) : std::nullopt;
}
inline std::optional<unsigned int> Device::clock_mhz(Clock c) const {
  unsigned int mhz = 0;
  return Library::ok(lib_->f_.clock, h_, static_cast<int>(c), &mhz) ? std::optional(mhz) : std::nullopt;
}
inline std::optional<unsigned int> Device::max_clock_mhz(Clock c) const {
  unsigned int mhz = 0;
  return Library::ok(lib_->f_.max_clock, h_, static_cast<int>(c), &mhz) ? std::optional(mhz) : std::nullopt;
}
inline std::optional<PciAddress> Device::pci() const {
  abi::PciInfo p{};
  if (!Library::ok(lib_->f_.pci_info, h_, &p)) return std::nullopt;
  return PciAddress{p.domain, p.bus, p.device};
}
inline std::optional<std::string> Device::pci_bus_id() const {
  abi::PciInfo p{};
  if (!Library::ok(lib_->f_.pci_info, h_, &p)) return std::nullopt;
  return std::string(p.bus_id);
}
inline std::vector<NvLink> Device::nvlinks() const {
  std::vector<NvLink> out;
  for (unsigned int l = 0; l < abi::kMaxNvLinks; ++l) {
    int active = 0;
    if (!Library::ok(lib_->f_.nvlink_state, h_, l, &active) || active != 1) continue;
    abi::PciInfo p{};
    if (Library::ok(lib_->f_.nvlink_remote_pci, h_, l, &p)) out.push_back({l, PciAddress{p.domain, p.bus, p.device}});
    else out.push_back({l, std::nullopt});
  }
  return out;
}
inline std::optional<Topology> Device::common_ancestor(const Device& other) const {
  int level = 0;
  if (!Library::ok(lib_->f_.common_ancestor, h_, other.h_, &level)) return std::nullopt;
  return static_cast<Topology>(level);
}

#ifdef DPML_WITH_CUDA
// The NVML handle of CUDA device `cuda_index` (as this process numbers it), by its PCI bus id.
inline std::optional<Device> device_of_cuda(const Library& lib, int cuda_index) {
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, cuda_index) != cudaSuccess) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  return lib.device_by_pci_bus_id(bus_id);
}
#endif

// What a GPU drew between two laps of a PowerMeter.
struct Lap {
  double seconds = 0;                   // since the previous lap (or the meter's construction)
  std::optional<double> joules, watts;  // nothing where the GPU reports neither energy nor power
  bool from_energy_counter = false;     // else integrated from power samples
  std::optional<abi::Utilization> utilization;  // NVML's last sample period, at the lap
};

// Laps chain: each starts at the instant the previous one ended, so their seconds add up to the
// time metered. A lap's joules are its seconds × the GPU's mean power as last read; the GPU is read
// at a lap only when `read_interval` seconds (0.1) have passed since the last read, so a loop of
// millisecond steps (fashion_mnist: ~1 ms) does not spend its time in NVML, and a reading is no
// staler than the counter's own steps (every ~100 ms on H100/H200). With an energy counter, the
// mean power is the counter's over its recent history — from the first reading at which the
// counter had moved that is at least `window` seconds old, to the latest such reading: a
// difference of two arbitrary readings is off by up to a counter step at each end, and readings
// at which the counter had just moved are late by at most one read interval, so over the window
// the error is at most an interval / window. Until the counter has moved twice, the mean is NVML's
// own power reading. Without a counter, the mean is the integral of the power samples (sample(),
// and one at each read) since the previous read over its time.
class PowerMeter {
 public:
  using clock = std::chrono::steady_clock;

  explicit PowerMeter(Device gpu, double window_s = 2.0, double read_interval_s = 0.1)
      : gpu_(gpu), counter_(gpu.energy_j().has_value()), window_(window_s), read_interval_(read_interval_s), start_(clock::now()),
        last_t_(start_) {
    if (counter_) last_j_ = gpu_.energy_j();
    else begin_integral();
  }

  // One more power sample for the integral (no-op where the energy counter is used): call it
  // now and then during long work when the GPU has no counter.
  void sample() {
    if (counter_) return;
    const clock::time_point t = clock::now();
    const std::optional<double> w = gpu_.power_w();
    if (w && last_w_ && integral_j_) *integral_j_ += 0.5 * (*w + *last_w_) * std::chrono::duration<double>(t - last_t_).count();
    else integral_j_.reset();
    last_w_ = w;
    last_t_ = t;
  }

  // Since construction or the previous lap; the next starts now.
  Lap lap() {
    const clock::time_point t = clock::now();
    if (!read_at_ || t - *read_at_ >= std::chrono::duration<double>(read_interval_)) read(t);
    Lap out;
    out.from_energy_counter = counter_;
    out.seconds = std::chrono::duration<double>(t - start_).count();
    start_ = t;
    out.watts = watts_;
    if (watts_) out.joules = *watts_ * out.seconds;
    out.utilization = utilization_;
    return out;
  }

 private:
  struct Tick {
    clock::time_point t;
    double joules;
  };

  // The GPU's mean power and utilisation now (see the top of the class).
  void read(clock::time_point t) {
    read_at_ = t;
    if (counter_) {
      observe(t, gpu_.energy_j());
      watts_ = ticks_.size() >= 2 ? std::optional((ticks_.back().joules - ticks_.front().joules) /
                                                  std::chrono::duration<double>(ticks_.back().t - ticks_.front().t).count())
                                  : gpu_.power_w();
    } else {
      sample();
      const double span = std::chrono::duration<double>(last_t_ - integral_from_).count();
      watts_ = integral_j_ && span > 0 ? std::optional(*integral_j_ / span) : last_w_;
      begin_integral();
    }
    utilization_ = gpu_.utilization();
  }

  // A counter reading: kept as a tick where the counter moved since the previous reading; ticks
  // older than needed for `window_` seconds of history are dropped (two are always kept).
  void observe(clock::time_point t, std::optional<double> joules) {
    if (!joules) {  // a failed read: the history no longer spans the work
      ticks_.clear();
    } else if (!last_j_ || *joules != *last_j_) {
      ticks_.push_back({t, *joules});
      while (ticks_.size() > 2 && ticks_[1].t <= t - std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(window_)))
        ticks_.pop_front();
    }
    last_j_ = joules;
  }

  void begin_integral() {
    if (!last_w_) last_w_ = gpu_.power_w();  // at construction; afterwards the sample just taken
    integral_from_ = last_t_;
    integral_j_ = last_w_ ? std::optional(0.0) : std::nullopt;
  }

  Device gpu_;
  bool counter_;
  double window_, read_interval_;
  clock::time_point start_, last_t_;          // the lap's start; sampling: the latest sample's time
  std::optional<clock::time_point> read_at_;  // the last read (none yet: the first lap reads)
  std::optional<double> watts_;               // the mean power as last read
  std::optional<abi::Utilization> utilization_;
  std::optional<double> last_j_;              // counter: the latest reading
  std::deque<Tick> ticks_;                    // counter: readings at which it had moved, oldest first
  std::optional<double> last_w_;              // sampling: the latest power reading
  clock::time_point integral_from_;           // sampling: where the integral starts
  std::optional<double> integral_j_;          // sampling: joules since integral_from_ (nothing once a sample failed)
};

}  // namespace dpml::nvml
