#pragma once
// Sharded, layout-independent checkpoints: atomic, optionally asynchronous saving on every
// rank, and reading of any block of any tensor whatever layout wrote it.
//
// On disk (<root> is the directory given to the writer):
//
//   <root>/step-<N>/manifest.json          what the checkpoint holds (manifest.hpp)
//   <root>/step-<N>/rank-<r>.safetensors   the pieces rank r owned (only ranks that own some)
//   <root>/step-<N>.tmp/                   a save in progress, or one that died: never read
//   <root>/latest                          "step-<N>\n": the newest complete checkpoint
//
// Saving (CheckpointWriter, collective over the communicator it is given):
//   1. each rank add()s the tensors it holds: name, global shape, its block of the tensor, host
//      data — copied at once, so training may go on and overwrite the source (add_in_place():
//      not copied, for buffers that stay unchanged until the save commits);
//   2. save_async() exchanges what every rank holds (one allgather of short descriptors) and
//      every rank computes the same plan: tensors must agree on dtype and global shape across
//      ranks; a block held by several ranks (replicas along the data axis, replicated biases) is
//      written by the lowest of them only; the blocks must tile each tensor exactly. Then a
//      background thread writes rank-<r>.safetensors into step-<N>.tmp/ and fsyncs it; this
//      thread makes no MPI call (MPI runs MPI_THREAD_SERIALIZED);
//   3. wait() (or a poll() that finds every rank's thread done) runs the MPI part on the calling
//      thread: gathers the checksums and errors; rank 0 writes the manifest, fsyncs it and the
//      directory, renames step-<N>.tmp → step-<N>, replaces `latest` atomically (write a
//      temporary, fsync, rename) and deletes the oldest complete checkpoints beyond keep_last
//      (and .tmp leftovers of older steps) — after a poll() on a background thread, so that
//      training does not wait for a large delete; wait() also waits for the deletion.
//      Every rank returns from wait() only once the checkpoint is committed.
//   A crash anywhere before the rename leaves a .tmp directory that no reader ever returns; a
//   crash between the rename and `latest` leaves `latest` on the previous checkpoint.
//   A failure on any rank (disk full, a bad tensor) is reported on every rank, naming the rank,
//   as an Error with Scope::everywhere — nobody is left waiting in a collective. Rank 0 then
//   removes the save's step-<N>.tmp. With max_failures = K > 1 a failed save does not end the
//   run: rank 0 reports it once (step and error), and save_async/poll/wait return as if it had
//   committed; the K-th failure in a row is raised (a commit resets the count). A writer's rank 0
//   removes the step-<N>.tmp directories that earlier runs left (saves that died) when it is
//   made, naming them once.
//
// Loading (CheckpointReader, no MPI: each rank reads what it needs):
//   open a step directory, or find_latest_valid(<root>): `latest` first, else the complete
//   step-<N> directories newest first; one that is torn or corrupt (no manifest, a manifest that
//   does not parse or fails its own checksum or checks, a missing or truncated file, a checksum
//   mismatch, or whatever the caller's `check` refuses) is skipped with a message naming it and
//   why (through `skipped`, a caller tells a root without checkpoints from one with only bad
//   ones). read(name, shape,
//   block, dst) checks the shape against the model's and assembles the block from whichever
//   pieces overlap it, verifying each piece's CRC-32 — so a tensor saved as tp=2 shards reads
//   back whole, or as tp=4 shards, or split along another dimension (resharding).
//
//   CheckpointWriter ckpt(grid.world(), "runs/gpt2", {.keep_last = 3});
//   for (auto* p : model.parameters()) {
//     const auto g = layers::global_slice(*p, &grid);
//     ckpt.add(p->name(), g.global, slice_along(g.global, g.dim, g.offset, p->shape()[g.dim]), p->value());
//   }
//   ckpt.save_async({.step = step, .config = cfg, .layout = {.tp = 2, .pp = 1, .dp = 4}});
//   ... train; call ckpt.poll() once per step on every rank; ckpt.wait() before exiting ...
//
//   auto dir = find_latest_valid(grid.world(), "runs/gpt2");   // std::optional<std::string>
//   CheckpointReader r(*dir);
//   r.read(p->name(), g.global, my_block, std::span(p->value().data(), p->numel()));

#include "dpml/checkpoint/json.hpp"
#include "dpml/checkpoint/manifest.hpp"
#include "dpml/checkpoint/safetensors.hpp"
#include "dpml/comm/mpi.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace dpml::checkpoint {

inline std::string step_dir_name(std::int64_t step) { return "step-" + std::to_string(step); }

// The step of a directory named "step-<N>" (not "step-<N>.tmp"), or nullopt.
inline std::optional<std::int64_t> step_of_dir_name(std::string_view name) {
  constexpr std::string_view prefix = "step-";
  if (name.substr(0, prefix.size()) != prefix || name.size() == prefix.size() || name.size() > prefix.size() + 18)
    return std::nullopt;
  std::int64_t step = 0;
  for (const char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  return step;
}
// The step of a directory named "step-<N>.tmp" (a save in progress, or one that died), or nullopt.
inline std::optional<std::int64_t> step_of_tmp_name(std::string_view name) {
  if (!name.ends_with(".tmp")) return std::nullopt;
  return step_of_dir_name(name.substr(0, name.size() - 4));
}

// What a save records besides the tensors.
struct SaveInfo {
  std::int64_t step = 0;
  Json config = Json::object();  // str → string / number / bool
  SavedLayout layout;
};

namespace detail {

// Raises, on every rank alike, the errors that ranks reported ("" = none) in an exchange.
inline void raise_reported(const std::vector<std::string>& errors, std::string_view during) {
  std::string message;
  for (std::size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) message += (message.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + errors[r]);
  if (!message.empty()) throw Error(std::string(during) + " failed: " + message, Scope::everywhere);
}

// One line to std::cerr in one piece (one write() on stderr): mpiexec forwards each rank's stdout
// and stderr as they come, so a line written piece by piece (std::cerr << a << b: a write each)
// can be cut by another stream's line (the progress line) and no longer reads, or matches, as one.
inline void report_line(const std::string& line) { std::cerr << line + "\n" << std::flush; }

inline std::string message_of(const std::exception& e) {
  if (const auto* d = dynamic_cast<const Error*>(&e)) return d->message();
  return e.what();
}

inline Json slice_json(const Slice& s) {
  Json a = Json::array();
  for (const auto& r : s) a.push_back(Json(Json::Array{r.begin, r.end}));
  return a;
}
inline Slice slice_from_json(const Json& j) {
  Slice s;
  for (const auto& r : j.as_array()) s.push_back({r.as_array().at(0).as_int(), r.as_array().at(1).as_int()});
  return s;
}

}  // namespace detail

struct WriterOptions {
  int keep_last = 3;  // complete checkpoints kept in the root directory; <= 0 keeps all
  // Failed saves in a row that stop the run (the K-th is raised; >= 1). 1: every failure is
  // raised. Above 1: the ones before are reported by rank 0 and training goes on.
  int max_failures = 1;
  // Tests: runs on each rank's background thread before it writes its file; an exception it
  // throws fails the save as a full disk would. Empty: nothing.
  std::function<void(std::int64_t step)> before_write;
};

class CheckpointWriter {
 public:
  // `comm` (usually the world) is viewed, not owned: it must outlive the writer.
  // Rank 0 removes the step-<N>.tmp directories in `root` that saves of earlier runs left.
  CheckpointWriter(const comm::Mpi& comm, std::string root, WriterOptions options = {})
      : comm_(comm.native()), root_(std::move(root)), options_(std::move(options)) {
    DPML_REQUIRE(options_.max_failures >= 1, "checkpoint max_failures " << options_.max_failures << " must be at least 1");
    if (comm_.rank() == 0) remove_leftovers();
  }
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  // Waits for the background write but commits nothing (no MPI here: this may run while an
  // exception unwinds); a save never wait()ed for stays a .tmp directory that readers skip.
  ~CheckpointWriter() {
    if (job_ && job_->thread.joinable()) job_->thread.join();
    if (pruner_.joinable()) pruner_.join();
  }

  const std::string& root() const noexcept { return root_; }

  // Stages `data`, this rank's block `slice` of tensor `name` of global shape `global`, for the
  // next save; the data are copied now. Ranks holding the same block may all add it (it is
  // written once) or only one of them may.
  template <class T>
  void add(std::string name, std::span<const std::int64_t> global, Slice slice, std::span<const T> data) {
    stage(std::move(name), global, std::move(slice), data, /*copy=*/true);
  }
  // The same without a copy: the background write reads `data` in place, so it must stay alive
  // and unchanged until this save commits (wait(), or poll() returning true) — for buffers
  // nothing touches in between, such as a host mirror of device state.
  template <class T>
  void add_in_place(std::string name, std::span<const std::int64_t> global, Slice slice, std::span<const T> data) {
    stage(std::move(name), global, std::move(slice), data, /*copy=*/false);
  }
  template <class T>
  void add(std::string name, std::span<const std::int64_t> global, Slice slice, std::span<T> data) {
    add(std::move(name), global, std::move(slice), std::span<const T>(data));
  }
  template <class T, class Space>
  void add(std::string name, const Shape& global, Slice slice, TensorView<T, Space> data) {
    static_assert(std::is_same_v<Space, HostSpace>, "checkpoint: copy device tensors to the host before add()");
    DPML_REQUIRE(data.is_contiguous(), "checkpoint tensor '" << name << "' is not contiguous");
    add(std::move(name), std::span<const std::int64_t>(global.begin(), global.end()), std::move(slice),
        std::span<const std::remove_const_t<T>>(data.data(), static_cast<std::size_t>(data.numel())));
  }
  // A whole tensor (replicated, or held by this rank alone).
  template <class T>
  void add_full(std::string name, std::span<const std::int64_t> shape, std::span<const T> data) {
    add(std::move(name), shape, full_slice(shape), data);
  }

  // Saves what was staged since the last save, and waits for it (collective).
  void save(const SaveInfo& info) {
    save_async(info);
    wait();
  }

  // Starts saving what was staged (collective): plans, then writes on a background thread. A
  // save still pending is completed first.
  void save_async(const SaveInfo& info) {
    wait();
    try {
      start(info);
    } catch (const Error& e) {
      if (e.scope() != Scope::everywhere) throw;
      failed(info.step, e);
    }
  }

  bool pending() const noexcept { return job_ != nullptr; }
  // Saves that failed since the last commit, and in all.
  int failures_in_a_row() const noexcept { return failures_; }
  int failed_saves() const noexcept { return failed_saves_; }

  // Collective, cheap (one small allreduce): commits the pending save if every rank's write is
  // done. Returns true when no save is pending any more. Call at the same points on every rank
  // (e.g. once per step).
  bool poll() {
    if (!job_) return true;
    const int done = job_->done.load(std::memory_order_acquire) ? 1 : 0;
    if (comm_.allreduce(done, comm::ReduceOp::min) == 0) return false;
    complete(/*prune_now=*/false);  // deleting old checkpoints goes on in the background
    return true;
  }

  // Completes the pending save, if any (collective): the checkpoint is committed on return (or,
  // below max_failures, its failure reported), and checkpoints beyond keep_last are deleted.
  void wait() {
    complete(/*prune_now=*/true);
    if (pruner_.joinable()) pruner_.join();
  }

 private:
  struct Job;  // a save in flight (below)

  // save_async's work: the plan, then the background write.
  void start(const SaveInfo& info) {
    std::vector<Staged> staged = std::move(staged_);
    staged_.clear();
    auto job = std::make_unique<Job>();
    job->tmp = (std::filesystem::path(root_) / (step_dir_name(info.step) + ".tmp")).string();
    job->final_dir = (std::filesystem::path(root_) / step_dir_name(info.step)).string();
    job->manifest.step = info.step;
    job->manifest.config = info.config;
    job->manifest.layout = info.layout;

    // Rank 0 makes a clean .tmp directory; the exchange below orders it before any write.
    std::string error;
    if (comm_.rank() == 0) {
      try {
        std::filesystem::create_directories(root_);
        std::filesystem::remove_all(job->tmp);
        std::filesystem::create_directory(job->tmp);
      } catch (const std::exception& e) {
        error = "cannot create '" + job->tmp + "': " + detail::message_of(e);
      }
    }
    Json mine = Json(Json::Object{{"error", error}, {"tensors", Json::array()}});
    for (const auto& s : staged) {
      Json shape = Json::array();
      for (auto d : s.shape) shape.push_back(d);
      mine.as_object()[1].second.push_back(Json(Json::Object{
          {"name", s.name}, {"dtype", dtype_name(s.dtype)}, {"shape", shape}, {"slice", detail::slice_json(s.slice)}}));
    }
    const auto all = comm_.allgather(mine.dump());
    std::vector<std::string> errors;
    for (const auto& text : all) errors.push_back(Json::parse(text, "checkpoint plan").at("error").as_string());
    detail::raise_reported(errors, "checkpoint step " + std::to_string(info.step));

    // The plan: the same on every rank, so its errors are raised everywhere alike.
    std::vector<std::size_t> owned;  // indices into `staged` that this rank writes
    try {
      plan(all, job->manifest, job->owner, owned);
    } catch (const Error& e) {
      throw Error("checkpoint step " + std::to_string(info.step) + ": " + e.message(), Scope::everywhere);
    }

    SafetensorsWriter file;
    file.set_metadata("format", "dpml-checkpoint");
    file.set_metadata("step", std::to_string(info.step));
    file.set_metadata("rank", std::to_string(comm_.rank()));
    for (std::size_t i : owned) {
      Staged& s = staged[i];
      if (s.bytes.empty()) file.add_borrowed(s.name, s.dtype, extents(s.slice), s.in_place);
      else file.add(s.name, s.dtype, extents(s.slice), std::move(s.bytes));
    }
    staged.clear();
    if (!owned.empty()) job->file_name = "rank-" + std::to_string(comm_.rank()) + ".safetensors";
    Job* j = job.get();
    job->thread = std::thread([j, file = std::move(file), before = options_.before_write, step = info.step] {
      try {
        if (before) before(step);
        if (!j->file_name.empty()) {
          file.write((std::filesystem::path(j->tmp) / j->file_name).string());
          for (std::size_t i = 0; i < file.entries().size(); ++i) j->crcs.set(file.entries()[i].name, crc32_of(file.bytes(i)));
        }
      } catch (const std::exception& e) {
        j->error = detail::message_of(e);
      }
      j->done.store(true, std::memory_order_release);
    });
    job_ = std::move(job);
  }

  void complete(bool prune_now) {
    if (!job_) return;
    std::unique_ptr<Job> job = std::move(job_);
    try {
      finish(*job, prune_now);
    } catch (const Error& e) {
      if (e.scope() != Scope::everywhere) throw;
      failed(job->manifest.step, e);
      return;
    }
    failures_ = 0;
  }

  // A save of `step` failed on every rank alike (Scope::everywhere, every background write done):
  // rank 0 removes its .tmp directory; the max_failures-th failure in a row is raised, the ones
  // before it reported once.
  void failed(std::int64_t step, const Error& e) {
    namespace fs = std::filesystem;
    if (comm_.rank() == 0) {
      std::error_code ec;  // a failure to delete: the next writer's start-up removes it
      fs::remove_all(fs::path(root_) / (step_dir_name(step) + ".tmp"), ec);
    }
    ++failed_saves_;
    if (++failures_ >= options_.max_failures) {
      if (options_.max_failures == 1) throw e;
      throw Error(std::to_string(failures_) + " checkpoint saves failed in a row, the last of step " + std::to_string(step) +
                      ": " + e.message(),
                  Scope::everywhere);
    }
    if (comm_.rank() == 0)
      detail::report_line("dpml checkpoint: step " + std::to_string(step) + " not saved (failure " + std::to_string(failures_) +
                          " in a row; failure " + std::to_string(options_.max_failures) +
                          " stops the run); training goes on, the next save retries: " + e.message());
  }

  // complete()'s work: the checksums and errors of every rank, the commit, pruning.
  void finish(Job& job, bool prune_now) {
    job.thread.join();

    // Errors and checksums (by tensor name) of every rank, on every rank.
    Json mine = Json(Json::Object{{"error", job.error}, {"crcs", job.crcs}});
    const auto all = comm_.allgather(mine.dump());
    std::vector<std::string> errors;
    std::vector<Json> crcs;  // [rank] → {tensor name: crc32}
    for (const auto& text : all) {
      Json j = Json::parse(text, "checkpoint checksums");
      errors.push_back(j.at("error").as_string());
      crcs.push_back(j.at("crcs"));
    }
    const std::string what = "saving checkpoint '" + job.final_dir + "'";
    detail::raise_reported(errors, what);

    std::string error;
    if (comm_.rank() == 0) {
      try {
        commit(job, crcs);
      } catch (const std::exception& e) {
        error = detail::message_of(e);
      }
    }
    detail::raise_reported(comm_.allgather(error), what);
    if (comm_.rank() == 0) start_pruning(job.final_dir, job.manifest.step, prune_now);
  }

  // Rank 0, after a commit: deletes what prune() names — on a background thread unless
  // `now` (deleting a 1.4 GiB checkpoint takes long enough to show in a training step). A
  // failure to delete loses nothing (the new checkpoint is committed): a warning.
  void start_pruning(std::string keep, std::int64_t step, bool now) {
    if (pruner_.joinable()) pruner_.join();
    auto run = [this, keep = std::move(keep), step] {
      try {
        prune(keep, step);
      } catch (const std::exception& e) {
        detail::report_line("dpml checkpoint: could not delete old checkpoints in '" + root_ + "': " + detail::message_of(e));
      }
    };
    if (now) run();
    else pruner_ = std::thread(std::move(run));
  }

  struct Staged {
    std::string name;
    Dtype dtype;
    std::vector<std::int64_t> shape;  // global
    Slice slice;                      // this rank's block
    std::vector<std::byte> bytes;     // (extents(slice)), row-major: a copy ...
    std::span<const std::byte> in_place;  // ... or the caller's bytes (add_in_place)
  };

  template <class T>
  void stage(std::string name, std::span<const std::int64_t> global, Slice slice, std::span<const T> data, bool copy) {
    DPML_REQUIRE(slice.size() == global.size(), "checkpoint tensor '" << name << "': slice " << slice_string(slice) << " has "
                                                                      << slice.size() << " dimensions, the shape "
                                                                      << shape_string(global) << " has " << global.size());
    for (std::size_t d = 0; d < global.size(); ++d)
      DPML_REQUIRE(0 <= slice[d].begin && slice[d].begin <= slice[d].end && slice[d].end <= global[d],
                   "checkpoint tensor '" << name << "': slice " << slice_string(slice) << " lies outside its shape "
                                         << shape_string(global));
    DPML_REQUIRE(static_cast<std::int64_t>(data.size()) == volume(slice),
                 "checkpoint tensor '" << name << "': slice " << slice_string(slice) << " holds " << volume(slice)
                                       << " elements, got " << data.size());
    for (const auto& s : staged_) DPML_REQUIRE(s.name != name, "checkpoint tensor '" << name << "' added twice on this rank");
    const auto bytes = std::as_bytes(data);
    staged_.push_back({std::move(name), dtype_of<T>, std::vector<std::int64_t>(global.begin(), global.end()),
                       std::move(slice), copy ? std::vector<std::byte>(bytes.begin(), bytes.end()) : std::vector<std::byte>{},
                       copy ? std::span<const std::byte>{} : bytes});
  }
  struct Job {
    std::string tmp, final_dir, file_name;
    Manifest manifest;                              // crc32s filled at commit
    std::vector<std::vector<int>> owner;            // [tensor][piece] → rank that writes it
    std::thread thread;
    std::atomic<bool> done{false};
    std::string error;                              // from the thread
    Json crcs = Json::object();                     // of this rank's entries: {tensor name: crc32}
  };

  // From every rank's descriptors: the manifest's tensors and pieces, who writes each piece, and
  // which of this rank's staged tensors it writes (in the order its file will hold them).
  void plan(const std::vector<std::string>& all, Manifest& m, std::vector<std::vector<int>>& owner,
            std::vector<std::size_t>& owned) const {
    for (std::size_t r = 0; r < all.size(); ++r) {
      const Json d = Json::parse(all[r], "checkpoint plan");
      const auto& tensors = d.at("tensors").as_array();
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        const Json& t = tensors[i];
        const std::string& name = t.at("name").as_string();
        const Dtype dtype = parse_dtype(t.at("dtype").as_string(), "tensor '" + name + "'");
        std::vector<std::int64_t> shape;
        for (const auto& x : t.at("shape").as_array()) shape.push_back(x.as_int());
        const Slice slice = detail::slice_from_json(t.at("slice"));

        auto it = std::find_if(m.tensors.begin(), m.tensors.end(), [&](const TensorRecord& x) { return x.name == name; });
        if (it == m.tensors.end()) {
          m.tensors.push_back({name, dtype, shape, {}});
          owner.emplace_back();
          it = m.tensors.end() - 1;
        }
        const auto k = static_cast<std::size_t>(it - m.tensors.begin());
        DPML_REQUIRE(it->dtype == dtype && it->shape == shape,
                     "tensor '" << name << "' is " << dtype_name(it->dtype) << " " << shape_string(it->shape) << " on rank "
                                << owner[k].front() << " but " << dtype_name(dtype) << " " << shape_string(shape)
                                << " on rank " << r);
        const bool duplicate = std::any_of(it->pieces.begin(), it->pieces.end(), [&](const Piece& p) { return p.slice == slice; });
        if (duplicate) continue;  // a lower rank holds the same block and writes it
        it->pieces.push_back({"rank-" + std::to_string(r) + ".safetensors", slice, 0});
        owner[k].push_back(static_cast<int>(r));
        if (static_cast<int>(r) == comm_.rank()) owned.push_back(i);
      }
    }
    m.validate();
  }

  // Rank 0, once every rank's file is on disk: manifest, rename, `latest`, pruning.
  void commit(Job& job, const std::vector<Json>& crcs) const {
    namespace fs = std::filesystem;
    for (std::size_t t = 0; t < job.manifest.tensors.size(); ++t) {
      TensorRecord& rec = job.manifest.tensors[t];
      for (std::size_t p = 0; p < rec.pieces.size(); ++p) {
        const Json* crc = crcs.at(static_cast<std::size_t>(job.owner[t][p])).find(rec.name);
        DPML_REQUIRE(crc != nullptr, "rank " << job.owner[t][p] << " reported no checksum for tensor '" << rec.name << "'");
        rec.pieces[p].crc32 = static_cast<std::uint32_t>(crc->as_int());
      }
    }
    write_file_synced((fs::path(job.tmp) / kManifestFile).string(), job.manifest.to_json().dump() + "\n");
    fsync_directory(job.tmp);
    fs::remove_all(job.final_dir);  // an older save of the same step
    fs::rename(job.tmp, job.final_dir);
    fsync_directory(root_);
    const std::string latest = (fs::path(root_) / "latest").string(), latest_tmp = latest + ".tmp";
    write_file_synced(latest_tmp, step_dir_name(job.manifest.step) + "\n");
    fs::rename(latest_tmp, latest);
    fsync_directory(root_);
  }

  // Deletes the oldest complete checkpoints beyond keep_last (never `keep`, just written), and
  // the .tmp directories of older steps: saves that died (one writer saves one step at a time).
  void prune(const std::string& keep, std::int64_t step) const {
    namespace fs = std::filesystem;
    std::vector<std::pair<std::int64_t, fs::path>> complete;
    std::vector<fs::path> stale;
    for (const auto& e : fs::directory_iterator(root_)) {
      if (!e.is_directory()) continue;
      const std::string name = e.path().filename().string();
      if (auto s = step_of_dir_name(name)) complete.emplace_back(*s, e.path());
      else if (auto t = step_of_tmp_name(name); t && *t < step) stale.push_back(e.path());
    }
    for (const auto& p : stale) fs::remove_all(p);
    if (options_.keep_last <= 0) return;
    std::sort(complete.begin(), complete.end());
    const std::size_t keep_last = static_cast<std::size_t>(options_.keep_last);
    for (std::size_t i = 0; i + keep_last < complete.size(); ++i)
      if (complete[i].second != fs::path(keep)) fs::remove_all(complete[i].second);
  }

  // Rank 0, at construction: deletes the step-<N>.tmp directories that saves of earlier runs left
  // (nothing reads them), naming them once. A failure to delete is a warning: the directory is
  // skipped by readers all the same.
  void remove_leftovers() const {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::is_directory(root_, ec)) return;
    std::vector<fs::path> leftovers;
    std::string names;
    try {
      for (const auto& e : fs::directory_iterator(root_))
        if (e.is_directory() && step_of_tmp_name(e.path().filename().string())) leftovers.push_back(e.path());
      std::sort(leftovers.begin(), leftovers.end());
      for (const auto& p : leftovers) {
        fs::remove_all(p);
        names += (names.empty() ? "" : ", ") + p.filename().string();
      }
    } catch (const std::exception& e) {
      detail::report_line("dpml checkpoint: could not remove the unfinished saves in '" + root_ + "': " + detail::message_of(e));
    }
    if (!names.empty())
      detail::report_line("dpml checkpoint: removed unfinished saves of an earlier run in '" + root_ + "': " + names);
  }

  comm::Mpi comm_;
  std::string root_;
  WriterOptions options_;
  int failures_ = 0, failed_saves_ = 0;  // failed saves since the last commit, in all
  std::vector<Staged> staged_;
  std::unique_ptr<Job> job_;
  std::thread pruner_;  // rank 0: deleting old checkpoints after a commit found by poll()
};

// ------------------------------------------------------------------------------------------------

class CheckpointReader {
 public:
  // Opens the checkpoint in `dir` (a step-<N> directory): reads and validates the manifest,
  // opens every file and checks its header against the manifest and its size (truncation).
  // Checksums are verified as pieces are read, or all at once by verify().
  explicit CheckpointReader(std::string dir) : dir_(std::move(dir)) {
    namespace fs = std::filesystem;
    manifest_path_ = (fs::path(dir_) / kManifestFile).string();
    DPML_REQUIRE(fs::is_directory(dir_), "checkpoint directory '" << dir_ << "' does not exist");
    DPML_REQUIRE(fs::exists(manifest_path_), "checkpoint '" << dir_ << "' has no " << kManifestFile
                                                            << " (torn: its save did not finish)");
    manifest_ = Manifest::load(manifest_path_);
    for (const auto& t : manifest_.tensors)
      for (const auto& p : t.pieces) {
        const std::string path = (fs::path(dir_) / p.file).string();
        auto it = files_.find(p.file);
        if (it == files_.end()) {
          DPML_REQUIRE(fs::exists(path), "checkpoint file '" << path << "' is missing (it holds tensor '" << t.name << "')");
          it = files_.emplace(p.file, std::make_unique<SafetensorsFile>(path)).first;
        }
        const SafetensorsEntry* e = it->second->find(t.name);
        DPML_REQUIRE(e != nullptr, "checkpoint file '" << path << "' has no entry for tensor '" << t.name
                                                       << "' that the manifest places there");
        DPML_REQUIRE(e->dtype == t.dtype && e->shape == extents(p.slice),
                     "checkpoint file '" << path << "': tensor '" << t.name << "' is " << dtype_name(e->dtype) << " "
                                         << shape_string(e->shape) << ", the manifest says " << dtype_name(t.dtype) << " "
                                         << shape_string(extents(p.slice)));
      }
  }

  const std::string& dir() const noexcept { return dir_; }
  const Manifest& manifest() const noexcept { return manifest_; }
  std::int64_t step() const noexcept { return manifest_.step; }
  bool contains(std::string_view name) const { return manifest_.find(name) != nullptr; }
  const TensorRecord& tensor(std::string_view name) const {
    const TensorRecord* t = manifest_.find(name);
    DPML_REQUIRE(t != nullptr, "no tensor '" << name << "' in checkpoint '" << manifest_path_ << "'");
    return *t;
  }

  // Reads block `wanted` of tensor `name` into dst (row-major over the block's extents). The
  // tensor's global shape must be `shape` (the model's) and its dtype T's.
  template <class T>
  void read(std::string_view name, std::span<const std::int64_t> shape, const Slice& wanted, std::span<T> dst) const {
    const TensorRecord& t = tensor(name);
    DPML_REQUIRE(std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end()),
                 "tensor '" << name << "' has shape " << shape_string(t.shape) << " in checkpoint '" << manifest_path_
                            << "' but the model expects " << shape_string(shape));
    DPML_REQUIRE(t.dtype == dtype_of<T>, "tensor '" << name << "' is " << dtype_name(t.dtype) << " in checkpoint '"
                                                    << manifest_path_ << "', read as " << dtype_name(dtype_of<T>));
    DPML_REQUIRE(wanted.size() == t.shape.size(), "tensor '" << name << "': block " << slice_string(wanted) << " has "
                                                             << wanted.size() << " dimensions, the tensor " << t.shape.size());
    for (std::size_t d = 0; d < wanted.size(); ++d)
      DPML_REQUIRE(0 <= wanted[d].begin && wanted[d].begin <= wanted[d].end && wanted[d].end <= t.shape[d],
                   "tensor '" << name << "': block " << slice_string(wanted) << " lies outside its shape "
                              << shape_string(t.shape));
    DPML_REQUIRE(static_cast<std::int64_t>(dst.size()) == volume(wanted),
                 "tensor '" << name << "': block " << slice_string(wanted) << " holds " << volume(wanted)
                            << " elements, the destination " << dst.size());
    std::int64_t copied = 0;
    for (const Piece& p : t.pieces) {
      const Slice common = intersect(p.slice, wanted);
      if (volume(common) == 0) continue;
      const std::vector<std::byte> bytes = piece_bytes(t, p);
      copied += copy_block(common, p.slice, bytes.data(), wanted, reinterpret_cast<std::byte*>(dst.data()), sizeof(T));
    }
    DPML_REQUIRE(copied == volume(wanted), "tensor '" << name << "': the pieces in checkpoint '" << manifest_path_
                                                      << "' hold " << copied << " of the " << volume(wanted)
                                                      << " elements of block " << slice_string(wanted));
  }
  // The whole tensor.
  template <class T>
  std::vector<T> read_full(std::string_view name, std::span<const std::int64_t> shape) const {
    const Slice all = full_slice(shape);
    std::vector<T> out(static_cast<std::size_t>(volume(all)));
    read(name, shape, all, std::span<T>(out));
    return out;
  }
  // Block `wanted` into a host tensor view of the block's shape.
  template <class T>
  void read(std::string_view name, const Shape& shape, const Slice& wanted, TensorView<T, HostSpace> dst) const {
    DPML_REQUIRE(dst.is_contiguous(), "tensor '" << name << "': destination is not contiguous");
    read(name, std::span<const std::int64_t>(shape.begin(), shape.end()), wanted,
         std::span<T>(dst.data(), static_cast<std::size_t>(dst.numel())));
  }

  // Verifies every piece's checksum (reads the whole checkpoint).
  void verify() const {
    for (const auto& t : manifest_.tensors)
      for (const auto& p : t.pieces) piece_bytes(t, p);
  }

 private:
  // A piece's bytes, checksum verified.
  std::vector<std::byte> piece_bytes(const TensorRecord& t, const Piece& p) const {
    const SafetensorsFile& f = *files_.at(p.file);
    std::vector<std::byte> bytes = f.read_bytes(f.entry(t.name));
    const std::uint32_t crc = crc32_of(bytes);
    DPML_REQUIRE(crc == p.crc32, "checksum mismatch in checkpoint file '" << f.path() << "' for tensor '" << t.name << "' block "
                                                                          << slice_string(p.slice) << ": crc32 " << crc
                                                                          << ", the manifest records " << p.crc32
                                                                          << " (corrupt checkpoint)");
    return bytes;
  }

  // Copies block `common` from src (holding block `src_block`) to dst (holding `dst_block`),
  // both row-major; returns the elements copied. Rows along the last dimension are contiguous
  // in both, so each is one memcpy.
  static std::int64_t copy_block(const Slice& common, const Slice& src_block, const std::byte* src, const Slice& dst_block,
                                 std::byte* dst, std::size_t elem) {
    const std::size_t rank = common.size();
    if (rank == 0) {
      std::memcpy(dst, src, elem);
      return 1;
    }
    std::vector<std::int64_t> src_stride(rank, 1), dst_stride(rank, 1), idx(rank);
    for (std::size_t d = rank - 1; d-- > 0;) {
      src_stride[d] = src_stride[d + 1] * src_block[d + 1].size();
      dst_stride[d] = dst_stride[d + 1] * dst_block[d + 1].size();
    }
    for (std::size_t d = 0; d < rank; ++d) idx[d] = common[d].begin;
    const std::int64_t row = common[rank - 1].size();
    std::int64_t copied = 0;
    for (;;) {
      std::int64_t s = 0, t = 0;
      for (std::size_t d = 0; d < rank; ++d) {
        s += (idx[d] - src_block[d].begin) * src_stride[d];
        t += (idx[d] - dst_block[d].begin) * dst_stride[d];
      }
      std::memcpy(dst + static_cast<std::size_t>(t) * elem, src + static_cast<std::size_t>(s) * elem,
                  static_cast<std::size_t>(row) * elem);
      copied += row;
      std::size_t d = rank - 1;  // advance the multi-index over all but the last dimension
      for (;;) {
        if (d == 0) return copied;
        --d;
        if (++idx[d] < common[d].end) break;
        idx[d] = common[d].begin;
      }
    }
  }

  std::string dir_, manifest_path_;
  Manifest manifest_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>, std::less<>> files_;
};

// The newest complete, intact checkpoint under `root` (its step directory), or nullopt: the one
// `latest` names if it is intact, else the step-<N> directories newest first. Each one skipped
// (torn, corrupt, or refused by `check`, which throws an Error saying why) is described in
// `skipped` if given, else printed to stderr. Reads every byte of the checkpoint it returns
// (checksums).
inline std::optional<std::string> find_latest_valid(const std::string& root, std::vector<std::string>* skipped = nullptr,
                                                    const std::function<void(const CheckpointReader&)>& check = {}) {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  const fs::path latest = fs::path(root) / "latest";
  if (std::ifstream in(latest); in) {
    std::string name;
    std::getline(in, name);
    if (step_of_dir_name(name)) candidates.push_back(fs::path(root) / name);
  }
  std::vector<std::pair<std::int64_t, fs::path>> steps;
  if (fs::is_directory(root))
    for (const auto& e : fs::directory_iterator(root))
      if (auto step = step_of_dir_name(e.path().filename().string()); step && e.is_directory()) steps.emplace_back(*step, e.path());
  std::sort(steps.rbegin(), steps.rend());
  for (const auto& s : steps)
    if (std::find(candidates.begin(), candidates.end(), s.second) == candidates.end()) candidates.push_back(s.second);

  for (const auto& dir : candidates) {
    try {
      const CheckpointReader reader(dir.string());
      reader.verify();
      if (check) check(reader);
      return dir.string();
    } catch (const Error& e) {
      const std::string why = "skipping checkpoint '" + dir.string() + "': " + e.message();
      if (skipped) skipped->push_back(why);
      else detail::report_line("dpml: " + why);
    }
  }
  return std::nullopt;
}

// The same, collective over `comm`: rank 0 searches (and prints what it skips), every rank gets
// its answer — the checkpoint is read through once, not once per rank.
inline std::optional<std::string> find_latest_valid(const comm::Mpi& comm, const std::string& root) {
  std::string found;
  if (comm.rank() == 0) found = find_latest_valid(root).value_or("");
  comm.broadcast(found, 0);
  if (found.empty()) return std::nullopt;
  return found;
}

}  // namespace dpml::checkpoint
