// dpml-scaling-model: predicts a GPT training step on a cluster — step time, tokens/s, scaling,
// and where the time goes (compute, tensor-parallel all-reduces, pipeline bubble, exposed
// data-parallel reduction, optimizer) — from one GPU's measured tokens/s and the links' measured
// all-reduce bandwidths (train/scaling_model.hpp says how). One JSON line, then a short table.
//
//   dpml-scaling-model --model 1.3b --seq-length 2048 --dp 64 --tp 1 --gpus-per-node 8 \
//       --tokens-per-s 0 --mfu 0.45 --inter-busbw 40 --dp-allreduce hierarchical
//
// --model picks a GPT-2/GPT-3 size (124m 350m 760m 1.3b 2.7b 6.7b); --num-layers, --hidden-size
// and --vocab-size override it one by one. Without --tokens-per-s (0) one GPU's speed is
// --peak-tflops × --mfu over the model's FLOPs per token.

#include <dpml/comm/launch.hpp>
#include <dpml/core/error.hpp>
#include <dpml/train/args.hpp>
#include <dpml/train/scaling_model.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

namespace {

namespace scaling = dpml::train::scaling;

struct Size {
  const char* name;
  std::int64_t layers, hidden;
};
// GPT-2 small and medium, GPT-3's 760M to 6.7B (Brown et al. 2020, table 2.1).
constexpr Size kSizes[] = {{"124m", 12, 768}, {"350m", 24, 1024}, {"760m", 24, 1536},
                           {"1.3b", 24, 2048}, {"2.7b", 32, 2560}, {"6.7b", 32, 4096}};

int run(int argc, char** argv) {
  std::string model = "124m", dp_allreduce = "flat", wire = "bf16";
  std::int64_t layers = 0, hidden = 0, vocab = 50257, seq = 1024;
  scaling::Layout l;
  scaling::Calibration cal;
  scaling::Links links;
  namespace t = dpml::train;
  t::Args args("dpml-scaling-model",
               "A GPT layout's training step on a cluster, predicted from one GPU's tokens/s and the links'\n"
               "all-reduce bandwidths (include/dpml/train/scaling_model.hpp).");
  args.flag("--model", model, "GPT size: 124m | 350m | 760m | 1.3b | 2.7b | 6.7b")
      .flag("--num-layers", layers, "transformer blocks (0: --model's)", t::at_least<std::int64_t>(0))
      .flag("--hidden-size", hidden, "model width C (0: --model's)", t::at_least<std::int64_t>(0))
      .flag("--vocab-size", vocab, "vocabulary", t::at_least<std::int64_t>(1))
      .flag("--seq-length", seq, "tokens per sequence T", t::at_least<std::int64_t>(1))
      .flag("--dp", l.dp, "data-parallel ranks", t::at_least(1))
      .flag("--tp", l.tp, "tensor-parallel ranks (inside a node)", t::at_least(1))
      .flag("--pp", l.pp, "pipeline stages", t::at_least(1))
      .flag("--schedule", l.schedule, "pipeline schedule: gpipe | 1f1b | zb-h1 | interleaved")
      .flag("--num-virtual-stages-per-pipeline-rank", l.virtual_stages, "--schedule interleaved: model chunks per pipeline rank",
            t::at_least(1))
      .flag("--micro-batches", l.micro_batches, "micro-batches per step and data rank", t::at_least(1))
      .flag("--micro-batch", l.micro_batch, "sequences per micro-batch", t::at_least<std::int64_t>(1))
      .flag("--zero", l.zero, "ZeRO-1: the optimizer's update split over the data ranks")
      .flag("--dp-allreduce", dp_allreduce, "data-parallel all-reduce across nodes: flat | hierarchical")
      .flag("--grad-wire", wire, "gradient element on the wire: bf16 | fp32")
      .flag("--compression", l.compression, "fraction of the gradient bytes sent, at most 1 (1: none)", t::positive<double>())
      .flag("--tokens-per-s", cal.tokens_per_s, "one GPU's measured tokens/s on this model at --micro-batch (0: --peak-tflops × --mfu)",
            t::at_least(0.0))
      .flag("--calibration-batch", cal.batch, "sequences per step of that one-GPU run", t::at_least<std::int64_t>(1))
      .flag("--peak-tflops", cal.peak_tflops, "one GPU's bf16 GEMM peak, TFLOP/s", t::positive<double>())
      .flag("--mfu", cal.mfu, "model FLOPs utilisation of one GPU when --tokens-per-s is 0", t::half_open(1e-6, 1.0))
      .flag("--replicated", cal.replicated, "fraction of the compute tensor parallelism does not divide", t::half_open(0.0, 1.0))
      .flag("--optimizer-fraction", cal.optimizer, "fraction of one GPU's step in the optimizer", t::half_open(0.0, 1.0))
      .flag("--dp-lock-step-ms", cal.dp_lock_step_ms, "fixed cost of a data-parallel step, ms", t::at_least(0.0))
      .flag("--gpus-per-node", links.gpus_per_node, "GPUs per node", t::at_least(1))
      .flag("--intra-busbw", links.intra_busbw_gbs, "all-reduce bus bandwidth inside a node, GB/s", t::positive<double>())
      .flag("--intra-latency", links.intra_latency_us, "per ring step inside a node, µs", t::at_least(0.0))
      .flag("--inter-busbw", links.inter_busbw_gbs, "all-reduce bus bandwidth between nodes per GPU, GB/s", t::positive<double>())
      .flag("--inter-latency", links.inter_latency_us, "per ring step between nodes, µs", t::at_least(0.0));
  if (!args.parse(argc, argv)) return 0;
  const Size* size = nullptr;
  for (const auto& s : kSizes)
    if (model == s.name) size = &s;
  DPML_REQUIRE(size, "--model " << model << " is not one of 124m, 350m, 760m, 1.3b, 2.7b, 6.7b");
  DPML_REQUIRE(dp_allreduce == "flat" || dp_allreduce == "hierarchical", "--dp-allreduce " << dp_allreduce << " is not flat or hierarchical");
  DPML_REQUIRE(wire == "bf16" || wire == "fp32", "--grad-wire " << wire << " is not bf16 or fp32");
  DPML_REQUIRE(l.compression <= 1, "--compression " << l.compression << " is above 1 (the fraction of the bytes sent)");
  DPML_REQUIRE(l.virtual_stages == 1 || l.schedule == "interleaved",
               "--num-virtual-stages-per-pipeline-rank " << l.virtual_stages << " needs --schedule interleaved");
  l.hierarchical = dp_allreduce == "hierarchical";
  l.wire_bytes = wire == "bf16" ? 2 : 4;
  const dpml::models::GptConfig c{.vocab = vocab, .max_seq = seq, .layers = layers ? layers : size->layers,
                                  .heads = 1, .dim = hidden ? hidden : size->hidden};
  const auto r = scaling::predict(c, seq, l, cal, links);
  const int gpus = l.dp * l.tp * l.pp;
  std::printf("{\"tool\":\"dpml-scaling-model\",\"layers\":%lld,\"hidden\":%lld,\"seq\":%lld,\"gpus\":%d,\"dp\":%d,\"tp\":%d,\"pp\":%d,"
              "\"schedule\":\"%s\",\"virtual_stages\":%d,\"micro_batches\":%d,\"micro_batch\":%lld,\"dp_allreduce\":\"%s\",\"grad_wire\":\"%s\","
              "\"compression\":%g,\"step_ms\":%.3f,\"tokens_per_s\":%.0f,\"scaling\":%.4f,\"compute_ms\":%.3f,\"tp_comm_ms\":%.3f,"
              "\"bubble_ms\":%.3f,\"dp_exposed_ms\":%.3f,\"optimizer_ms\":%.3f}\n",
              static_cast<long long>(c.layers), static_cast<long long>(c.dim), static_cast<long long>(seq), gpus, l.dp, l.tp,
              l.pp, l.schedule.c_str(), l.virtual_stages, l.micro_batches, static_cast<long long>(l.micro_batch), dp_allreduce.c_str(),
              wire.c_str(), l.compression, r.step_s * 1e3, r.tokens_per_s, r.scaling, r.compute_s * 1e3, r.tp_comm_s * 1e3,
              r.bubble_s * 1e3, r.dp_exposed_s * 1e3, r.optimizer_s * 1e3);
  std::printf("\n| GPUs | layout | step ms | tokens/s | scaling | compute (tp comm) | bubble | dp exposed | optimizer |\n"
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|\n"
              "| %d | dp %d × tp %d × pp %d | %.2f | %.0f | %.1f %% | %.2f (%.2f) | %.2f | %.2f | %.2f |\n",
              gpus, l.dp, l.tp, l.pp, r.step_s * 1e3, r.tokens_per_s, 100 * r.scaling, r.compute_s * 1e3, r.tp_comm_s * 1e3,
              r.bubble_s * 1e3, r.dp_exposed_s * 1e3, r.optimizer_s * 1e3);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dpml::run_local("dpml-scaling-model", [&] { return run(argc, argv); });
}
