#pragma once
// The data axis' flags of the programs that train data parallel (train_gpt, fashion_mnist): how
// the gradients are all-reduced (--dp-allreduce flat | hierarchical, nodes simulated by
// --ranks-per-node) and what they travel as (--grad-compression and its sizes). One definition of
// their names, ranges and help; the program keeps the values in a DataAxisFlags and hands them to
// parallel::with_strategy and DistributedOptimizerOptions::compression.
//
//   train::DataAxisFlags axis;
//   train::data_axis_flags(args, axis);
//   if (!args.parse(argc, argv, world.rank())) return 0;
//   axis.require_device(device, true);                 // PowerSGD / top-k offered on GPUs too
//   auto grid = ProcessGrid::create(world, {.ranks_per_node = axis.ranks_per_node});
//   parallel::with_strategy(schedule, zero, axis.dp_allreduce, axis.grad_compression, body);

#include "dpml/core/error.hpp"
#include "dpml/parallel/compression/policy.hpp"
#include "dpml/parallel/strategy.hpp"
#include "dpml/train/args.hpp"

#include <cstdint>
#include <string>

namespace dpml::train {

struct DataAxisFlags {
  std::string dp_allreduce = "flat";      // flat | hierarchical
  int ranks_per_node = 0;                 // 0: the ranks sharing a host
  std::string grad_compression = "none";  // none | bf16 | fp16 | powersgd | topk
  int powersgd_rank = 4;
  double topk_ratio = 0.01;
  std::int64_t compression_start_iter = 1;  // the first compressed step

  // The compression policy's sizes, its PowerSGD start drawn from `seed`.
  parallel::CompressionOptions compression(std::uint64_t seed) const {
    return {.powersgd_rank = powersgd_rank, .topk_ratio = topk_ratio, .seed = seed, .start_step = compression_start_iter};
  }
  // Refused on every rank: a compression that `device` cannot run. On a GPU the buckets hold bf16
  // or fp16 gradients already, so bf16 / fp16 on the wire would change nothing; PowerSGD and top-k
  // run on GPU buckets in a program whose GPU path offers them (`gpu_low_rank_and_topk`).
  void require_device(const std::string& device, bool gpu_low_rank_and_topk = false) const {
    if (device == "cpu" || grad_compression == "none") return;
    DPML_REQUIRE_EVERYWHERE(grad_compression != "bf16" && grad_compression != "fp16",
                            "--grad-compression " << grad_compression << " is for CPU ranks' fp32 gradients: on GPUs the "
                                                  "buckets hold 16-bit gradients already");
    DPML_REQUIRE_EVERYWHERE(gpu_low_rank_and_topk, "--grad-compression " << grad_compression
                                                                         << " runs on CPU ranks only in this program (--device cpu)");
  }
  // For a banner: ", hierarchical all-reduce", ", --grad-compression topk [from step N]" or ""
  // (`sep` first).
  std::string describe(const char* sep) const {
    if (dp_allreduce == "hierarchical") return std::string(sep) + "hierarchical all-reduce";
    if (grad_compression != "none")
      return std::string(sep) + "--grad-compression " + grad_compression +
             (compression_start_iter > 1 ? " from step " + std::to_string(compression_start_iter) : "");
    return "";
  }
};

inline Args& data_axis_flags(Args& args, DataAxisFlags& d) {
  return args
      .flag("--dp-allreduce", d.dp_allreduce,
            "data-parallel gradient reduction: flat (one all-reduce) | hierarchical (inside each node, across nodes, inside each node)",
            parallel::check_dp_allreduce)
      .flag("--ranks-per-node", d.ranks_per_node,
            "data-parallel ranks per node for --dp-allreduce hierarchical (0: the ranks sharing a host; K: consecutive data ranks by K)",
            at_least(0))
      .flag("--grad-compression", d.grad_compression,
            "data-parallel gradients on the wire (flat all-reduce): none | bf16 | fp16 (CPU ranks' fp32 gradients as 16-bit values, fp32 sums) | "
            "powersgd (rank --powersgd-rank, error feedback) | topk (--topk-ratio of each bucket, error feedback)",
            parallel::check_grad_compression)
      .flag("--powersgd-rank", d.powersgd_rank, "--grad-compression powersgd: columns of P and Q", between(1, 1024))
      .flag("--topk-ratio", d.topk_ratio, "--grad-compression topk: the fraction of each bucket's entries each rank sends",
            Range<double>(0.0, 1.0, true))
      .flag("--compression-start-iter", d.compression_start_iter,
            "--grad-compression: the first compressed step; the steps before it are all-reduced exactly (PyTorch's "
            "start_powerSGD_iter), counted as the trainer counts them, so a resume switches at the same step",
            at_least(1));
}

}  // namespace dpml::train
