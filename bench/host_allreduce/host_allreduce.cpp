// host_allreduce: the time of a flat all-reduce (comm::Mpi) against the hierarchical one
// (comm::Hierarchical<comm::Mpi>: reduce-scatter inside each node, all-reduce across nodes,
// all-gather inside each node) of a float buffer over every rank of the launch, for sizes from
// --min-elements to --max-elements by --factor. Nodes: --ranks-per-node consecutive ranks (a
// cluster modelled on one host), or 0 for the hosts of the launch.
//
//   mpiexec -n 4 build/cpu/bench/host_allreduce/host_allreduce --ranks-per-node 2
//
// Per size: --warmup calls of each path, then --repeats batches of --iters in-place sums per path,
// the two paths interleaved batch by batch; a call's time is the median batch time / iters, the
// slowest rank's. On one host both paths move their bytes through shared memory, and the
// hierarchical one makes three collectives of one: it is not expected to be faster there; on a
// cluster it sends a node-size-th of the bytes over the links between nodes.
//
// Output: one JSON object per (size, path) —
// {"bench":"host_allreduce","path":"flat"|"hierarchical","elements":..,"bytes":..,"ranks":..,"ranks_per_node":..,"us":..}
// — then a Markdown table of both times and hierarchical / flat (rank 0).
#include <dpml/comm/hierarchical.hpp>
#include <dpml/comm/launch.hpp>
#include <dpml/comm/mpi.hpp>
#include <dpml/train/args.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

using namespace dpml;

namespace {
struct Options {
  std::int64_t min_elements = 1 << 10, max_elements = 1 << 20;
  int factor = 8, ranks_per_node = 2, warmup = 2, iters = 5, repeats = 5;
};

// Seconds per call of `call` (median of the batches, slowest rank).
template <class Call>
double time_per_call(const comm::Mpi& world, const Options& o, Call&& call, std::vector<double>& batches) {
  world.barrier();
  const double t0 = MPI_Wtime();
  for (int i = 0; i < o.iters; ++i) call();
  batches.push_back(world.allreduce((MPI_Wtime() - t0) / o.iters, comm::ReduceOp::max));
  std::vector<double> v = batches;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const comm::Mpi& world) {
    Options o;
    train::Args args("host_allreduce", "Flat against hierarchical all-reduce of float buffers over the ranks of the launch.");
    args.flag("--min-elements", o.min_elements, "smallest buffer (floats)", train::between<std::int64_t>(1, std::int64_t{1} << 30))
        .flag("--max-elements", o.max_elements, "largest buffer (floats; >= --min-elements)",
              train::between<std::int64_t>(1, std::int64_t{1} << 30))
        .flag("--factor", o.factor, "ratio of one size to the next", train::between(2, 1 << 20))
        .flag("--ranks-per-node", o.ranks_per_node, "consecutive ranks per node (0: the ranks sharing a host)", train::at_least(0))
        .flag("--warmup", o.warmup, "untimed calls of each path per size", train::at_least(0))
        .flag("--iters", o.iters, "calls in one timed batch", train::at_least(1))
        .flag("--repeats", o.repeats, "timed batches per path (the median is reported)", train::at_least(1));
    if (!args.parse(argc, argv, world.rank())) return 0;
    DPML_REQUIRE_EVERYWHERE(o.max_elements >= o.min_elements,
                            "--max-elements " << o.max_elements << " is below --min-elements " << o.min_elements);
    const auto hier = comm::Hierarchical<comm::Mpi>::from(world, o.ranks_per_node);
    struct Row {
      std::int64_t n;
      double flat, hier;
    };
    std::vector<Row> rows;
    for (std::int64_t n = o.min_elements; n <= o.max_elements; n *= o.factor) {
      std::vector<float> buf(static_cast<std::size_t>(n), 1.0f / static_cast<float>(world.size()));
      const auto flat_call = [&] { world.allreduce(buf.data(), buf.size(), comm::ReduceOp::sum); };
      const auto hier_call = [&] { hier.allreduce(buf.data(), buf.size(), comm::ReduceOp::sum); };
      for (int i = 0; i < o.warmup; ++i) flat_call(), hier_call();
      std::vector<double> flat_batches, hier_batches;
      Row r{n, 0, 0};
      for (int k = 0; k < o.repeats; ++k) {
        r.flat = time_per_call(world, o, flat_call, flat_batches);
        r.hier = time_per_call(world, o, hier_call, hier_batches);
      }
      rows.push_back(r);
      if (world.rank() == 0)
        for (const auto& [path, s] : {std::pair{"flat", r.flat}, std::pair{"hierarchical", r.hier}})
          std::printf("{\"bench\":\"host_allreduce\",\"path\":\"%s\",\"elements\":%lld,\"bytes\":%lld,\"ranks\":%d,"
                      "\"ranks_per_node\":%d,\"us\":%.1f}\n",
                      path, static_cast<long long>(n), static_cast<long long>(n) * 4, world.size(), hier.ranks_per_node(), s * 1e6);
    }
    if (world.rank() == 0) {
      std::printf("\n| floats | flat µs | hierarchical µs (%d node(s) × %d ranks) | hierarchical / flat |\n|---:|---:|---:|---:|\n",
                  hier.nodes(), hier.ranks_per_node());
      for (const Row& r : rows)
        std::printf("| %lld | %.1f | %.1f | %.2f |\n", static_cast<long long>(r.n), r.flat * 1e6, r.hier * 1e6, r.hier / r.flat);
    }
    return 0;
  });
}
