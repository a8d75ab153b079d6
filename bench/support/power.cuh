#pragma once
// What the GPU benches share for energy: the GPUs' mean power while a bench keeps repeating its
// training step after the timed steps (bench/gpt_train, bench/encoder_train, bench/resnet_train),
// so a run reports power_w beside its throughput and a throughput per joule (samples/s ÷ W).
// bench/reference/gpu_power.py measures PyTorch's runs by the same rule, so the two compare.
//
// Each rank meters its own GPU with nvml::PowerMeter: its energy counter (it moves in ~100 ms
// steps on H100/H200), read at most every 0.1 s, averaged between the first and last moves of the
// phase's last `seconds − 1` (the first second lets power settle after the timed steps' end). The
// ranks' means are summed. Nothing is reported (null in the JSON line) where NVML or any rank's
// GPU gives no reading; rank 0 says why on stderr (included by relative path; not a program).
#include <dpml/comm/mpi.hpp>
#include <dpml/core/cuda_error.hpp>
#include <dpml/core/nvml.hpp>
#include <dpml/train/args.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

namespace dpml::bench {

// How long a bench trains on after its timed steps to meter the power, unless --energy-seconds says.
inline constexpr double kEnergySeconds = 3;

// --energy-seconds among a bench's flags.
inline train::Args& energy_seconds_flag(train::Args& args, double& seconds) {
  return args.flag("--energy-seconds", seconds,
                   "after the timed steps, train this many seconds more to meter the GPUs' mean power "
                   "(bench/support/power.cuh; 0: not measured)",
                   train::at_least(0.0));
}

// Repeats step() — which ends synchronised, as a timed training step does — ⌈seconds / ms_per_step⌉
// times on every rank (the same count everywhere: `ms_per_step` is the slowest rank's) and returns
// the ranks' GPUs' summed mean power in watts, NaN where not measured (seconds ≤ 0: nothing runs).
template <class Step>
double mean_power_w(const comm::Mpi& world, double seconds, double ms_per_step, Step&& step) {
  if (!(seconds > 0)) return NAN;
  const nvml::Library& lib = nvml::Library::instance();
  int device = 0;
  DPML_CHECK_CUDA(cudaGetDevice(&device));
  std::string why;
  std::optional<nvml::PowerMeter> meter;
  if (!lib.available()) why = "no NVML (" + lib.why() + ")";
  else if (const auto gpu = nvml::device_of_cuda(lib, device)) meter.emplace(*gpu, std::max(1.0, seconds - 1.0), 0.1);
  else why = "NVML does not name CUDA device " + std::to_string(device);
  const long long steps = std::max(1LL, static_cast<long long>(std::ceil(seconds * 1e3 / ms_per_step)));
  std::optional<double> watts;
  for (long long i = 0; i < steps; ++i) {
    step();
    if (meter) watts = meter->lap().watts;
  }
  if (meter && !watts) why = "the GPU reports neither energy nor power";
  double sums[2] = {watts.value_or(0.0), watts ? 0.0 : 1.0};  // watts, ranks without a reading
  world.allreduce(sums, 2, comm::ReduceOp::sum);
  if (sums[1] == 0) return sums[0];
  if (world.rank() == 0)
    std::fprintf(stderr, "power not measured: %s\n", why.empty() ? "a rank's GPU gives no reading" : why.c_str());
  return NAN;
}

// A JSON number, or null for NaN and infinities (printf would write nan, which JSON lacks).
inline std::string json_number(double v, int decimals = 1) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

}  // namespace dpml::bench
