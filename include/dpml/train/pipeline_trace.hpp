#pragma once
// A pipeline step as a Gantt chart's data: every rank's F/B/W and waits of one traced step
// (Trainer::trace_next_step, pipeline::Span), gathered to world rank 0 and written as one JSON
// file that scripts/plot-metrics.py --trace draws (one row per rank, a bar per action):
//
//   {"step": 12, "micro_batches": 4, "schedule": "1f1b", "time_unit": "s",
//    "ranks": [{"rank": 0, "host": "node1", "stage": 0, "tensor": 0, "data": 0,
//               "spans": [["F", 0, 0.0000, 0.0121], ["w", 1, 0.0121, 0.0133], …]}, …]}
//
// Times are seconds from the earliest start over all ranks, on each host's steady clock
// (CLOCK_MONOTONIC): one time base for the ranks of a node; across nodes the clocks are not
// aligned (each rank's host is recorded, and the chart says so). On a GPU the spans are the host's
// launches (the executor's stream-ordered stages return once their work is queued). Collective
// over the grid's world; only rank 0 writes.
//
//   trainer.trace_next_step();
//   const auto r = trainer.train_step(batch, lr);
//   train::write_pipeline_trace("trace.json", grid, step, "1f1b", m, r.pipeline);

#include "dpml/comm/mpi.hpp"
#include "dpml/core/axis.hpp"
#include "dpml/core/error.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/parallel/pipeline/executor.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace dpml::train {

inline void write_pipeline_trace(const std::string& path, const parallel::ProcessGrid& grid, std::int64_t step,
                                 const std::string& schedule, int micro_batches, const parallel::pipeline::StepTimings& timings) {
  const comm::Mpi& world = grid.world();
  // Per rank: its coordinates, then per span kind, micro-batch, start, end (doubles); its host.
  int len = 0;
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  DPML_CHECK_MPI(MPI_Get_processor_name(name, &len));
  const std::vector<std::string> hosts = world.allgather(std::string(name, static_cast<std::size_t>(len)));
  std::vector<double> mine = {static_cast<double>(grid.coord(Axis::pipeline)), static_cast<double>(grid.coord(Axis::tensor)),
                              static_cast<double>(grid.coord(Axis::data))};
  for (const auto& s : timings.spans) mine.insert(mine.end(), {static_cast<double>(s.kind), static_cast<double>(s.micro_batch), s.start, s.end});
  const int n = world.size();
  std::vector<int> counts(static_cast<std::size_t>(n));
  const int count = static_cast<int>(mine.size());
  world.allgather(&count, counts.data(), 1);
  std::int64_t all = 0;
  for (int c : counts) all += c;
  std::vector<double> gathered(static_cast<std::size_t>(all));
  world.allgatherv(mine.data(), gathered.data(), counts);
  if (world.rank() != 0) return;

  double t0 = std::numeric_limits<double>::infinity();
  for (std::size_t at = 0, r = 0; r < counts.size(); at += static_cast<std::size_t>(counts[r]), ++r)
    for (std::size_t i = at + 3; i < at + static_cast<std::size_t>(counts[r]); i += 4) t0 = std::min(t0, gathered[i + 2]);
  std::ofstream out(path, std::ios::trunc);
  DPML_REQUIRE(out.good(), "--trace-pipeline: cannot open '" << path << "' for writing");
  char buf[128];
  out << "{\"step\": " << step << ", \"micro_batches\": " << micro_batches << ", \"schedule\": \"" << schedule
      << "\", \"time_unit\": \"s\",\n \"ranks\": [";
  for (std::size_t at = 0, r = 0; r < counts.size(); at += static_cast<std::size_t>(counts[r]), ++r) {
    const double* d = gathered.data() + at;
    out << (r ? ",\n  " : "\n  ") << "{\"rank\": " << r << ", \"host\": \"" << hosts[r] << "\", \"stage\": "
        << static_cast<int>(d[0]) << ", \"tensor\": " << static_cast<int>(d[1]) << ", \"data\": " << static_cast<int>(d[2])
        << ", \"spans\": [";
    for (int i = 3, k = 0; i < counts[r]; i += 4, ++k) {
      std::snprintf(buf, sizeof buf, "%s[\"%c\", %d, %.7f, %.7f]", k ? ", " : "", static_cast<char>(d[i]), static_cast<int>(d[i + 1]),
                    d[i + 2] - t0, d[i + 3] - t0);
      out << buf;
    }
    out << "]}";
  }
  out << "\n]}\n";
  DPML_REQUIRE(out.good(), "--trace-pipeline: writing '" << path << "' failed");
}

}  // namespace dpml::train
