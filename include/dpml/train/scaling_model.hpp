#pragma once
// A GPT training step's time on a cluster, predicted from one GPU's measured speed and the links'
// measured bandwidths — the model behind tools/scaling-model (Step 14: what a layout would do on
// 8 × 8 or 32 × 8 GPUs when only one host is lent).
//
// Inputs: the model (GptConfig, sequence length T), the layout (dp × tp × pp, schedule, m
// micro-batches of B sequences per data rank, flat or hierarchical data-parallel all-reduce,
// bytes per gradient element on the wire and a compression ratio), one GPU's calibration (its
// tokens/s on this model at the layout's micro-batch B — smaller micro-batches run slower per token
// — or a peak and an MFU) and the links (GPUs per node,
// all-reduce bus bandwidth and latency inside a node and between nodes).
//
// The step, on the slowest data rank (tp innermost in the rank order, then dp, then pp, as
// Megatron places them — a node holds whole tp groups):
//   compute   one GPU's time per token, split by model FLOPs (flops.hpp's convention) into the
//             blocks (6·12C² + 12·T·C per token each) and the LM head (6·V·C); under tp a
//             `replicated` fraction of it is not divided (LayerNorms, residual adds, the
//             embedding: 9 % of a GPT-2 step, from its kernel families, less at larger widths);
//             F, B and W a third each
//   tp comm   per block and micro-batch four all-reduces of (B, T, C) bf16 (two forward, two in
//             the input gradient), on the compute stream (ring_allreduce_s)
//   pipeline  the schedule's own table (parallel/pipeline/schedule.hpp) replayed with these
//             per-stage costs (the first stage's embedding, the last stage's head) and one
//             (B, T, C) activation per message: makespan = compute + bubble; interleaved with v
//             chunks, each chunk's F, B and W cost 1/v of its rank's (the head's share spread
//             over the last rank's chunks) and every chunk boundary is a message
//   dp        the stage's gradients (its parameters / tp, × wire bytes × compression) reduced
//             in buckets during the last micro-batch's backward: exposed = the all-reduce's time
//             beyond that backward, at least the last bucket's (the tied embedding's gradient
//             is ready last) — plus a fixed lock-step cost per step (1 ms measured on 2 GPUs);
//             hierarchical: reduce-scatter in the node, all-reduce across nodes on 1/g of it,
//             all-gather in the node
//   optimizer one GPU's optimizer time (a fraction of its step) × the parameters this rank
//             updates / all (ZeRO-1: / dp)
// Everything not named (host launches, the loss's all-reduce, clock changes under load) is in the
// calibration or missing; bench/RESULTS.md holds the model against the measured 2- and 4-GPU runs.

#include "dpml/core/error.hpp"
#include "dpml/models/gpt.hpp"
#include "dpml/parallel/pipeline/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace dpml::train::scaling {

struct Links {
  int gpus_per_node = 8;
  double intra_busbw_gbs = 300;   // NVLink all-reduce bus bandwidth (bench_allreduce, 2×H100/H200, bf16 256 MiB: 302)
  double intra_latency_us = 18;   // ring_allreduce_s's latency: fits 2 GPUs' measured busbw
  double inter_busbw_gbs = 40;    // per GPU between nodes: a 400 Gb/s NIC each (50 GB/s), ~80 % of it
  double inter_latency_us = 15;
};

struct Calibration {
  double tokens_per_s = 464'000;   // one GPU, this model and T, at the layout's micro-batch (0: from peak × mfu)
  std::int64_t batch = 16;         // sequences per step of that one-GPU run (its optimizer's share is per step)
  double peak_tflops = 896;        // bf16 GEMM peak measured on that GPU (gpt_train's 8192³ cuBLASLt)
  double mfu = 0.446;              // used when tokens_per_s is 0
  double replicated = 0.09;        // of the step's compute not divided by tp, at width 768 (GPT-2 124M's kernel
                                   // families: LayerNorm, residual adds, embedding); scaled by 768 / C, as that
                                   // work grows with C per token and the products with C²
  double optimizer = 0.033;        // of one GPU's step spent in the optimizer (AdamW 1.09 of 33.6 ms)
  double dp_lock_step_ms = 1.0;    // fixed cost of a data-parallel step (2×H200/H100, bench/RESULTS.md)
};

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  std::string schedule = "1f1b";   // gpipe | 1f1b | zb-h1 | interleaved
  int virtual_stages = 1;          // interleaved: model chunks per pipeline rank
  int micro_batches = 1;           // per step and data rank
  std::int64_t micro_batch = 16;   // sequences per micro-batch
  bool hierarchical = false;       // data-parallel all-reduce
  double wire_bytes = 2;           // per gradient element (bf16 2, fp32 4)
  double compression = 1;          // fraction of the gradient bytes sent (PowerSGD, top-k: < 1)
  bool zero = false;               // ZeRO-1: the optimizer's update split over dp
};

struct Prediction {
  double step_s = 0, tokens_per_s = 0;
  double compute_s = 0;        // the slowest stage's own F, B and W (with its tp all-reduces)
  double tp_comm_s = 0;        // of which tensor-parallel all-reduces
  double bubble_s = 0;         // pipeline makespan − that stage's busy time
  double dp_exposed_s = 0;     // data-parallel reduction not hidden, with the lock-step cost
  double optimizer_s = 0;
  double scaling = 0;          // tokens/s over (GPUs × one GPU's tokens/s)
};

// All-reduce of `bytes` over n ranks: the ring's bandwidth term 2(n−1)/n · bytes / busbw (GB/s)
// and a latency (µs) paid 2·log2(n) times — NCCL pipelines a large message through the ring, so
// its start-up grows like a tree's, not with every ring step (2 ranks: 2 latencies, which with
// 18 µs fits the measured 208 / 268 / 302 GB/s at 16 / 64 / 256 MiB).
inline double ring_allreduce_s(double bytes, int n, double busbw_gbs, double latency_us) {
  if (n <= 1) return 0.0;
  return 2.0 * (n - 1) / n * bytes / (busbw_gbs * 1e9) + 2.0 * std::log2(static_cast<double>(n)) * latency_us * 1e-6;
}

// Training FLOPs per token of one block and of the LM head (flops.hpp's convention).
inline double block_flops_per_token(const models::GptConfig& c, std::int64_t seq) {
  const double C = static_cast<double>(c.dim);
  return 6.0 * 12.0 * C * C + 12.0 * static_cast<double>(seq) * C;
}
inline double head_flops_per_token(const models::GptConfig& c) {
  return 6.0 * static_cast<double>(c.vocab) * static_cast<double>(c.dim);
}

inline Prediction predict(const models::GptConfig& c, std::int64_t seq, const Layout& l, const Calibration& cal,
                          const Links& links) {
  DPML_REQUIRE(l.dp >= 1 && l.tp >= 1 && l.pp >= 1 && l.micro_batches >= 1 && l.micro_batch >= 1,
               "scaling model: dp, tp, pp, micro-batches and the micro-batch must be at least 1");
  DPML_REQUIRE(l.pp <= c.layers, "scaling model: pp " << l.pp << " exceeds the " << c.layers << " layers");
  DPML_REQUIRE(l.tp <= links.gpus_per_node && links.gpus_per_node % l.tp == 0,
               "scaling model: tp " << l.tp << " must divide the " << links.gpus_per_node << " GPUs of a node");
  const double L = static_cast<double>(c.layers), C = static_cast<double>(c.dim), V = static_cast<double>(c.vocab);
  const double fb = block_flops_per_token(c, seq), fh = head_flops_per_token(c), f = L * fb + fh;
  // One GPU: seconds per token of compute (the optimizer's share taken out) and of the optimizer.
  const double per_token = cal.tokens_per_s > 0 ? 1.0 / cal.tokens_per_s : f / (cal.peak_tflops * 1e12 * cal.mfu);
  const double compute_per_token = per_token * (1.0 - cal.optimizer);
  const double optimizer_1gpu = per_token * cal.optimizer * static_cast<double>(cal.batch * seq);
  const double replicated = std::min(1.0, cal.replicated * 768.0 / C);
  const double tp_scale = (1.0 - replicated) / l.tp + replicated;
  const double block_s = compute_per_token * fb / f * tp_scale, head_s = compute_per_token * fh / f * tp_scale;

  const double mb_tokens = static_cast<double>(l.micro_batch * seq);
  const double act_bytes = mb_tokens * C * 2.0;  // one (B, T, C) bf16 tensor
  const double tp_ar = ring_allreduce_s(act_bytes, l.tp, links.intra_busbw_gbs, links.intra_latency_us);
  // Stages: the model's cut (models::stage_blocks: even, or the configured ends), embedding first, head last.
  const int v = l.schedule == "interleaved" ? l.virtual_stages : 1;
  DPML_REQUIRE(v >= 1 && l.pp * v <= c.layers, "scaling model: " << l.pp << " stages × " << v << " chunks exceed the "
                                                                  << c.layers << " layers");
  models::check_stage_cut(c, l.pp, v);
  std::vector<std::int64_t> blocks(static_cast<std::size_t>(l.pp));  // per rank, over its chunks
  for (int s = 0; s < l.pp; ++s)
    for (int ch = 0; ch < v; ++ch) blocks[static_cast<std::size_t>(s)] += models::stage_blocks(c, l.pp * v, ch * l.pp + s).count;
  // A message between stages crosses nodes when a stage's tp · dp ranks fill a node.
  const bool pp_inter = l.pp > 1 && l.tp * l.dp >= links.gpus_per_node;
  const double p2p_s = act_bytes / ((pp_inter ? links.inter_busbw_gbs : links.intra_busbw_gbs) * 1e9) +
                       (pp_inter ? links.inter_latency_us : links.intra_latency_us) * 1e-6;
  std::vector<parallel::pipeline::Costs> costs(static_cast<std::size_t>(l.pp));
  for (int s = 0; s < l.pp; ++s) {
    const auto b = static_cast<double>(blocks[static_cast<std::size_t>(s)]);
    const double work = mb_tokens * (b * block_s + (s == l.pp - 1 ? head_s : 0.0));
    const double per_chunk = (work / 3 + 2 * b * tp_ar) / v;
    costs[static_cast<std::size_t>(s)] = {per_chunk, per_chunk, work / 3 / v, p2p_s};
  }
  namespace pl = parallel::pipeline;
  pl::Schedule table;
  if (l.schedule == "gpipe") table = pl::make_schedule(pl::GPipe{}, l.pp, l.micro_batches);
  else if (l.schedule == "1f1b") table = pl::make_schedule(pl::OneFOneB{}, l.pp, l.micro_batches);
  else if (l.schedule == "zb-h1") table = pl::make_schedule(pl::ZeroBubbleH1{}, l.pp, l.micro_batches);
  else if (l.schedule == "interleaved") table = pl::make_schedule(pl::Interleaved1F1B{v}, l.pp, l.micro_batches);
  else DPML_REQUIRE(false, "scaling model: schedule '" << l.schedule << "' is not gpipe, 1f1b, zb-h1 or interleaved");
  const auto sim = pl::simulate(table, costs);

  Prediction r;
  int slowest = 0;
  for (int s = 1; s < l.pp; ++s)
    if (sim.stages[static_cast<std::size_t>(s)].busy > sim.stages[static_cast<std::size_t>(slowest)].busy) slowest = s;
  const auto& st = costs[static_cast<std::size_t>(slowest)];
  r.compute_s = sim.stages[static_cast<std::size_t>(slowest)].busy;
  r.tp_comm_s = 4.0 * static_cast<double>(blocks[static_cast<std::size_t>(slowest)]) * tp_ar * l.micro_batches;
  r.bubble_s = sim.makespan - r.compute_s;

  // Data parallel: the largest stage's gradient (first and last stages hold the tied embedding).
  double stage_params = 0;
  for (int s = 0; s < l.pp; ++s) {
    const double emb = (s == 0 || s == l.pp - 1) ? V * C : 0.0;
    stage_params = std::max(stage_params, (static_cast<double>(blocks[static_cast<std::size_t>(s)]) * (12 * C * C + 13 * C) + emb) / l.tp);
  }
  const double grad_bytes = stage_params * l.wire_bytes * l.compression;
  const double last_bucket = V * C / l.tp * l.wire_bytes * l.compression;
  const int dp_in_node = std::max(1, std::min(l.dp, links.gpus_per_node / l.tp));
  const int nodes = (l.dp + dp_in_node - 1) / dp_in_node;
  auto dp_time = [&](double bytes) {
    if (nodes == 1) return ring_allreduce_s(bytes, l.dp, links.intra_busbw_gbs, links.intra_latency_us);
    if (!l.hierarchical) return ring_allreduce_s(bytes, l.dp, links.inter_busbw_gbs, links.inter_latency_us);
    const double g = dp_in_node, in_node = (g - 1) / g * bytes / (links.intra_busbw_gbs * 1e9) +
                                           (g - 1) * links.intra_latency_us * 1e-6;  // reduce-scatter = all-gather
    return 2 * in_node + ring_allreduce_s(bytes / g, nodes, links.inter_busbw_gbs, links.inter_latency_us);
  };
  if (l.dp > 1) {
    const double hidden_behind = v * (st.backward_input + st.backward_weight);  // the last micro-batch's backward (all chunks)
    r.dp_exposed_s = std::max(dp_time(grad_bytes) - hidden_behind, dp_time(last_bucket)) + cal.dp_lock_step_ms * 1e-3;
  }
  const double all_params = L * (12 * C * C + 13 * C) + V * C;
  r.optimizer_s = optimizer_1gpu * stage_params / all_params / (l.zero ? l.dp : 1);
  r.step_s = sim.makespan + r.dp_exposed_s + r.optimizer_s;
  const double tokens = static_cast<double>(l.dp * l.micro_batches) * mb_tokens;
  r.tokens_per_s = tokens / r.step_s;
  r.scaling = r.tokens_per_s / (static_cast<double>(l.dp * l.tp * l.pp) / per_token);
  return r;
}

}  // namespace dpml::train::scaling
