#pragma once
// What a training step cost the machine, for the metrics of any training loop (train_gpt,
// fashion_mnist): MFU — the step's model FLOPs (train/flops.hpp) over its time and the bf16 peak
// of the run's GPUs —, this process's memory now and at most (train/memory.hpp, rank 0's in the
// metrics) and the GPUs' power and energy (train/energy.hpp). One reading per step, whose fields
// go to every metrics sink under fixed names (Reading::metrics) beside the loop's own.
//
// MFU and power need a GPU per rank (`own_gpus`); on CPU ranks and shared GPUs they are NaN (left
// out of the progress line, null in JSON), as MFU is on a GPU missing from the peak table.
//
//   train::StepMeter<Space> meter(world, own_gpus);                 // collective
//   const auto hw = meter.lap(flops_per_step, r.seconds);          // collective: every step
//   metrics.write(step, {{"loss", r.loss}, …}, hw.metrics("energy_j_per_token", tokens));

#include "dpml/comm/mpi.hpp"
#include "dpml/train/energy.hpp"
#include "dpml/train/flops.hpp"
#include "dpml/train/memory.hpp"
#include "dpml/train/progress.hpp"

#include <array>
#include <cmath>
#include <string_view>

namespace dpml::train {

template <class Space>
class StepMeter {
 public:
  struct Reading {
    double mfu = NAN, memory_gib = NAN, peak_memory_gib = NAN;
    EnergyReading power;
    // The record's fields; the energy per unit of work (`units` of it in the step) under `per_unit`
    // (e.g. "energy_j_per_token"). The names must outlive the write (literals).
    std::array<Metric, 7> metrics(std::string_view per_unit, double units) const {
      return {{{"mfu", mfu},
               {"memory_gib", memory_gib},
               {"peak_memory_gib", peak_memory_gib},
               {"power_w", power.watts},
               {"energy_j", power.joules},
               {per_unit, power.joules / units},
               {"gpu_util", power.gpu_util}}};
    }
  };

  // Collective over `world` (which outlives the meter).
  StepMeter(const comm::Mpi& world, bool own_gpus) : energy_(world, own_gpus) {
#if defined(DPML_WITH_CUDA)
    if (own_gpus) peak_tflops_ = device_peak_bf16_tflops(world.rank() == 0) * world.size();
#endif
  }

  // The step that took `seconds` and did `flops` of model work (all ranks'). Collective.
  Reading lap(double flops, double seconds) {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    const MemoryUse mem = memory_now<Space>();
    Reading r;
    r.mfu = mfu(flops, seconds, peak_tflops_);
    r.memory_gib = static_cast<double>(mem.current_bytes) / kGiB;
    r.peak_memory_gib = static_cast<double>(mem.peak_bytes) / kGiB;
    r.power = energy_.lap();
    return r;
  }

 private:
  EnergyMeter energy_;
  double peak_tflops_ = NAN;  // all GPUs' bf16 dense TFLOP/s
};

}  // namespace dpml::train
