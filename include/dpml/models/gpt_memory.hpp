#pragma once
// What a models::Gpt trained by train::GptTrainer holds on each rank of a (tp, pp, dp) layout, in
// bytes, before anything is allocated — read off the buffers the layers, the trainer and the
// optimizer really make (not a lower bound), so that a layout can be planned (train_gpt --dry-run)
// and one that cannot fit refused with the estimate in the message (train/memory_fit.hpp).
//
// One row per rank kind: a pipeline stage (every tensor shard of a stage holds the same: heads,
// MLP columns and the padded vocabulary split evenly). Its columns:
//
//   parameters   the stage's share (stage_blocks: blocks, the embedding on the first stage,
//                ln_f and — pp > 1 — the tied copy of wte on the last), vocabulary padded to
//                tp · pad_multiple rows as VocabPartition pads it, in the storage type; under
//                ZeRO-3 a 1/dp shard of it and the pool of gathered buckets (kZero3Slots and one prefetched, each at
//                most a bucket plus one more parameter)
//   gradients    the same count in the storage type (FlatParameters' flat gradient buffer); under
//                ZeRO-2 the slot pool instead: up to kZero2Slots, each at most a bucket plus one more
//                parameter (a c_fc weight, or wte on the end stages: parallel/data.hpp). With a
//                compression over dp > 1 (parallel/compression/) its state too: the residual (the
//                gradients' count); PowerSGD's Qt (r·m per compressed (n, m) matrix) and its P
//                message (r·n per matrix and the dense rest: exact for one bucket, an upper bound
//                for several); top-k's gathered (index, value) pairs, dp·k of the largest bucket,
//                and on a GPU the Device scratch of its sort (GptMemoryTerms::topk_scratch_bytes
//                per element of that bucket)
//   optimizer    fp32 master (16-bit storage only) and AdamW's two moments; under ZeRO-1 a 1/dp
//                shard of them plus the reduce-scattered gradient shard (parallel/data.hpp); an
//                offloaded optimizer (offload_optimizer) also keeps host mirrors of the values and
//                gradients it updates (optim/optimizer.hpp); on a GPU it leaves only the gradient
//                shard there, its state and mirrors counted in host_optimizer (host memory)
//   activations  what a micro-batch keeps from its forward until its backward, per block
//                (B, T, ·): ln_1 C, qkv 3C/tp, attention out C/tp, r C, ln_2 C, pre 4C/tp,
//                GELU out 4C/tp (not with recompute_gelu), y C, two row statistics per
//                LayerNorm, the attention's state (GPU: log-sum-exp (B, H/tp, T) fp32; host: the
//                probabilities (B, H/tp, T, T)); zero-bubble stages that delay W also keep
//                d pre 4C/tp, d qkv 3C/tp and 4 × C of gradients; the first stage's embedding
//                output and the last stage's d(final hidden) — times the micro-batches in flight
//                (pipeline::plan_buffers on the schedule's table: GPipe m, 1F1B min(pp − s, m),
//                ZB-H1 min(pp, m); the interleaved schedule per chunk, GptLayout::virtual_stages).
//                With full recomputation a block keeps per micro-batch only its output y and
//                one set of children activations for all (the MLP writing into y).
//   buffers      what lives once: the last stage's head (logits (B·T, V_pad/tp), ln_f's output),
//                the Device's shared scratch ("blk.small" C, "blk.big" max(4C, 3C)/tp, the
//                "blk.dx0/1" ring where the backward is not in place, "mlp.gelu" 4C/tp,
//                "blk.rerun" C), the pipeline's message buffers (one (B, T, C) per micro-batch
//                and direction a stage receives or sends back) and the batch's token ids
//   workspace    GPU only, stated constants (below): the Device (stream, cuBLASLt workspace) and
//                NCCL — a rank's communicators counted as parallel::DeviceGrid makes them (one per
//                axis of size > 1, the world's unless an axis spans it, the pipeline's ends at
//                pp > 2); the driver's own context is outside (cudaMemGetInfo's free memory
//                before the run already lacks it)
//
// Not counted: the allocator's rounding (cudaMalloc rounds to 2 MiB: < 1 % here), one-op
// scratch (attention and norm partials), host-side copies, the host process itself.
//
//   const auto e = models::estimate_gpt_memory(cfg, {.tp = 2, .pp = 2, .dp = 1, .micro_batch = 4,
//                                                    .micro_batches = 8, .schedule = "zb-h1"},
//                                              models::GptMemoryTerms::gpu());
//   std::fputs(models::memory_table(e, 80.0 * (1 << 30), "GPU").c_str(), stdout);
//   if (e.largest().total() > have) …

#include "dpml/core/error.hpp"
#include "dpml/models/gpt.hpp"
#include "dpml/parallel/data.hpp"  // kZero2Slots
#include "dpml/parallel/pipeline/partition.hpp"
#include "dpml/parallel/pipeline/schedule.hpp"
#include "dpml/parallel/strategy.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace dpml::models {

// The launch: degrees, the micro-batch (sequences of seq tokens) and micro-batches per step per data rank, the
// pipeline schedule's name (gpipe | 1f1b | zb-h1), ZeRO-1.
struct GptLayout {
  int tp = 1, pp = 1, dp = 1;
  std::int64_t micro_batch = 1;
  std::int64_t seq = 0;  // tokens per sequence T (0: the config's max_seq)
  int micro_batches = 1;
  std::string schedule = "1f1b";
  bool zero = false;
  bool shard_gradients = false;  // ZeRO-2 (with zero): no whole gradient buffer, a pool of bucket slots
  bool shard_values = false;     // ZeRO-3 (with shard_gradients): the values' 1/dp shard and a pool of gathered buckets
  bool prefetch_values = true;   // ZeRO-3: one more gathered bucket, the next one, gathered ahead of its read
  bool offload_optimizer = false;  // a GPU's optimizer state in host memory (ZeRO-Offload)
  std::int64_t bucket_bytes = std::int64_t{25} << 20;  // DistributedOptimizerOptions::bucket_bytes
  int virtual_stages = 1;  // chunks per pipeline rank: the interleaved schedule's v (models::GptChunks)
  std::string compression = "none";  // the data axis' gradients: none | powersgd | topk (bf16 / fp16 wire: no state)
  int powersgd_rank = 4;
  double topk_ratio = 0.01;
};

// Where the trainer runs, as bytes per element and the constants of the device.
struct GptMemoryTerms {
  double value_bytes = 4;       // parameters, gradients and activations: sizeof(T)
  double master_bytes = 0;      // fp32 master copy per parameter (16-bit T only)
  double moment_bytes = 4;      // each of AdamW's two moments: sizeof(master type)
  double stat_bytes = 4;        // LayerNorm statistics, log-sum-exp: sizeof(accum_t<T>)
  bool attention_probabilities = true;  // the host's attention keeps (B, H/tp, T, T); a GPU its log-sum-exp
  double device_bytes = 0;      // the Device: stream, cuBLASLt workspace, GEMM context
  double first_comm_bytes = 0;  // the process's first NCCL communicator, with its connections
  double comm_bytes = 0;        // each further NCCL communicator
  double p2p_bytes = 0;         // NCCL's point-to-point connections of a pipeline stage (pp > 1)
  bool device = false;          // the terms of a GPU (an offloaded optimizer leaves it); else host ranks
  double topk_scratch_bytes = 0;  // top-k's selection, per element of a bucket, kept (a GPU's radix sort:
                                  // two key and two index buffers, 2·value_bytes + 8; the host's is freed)

  // Host ranks, float or double: no master copy, no workspace (MPI's buffers are the library's).
  static constexpr GptMemoryTerms host(double bytes = 4) {
    return {.value_bytes = bytes, .moment_bytes = bytes, .stat_bytes = bytes};
  }
  // A GPU in bf16 or fp16 (fp32 master and moments). The constants were measured on 2×H200
  // (driver 580, NCCL 2.28.3, NCCL_CUMEM_ENABLE=0 as comm::Nccl sets it; bench/gpt_train's
  // gpt_train_memory phases, bench/results/h200x2-2026-11-27-shared-comms/):
  //   device_bytes      0.033 GiB: the "device" phase (kernels::Device<CudaSpace>), H100 and H200 alike
  //   first_comm_bytes  0.90 GiB: the "communicators" phase of one communicator (0.72 GiB) plus
  //                     what the first step added at dp 2 and tp 2 over one GPU (0.18 GiB: the
  //                     connections NCCL makes at its first collective)
  //   comm_bytes        0.25 GiB: each further communicator (parallel/device_grid.hpp's figure;
  //                     RESULTS' 2026-11-27 sessions: 0.19–0.29 GiB saved per shared one) — not
  //                     validated by a measurement of its own
  //   p2p_bytes         0.44 GiB per rank of a pipeline (pp > 1): FITTED, not derived — both stages
  //                     of the pp 2 run (ZB-H1, 4 micro-batches of 4) measured 0.44 GiB above the
  //                     rest of this estimate (stage 0 after its first step: 3.55 against 3.11;
  //                     the largest rank at the end: 4.68 against 4.24). The same constant then
  //                     matched pp 2 runs of 4 and 12 blocks under GPipe, 1F1B and ZB-H1 within
  //                     0.4 % (one within 4 %): it does not grow with the stage. NCCL's
  //                     point-to-point buffers are the suspect; not traced (bench/RESULTS.md)
  static constexpr GptMemoryTerms gpu() {
    constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
    return {.value_bytes = 2, .master_bytes = 4, .moment_bytes = 4, .stat_bytes = 4, .attention_probabilities = false,
            .device_bytes = 0.033 * GiB, .first_comm_bytes = 0.90 * GiB, .comm_bytes = 0.25 * GiB, .p2p_bytes = 0.44 * GiB,
            .device = true, .topk_scratch_bytes = 2 * 2 + 8};
  }
};

// One rank kind's bytes (a pipeline stage; every tensor shard of it alike).
struct GptStageMemory {
  int stage = 0;
  std::int64_t parameter_elements = 0;  // this rank's parameters (unpadded offsets; padded vocabulary)
  int in_flight = 1;                    // micro-batches held at once (interleaved: a chunk's most)
  int communicators = 0;                // NCCL communicators of this rank (GPU)
  double parameters = 0, gradients = 0, optimizer = 0;
  double activation_per_micro_batch = 0;  // what one micro-batch in flight keeps (interleaved: in all chunks)
  double activations = 0;                 // activation_per_micro_batch × in_flight (+ recompute's shared set);
                                          // interleaved: the sum of each chunk's
  double buffers = 0, workspace = 0;
  double host_optimizer = 0;  // a GPU's offloaded optimizer, in host memory (not in total())
  double total() const noexcept { return parameters + gradients + optimizer + activations + buffers + workspace; }
};

struct GptMemoryEstimate {
  GptLayout layout;
  std::vector<GptStageMemory> stages;  // (pp)
  const GptStageMemory& largest() const {
    return *std::max_element(stages.begin(), stages.end(),
                             [](const GptStageMemory& a, const GptStageMemory& b) { return a.total() < b.total(); });
  }
  // The most host memory a rank's offloaded optimizer takes (0: none offloaded from a GPU).
  double largest_host_optimizer() const {
    double most = 0;
    for (const auto& s : stages) most = std::max(most, s.host_optimizer);
    return most;
  }
};

namespace detail {

// The schedule's table for `name` (the names train_gpt's with_strategy takes; "interleaved" with v
// chunks per rank).
inline parallel::pipeline::Schedule schedule_table(const std::string& name, int pp, int m, int v) {
  if (name == "interleaved") return parallel::pipeline::make_schedule(parallel::pipeline::Interleaved1F1B{v}, pp, m);
  return parallel::with_schedule(parallel::staged_model_schedule(name),
                                 [&]<class Sched>() { return parallel::pipeline::make_schedule(Sched{}, pp, m); });
}

// NCCL communicators of stage `s`'s ranks as parallel::DeviceGrid builds them (groups of one: none).
inline int communicators(const GptLayout& l, int s) {
  const int world = l.tp * l.pp * l.dp;
  int n = (l.tp > 1) + (l.dp > 1) + (l.pp > 1);
  if (world > 1 && l.tp != world && l.pp != world && l.dp != world) ++n;  // the world's own
  if (l.pp > 2 && (s == 0 || s == l.pp - 1)) ++n;                          // the pipeline's two ends
  return n;
}

// The weight matrices PowerSGD compresses (r(n + m) < n·m, as parallel/compression/powersgd.hpp
// decides): Σ n, Σ m and Σ n·m over them.
struct CompressedMatrices {
  double rows = 0, cols = 0, elements = 0;
  void add(std::int64_t n, std::int64_t m, int r) {
    if (static_cast<std::int64_t>(r) * (n + m) >= n * m) return;
    rows += static_cast<double>(n);
    cols += static_cast<double>(m);
    elements += static_cast<double>(n) * static_cast<double>(m);
  }
};

}  // namespace detail

// The bytes of every stage of `c` (as the trainer builds it: pad_multiple, recompute_gelu and
// recompute from c) under layout `l` with terms `t`.
inline GptMemoryEstimate estimate_gpt_memory(const GptConfig& c, const GptLayout& l, const GptMemoryTerms& t) {
  DPML_REQUIRE_EVERYWHERE(l.tp >= 1 && l.pp >= 1 && l.dp >= 1 && l.micro_batch >= 1 && l.micro_batches >= 1,
                          "GPT memory estimate: layout tp " << l.tp << ", pp " << l.pp << ", dp " << l.dp << ", micro-batch "
                                                            << l.micro_batch << " × " << l.micro_batches << " is not positive");
  DPML_REQUIRE_EVERYWHERE(c.layers >= l.pp, "the model has " << c.layers << " layers, fewer than the " << l.pp
                                                             << " pipeline stages of --pp " << l.pp);
  namespace pl = parallel::pipeline;
  const double tp = l.tp, C = static_cast<double>(c.dim), H = static_cast<double>(c.heads);
  const double B = static_cast<double>(l.micro_batch), T = static_cast<double>(l.seq > 0 ? l.seq : c.max_seq);
  const double BT = B * T, BTC = BT * C, a = t.value_bytes;
  const std::int64_t unit = c.pad_multiple * l.tp;
  const std::int64_t v_local = (c.vocab + unit - 1) / unit * unit / l.tp;  // VocabPartition::local()
  const std::int64_t Ci = c.dim, Ct = c.dim / l.tp;
  // Per block (layers/transformer_block.hpp): 12C²/tp + 7C/tp + 6C (tp = 1: GptConfig's 12C² + 13C).
  const std::int64_t block_params = 12 * Ci * Ct + 7 * Ct + 6 * Ci;
  const double hidden = 4 * C / tp;
  // One micro-batch's kept activations of one block, and what a delayed W adds.
  const double ln_stats = 2 * 2 * BT * t.stat_bytes;  // ln_1, ln_2: mean and rstd (rows)
  const double attn_state = t.attention_probabilities ? B * (H / tp) * T * T * a : B * (H / tp) * T * t.stat_bytes;
  const double block_kept = (C + 3 * C / tp + C / tp + C + C + hidden + (c.recompute_gelu ? 0 : hidden) + C) * BT * a +
                            ln_stats + attn_state;
  const double block_deferred = (hidden + 3 * C / tp + 4 * C) * BT * a;
  const int v = l.virtual_stages;
  DPML_REQUIRE_EVERYWHERE(v >= 1 && c.layers >= l.pp * v, "the model has " << c.layers << " layers, fewer than the " << l.pp * v
                                                                          << " virtual pipeline stages of --pp " << l.pp << " × "
                                                                          << v << " chunks");
  check_stage_cut(c, l.pp, v);
  const auto table = detail::schedule_table(l.schedule, l.pp, l.micro_batches, v);

  GptMemoryEstimate e{l, {}};
  for (int s = 0; s < l.pp; ++s) {
    GptStageMemory m;
    m.stage = s;
    m.in_flight = 0;
    const auto& actions = table[static_cast<std::size_t>(s)];
    double once = 0;
    bool holds_last = false, any_deferred = false;
    detail::CompressedMatrices matrices;
    for (int ch = 0; ch < v; ++ch) {  // chunk ch: virtual stage ch·pp + s (one chunk but under the interleaved schedule)
      const bool first = s == 0 && ch == 0, last = s == l.pp - 1 && ch == v - 1;
      holds_last = holds_last || last;
      const auto blocks = static_cast<double>(stage_blocks(c, l.pp * v, ch * l.pp + s).count);
      const auto chunk_actions = pl::of_chunk(actions, ch);
      const int in_flight =
          pl::plan_buffers(chunk_actions, l.micro_batches, {pl::Op::Forward, pl::Op::BackwardInput, pl::Op::BackwardWeight}).count;
      const bool deferred = !pl::weight_follows_input(chunk_actions) && !c.recompute;
      any_deferred = any_deferred || deferred;
      m.in_flight = std::max(m.in_flight, in_flight);

      m.parameter_elements += static_cast<std::int64_t>(blocks) * block_params;
      if (first) m.parameter_elements += v_local * Ci + c.max_seq * Ci;  // wte shard, wpe
      if (last) m.parameter_elements += 2 * Ci + (l.pp > 1 ? v_local * Ci : 0);  // ln_f, the tied copy of wte
      // The weight matrices (n, m) = (out, in) a compression sees: c_attn, attn.c_proj, c_fc, mlp.c_proj.
      for (int b = 0; b < static_cast<int>(blocks); ++b)
        for (const auto& [rows, cols] : {std::pair{3 * Ct, Ci}, std::pair{Ci, Ct}, std::pair{4 * Ct, Ci}, std::pair{Ci, 4 * Ct}})
          matrices.add(rows, cols, l.powersgd_rank);
      if (first) matrices.add(v_local, Ci, l.powersgd_rank), matrices.add(c.max_seq, Ci, l.powersgd_rank);
      if (last && l.pp > 1) matrices.add(v_local, Ci, l.powersgd_rank);

      // Per micro-batch in flight; with recompute each block keeps y only, its children one set for all.
      double per_mb = c.recompute ? blocks * BTC * a : blocks * (block_kept + (deferred ? block_deferred : 0.0));
      if (first) per_mb += BTC * a;  // the embedding's output
      if (last) per_mb += BTC * a;   // d(final hidden), from the head at forward time
      m.activation_per_micro_batch += per_mb;
      m.activations += per_mb * in_flight + (c.recompute ? blocks * (block_kept - BTC * a) : 0.0);  // y: the block's own

      const double m_all = l.micro_batches;
      if (!first) once += 2 * m_all * BTC * a;  // received activations, gradients sent back (PipelineStep, per chunk)
      if (!last) once += m_all * BTC * a;       // received gradients
    }
    const double n = static_cast<double>(m.parameter_elements);
    const double shards = l.zero ? l.dp : 1;
    m.parameters = n * a;
    m.gradients = n * a;
    // A pool of `most` bucket slots, each at most a bucket and one more parameter (wte's on the end stages).
    const auto pool = [&](std::size_t most) {
      const double bucket = static_cast<double>(l.bucket_bytes) / a, wte = static_cast<double>(v_local) * C;
      const bool holds_wte = s == 0 || holds_last;
      const double slots = std::min(static_cast<double>(most), std::ceil(n / bucket));
      return std::min(n, (holds_wte ? wte + bucket : 0.0) + (slots - (holds_wte ? 1 : 0)) * (bucket + 4 * C * C / tp)) * a;
    };
    if (l.zero && l.shard_gradients) m.gradients = pool(parallel::kZero2Slots);  // ZeRO-2's slots
    if (l.zero && l.shard_values) m.parameters = n * a / l.dp + pool(parallel::kZero3Slots + (l.prefetch_values ? parallel::kZero3PrefetchSlots : 0));  // ZeRO-3: shard, gathered buckets
    const double owned = n / shards;  // the elements this rank's optimizer updates
    const double state = owned * (t.master_bytes + 2 * t.moment_bytes) + (l.offload_optimizer ? 2 * owned * a : 0.0);
    if (l.offload_optimizer && t.device) m.host_optimizer = state;  // the state and mirrors in host memory
    m.optimizer = (l.offload_optimizer && t.device ? 0.0 : state) + (l.zero && l.dp > 1 ? n * a / l.dp : 0.0);
    if (l.dp > 1 && l.compression == "powersgd") {  // the residual, Qt, the P message with the dense rest
      const double r = l.powersgd_rank;
      m.gradients += (n + r * matrices.cols + r * matrices.rows + (n - matrices.elements)) * a;
    } else if (l.dp > 1 && l.compression == "topk") {  // the residual, the gathered pairs, the sort's scratch
      const bool holds_wte = s == 0 || holds_last;
      const double largest = std::min(n, static_cast<double>(l.bucket_bytes) / a + (holds_wte ? static_cast<double>(v_local) * C : 4 * C * C / tp));
      const double k = std::max(1.0, std::ceil(l.topk_ratio * largest));
      m.gradients += n * a + l.dp * k * (4 + a) + largest * t.topk_scratch_bytes;
    }

    // Once per stage: the head, the Device's shared scratch, messages, the batch's tokens.
    const bool last = holds_last, deferred = any_deferred;
    if (last)  // logits (B·T, V_pad/tp), ln_f's output and statistics, the loss sum, tp > 1: the (tp, 3, B·T) partials
      once += BT * static_cast<double>(v_local) * a + BTC * a + BT * 2 * t.stat_bytes + 8 + (l.tp > 1 ? tp * 3 * BT * t.stat_bytes : 0.0);
    if (!deferred || last) once += BTC * a;                    // blk.small (and the head's dh)
    if (!deferred) once += BT * std::max(hidden, 3 * C / tp) * a;  // blk.big
    if (!deferred && !last) once += 2 * BTC * a;               // the blk.dx ring (a backward not in place)
    if (c.recompute_gelu) once += BT * hidden * a;             // mlp.gelu
    if (c.recompute) once += BTC * a;                          // blk.rerun
    once += 2 * static_cast<double>(l.micro_batches) * BT * 4;  // the step's token ids and targets (int32)
    m.buffers = once;

    m.communicators = t.first_comm_bytes > 0 ? detail::communicators(l, s) : 0;  // host: MPI, not counted
    m.workspace = t.device_bytes + (m.communicators > 0 ? t.first_comm_bytes + (m.communicators - 1) * t.comm_bytes : 0.0) +
                  (l.pp > 1 && m.communicators > 0 ? t.p2p_bytes : 0.0);
    e.stages.push_back(m);
  }
  return e;
}

// The estimate as a table, one row per stage, in GiB, beside `have` bytes of `memory` ("GPU",
// "host") per rank (≤ 0: not known); with a GPU's offloaded optimizer, a line of its host memory
// beside `host_have` bytes per rank.
inline std::string memory_table(const GptMemoryEstimate& e, double have, const std::string& memory, double host_have = 0) {
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  const GptLayout& l = e.layout;
  std::string out;
  char line[320];
  std::snprintf(line, sizeof line,
                "memory per rank (%s, GiB) of tp %d × pp %d × dp %d, micro-batch %lld × %d, schedule %s%s%s%s%s; every tensor shard of a stage alike\n",
                memory.c_str(), l.tp, l.pp, l.dp, static_cast<long long>(l.micro_batch), l.micro_batches, l.schedule.c_str(),
                !l.zero ? "" : l.shard_values ? ", ZeRO-3" : l.shard_gradients ? ", ZeRO-2" : ", ZeRO-1", l.compression == "none" ? "" : ", --grad-compression ",
                l.compression == "none" ? "" : l.compression.c_str(), l.offload_optimizer ? ", optimizer on the host" : "");
  out += line;
  out += "| stage | parameters | gradients | optimizer | activations (per micro-batch × in flight) | buffers | workspace + comms | total |\n";
  out += "|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& s : e.stages) {
    std::snprintf(line, sizeof line, "| %d | %.3f | %.3f | %.3f | %.3f (%.3f × %d) | %.3f | %.3f (%d NCCL) | %.3f |\n", s.stage,
                  s.parameters / GiB, s.gradients / GiB, s.optimizer / GiB, s.activations / GiB,
                  s.activation_per_micro_batch / GiB, s.in_flight, s.buffers / GiB, s.workspace / GiB, s.communicators,
                  s.total() / GiB);
    out += line;
  }
  const double need = e.largest().total();
  if (have > 0)
    std::snprintf(line, sizeof line, "largest rank: %.3f GiB of the %.3f GiB a rank has: %s\n", need / GiB, have / GiB,
                  need <= have ? "fits" : "does NOT fit");
  else
    std::snprintf(line, sizeof line, "largest rank: %.3f GiB\n", need / GiB);
  out += line;
  const double host = e.largest_host_optimizer();
  if (host > 0) {
    std::snprintf(line, sizeof line,
                  "offloaded optimizer (fp32 master weights, moments, mirrors of the values and gradients) in host memory: "
                  "%.3f GiB per rank",
                  host / GiB);
    out += line;
    if (host_have > 0) {
      std::snprintf(line, sizeof line, " of the %.3f GiB a rank has: %s", host_have / GiB, host <= host_have ? "fits" : "does NOT fit");
      out += line;
    }
    out += '\n';
  }
  return out;
}

}  // namespace dpml::models
