// host_throughput: training throughput (images/s) of the ResNet-style CNN of examples/fashion_mnist
// (models::ResNet, width 16, 1 block per stage, SGD with Nesterov momentum) through
// train::ClassifierTrainer, data parallel over every rank of the launch, on synthetic 28×28 data.
//
//   mpiexec -n 1 host_throughput
//   mpiexec -n 2 host_throughput
//   mpiexec -n 4 host_throughput --steps 10
//
// Each rank holds its loader slice of one fixed random global batch ([⌊r·G/K⌋, ⌊(r+1)·G/K⌋) of G
// samples, as data::DistributedSampler cuts it). After --warmup steps, --steps steps are timed;
// a step's time is the slowest rank's, and so is its exposed communication (the time the
// optimizer waited for gradient all-reduces that backward did not hide). Reported: the median
// step time, images/s = G / median, and the median exposed communication per step, with the
// 1-minute load average read at the start (the machine may be shared).
// Output: one JSON object ({"bench":"host_throughput",...}), then a table on stderr (rank 0).
#include <dpml/comm/launch.hpp>
#include <dpml/comm/mpi.hpp>
#include <dpml/core/tensor.hpp>
#include <dpml/data/loader.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/resnet.hpp>
#include <dpml/optim/sgd.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/train/args.hpp>
#include <dpml/train/classifier.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

using namespace dpml;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// First field of /proc/loadavg, −1 where there is none.
double load_average() {
  std::ifstream f("/proc/loadavg");
  double load = -1;
  f >> load;
  return f ? load : -1;
}

// This rank's slice of a random global batch of G images (1, 28, 28) with labels in [0, 10).
data::Batch synthetic_slice(std::int64_t G, int rank, int ranks, std::uint64_t seed) {
  const std::int64_t lo = rank * G / ranks, hi = (rank + 1) * G / ranks, n = hi - lo;
  data::Batch b;
  b.global_size = G;
  b.images = Tensor<float>({n, 1, 28, 28});  // (n, 1, 28, 28)
  b.labels = Tensor<std::int32_t>({n});      // (n)
  std::mt19937_64 gen(seed + static_cast<std::uint64_t>(rank));
  std::normal_distribution<float> pixel(0.f, 1.f);
  for (std::int64_t i = 0; i < b.images.numel(); ++i) b.images[i] = pixel(gen);
  for (std::int64_t i = 0; i < n; ++i) b.labels[i] = static_cast<std::int32_t>(gen() % 10);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const comm::Mpi& world) {
    std::int64_t width = 16, blocks = 1, global_batch = 128;
    int warmup = 3, steps = 10, micro_batches = 1;
    double bucket_mb = 25;
    bool sync_bn = false;
    train::Args args("host_throughput",
                     "Training images/s of the ResNet-style CNN (Fashion-MNIST shapes, synthetic data) through\n"
                     "ClassifierTrainer, data parallel over all ranks of the launch (mpiexec -n 1, 2, 4).");
    args.flag("--width", width, "channels of the first stage (then 2w, 4w)", dpml::train::at_least(1))
        .flag("--blocks", blocks, "basic blocks per stage", dpml::train::at_least(1))
        .flag("--global-batch", global_batch, "images per step over all ranks", dpml::train::at_least(1))
        .flag("--micro-batches", micro_batches, "gradient-accumulation chunks of each rank's batch", dpml::train::at_least(1))
        .flag("--bucket-mb", bucket_mb, "gradient bucket size, MiB", dpml::train::positive<double>())
        .flag("--sync-bn", sync_bn, "batch-norm statistics over the whole data-parallel batch")
        .flag("--warmup", warmup, "untimed steps first", dpml::train::at_least(0))
        .flag("--steps", steps, "timed steps (median reported)", dpml::train::at_least(1));
    if (!args.parse(argc, argv, world.rank())) return 0;
    DPML_REQUIRE_EVERYWHERE(warmup >= 0 && steps >= 1 && bucket_mb > 0 && global_batch >= world.size(),
                            "--warmup ≥ 0, --steps ≥ 1, --bucket-mb > 0 and --global-batch ≥ ranks ("
                                << world.size() << ") are needed");
    const double load = load_average();
    auto grid = ProcessGrid::create(world, {});
    const int dp = grid.dp(), dp_rank = grid.coord(Axis::data);
    auto model = models::ResNet<float>::make({.width = width, .blocks_per_stage = blocks, .sync_batch_norm = sync_bn});
    layers::initialize_all(model.parameters(), 1, &grid);
    using Model = decltype(model);
    train::ClassifierTrainer<Model, optim::Sgd> trainer(
        model, grid, {.momentum = 0.9, .weight_decay = 5e-4, .nesterov = true},
        {.bucket_bytes = static_cast<std::size_t>(bucket_mb * (1 << 20))}, {.micro_batches = micro_batches, .seed = 1});
    const data::Batch batch = synthetic_slice(global_batch, dp_rank, dp, 7);

    std::vector<double> step_s, comm_s;
    for (int s = 0; s < warmup + steps; ++s) {
      const auto r = trainer.train_step(batch, 0.01);
      double slowest[2] = {r.seconds, r.exposed_comm_seconds};
      world.allreduce(slowest, 2, comm::ReduceOp::max);
      if (s < warmup) continue;
      step_s.push_back(slowest[0]);
      comm_s.push_back(slowest[1]);
    }
    const double step = median(step_s), exposed = median(comm_s);
    const double ips = static_cast<double>(global_batch) / step;
    if (world.rank() == 0) {
      const char* env = std::getenv("OPENBLAS_NUM_THREADS");
      std::printf("{\"bench\":\"host_throughput\",\"ranks\":%d,\"model\":\"resnet\",\"width\":%lld,\"blocks\":%lld,"
                  "\"global_batch\":%lld,\"micro_batches\":%d,\"warmup\":%d,\"steps\":%d,\"median_step_s\":%.4f,"
                  "\"min_step_s\":%.4f,\"max_step_s\":%.4f,\"img_per_s\":%.1f,\"exposed_comm_s\":%.4f,"
                  "\"openblas_threads\":\"%s\",\"load_avg_1m\":%.2f}\n",
                  dp, static_cast<long long>(width), static_cast<long long>(blocks),
                  static_cast<long long>(global_batch), micro_batches, warmup, steps, step,
                  *std::min_element(step_s.begin(), step_s.end()), *std::max_element(step_s.begin(), step_s.end()),
                  ips, exposed, env ? env : "unset", load);
      std::fflush(stdout);
      std::fprintf(stderr, "\n%5s %6s %12s %9s %15s %8s\n", "ranks", "batch", "median step", "img/s", "exposed comm/step",
                   "load 1m");
      std::fprintf(stderr, "%5d %6lld %10.1f ms %9.1f %12.1f ms %8.2f\n", dp, static_cast<long long>(global_batch),
                   1e3 * step, ips, 1e3 * exposed, load);
    }
    return 0;
  });
}
