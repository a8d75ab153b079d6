#pragma once
// Checkpoints of a train::Trainer in layout-independent form, resume on any layout, and GPT-2 export.
//
// A training checkpoint (checkpoint/checkpoint.hpp writes it: one directory per step, atomic,
// asynchronous, last K kept) holds
//   <param>                 every parameter as its *global* tensor: each rank adds its block
//                           (layers::global_slice); replicas along the data axis and replicated
//                           tensors are written once; the tied copy of wte.weight on the last
//                           pipeline stage (Param::is_duplicate) is not saved; wte.weight is
//                           saved without its padding rows: (V, C), whatever tp padded it to;
//   <param>.exp_avg, <param>.exp_avg_sq
//                           the update rule's state (Rule::state_names), also as global tensors
//                           of the parameter's shape;
//   config                  model.* (a GPT's sizes: checked on load, a mismatch names the flag),
//                           data.global_batch, a GPT's data.seq_len (checked: the data position
//                           means nothing under another batch), train.step (steps run),
//                           train.optimizer_step (updates made: skipped steps differ),
//                           train.epoch / train.batch (the next batch), train.loss_scale and
//                           train.loss_scale_clean_steps (a dynamic loss scaler's state; a
//                           checkpoint without them resumes at the scaler's initial scale),
//                           train.seed and what the
//                           caller records of its data (extra_config: train_gpt's data.path,
//                           data.tokens) — checked on load unless overridden (ResumeChecks): the
//                           data order would change; a checkpoint without them loads unchecked;
//   layout                  (tp, pp, dp, zero) of the writer — for information only.
//
// What is a model's own comes from two overloads in detail:: — model_fields (the config entries
// it records and checks) and stored_rows (a tensor saved without its padding rows) — given for
// models::Gpt (and its chunks, models::GptChunks) here; any other model (a Sequential cut into
// stages, …) records none and saves every tensor whole. A pipeline stage saves the parameters it trains, under their global names.
//
// ZeRO-1: the optimizer state lives in segments of the flat buffer that cut across parameters.
// Saving all-gathers each state slot over the data axis (one allgatherv per segment, every data
// rank then holds the slot for its whole flat buffer, as without ZeRO) and saves parameter
// blocks; loading reads this rank's parameter blocks into a flat buffer and keeps its own
// segments. So a ZeRO checkpoint is the same file set as a plain one: either loads into the other.
// (The cost is one flat buffer of state per slot for the duration of save_async.)
//
// A trainer on a GPU (parameters in device memory, bf16 with fp32 master weights) saves and loads
// the same file set: the weights saved are its fp32 master weights and the optimizer state its fp32
// moments, read and written by name through the DistributedOptimizer (read_state / write_state:
// one host copy of each slot's whole flat buffer, gathered over the data axis under ZeRO-1), so a
// GPU checkpoint resumes on CPU ranks and the other way round, in any layout.
//
// Saves that fail (an unwritable directory, a full disk) do not end a long run: each is reported
// once by rank 0 (step and error), its step-<N>.tmp removed, and the next interval retries; the
// max_failures-th failure in a row stops the run with its error (CheckpointerOptions). Unfinished
// saves an earlier run left (step-<N>.tmp) are removed when the Checkpointer is made.
//
// Resuming (resolve_resume, collective): --resume latest takes the newest checkpoint in the save
// directory that is complete and valid — its manifest parses and matches its own checksum, every
// file is there with its checksums, and its position (train.step, train.epoch, …) is possible —
// and falls back past the others, rank 0 naming each one skipped and why. A directory whose every
// checkpoint is bad stops the run with an Error naming it and them (starting fresh would silently
// throw the training away), unless fresh_if_corrupt (train_gpt: --resume-fresh-if-corrupt); one
// with no checkpoint at all starts fresh.
//
// Loading (load_checkpoint, collective): every rank opens the checkpoint and reads exactly its
// blocks (CheckpointReader assembles them from whatever pieces were saved: resharding). Errors
// (config mismatch, missing tensor, shape, checksum) are gathered and raised on every rank alike,
// naming the file and tensor, so the job exits cleanly. Restored: weights, optimizer state and
// step count, the trainer's step; returned: the data position. Same layout → the resumed run is
// bitwise the uninterrupted one (host); another layout → equal to rounding.
//
// Export (export_gpt2): one safetensors file of the full model with GPT-2's names and layouts,
// for other tools: wte.weight (V rows, no padding), wpe.weight, h.N.ln_1.weight/bias,
// h.N.attn.c_attn.weight (C, 3C), h.N.attn.c_attn.bias (3C), h.N.attn.c_proj.weight (C, C),
// h.N.mlp.c_fc.weight (C, 4C), h.N.mlp.c_proj.weight (4C, C), …, ln_f.weight/bias. GPT-2 stores
// its Conv1D weights as (in, out): ours are (out, in), so every linear weight is transposed; and
// GPT-2's c_attn columns are [q | k | v] (each head-major), while our c_attn rows are
// (head, {q, k, v}, head_dim) so that tensor parallelism splits whole heads: rows are permuted
// (weight and bias). The file is assembled through a temporary checkpoint (<file>.parts/, any
// layout) that rank 0 reads whole and rewrites. A path ending in '/' (or an existing directory)
// is a Hugging Face directory instead: DIR/model.safetensors with transformers' names
// ("transformer." + name, no lm_head.weight: tied) and DIR/config.json (train/hf_gpt2.hpp), which
// GPT2LMHeadModel.from_pretrained(DIR) loads. import_gpt2 is the inverse, of either form or of a
// save_pretrained file or directory (a config.json there is checked against the model): every
// rank reads the file's tensors it needs (whole: fine at GPT-2 sizes) and keeps its block.
//
//   train::Checkpointer ckpt(trainer, "runs/gpt", {.keep_last = 3});
//   ... after step s: ckpt.save_async({.step = s, .epoch = e, .batch = b});
//   ... every step on every rank: ckpt.poll();    at exit: ckpt.wait();
//   auto pos = train::load_checkpoint(trainer, "runs/gpt/step-200");

#include "dpml/checkpoint/checkpoint.hpp"
#include "dpml/checkpoint/json.hpp"
#include "dpml/checkpoint/manifest.hpp"
#include "dpml/checkpoint/safetensors.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/bf16.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/nvtx.hpp"
#include "dpml/layers/init.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/models/gpt.hpp"
#include "dpml/parallel/grid.hpp"
#include "dpml/train/hf_gpt2.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpml::train {

// Where training stands: steps run, and the next batch (epoch, index within the epoch).
struct TrainPosition {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::int64_t batch = 0;
};

// A setting a checkpoint records and a resume checks: (config key, flag, value).
struct ConfigField {
  const char* key;
  const char* flag;
  checkpoint::Json value;
};

// What a resume checks beyond the model's sizes: that the data order continues. The seed
// (train.seed, recorded by every Checkpointer) and `data`, the data's identity (entries the caller
// records through CheckpointerOptions::extra_config, e.g. data.path and data.tokens). A mismatch is
// refused naming the flag and both values unless `override_config`; an entry the checkpoint lacks
// (written before it was recorded) is not checked.
struct ResumeChecks {
  std::vector<ConfigField> data;
  bool override_config = false;
};

namespace detail {

using checkpoint::Slice;

// The trainer's element type (its parameters'), and the type its optimizer state and checkpoints
// hold (the same on the host; fp32 beside 16-bit parameters).
template <class Trainer>
using value_t = std::remove_cvref_t<decltype(*std::declval<Trainer&>().optimizer().flat().values().data())>;
template <class Trainer>
using state_t = typename std::remove_reference_t<decltype(std::declval<Trainer&>().optimizer())>::master_type;
// Whether the trainer's parameters live in device memory (their state is then read and written by name).
template <class Trainer>
inline constexpr bool on_device = !Trainer::ParamT::space::host_accessible;
// Whether the weights travel as one whole flat buffer on the host (read_weights, write_weights: by
// name, collective over the data axis), not through each parameter's value: on a GPU, and under
// ZeRO-3, where a value is only a view of a gathered bucket that the next gather may take back.
template <class Trainer>
bool flat_weights(Trainer& t) {
  return on_device<Trainer> || t.optimizer().options().shard_values;
}

// Any model: only the global batch (samples per step; 0 where the batches carry it).
template <class Model>
std::vector<ConfigField> model_fields(const Model&, std::int64_t global_batch, std::int64_t /*seq_len*/) {
  return {{"data.global_batch", "--global-batch", global_batch}};
}
// A GPT: its sizes, and the tokens per sequence (0: its max_seq).
template <class T, class Space, class Comm>
std::vector<ConfigField> model_fields(const models::Gpt<T, Space, Comm>& m, std::int64_t global_batch, std::int64_t seq_len) {
  const auto& c = m.config();
  return {{"model.vocab", "--vocab-size", c.vocab},       {"model.max_seq", "--seq-length", c.max_seq},
          {"model.layers", "--num-layers", c.layers},     {"model.heads", "--num-attention-heads", c.heads},
          {"model.dim", "--hidden-size", c.dim},          {"data.global_batch", "--global-batch", global_batch},
          {"data.seq_len", "--seq-length", seq_len > 0 ? seq_len : c.max_seq}};
}

// A GPT cut into chunks for the interleaved schedule: the same as its chunks' model.
template <class T, class Space, class Comm>
std::vector<ConfigField> model_fields(const models::GptChunks<T, Space, Comm>& m, std::int64_t global_batch, std::int64_t seq_len) {
  return model_fields(m.chunk(0), global_batch, seq_len);
}

// Rows of parameter p's global tensor that are saved (the rest is padding): any model, all.
template <class Model>
std::int64_t stored_rows(const Model&, const ParamBase&, std::int64_t rows) {
  return rows;
}
// A GPT: wte.weight's rows V ≤ r < V_pad are padding, the last rows of the last shards.
template <class T, class Space, class Comm>
std::int64_t stored_rows(const models::Gpt<T, Space, Comm>& m, const ParamBase& p, std::int64_t rows) {
  return p.name() == "wte.weight" ? m.config().vocab : rows;
}
template <class T, class Space, class Comm>
std::int64_t stored_rows(const models::GptChunks<T, Space, Comm>& m, const ParamBase& p, std::int64_t rows) {
  return stored_rows(m.chunk(0), p, rows);
}

// A parameter as a block of its layout-independent global tensor (without padding rows).
struct GlobalBlock {
  std::vector<std::int64_t> shape;  // global
  Slice slice;                      // this rank's block; its elements are the first of the local tensor
};

template <class T, class Space, class Model>
GlobalBlock block_of(const Param<T, Space>& p, const parallel::ProcessGrid& grid, const Model& model) {
  const auto g = layers::global_slice(p, &grid);
  GlobalBlock b{std::vector<std::int64_t>(g.global.begin(), g.global.end()), {}};
  b.slice = p.sharding().is_replicated() ? checkpoint::full_slice(b.shape)
                                         : checkpoint::slice_along(b.shape, g.dim, g.offset, p.shape()[g.dim]);
  if (const std::int64_t rows = stored_rows(model, p, b.shape[0]); rows < b.shape[0]) {
    b.shape[0] = rows;
    b.slice[0] = {std::min(b.slice[0].begin, rows), std::min(b.slice[0].end, rows)};
  }
  return b;
}

// Raises on every rank the distinct errors that ranks caught ("" = none), naming what was done.
inline void raise_collected(const comm::Mpi& world, const std::string& mine, const std::string& during) {
  const auto all = world.allgather(mine);
  std::string message;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty() && message.find(all[r]) == std::string::npos)
      message += (message.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + all[r]);
  if (!message.empty()) throw Error(during + " failed: " + message, Scope::everywhere);
}

// State slot k of the update rule over this rank's whole flat buffer (flat offsets), into `out`
// (resized; its memory is reused from one save to the next). On a GPU: read by name.
template <class Trainer>
void gather_flat_state(Trainer& t, std::size_t k, std::vector<state_t<Trainer>>& out) {
  auto& dist = t.optimizer();
  auto& opt = dist.optimizer();
  const auto& flat = dist.flat();
  using T = state_t<Trainer>;
  if constexpr (on_device<Trainer>) {
    out = dist.read_state(opt.state_names()[k], 0, flat.numel());
    return;
  }
  out.resize(static_cast<std::size_t>(flat.numel()));
  if constexpr (!Trainer::zero) {
    for (std::size_t i = 0; i < flat.params().size(); ++i) {
      const auto s = opt.state(i, k);
      std::copy(s.begin(), s.end(), out.begin() + flat.offsets()[i]);
    }
  } else {
    const auto& segs = dist.buckets().own_segments();
    for (std::size_t j = 0; j < segs.size(); ++j) {
      const auto s = opt.state(j, k);
      std::copy(s.begin(), s.end(), out.begin() + segs[j].flat_offset);
    }
    const auto& data = t.grid().comm(Axis::data);
    if (data.size() > 1) {
      // Segment j of every data rank is its part of bucket j, the parts in rank order.
      const auto n = segs.size(), p = static_cast<std::size_t>(data.size());
      std::vector<int> mine(n), all(n * p);
      for (std::size_t j = 0; j < n; ++j) mine[j] = static_cast<int>(segs[j].count);
      data.allgather(mine.data(), all.data(), n);
      std::vector<comm::Request> reqs;
      for (std::size_t j = 0; j < n; ++j) {
        std::vector<int> counts(p);
        std::int64_t before = 0;
        for (std::size_t r = 0; r < p; ++r) {
          counts[r] = all[r * n + j];
          if (static_cast<int>(r) < data.rank()) before += counts[r];
        }
        T* bucket = out.data() + segs[j].flat_offset - before;
        reqs.push_back(data.iallgatherv(bucket + before, bucket, counts));
      }
      for (auto& r : reqs) r.wait();
    }
  }
}

// The inverse: this rank keeps its ranges of a whole-flat-buffer state slot.
template <class Trainer, class T>
void scatter_flat_state(Trainer& t, std::size_t k, const std::vector<T>& full) {
  auto& dist = t.optimizer();
  auto& opt = dist.optimizer();
  if constexpr (on_device<Trainer>) {
    dist.write_state(opt.state_names()[k], 0, std::span<const T>(full));
    return;
  }
  auto copy_range = [&](std::size_t range, std::int64_t flat_offset) {
    auto s = opt.state(range, k);
    std::copy_n(full.begin() + flat_offset, s.size(), s.begin());
  };
  if constexpr (!Trainer::zero) {
    for (std::size_t i = 0; i < dist.flat().params().size(); ++i) copy_range(i, dist.flat().offsets()[i]);
  } else {
    const auto& segs = dist.buckets().own_segments();
    for (std::size_t j = 0; j < segs.size(); ++j) copy_range(j, segs[j].flat_offset);
  }
}

inline std::string state_tensor_name(const std::string& param, const char* slot) { return param + "." + slot; }

// A GPU (or ZeRO-3) trainer's weights as saved: the whole flat buffer of its (fp32 master) weights
// on the host (collective over the data axis under ZeRO).
template <class Trainer>
std::vector<state_t<Trainer>> read_weights(Trainer& t) {
  return t.optimizer().read_state("master", 0, t.optimizer().flat().numel());
}
// The inverse: master weights from the whole flat buffer `w` (this rank keeps its part), and the
// working values rounded from them on every rank.
template <class Trainer>
void write_weights(Trainer& t, const std::vector<state_t<Trainer>>& w) {
  auto& dist = t.optimizer();
  dist.write_state("master", 0, std::span<const state_t<Trainer>>(w));
  using T = value_t<Trainer>;
  if constexpr (!std::is_same_v<T, state_t<Trainer>>) {
    const std::vector<T> rounded(w.begin(), w.end());
    SpaceCopy<typename Trainer::ParamT::space, HostSpace>::copy(dist.flat().values().data(), rounded.data(),
                                                                rounded.size() * sizeof(T));
  }
}
// Where parameter i's elements are read from or written to: its own values on the host, its
// range of `flat` (a whole flat buffer on the host) on a GPU or under ZeRO-3 (flat_weights).
template <class Trainer, class S>
S* weights_of(Trainer& t, std::size_t i, std::vector<S>& flat) {
  if constexpr (!on_device<Trainer>)
    if (!flat_weights(t)) return t.optimizer().flat().params()[i]->value().data();
  return flat.data() + t.optimizer().flat().offsets()[i];
}

template <class Trainer>
std::vector<ConfigField> checked_fields(Trainer& t, std::int64_t seq_len) {
  return model_fields(t.model(), t.options().global_batch, seq_len);
}
// What a resume checks beyond them (see ResumeChecks): the seed, kept exact as text (u64), and the data.
template <class Trainer>
std::vector<ConfigField> run_fields(Trainer& t, const std::vector<ConfigField>& data) {
  std::vector<ConfigField> fields{{"train.seed", "--seed", std::to_string(t.options().seed)}};
  fields.insert(fields.end(), data.begin(), data.end());
  return fields;
}
// A config value in a message: text as it is, numbers as JSON writes them.
inline std::string shown(const checkpoint::Json& v) { return v.is_string() ? v.as_string() : v.dump(); }

}  // namespace detail

struct CheckpointerOptions {
  int keep_last = 3;              // complete checkpoints kept (<= 0: all)
  int max_failures = 3;           // failed saves in a row that stop the run (>= 1); the ones before are reported
  std::int64_t seq_len = 0;       // a GPT's tokens per training sequence (recorded and checked); 0: its max_seq
  // Brings the trainer's host state up to date before a save stages it (a device trainer's
  // to_host()); runs after the save in flight has committed; its time counts as blocking.
  std::function<void()> refresh;
  // The trainer's host state changes only through `refresh` (a mirror of device state): saves
  // write the weights and, without ZeRO, the optimizer state in place — no staging copy.
  bool in_place = false;
  // Adds entries to the manifest's config: state the host trainer does not hold (a device
  // trainer's loss scale). Read back with checkpoint::CheckpointReader(dir).manifest().config.
  std::function<void(checkpoint::Json& config)> extra_config;
  // Tests (checkpoint::WriterOptions::before_write): runs on each rank's background thread before
  // it writes its file; an exception it throws fails the save as a full disk would.
  std::function<void(std::int64_t step)> before_write;
};

// Saves a trainer's state asynchronously; see the top of the file. Collective over the world.
template <class Trainer>
class Checkpointer {
 public:
  Checkpointer(Trainer& trainer, std::string root, CheckpointerOptions options = {})
      : trainer_(trainer), options_(options),
        writer_(trainer.grid().world(), std::move(root),
                {.keep_last = options.keep_last, .max_failures = options.max_failures, .before_write = options.before_write}) {}

  const std::string& root() const noexcept { return writer_.root(); }

  // Stages everything, then writes in the background. A save still in flight is completed first.
  // Staging copies the weights (training may go on and change them; not with `in_place`) and
  // gathers each optimizer state slot into a buffer the writer reads in place until the commit
  // (with `in_place` and no ZeRO, the optimizer's own state is read in place).
  void save_async(const TrainPosition& pos) {
    const NvtxRange range("checkpoint save");
    using T = detail::state_t<Trainer>;
    const auto t0 = clock::now();
    auto& t = trainer_;
    auto& dist = t.optimizer();
    auto& opt = dist.optimizer();
    const auto& flat = dist.flat();
    const auto& params = flat.params();
    const auto& model = t.model();
    writer_.wait();  // the previous save commits before this one stages (or a refresh overwrites what it reads)
    if (options_.refresh) options_.refresh();
    const bool state_in_place = options_.in_place && !Trainer::zero && !detail::on_device<Trainer>;
    held_.resize(opt.state_names().size());
    for (std::size_t k = 0; k < held_.size(); ++k) {
      if (!state_in_place) detail::gather_flat_state(t, k, held_[k]);
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (params[i]->is_duplicate()) continue;
        const auto b = detail::block_of(*params[i], t.grid(), model);
        const T* state = state_in_place ? opt.state(i, k).data() : held_[k].data() + flat.offsets()[i];
        writer_.add_in_place(detail::state_tensor_name(params[i]->name(), opt.state_names()[k]), b.shape, b.slice,
                             std::span<const T>(state, static_cast<std::size_t>(checkpoint::volume(b.slice))));
      }
    }
    if (detail::flat_weights(t)) held_weights_ = detail::read_weights(t);  // read in place until the commit
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto* p = params[i];
      if (p->is_duplicate()) continue;
      const auto b = detail::block_of(*p, t.grid(), model);
      const std::span<const T> value(detail::weights_of(t, i, held_weights_), static_cast<std::size_t>(checkpoint::volume(b.slice)));
      if (options_.in_place || detail::flat_weights(t)) writer_.add_in_place(p->name(), b.shape, b.slice, value);
      else writer_.add(p->name(), b.shape, b.slice, value);
    }
    checkpoint::SaveInfo info;
    info.step = pos.step;
    for (const auto& f : detail::checked_fields(t, options_.seq_len)) info.config.set(f.key, f.value);
    info.config.set("train.step", pos.step);
    info.config.set("train.optimizer_step", dist.optimizer().step_count());
    info.config.set("train.epoch", pos.epoch);
    info.config.set("train.batch", pos.batch);
    info.config.set("train.seed", std::to_string(t.options().seed));  // u64: kept exact as text
    if (const auto* scaler = t.dynamic_loss_scale()) {
      info.config.set("train.loss_scale", scaler->scale());
      info.config.set("train.loss_scale_clean_steps", scaler->clean_steps());
    }
    if (options_.extra_config) options_.extra_config(info.config);
    const auto& g = t.grid();
    info.layout = {.tp = g.tp(), .pp = g.pp(), .dp = g.dp(),
                   .zero = !Trainer::zero ? 0 : t.optimizer().options().shard_values ? 3 : t.optimizer().options().shard_gradients ? 2 : 1};
    writer_.save_async(info);
    started_ = t0;
    blocking_seconds_ += seconds_since(t0);
    ++saves_;
  }

  // Once per step on every rank (collective, cheap): commits the save in flight when every rank
  // has written its file. Returns true when none is in flight.
  bool poll() {
    const bool was_pending = writer_.pending();
    const auto t0 = clock::now();
    const bool done = writer_.poll();
    blocking_seconds_ += seconds_since(t0);
    if (was_pending && done) total_seconds_ += seconds_since(started_);
    return done;
  }
  // Completes the save in flight (collective): before exiting.
  void wait() {
    const bool was_pending = writer_.pending();
    const auto t0 = clock::now();
    writer_.wait();
    blocking_seconds_ += seconds_since(t0);
    if (was_pending) total_seconds_ += seconds_since(started_);
  }

  // Saves committed (or in flight): failed ones are not counted.
  int saves() const noexcept { return saves_ - writer_.failed_saves(); }
  // Time the training loop spent inside save_async/poll/wait (staging, planning, commits): the
  // time an asynchronous save costs training. And the time from save_async to commit, summed.
  double blocking_seconds() const noexcept { return blocking_seconds_; }
  double total_seconds() const noexcept { return total_seconds_; }

 private:
  using clock = std::chrono::steady_clock;
  static double seconds_since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

  Trainer& trainer_;
  CheckpointerOptions options_;
  checkpoint::CheckpointWriter writer_;
  std::vector<std::vector<detail::state_t<Trainer>>> held_;  // gathered state slots, read by the save in flight
  std::vector<detail::state_t<Trainer>> held_weights_;       // a GPU's master weights, read by the save in flight
  clock::time_point started_{};
  int saves_ = 0;
  double blocking_seconds_ = 0.0, total_seconds_ = 0.0;
};

namespace detail {

// A training checkpoint's position (what Checkpointer::save_async records) must be there, as
// integers that are not negative, train.step the manifest's step: else an Error saying why.
inline void check_position(const checkpoint::CheckpointReader& r) {
  const auto& config = r.manifest().config;
  const std::string manifest = (std::filesystem::path(r.dir()) / checkpoint::kManifestFile).string();
  for (const char* key : {"train.step", "train.optimizer_step", "train.epoch", "train.batch"}) {
    const checkpoint::Json* v = config.find(key);
    DPML_REQUIRE(v != nullptr && v->is_int(), "checkpoint manifest '" << manifest << "' has no integer config \"" << key << "\"");
    DPML_REQUIRE(v->as_int() >= 0, "checkpoint manifest '" << manifest << "': config \"" << key << "\" is " << v->as_int()
                                                          << " (negative)");
  }
  DPML_REQUIRE(config.at("train.step").as_int() == r.step(), "checkpoint manifest '" << manifest << "': config \"train.step\" is "
                                                                                   << config.at("train.step").as_int()
                                                                                   << ", the manifest's step " << r.step());
}

}  // namespace detail

// The checkpoint --resume names (collective). "latest" (or ""): the newest complete and valid one
// under `root` (see the top of the file), rank 0 naming each one skipped and why; nullopt if
// `root` holds no checkpoint at all. If it holds some and every one is bad: an Error naming
// `root` and each one skipped — or, with `fresh_if_corrupt`, they are named, then nullopt. Anything
// else is a step directory, verified whole by rank 0 first (a bad one: an Error on every rank
// naming the file and tensor, no fallback).
inline std::optional<std::string> resolve_resume(const comm::Mpi& world, const std::string& resume, const std::string& root,
                                                 bool fresh_if_corrupt = false) {
  std::string found, error;
  if (resume.empty() || resume == "latest") {
    DPML_REQUIRE_EVERYWHERE(!root.empty(), "--resume latest needs --save DIR (where to look)");
    if (world.rank() == 0) {
      std::vector<std::string> skipped;
      found = checkpoint::find_latest_valid(root, &skipped, detail::check_position).value_or("");
      if (found.empty() && !skipped.empty() && !fresh_if_corrupt) {
        error = "every checkpoint in --save '" + root + "' is corrupt or incomplete (" + std::to_string(skipped.size()) +
                " skipped: ";
        for (std::size_t i = 0; i < skipped.size(); ++i) error += (i ? "; " : "") + skipped[i];
        error += "); --resume-fresh-if-corrupt starts fresh instead";
      } else {
        for (const auto& s : skipped) checkpoint::detail::report_line("dpml: " + s);
        if (found.empty() && !skipped.empty())
          checkpoint::detail::report_line("dpml: every checkpoint in --save '" + root + "' is corrupt or incomplete (" +
                                          std::to_string(skipped.size()) + " skipped): starting fresh (--resume-fresh-if-corrupt)");
      }
    }
    detail::raise_collected(world, error, "--resume " + (resume.empty() ? std::string("latest") : resume));
    world.broadcast(found, 0);
    if (found.empty()) return std::nullopt;
    return found;
  }
  if (world.rank() == 0) {
    try {
      const checkpoint::CheckpointReader reader(resume);
      reader.verify();
      detail::check_position(reader);
    } catch (const Error& e) {
      error = e.message();
    }
  }
  detail::raise_collected(world, error, "resuming from '" + resume + "'");
  return resume;
}

// Restores a trainer from checkpoint directory `dir` (collective); returns the data position.
// `seq_len`: a GPT's tokens per training sequence of this run (0: its max_seq). `checks`: the data
// this run reads, and whether a seed or data that differ from the checkpoint's are accepted.
template <class Trainer>
TrainPosition load_checkpoint(Trainer& t, const std::string& dir, std::int64_t seq_len = 0, const ResumeChecks& checks = {}) {
  const auto& world = t.grid().world();
  TrainPosition pos;
  std::int64_t optimizer_step = 0;
  std::optional<std::pair<double, std::int64_t>> loss_scale;  // a dynamic scaler's (scale, clean steps)
  std::string error;
  // A GPU's weights on the host, read first (collective) so that padding keeps its values.
  std::vector<detail::state_t<Trainer>> weights;
  if (detail::flat_weights(t)) weights = detail::read_weights(t);
  try {
    const checkpoint::CheckpointReader reader(dir);
    const auto& config = reader.manifest().config;
    const std::string manifest = (std::filesystem::path(dir) / checkpoint::kManifestFile).string();
    auto get = [&](const char* key) -> std::int64_t {
      const checkpoint::Json* v = config.find(key);
      DPML_REQUIRE(v != nullptr && v->is_int(), "checkpoint manifest '" << manifest << "' has no integer config \"" << key << "\"");
      return v->as_int();
    };
    for (const auto& f : detail::checked_fields(t, seq_len)) {
      const std::int64_t saved = get(f.key);
      DPML_REQUIRE(saved == f.value.as_int(), "checkpoint '" << dir << "' was saved with " << f.flag << " " << saved << " (\""
                                                             << f.key << "\"), this run has " << f.flag << " " << f.value.as_int());
    }
    // The seed and the data: every difference in one message.
    std::string saved_as, given_as;
    for (const auto& f : detail::run_fields(t, checks.data)) {
      const checkpoint::Json* saved = config.find(f.key);
      if (saved == nullptr || *saved == f.value) continue;
      const char* sep = saved_as.empty() ? "" : " and ";
      saved_as += sep + std::string(f.flag) + " " + detail::shown(*saved) + " (\"" + f.key + "\")";
      given_as += sep + std::string(f.flag) + " " + detail::shown(f.value);
    }
    DPML_REQUIRE(saved_as.empty() || checks.override_config, "checkpoint '" << dir << "' was saved with " << saved_as << ", this run has "
                                                              << given_as << ": the data order would change (--override-resume-config resumes anyway)");
    pos = {get("train.step"), get("train.epoch"), get("train.batch")};
    optimizer_step = get("train.optimizer_step");
    if (auto* scaler = t.dynamic_loss_scale(); scaler && config.find("train.loss_scale")) {
      const checkpoint::Json* scale = config.find("train.loss_scale");
      DPML_REQUIRE(scale->is_number(), "checkpoint manifest '" << manifest << "': config \"train.loss_scale\" is not a number");
      loss_scale = {scale->as_double(), get("train.loss_scale_clean_steps")};
    }

    auto& dist = t.optimizer();
    const auto& flat = dist.flat();
    const auto& params = flat.params();
    const auto& model = t.model();
    for (std::size_t i = 0; i < params.size(); ++i) {  // duplicates too: the tied copy reads wte.weight
      const auto b = detail::block_of(*params[i], t.grid(), model);
      reader.read(params[i]->name(), b.shape, b.slice,
                  std::span(detail::weights_of(t, i, weights), static_cast<std::size_t>(checkpoint::volume(b.slice))));
    }
    for (std::size_t k = 0; k < dist.optimizer().state_names().size(); ++k) {
      std::vector<detail::state_t<Trainer>> state(static_cast<std::size_t>(flat.numel()));  // zeros: padding rows have no state
      for (std::size_t i = 0; i < params.size(); ++i) {
        const auto b = detail::block_of(*params[i], t.grid(), model);
        reader.read(detail::state_tensor_name(params[i]->name(), dist.optimizer().state_names()[k]), b.shape, b.slice,
                    std::span(state.data() + flat.offsets()[i], static_cast<std::size_t>(checkpoint::volume(b.slice))));
      }
      detail::scatter_flat_state(t, k, state);
    }
  } catch (const Error& e) {
    error = e.message();
  }
  detail::raise_collected(world, error, "loading checkpoint '" + dir + "'");
  if (detail::flat_weights(t)) detail::write_weights(t, weights);
  t.optimizer().optimizer().set_step_count(optimizer_step);
  t.set_step(pos.step);
  if (loss_scale) t.dynamic_loss_scale()->set(loss_scale->first, loss_scale->second);
  return pos;
}

// ---- GPT-2 export / import -----------------------------------------------------------------------

namespace detail {

// GPT-2's layout of our global tensors; see the top of the file.
inline bool is_linear_weight(const std::string& name, std::size_t rank) {
  return rank == 2 && name != "wte.weight" && name != "wpe.weight";
}
inline bool is_c_attn(const std::string& name) {
  return name.ends_with(".attn.c_attn.weight") || name.ends_with(".attn.c_attn.bias");
}
// GPT-2's shape of our tensor `name` of global shape `ours`: linear weights (out, in) → (in, out).
inline std::vector<std::int64_t> gpt2_shape(const std::string& name, const std::vector<std::int64_t>& ours) {
  if (is_linear_weight(name, ours.size())) return {ours[1], ours[0]};
  return ours;
}
// c_attn: our output row r = (head, s, d) is GPT-2's output column (s, head, d), s ∈ {q, k, v}.
inline std::int64_t gpt2_column(std::int64_t r, std::int64_t rows, std::int64_t heads) {
  const std::int64_t D = rows / 3 / heads, h = r / (3 * D), s = r / D % 3, d = r % D;
  return s * heads * D + h * D + d;
}
// Our global tensor (shape `ours`) ↔ GPT-2's: to_file = true maps ours → file, else file → ours.
template <class T>
std::vector<T> gpt2_convert(const std::string& name, const std::vector<std::int64_t>& ours, std::span<const T> in,
                            std::int64_t heads, bool to_file) {
  std::vector<T> out(in.begin(), in.end());
  const std::int64_t rows = ours[0], cols = ours.size() == 2 ? ours[1] : 1;
  const bool permute = is_c_attn(name), transpose = is_linear_weight(name, ours.size());
  if (!permute && !transpose) return out;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t g = permute ? gpt2_column(r, rows, heads) : r;  // our row r is GPT-2's column/row g
    for (std::int64_t c = 0; c < cols; ++c) {
      const auto here = static_cast<std::size_t>(r * cols + c);
      const auto there = static_cast<std::size_t>(transpose ? c * rows + g : g * cols + c);
      if (to_file) out[there] = in[here];
      else out[here] = in[there];
    }
  }
  return out;
}

// One tensor of a GPT-2 file as float: F32, or BF16 (a model saved in bfloat16) widened exactly.
inline std::vector<float> read_as_float(const checkpoint::SafetensorsFile& file, const checkpoint::SafetensorsEntry& e) {
  if (e.dtype != checkpoint::Dtype::BF16) return file.read<float>(e.name);  // any other dtype: refused naming it
  const auto narrow = file.read<bf16>(e.name);
  std::vector<float> out(narrow.size());
  std::transform(narrow.begin(), narrow.end(), out.begin(), [](bf16 v) { return static_cast<float>(v); });
  return out;
}

}  // namespace detail

// Writes the trainer's model as one GPT-2-style safetensors file, or, where `path` names a
// directory (is_hf_directory), as a Hugging Face directory (collective; rank 0 writes).
template <class Trainer>
void export_gpt2(Trainer& t, const std::string& path) {
  namespace fs = std::filesystem;
  const auto& world = t.grid().world();
  const bool hf = is_hf_directory(path);
  const std::string file = hf ? (fs::path(path) / kHfWeightsFile).string() : path;
  const std::string parts = file + ".parts";
  const auto& model = t.model();
  const auto& cfg = model.config();
  {
    std::vector<detail::state_t<Trainer>> weights;  // a GPU's (collective)
    if (detail::flat_weights(t)) weights = detail::read_weights(t);
    checkpoint::CheckpointWriter writer(world, parts, {.keep_last = 1});
    const auto& params = t.optimizer().flat().params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (params[i]->is_duplicate()) continue;
      const auto b = detail::block_of(*params[i], t.grid(), model);
      writer.add(params[i]->name(), b.shape, b.slice,
                 std::span<const detail::state_t<Trainer>>(detail::weights_of(t, i, weights),
                                                           static_cast<std::size_t>(checkpoint::volume(b.slice))));
    }
    writer.save({.step = 0, .config = checkpoint::Json::object(), .layout = {}});
  }
  std::string error;
  if (world.rank() == 0) {
    try {
      const checkpoint::CheckpointReader reader((fs::path(parts) / checkpoint::step_dir_name(0)).string());
      checkpoint::SafetensorsWriter out_file;
      out_file.set_metadata("format", "pt");  // transformers loads only "pt" safetensors
      out_file.set_metadata("producer", "dpml export_gpt2");
      for (const auto& rec : reader.manifest().tensors) {
        const auto read = reader.read_full<detail::state_t<Trainer>>(rec.name, rec.shape);
        const std::vector<float> values(read.begin(), read.end());  // GPT-2 files are F32
        const auto out = detail::gpt2_convert<float>(rec.name, rec.shape, values, cfg.heads, /*to_file=*/true);
        out_file.add<float>(hf ? hf_tensor_name(rec.name) : rec.name, detail::gpt2_shape(rec.name, rec.shape),
                            std::span<const float>(out));
      }
      const std::string tmp = file + ".tmp";
      out_file.write(tmp);
      fs::rename(tmp, file);
      fs::remove_all(parts);
      if (hf) {
        const std::string config = (fs::path(path) / kHfConfigFile).string();
        checkpoint::write_file_synced(config + ".tmp", hf_gpt2_config(cfg).dump() + "\n");
        fs::rename(config + ".tmp", config);
      }
    } catch (const std::exception& e) {
      error = std::string("exporting '") + path + "': " + e.what();
    }
  }
  detail::raise_collected(world, error, "export");
}

// Sets the trainer's model from a GPT-2-style safetensors file, a transformers save_pretrained
// file or a Hugging Face directory (collective; see train/hf_gpt2.hpp for names and the
// config.json check). Every parameter must be there with GPT-2's shape for this model, and every
// tensor of the file must be a parameter of the model (a pipeline stage's or another's) but
// GPT-2's attention masks (h.N.attn.bias, h.N.attn.masked_bias) and a tied lm_head.weight: a file
// of a deeper or otherwise larger model is refused, not truncated. F32 or BF16 tensors.
template <class Trainer>
void import_gpt2(Trainer& t, const std::string& path) {
  const auto& model = t.model();
  const auto& cfg = model.config();
  const auto& params = t.optimizer().flat().params();
  std::string error, mine;
  for (const auto* p : params) mine += p->name() + "\n";
  std::set<std::string> names;  // the whole model's: every rank's (a pipeline stage holds its own)
  for (const auto& theirs : t.grid().world().allgather(mine))
    for (std::size_t at = 0, end; (end = theirs.find('\n', at)) != std::string::npos; at = end + 1)
      names.insert(theirs.substr(at, end - at));
  std::vector<detail::state_t<Trainer>> weights;  // a GPU's (collective, first: padding keeps its values)
  if (detail::flat_weights(t)) weights = detail::read_weights(t);
  try {
    const Gpt2Source source = resolve_gpt2_import(path);
    if (!source.config.empty()) check_hf_gpt2_config(read_json_file(source.config), source.config, cfg);
    const std::string& where = source.weights;
    const checkpoint::SafetensorsFile file(where);
    std::map<std::string, const checkpoint::SafetensorsEntry*> entry_of;  // our name → the file's entry
    const checkpoint::SafetensorsEntry* head = nullptr;
    std::int64_t unused = 0;
    std::string some;  // the first few of them
    bool deeper = false;
    for (const auto& e : file.entries()) {
      if (e.name == kHfHead) head = &e;
      if (e.name == kHfHead || is_gpt2_buffer(e.name)) continue;
      const std::string ours = tensor_name_from_file(e.name);
      if (names.contains(ours)) {
        const auto [it, fresh] = entry_of.emplace(ours, &e);
        DPML_REQUIRE(fresh, "'" << where << "' holds '" << ours << "' twice: as '" << it->second->name << "' and as '" << e.name << "'");
        continue;
      }
      if (++unused <= 3) some += (unused > 1 ? ", '" : "'") + e.name + "'";
      long long layer = -1;
      deeper = deeper || (std::sscanf(ours.c_str(), "h.%lld.", &layer) == 1 && layer >= cfg.layers);
    }
    DPML_REQUIRE(unused == 0, "'" << where << "' has " << unused << " tensor" << (unused == 1 ? "" : "s") << " the model does not use, e.g. "
                                  << some << (deeper ? " (the file has more layers than --num-layers " + std::to_string(cfg.layers) + "?)" : ""));
    // One rank compares (two vocabulary-sized reads); its refusal reaches every rank, as every check
    // here does, through raise_collected below.
    if (head != nullptr && t.grid().world().rank() == 0) {
      const auto wte = entry_of.find("wte.weight");
      DPML_REQUIRE(wte != entry_of.end() && head->dtype == wte->second->dtype && head->shape == wte->second->shape &&
                       file.read_bytes(*head) == file.read_bytes(*wte->second),
                   "'" << where << "': " << kHfHead << " differs from the token embedding"
                       << (wte == entry_of.end() ? "" : " '" + wte->second->name + "'")
                       << ": dpml's GPT ties its output head to it (tie_word_embeddings), an untied head cannot be imported");
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto* p = params[i];
      const auto b = detail::block_of(*p, t.grid(), model);
      const auto file_shape = detail::gpt2_shape(p->name(), b.shape);
      const auto found = entry_of.find(p->name());
      DPML_REQUIRE(found != entry_of.end(),
                   "'" << where << "' has no tensor '" << p->name() << "' (nor '" << hf_tensor_name(p->name()) << "')");
      const checkpoint::SafetensorsEntry* e = found->second;
      DPML_REQUIRE(e->shape == file_shape, "tensor '" << e->name << "' in '" << where << "' has shape "
                                                      << checkpoint::shape_string(e->shape) << ", this model needs "
                                                      << checkpoint::shape_string(file_shape));
      const auto values = detail::read_as_float(file, *e);
      const auto ours = detail::gpt2_convert<float>(p->name(), b.shape, values, cfg.heads, /*to_file=*/false);
      // This rank's block of the (now ours-layout) global tensor: at most 2-D, split along one dim.
      const auto& s = b.slice;
      const std::int64_t cols = b.shape.size() == 2 ? b.shape[1] : 1;
      const std::int64_t c0 = b.shape.size() == 2 ? s[1].begin : 0, c1 = b.shape.size() == 2 ? s[1].end : 1;
      auto* dst = detail::weights_of(t, i, weights);
      for (std::int64_t r = s[0].begin; r < s[0].end; ++r)
        for (std::int64_t c = c0; c < c1; ++c) *dst++ = static_cast<detail::state_t<Trainer>>(ours[static_cast<std::size_t>(r * cols + c)]);
    }
  } catch (const Error& e) {
    error = e.message();
  }
  detail::raise_collected(t.grid().world(), error, "importing '" + path + "'");
  if (detail::flat_weights(t)) detail::write_weights(t, weights);
}

}  // namespace dpml::train
