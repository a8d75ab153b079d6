// pipeline_bubble: the idle fraction of each pipeline stage for GPipe, 1F1B, ZB-H1 and interleaved
// 1F1B with v = 2 and 4 chunks per rank (each chunk 1/v of a stage's F, B and W), beside the
// theory of parallel/pipeline/schedule.hpp.
//
//   pipeline_bubble --simulate                 # cost model, pp = 2 and 4, m = 4 and 8
//   mpiexec -n 2 pipeline_bubble               # measured: pp = world size, m = 4 and 8
//   mpiexec -n 4 pipeline_bubble --f-ms 4 --b-ms 4 --w-ms 4
//
// The measured mode runs the real executor (isend / early irecv between ranks) over a toy stage
// whose F, B and W sleep for fixed times and whose messages are --width floats; sleeping rather
// than spinning keeps the numbers meaningful with more ranks than cores. Per configuration, after
// one warm-up step, each of --steps steps starts after a barrier; the step's makespan is the
// slowest stage's time, and a stage's idle fraction is 1 − busy / makespan, averaged over steps.
// Output: one JSON object per line ({"bench":"pipeline_bubble",...}), then a table on stderr.
#include <dpml/comm/launch.hpp>
#include <dpml/comm/mpi.hpp>
#include <dpml/core/tensor.hpp>
#include <dpml/parallel/pipeline/executor.hpp>
#include <dpml/parallel/pipeline/schedule.hpp>
#include <dpml/train/args.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace pl = dpml::parallel::pipeline;

namespace {

struct SleepStage {
  using value_type = float;
  std::chrono::microseconds f, b, w;
  dpml::Tensor<float> in, out, grad_in, grad_out;  // (m, width) each
  SleepStage(pl::Costs c, int m, int width)
      : f(static_cast<long>(c.forward * 1000)), b(static_cast<long>(c.backward_input * 1000)),
        w(static_cast<long>(c.backward_weight * 1000)), in({m, width}, 0.f), out({m, width}, 1.f),
        grad_in({m, width}, 1.f), grad_out({m, width}, 0.f) {}
  void forward(int) { std::this_thread::sleep_for(f); }
  void backward_input(int) { std::this_thread::sleep_for(b); }
  void backward_weight(int) { std::this_thread::sleep_for(w); }
  dpml::TensorView<float> recv_forward_buffer(int mb) { return in.view().select0(mb); }
  dpml::TensorView<const float> send_forward_buffer(int mb) { return out.view().select0(mb); }
  dpml::TensorView<float> recv_backward_buffer(int mb) { return grad_out.view().select0(mb); }
  dpml::TensorView<const float> send_backward_buffer(int mb) { return grad_in.view().select0(mb); }
};

// The same under the interleaved schedule (a pl::ChunkedStage): v chunks per rank, each sleeping
// 1/v of the stage's F, B and W; chunk c's micro-batch mb is row c·m + mb of the buffers.
struct ChunkedSleepStage {
  using value_type = float;
  SleepStage rows;
  int m;
  ChunkedSleepStage(pl::Costs c, int v, int m, int width)
      : rows(pl::Costs{c.forward / v, c.backward_input / v, c.backward_weight / v, c.comm}, v * m, width), m(m) {}
  void forward(int c, int mb) { rows.forward(c * m + mb); }
  void backward_input(int c, int mb) { rows.backward_input(c * m + mb); }
  void backward_weight(int c, int mb) { rows.backward_weight(c * m + mb); }
  dpml::TensorView<float> recv_forward_buffer(int c, int mb) { return rows.recv_forward_buffer(c * m + mb); }
  dpml::TensorView<const float> send_forward_buffer(int c, int mb) { return rows.send_forward_buffer(c * m + mb); }
  dpml::TensorView<float> recv_backward_buffer(int c, int mb) { return rows.recv_backward_buffer(c * m + mb); }
  dpml::TensorView<const float> send_backward_buffer(int c, int mb) { return rows.send_backward_buffer(c * m + mb); }
};

struct Row {
  std::string schedule;
  int pp, m;
  double theory, simulated, measured;  // mean idle fractions (measured: −1 when not measured)
  std::vector<double> per_stage;
};

// `c`: a stage's costs; under interleaving each chunk's are c / v.
template <class Tag>
Row simulate_row(const char* name, int p, int m, const pl::Costs& stage_costs, Tag tag = {}) {
  const double v = pl::chunks_of(tag);
  const pl::Costs c{stage_costs.forward / v, stage_costs.backward_input / v, stage_costs.backward_weight / v, stage_costs.comm};
  const auto sim = pl::simulate(pl::make_schedule(tag, p, m), c);
  Row r{name, p, m, pl::theory_bubble(tag, p, m, c), sim.bubble_fraction(), -1, {}};
  for (const auto& s : sim.stages) r.per_stage.push_back(s.idle / sim.makespan);
  return r;
}

template <class Tag>
Row measure_row(const char* name, const dpml::comm::Mpi& world, int m, const pl::Costs& c, int width, int steps, Tag tag = {}) {
  const int p = world.size(), s = world.rank(), v = pl::chunks_of(tag);
  const auto schedule = pl::make_schedule(tag, p, m);
  pl::check_schedule(schedule, p, m, v).throw_if_error();
  SleepStage stage(c, m, width);
  ChunkedSleepStage chunks(c, v, m, width);
  std::vector<double> idle_sum(static_cast<std::size_t>(p), 0.0);
  for (int step = -1; step < steps; ++step) {  // step −1: warm-up, not counted
    world.barrier();
    const auto& actions = schedule[static_cast<std::size_t>(s)];
    const pl::StepTimings t = v == 1 ? pl::run_stage(actions, stage, world) : pl::run_stage(actions, chunks, world, false, v);
    double mine[2] = {t.busy(), t.total};
    std::vector<double> all(2 * static_cast<std::size_t>(p));
    world.allgather(mine, all.data(), 2);
    if (step < 0) continue;
    double makespan = 0;
    for (int r = 0; r < p; ++r) makespan = std::max(makespan, all[2 * static_cast<std::size_t>(r) + 1]);
    for (int r = 0; r < p; ++r) idle_sum[static_cast<std::size_t>(r)] += 1 - all[2 * static_cast<std::size_t>(r)] / makespan;
  }
  Row r = simulate_row(name, p, m, c, tag);
  double mean = 0;
  for (auto& x : idle_sum) mean += (x /= steps);
  r.measured = mean / p;
  r.per_stage = idle_sum;
  return r;
}

void print(const Row& r, const pl::Costs& c, bool measured) {
  std::printf("{\"bench\":\"pipeline_bubble\",\"mode\":\"%s\",\"schedule\":\"%s\",\"pp\":%d,\"micro_batches\":%d,"
              "\"f_ms\":%g,\"b_ms\":%g,\"w_ms\":%g,\"theory\":%.4f,\"simulated\":%.4f",
              measured ? "measured" : "simulated", r.schedule.c_str(), r.pp, r.m, c.forward, c.backward_input,
              c.backward_weight, r.theory, r.simulated);
  if (measured) std::printf(",\"measured\":%.4f", r.measured);
  std::printf(",\"idle_per_stage\":[");
  for (std::size_t i = 0; i < r.per_stage.size(); ++i) std::printf("%s%.4f", i ? "," : "", r.per_stage[i]);
  std::printf("]}\n");
}

void table(const std::vector<Row>& rows, bool measured) {
  std::fprintf(stderr, "\n%-7s %3s %3s %8s %10s %10s   idle fraction per stage (%s)\n", "sched", "pp", "m", "theory",
               "simulated", measured ? "measured" : "", measured ? "measured" : "simulated");
  for (const auto& r : rows) {
    std::fprintf(stderr, "%-7s %3d %3d %8.3f %10.3f ", r.schedule.c_str(), r.pp, r.m, r.theory, r.simulated);
    if (measured) std::fprintf(stderr, "%10.3f   ", r.measured);
    else std::fprintf(stderr, "%10s   ", "");
    for (double x : r.per_stage) std::fprintf(stderr, " %.3f", x);
    std::fprintf(stderr, "\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const dpml::comm::Mpi& world) {
    bool simulate_only = false;
    double f_ms = 4, b_ms = 4, w_ms = 4;
    int width = 4096, steps = 3;
    dpml::train::Args args("pipeline_bubble",
                           "Pipeline bubble (idle fraction per stage) of GPipe, 1F1B, ZB-H1 and interleaved 1F1B with\n"
                           "2 and 4 chunks per rank beside the theory.\n"
                           "Measured mode: pp = number of ranks (mpiexec -n 2 or 4), m = 4 and 8.");
    args.flag("--simulate", simulate_only, "cost model only, pp = 2 and 4 (any number of ranks; rank 0 prints)")
        .flag("--f-ms", f_ms, "forward time per micro-batch and stage, ms", dpml::train::at_least(0.0))
        .flag("--b-ms", b_ms, "backward-input time, ms", dpml::train::at_least(0.0))
        .flag("--w-ms", w_ms, "backward-weight time, ms", dpml::train::at_least(0.0))
        .flag("--width", width, "floats per activation / gradient message", dpml::train::at_least(1))
        .flag("--steps", steps, "measured steps per configuration (after one warm-up step)", dpml::train::at_least(1));
    if (!args.parse(argc, argv, world.rank())) return 0;
    DPML_REQUIRE_EVERYWHERE(steps >= 1 && width >= 1, "--steps and --width must be at least 1");
    const pl::Costs c{f_ms, b_ms, w_ms, 0};
    std::vector<Row> rows;
    const bool measured = !simulate_only;
    for (int p : simulate_only ? std::vector<int>{2, 4} : std::vector<int>{world.size()})
      for (int m : {4, 8}) {
        if (simulate_only) {
          rows.push_back(simulate_row<pl::GPipe>("gpipe", p, m, c));
          rows.push_back(simulate_row<pl::OneFOneB>("1f1b", p, m, c));
          rows.push_back(simulate_row<pl::ZeroBubbleH1>("zb-h1", p, m, c));
          rows.push_back(simulate_row("ilv-v2", p, m, c, pl::Interleaved1F1B{2}));
          rows.push_back(simulate_row("ilv-v4", p, m, c, pl::Interleaved1F1B{4}));
        } else {
          rows.push_back(measure_row<pl::GPipe>("gpipe", world, m, c, width, steps));
          rows.push_back(measure_row<pl::OneFOneB>("1f1b", world, m, c, width, steps));
          rows.push_back(measure_row<pl::ZeroBubbleH1>("zb-h1", world, m, c, width, steps));
          rows.push_back(measure_row("ilv-v2", world, m, c, width, steps, pl::Interleaved1F1B{2}));
          rows.push_back(measure_row("ilv-v4", world, m, c, width, steps, pl::Interleaved1F1B{4}));
        }
      }
    if (world.rank() == 0) {
      for (const auto& r : rows) print(r, c, measured);
      std::fflush(stdout);
      table(rows, measured);
    }
    return 0;
  });
}
