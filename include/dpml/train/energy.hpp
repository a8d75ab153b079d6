#pragma once
// What the GPUs of a run draw, step by step: each rank meters its own GPU through NVML
// (core/nvml.hpp, loaded at run time: nvml::PowerMeter, the GPU's energy counter over its last
// ~2 s, else power samples × time) and each lap() sums the laps over the world — the run's GPUs'
// summed power, the joules that power draws over the lap (a step's share even where a step is
// shorter than the counter's ~100 ms steps), and rank 0's GPU utilisation. A training loop calls lap() once per
// step (it is collective: one all-reduce of three numbers) and logs power_w, energy_j and
// energy_j_per_token (train_gpt, fashion_mnist).
//
// Nothing is metered — every reading NaN — on CPU ranks (a HostSpace run), in a build without
// CUDA, where ranks share GPUs (comm::Staged: a GPU would count once per rank), or where any
// rank's GPU gives no reading (no NVML, no driver, a GPU NVML cannot name or that reports neither
// energy nor power); world rank 0 then says once why, and training goes on.
//
//   train::EnergyMeter energy(world, /*metered=*/f.device == "cuda" && !shared_gpus);
//   for (step …) { trainer.train_step(…); const auto e = energy.lap(); … e.joules / tokens … }

#include "dpml/comm/mpi.hpp"
#include "dpml/core/nvml.hpp"

#ifdef DPML_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

namespace dpml::train {

struct EnergyReading {
  double joules = NAN;         // all GPUs, over the time since the previous lap
  double watts = NAN;          // their summed mean power over it
  double gpu_util = NAN;       // rank 0's GPU, percent of NVML's last sample period
};

class EnergyMeter {
 public:
  // Collective over `world` (which outlives the meter). `metered`: this run has a GPU of its own
  // on every rank.
  EnergyMeter(const comm::Mpi& world, bool metered) : world_(world) {
    std::string why = metered ? "" : "-";
#ifdef DPML_WITH_CUDA
    if (metered) {
      const nvml::Library& lib = nvml::Library::instance();
      int device = 0;
      if (!lib.available()) {
        why = "no NVML (" + lib.why() + ")";
      } else if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        why = "no current CUDA device";
      } else if (const auto gpu = nvml::device_of_cuda(lib, device)) {
        meter_.emplace(*gpu);
      } else {
        why = "NVML does not name CUDA device " + std::to_string(device);
      }
    }
#else
    if (metered) why = "built without CUDA";
#endif
    // Metered only if every rank is; rank 0 reports the first reason it knows of.
    on_ = world_.allreduce(meter_ ? 1 : 0, comm::ReduceOp::min) == 1;
    if (metered && !on_ && world_.rank() == 0)
      std::printf("dpml: GPU power and energy are not reported: %s\n", why.empty() ? "a rank's GPU gives no reading" : why.c_str());
  }

  bool metered() const noexcept { return on_; }

  // Since construction or the previous lap, summed over the world's GPUs. Collective.
  EnergyReading lap() {
    if (!on_) return {};
    double mine[3] = {NAN, 0.0, NAN};  // joules, seconds, utilisation (rank 0's)
    const nvml::Lap l = meter_->lap();
    if (l.joules) mine[0] = *l.joules;
    mine[1] = l.seconds;
    if (l.utilization && world_.rank() == 0) mine[2] = static_cast<double>(l.utilization->gpu);
    const double missing = std::isnan(mine[0]) ? 1.0 : 0.0;
    double sums[3] = {std::isnan(mine[0]) ? 0.0 : mine[0], missing, world_.rank() == 0 ? mine[2] : 0.0};
    world_.allreduce(sums, 3, comm::ReduceOp::sum);
    EnergyReading r;
    if (sums[1] == 0.0) {  // every GPU answered
      r.joules = sums[0];
      if (mine[1] > 0) r.watts = sums[0] / mine[1];
    }
    r.gpu_util = sums[2];
    return r;
  }

 private:
  const comm::Mpi& world_;
  std::optional<nvml::PowerMeter> meter_;
  bool on_ = false;
};

}  // namespace dpml::train
