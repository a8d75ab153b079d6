// checkpoint.hpp on the launch's ranks (1 and 2): sharded save and load, atomic commit and
// `latest`, torn and corrupt checkpoints skipped, bad checkpoints as Errors naming file and
// tensor, keep-last-K, asynchronous save equal to the synchronous one byte for byte, in-place staging, and plan
// errors (gaps, ranks that disagree) raised on every rank alike. The manifest's own checksum and
// train::resolve_resume's fallback past bad checkpoints (all bad: an Error unless asked to start
// fresh); failed saves that training survives until the K-th in a row; unfinished saves of an
// earlier run removed at start-up.
#include "common.hpp"

#include <dpml/checkpoint/checkpoint.hpp>
#include <dpml/train/checkpointing.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace dpml;
using namespace dpml::checkpoint;
namespace fs = std::filesystem;

namespace {

const std::vector<std::int64_t> kW = {8, 6};  // "w": rows split over the ranks
const std::vector<std::int64_t> kB = {5};     // "b": replicated, every rank adds it

// Stages this rank's tensors: w split along dim 0 (uneven when 8 does not divide), b whole.
void stage(CheckpointWriter& ckpt, const comm::Mpi& comm, int salt = 0) {
  const std::int64_t rows = kW[0] / comm.size() + (comm.rank() < kW[0] % comm.size() ? 1 : 0);
  std::int64_t first = 0;
  for (int r = 0; r < comm.rank(); ++r) first += kW[0] / comm.size() + (r < kW[0] % comm.size() ? 1 : 0);
  const Slice mine = slice_along(kW, 0, first, rows);
  ckpt.add<float>("w", kW, mine, test::reference_block<float>(1 + salt, kW, mine));
  ckpt.add<double>("b", kB, full_slice(kB), test::reference_block<double>(2 + salt, kB, full_slice(kB)));
}

SaveInfo info(std::int64_t step) {
  SaveInfo i;
  i.step = step;
  i.config = Json(Json::Object{{"model", "test"}, {"lr", 0.5}, {"layers", 3}});
  i.layout = {.tp = 1, .pp = 1, .dp = 2, .zero = 1};
  return i;
}

// What f() writes to std::cerr (and f's Error, if any, after "ERROR: ").
std::string cerr_of(const std::function<void()>& f) {
  std::ostringstream captured;
  std::streambuf* old = std::cerr.rdbuf(captured.rdbuf());
  const std::string error = test::error_of(f);
  std::cerr.rdbuf(old);
  return captured.str() + (error.empty() ? "" : "ERROR: " + error);
}

// A training checkpoint's config (what train::Checkpointer records of the position).
SaveInfo train_info(std::int64_t step) {
  SaveInfo i = info(step);
  i.config.set("train.step", step).set("train.optimizer_step", step).set("train.epoch", 0).set("train.batch", step);
  return i;
}

// Rewrites a manifest through `edit` and stamps it with its new checksum: a manifest that is
// self-consistent but says something impossible.
void edit_manifest(const std::string& path, const std::function<void(Json&)>& edit) {
  const auto bytes = test::read_bytes(path);
  Json j = Json::parse(std::string_view(bytes.data(), bytes.size()), path);
  edit(j);
  j.set(kManifestChecksum, manifest_checksum(j));
  const std::string text = j.dump() + "\n";
  test::write_bytes(path, std::vector<char>(text.begin(), text.end()));
}
Json& member(Json& object, const std::string& key) {
  for (auto& [k, v] : object.as_object())
    if (k == key) return v;
  throw std::logic_error("no member " + key);
}

std::string latest_of(const std::string& root) {
  std::ifstream in(root + "/latest");
  std::string s;
  std::getline(in, s);
  return s;
}

}  // namespace

TEST_CASE("checkpoint: sharded save, load, manifest", "[checkpoint]") {
  const auto world = test::world();
  test::SharedTempDir dir(world);
  CheckpointWriter ckpt(world, dir.str());
  stage(ckpt, world);
  ckpt.save(info(7));

  CHECK(latest_of(dir.str()) == "step-7");
  const CheckpointReader r(dir / "step-7");
  CHECK(r.step() == 7);
  CHECK(r.manifest().config.at("model").as_string() == "test");
  CHECK(r.manifest().config.at("layers").as_int() == 3);
  CHECK(r.manifest().layout == SavedLayout{1, 1, 2, 1});
  REQUIRE(r.contains("w"));
  CHECK(r.tensor("w").pieces.size() == static_cast<std::size_t>(world.size()));
  REQUIRE(r.tensor("b").pieces.size() == 1);  // replicated: written once, by rank 0
  CHECK(r.tensor("b").pieces[0].file == "rank-0.safetensors");
  CHECK(r.read_full<float>("w", kW) == test::reference_block<float>(1, kW, full_slice(kW)));
  CHECK(r.read_full<double>("b", kB) == test::reference_block<double>(2, kB, full_slice(kB)));
  const Slice block = {{3, 7}, {1, 4}};  // crosses the row split
  std::vector<float> got(12);
  r.read<float>("w", kW, block, got);
  CHECK(got == test::reference_block<float>(1, kW, block));
  r.verify();
  for (int rank = 0; rank < world.size(); ++rank) CHECK(fs::exists(dir / ("step-7/rank-" + std::to_string(rank) + ".safetensors")));
  CHECK_FALSE(fs::exists(dir / "step-7.tmp"));
  CHECK_FALSE(fs::exists(dir / "latest.tmp"));
  CHECK(find_latest_valid(world, dir.str()) == dir / "step-7");  // collective: rank 0 searches
}

TEST_CASE("checkpoint: host tensor views in and out", "[checkpoint]") {
  const auto world = test::world();
  test::SharedTempDir dir(world);
  const Shape global{2 * world.size(), 3};
  const std::vector<std::int64_t> g(global.begin(), global.end());
  const Slice rows = slice_along(g, 0, 2 * world.rank(), 2);
  Tensor<std::int32_t> mine(Shape{2, 3});  // (2, 3): this rank's rows
  const auto ref = test::reference_block<std::int32_t>(4, g, rows);
  std::copy(ref.begin(), ref.end(), mine.begin());
  CheckpointWriter ckpt(world, dir.str());
  ckpt.add("t", global, rows, mine.view());
  ckpt.save(info(1));

  const CheckpointReader r(dir / "step-1");
  Tensor<std::int32_t> all(global);  // (2·ranks, 3)
  r.read("t", global, full_slice(g), all.view());
  CHECK(std::vector<std::int32_t>(all.begin(), all.end()) == test::reference_block<std::int32_t>(4, g, full_slice(g)));
  Tensor<std::int32_t> column(Shape{2 * world.size(), 1});  // (2·ranks, 1)
  r.read("t", global, slice_along(g, 1, 2, 1), column.view());
  CHECK(std::vector<std::int32_t>(column.begin(), column.end()) ==
        test::reference_block<std::int32_t>(4, g, slice_along(g, 1, 2, 1)));
}

TEST_CASE("checkpoint: a failure on one rank is an Error on every rank", "[checkpoint]") {
  const auto world = test::world();
  test::SharedTempDir dir(world);
  if (world.rank() == 0) test::write_bytes(dir / "file", {'x'});
  world.barrier();
  const std::string root = dir / "file/sub";  // below a regular file: rank 0 cannot create it
  CheckpointWriter ckpt(world, root);
  stage(ckpt, world);
  const std::string e = test::error_of([&] { ckpt.save(info(1)); });
  CHECK(test::contains(e, "checkpoint step 1 failed: rank 0: cannot create '" + root + "/step-1.tmp'"));
  CHECK_FALSE(ckpt.pending());
}

TEST_CASE("checkpoint: latest is always complete; torn and corrupt ones are skipped", "[checkpoint]") {
  const auto world = test::world();
  test::SharedTempDir dir(world);
  {
    CheckpointWriter ckpt(world, dir.str(), {.keep_last = 0});
    stage(ckpt, world);
    ckpt.save(info(1));
    stage(ckpt, world);
    ckpt.save(info(2));
    // A save that dies before its commit (the writer goes away without wait()): only a .tmp.
    stage(ckpt, world);
    ckpt.save_async(info(3));
  }
  world.barrier();
  CHECK(fs::exists(dir / "step-3.tmp"));
  CHECK_FALSE(fs::exists(dir / "step-3"));
  CHECK(latest_of(dir.str()) == "step-2");
  std::vector<std::string> skipped;
  CHECK(find_latest_valid(dir.str(), &skipped) == dir / "step-2");
  CHECK(skipped.empty());

  // A complete-looking .tmp directory with a newer step is never returned either.
  world.barrier();
  if (world.rank() == 0) fs::copy(dir / "step-2", dir / "step-9.tmp");
  world.barrier();
  CHECK(find_latest_valid(dir.str(), &skipped) == dir / "step-2");

  // latest → a corrupt checkpoint: fall back to the previous complete one, naming the bad one.
  world.barrier();
  if (world.rank() == 0) test::flip_byte(dir / "step-2/rank-0.safetensors", 3);
  world.barrier();
  skipped.clear();
  CHECK(find_latest_valid(dir.str(), &skipped) == dir / "step-1");
  REQUIRE(skipped.size() == 1);
  CHECK(test::contains(skipped[0], "skipping checkpoint '" + (dir / "step-2") + "'"));
  CHECK(test::contains(skipped[0], "checksum mismatch in checkpoint file '" + (dir / "step-2/rank-0.safetensors") + "' for tensor 'b'"));

  // No latest file, and a torn checkpoint (no manifest): the newest intact step-N is used.
  world.barrier();
  if (world.rank() == 0) {
    fs::remove(dir / "latest");
    fs::copy(dir / "step-1", dir / "step-5");
    fs::remove(dir / "step-5/manifest.json");
  }
  world.barrier();
  skipped.clear();
  CHECK(find_latest_valid(dir.str(), &skipped) == dir / "step-1");
  REQUIRE(skipped.size() == 2);
  CHECK(test::contains(skipped[0], "checkpoint '" + (dir / "step-5") + "' has no manifest.json"));
  CHECK(test::contains(skipped[1], "step-2"));
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir / "step-1");
  world.barrier();
  skipped.clear();
  CHECK_FALSE(find_latest_valid(dir.str(), &skipped).has_value());
  CHECK(skipped.size() == 2);
  CHECK_FALSE(find_latest_valid(dir / "does-not-exist").has_value());
}

TEST_CASE("checkpoint: keep the last K", "[checkpoint]") {
  const auto world = test::world();
  test::SharedTempDir dir(world);
  if (world.rank() == 0) fs::create_directory(dir / "step-5.tmp");  // a save that died earlier
  world.barrier();
  CheckpointWriter ckpt(world, dir.str(), {.keep_last = 2});
  for (std::int64_t step = 10; step <= 50; step += 10) {
    stage(ckpt, world);
    ckpt.save(info(step));
  }
  world.barrier();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.str())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"latest", "step-40", "step-50"});  // step-5.tmp removed too
  CHECK(latest_of(dir.str()) == "step-50");
}

TEST_CASE("checkpoint: asynchronous save equals the synchronous one byte for byte", "[checkpoint]") {
  const auto world = test::world();
  test::SharedTempDir sync_dir(world), async_dir(world);
  CheckpointWriter sync(world, sync_dir.str()), async(world, async_dir.str());
  stage(sync, world);
  sync.save(info(4));

  // The async writer copies at add(): overwriting the source afterwards changes nothing saved.
  std::vector<float> source = test::reference_block<float>(3, {16}, full_slice(std::vector<std::int64_t>{16}));
  const std::vector<std::int64_t> shape16 = {16};
  stage(async, world);
  async.save_async(info(4));
  CHECK(async.pending());
  while (!async.poll()) {  // collective: every rank sees the same answer
  }
  CHECK_FALSE(async.pending());
  world.barrier();
  for (const auto& e : fs::directory_iterator(sync_dir / "step-4")) {
    const std::string name = e.path().filename().string();
    CAPTURE(name);
    CHECK(test::read_bytes(e.path().string()) == test::read_bytes(async_dir / ("step-4/" + name)));
  }
  CHECK(std::distance(fs::directory_iterator(sync_dir / "step-4"), fs::directory_iterator()) ==
        std::distance(fs::directory_iterator(async_dir / "step-4"), fs::directory_iterator()));

  // Source overwritten while the background write runs.
  async.add<float>("v", shape16, full_slice(shape16), source);
  async.save_async(info(5));
  for (auto& x : source) x = -1;
  async.wait();
  CHECK(CheckpointReader(async_dir / "step-5").read_full<float>("v", shape16) ==
        test::reference_block<float>(3, shape16, full_slice(shape16)));
}

TEST_CASE("checkpoint: add_in_place writes the caller's bytes as they are at the write, no copy", "[checkpoint]") {
  const auto world = test::world();
  test::SharedTempDir copied_dir(world), in_place_dir(world);
  const std::vector<std::int64_t> shape = {7, 3};
  const Slice all = full_slice(shape);
  const std::vector<float> final_values = test::reference_block<float>(11, shape, all);

  CheckpointWriter copied(world, copied_dir.str());
  copied.add<float>("m", shape, all, final_values);
  copied.save(info(2));

  // Staged in place with other values, then changed before save_async: what is written is what
  // the buffer holds when the background write reads it — the final values.
  std::vector<float> buffer(final_values.size(), -3.0f);
  CheckpointWriter in_place(world, in_place_dir.str());
  in_place.add_in_place<float>("m", shape, all, buffer);
  std::copy(final_values.begin(), final_values.end(), buffer.begin());
  in_place.save_async(info(2));
  in_place.wait();
  world.barrier();
  for (const auto& e : fs::directory_iterator(copied_dir / "step-2")) {
    const std::string name = e.path().filename().string();
    CAPTURE(name);
    CHECK(test::read_bytes(e.path().string()) == test::read_bytes(in_place_dir / ("step-2/" + name)));
  }
  CHECK(CheckpointReader(in_place_dir / "step-2").read_full<float>("m", shape) == final_values);
}

TEST_CASE("checkpoint: bad checkpoints are Errors naming the file and the tensor", "[checkpoint]") {
  // Each rank on its own directory (MPI_COMM_SELF): reading is local.
  const comm::Mpi self(MPI_COMM_SELF);
  test::SharedTempDir dir(self);
  CheckpointWriter ckpt(self, dir.str());
  stage(ckpt, self);
  ckpt.save(info(1));
  const std::string step = dir / "step-1", file = dir / "step-1/rank-0.safetensors", manifest = dir / "step-1/manifest.json";
  const CheckpointReader good(step);

  CHECK(test::contains(test::error_of([&] { good.read_full<float>("nope", kW); }),
                       "no tensor 'nope' in checkpoint '" + manifest + "'"));
  CHECK(test::contains(test::error_of([&] { good.read_full<float>("w", std::vector<std::int64_t>{8, 7}); }),
                       "tensor 'w' has shape [8, 6] in checkpoint '" + manifest + "' but the model expects [8, 7]"));
  CHECK(test::contains(test::error_of([&] { good.read_full<double>("w", kW); }),
                       "tensor 'w' is F32 in checkpoint '" + manifest + "', read as F64"));
  std::vector<float> small(3);
  CHECK(test::contains(test::error_of([&] { good.read<float>("w", kW, {{0, 9}, {0, 1}}, small); }), "lies outside its shape"));

  // Flipped byte in the data of "w" (the first entry): found when w is read.
  test::flip_byte(file, 45);  // b (5 doubles, 40 bytes) ends the file: 45 bytes from the end lies in w
  const CheckpointReader flipped(step);
  CHECK(test::contains(test::error_of([&] { flipped.read_full<float>("w", kW); }),
                       "checksum mismatch in checkpoint file '" + file + "' for tensor 'w'"));
  CHECK(flipped.read_full<double>("b", kB) == test::reference_block<double>(2, kB, full_slice(kB)));
  test::flip_byte(file, 45);  // back

  // Truncated: the file's last tensor is named.
  const auto bytes = test::read_bytes(file);
  test::truncate_by(file, 8);
  CHECK(test::contains(test::error_of([&] { CheckpointReader{step}; }), "safetensors file '" + file + "' is truncated: tensor 'b'"));
  test::write_bytes(file, bytes);
  CHECK(CheckpointReader(step).read_full<float>("w", kW) == test::reference_block<float>(1, kW, full_slice(kW)));

  // A missing file, a missing manifest, a manifest that lies about a shape.
  fs::rename(file, file + ".away");
  CHECK(test::contains(test::error_of([&] { CheckpointReader{step}; }),
                       "checkpoint file '" + file + "' is missing (it holds tensor 'w')"));
  fs::rename(file + ".away", file);
  const auto text = test::read_bytes(manifest);
  std::string edited(text.begin(), text.end());
  edited.replace(edited.find("\"shape\":[5]"), 11, "\"shape\":[6]");
  test::write_bytes(manifest, std::vector<char>(edited.begin(), edited.end()));
  CHECK(test::contains(test::error_of([&] { CheckpointReader{step}; }),
                       "bad checkpoint manifest '" + manifest + "': manifest checksum mismatch"));
  edit_manifest(manifest, [](Json&) {});  // the same lie with a checksum that agrees: the tiling check finds it
  CHECK(test::contains(test::error_of([&] { CheckpointReader{step}; }),
                       "bad checkpoint manifest '" + manifest + "'"));
  CHECK(test::contains(test::error_of([&] { CheckpointReader{step}; }), "tensor 'b' of shape [6]: its pieces hold 5 of its 6 elements"));
  fs::remove(manifest);
  CHECK(test::contains(test::error_of([&] { CheckpointReader{step}; }), "checkpoint '" + step + "' has no manifest.json"));
}

TEST_CASE("checkpoint: plan errors are raised on every rank", "[checkpoint]") {
  const auto world = test::world();
  test::SharedTempDir dir(world);
  CheckpointWriter ckpt(world, dir.str());
  // Only rank 0's half of the rows: the others' rows are missing.
  if (world.rank() == 0 && world.size() > 1) ckpt.add<float>("w", kW, slice_along(kW, 0, 0, 4), std::vector<float>(24));
  if (world.size() == 1) ckpt.add<float>("w", kW, slice_along(kW, 0, 0, 4), std::vector<float>(24));
  CHECK(test::contains(test::error_of([&] { ckpt.save(info(1)); }), "tensor 'w' of shape [8, 6]: its pieces hold 24 of its 48 elements"));
  if (world.size() > 1) {  // ranks disagree on a shape
    const std::vector<std::int64_t> shape = {4 + (world.rank() > 0 ? 1 : 0)};
    ckpt.add<float>("x", shape, full_slice(shape), std::vector<float>(static_cast<std::size_t>(shape[0])));
    CHECK(test::contains(test::error_of([&] { ckpt.save(info(2)); }), "tensor 'x' is F32 [4] on rank 0 but F32 [5] on rank 1"));
  }
  // Overlapping blocks that are not identical.
  const Slice mine = slice_along(kW, 0, world.rank() == 0 ? 0 : 1, 7);
  if (world.size() > 1 && world.rank() < 2) {
    ckpt.add<float>("w", kW, mine, std::vector<float>(42));
    CHECK(test::contains(test::error_of([&] { ckpt.save(info(3)); }), "overlap"));
  } else if (world.size() > 1) {
    CHECK(test::contains(test::error_of([&] { ckpt.save(info(3)); }), "overlap"));
  }
  world.barrier();
  CHECK_FALSE(fs::exists(dir / "latest"));
}

TEST_CASE("checkpoint: the manifest's checksum covers its own fields", "[checkpoint]") {
  const auto world = test::world();
  test::SharedTempDir dir(world);
  CheckpointWriter ckpt(world, dir.str(), {.keep_last = 0});
  for (std::int64_t step = 1; step <= 2; ++step) {
    stage(ckpt, world);
    ckpt.save(info(step));
  }
  world.barrier();
  const std::string m1 = dir / "step-1/manifest.json", m2 = dir / "step-2/manifest.json";
  const auto text = test::read_bytes(m2);
  const Json j = Json::parse(std::string_view(text.data(), text.size()), m2);
  REQUIRE(j.as_object().back().first == kManifestChecksum);  // written last, over the rest
  CHECK(j.at(kManifestChecksum).as_int() == manifest_checksum(j));
  world.barrier();

  // One flipped bit in the step ("step":2 → "step":3): no tensor file changed, the checkpoint is
  // skipped for the previous one all the same.
  if (world.rank() == 0) {
    std::string edited(text.begin(), text.end());
    const auto at = edited.find("\"step\":2");
    REQUIRE(at != std::string::npos);
    edited[at + 7] ^= 0x01;
    test::write_bytes(m2, std::vector<char>(edited.begin(), edited.end()));
  }
  world.barrier();
  std::vector<std::string> skipped;
  CHECK(find_latest_valid(dir.str(), &skipped) == dir / "step-1");
  REQUIRE(skipped.size() == 1);
  CHECK(test::contains(skipped[0], "skipping checkpoint '" + (dir / "step-2") + "': bad checkpoint manifest '" + m2 +
                                       "': manifest checksum mismatch: crc32 "));

  // A manifest that does not parse, one with a negative step: skipped alike.
  world.barrier();
  if (world.rank() == 0) {
    test::write_bytes(m2, std::vector<char>(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(text.size() / 2)));
    fs::copy(dir / "step-1", dir / "step-3", fs::copy_options::recursive);
    edit_manifest(dir / "step-3/manifest.json", [](Json& m) { member(m, "step") = Json(-3); });
  }
  world.barrier();
  skipped.clear();
  CHECK(find_latest_valid(dir.str(), &skipped) == dir / "step-1");
  REQUIRE(skipped.size() == 2);  // `latest` (step-2) first, then newest first
  CHECK(test::contains(skipped[0], "skipping checkpoint '" + (dir / "step-2") + "'"));
  CHECK(test::contains(skipped[0], m2));
  CHECK(test::contains(skipped[1], "skipping checkpoint '" + (dir / "step-3") + "'"));
  CHECK(test::contains(skipped[1], "step -3 is negative"));

  // A manifest written before the checksum existed (no such member) is read as before.
  world.barrier();
  if (world.rank() == 0) {
    const auto old = test::read_bytes(m1);
    std::string stripped(old.begin(), old.end());
    const auto at = stripped.find(",\"manifest_crc32\":");
    REQUIRE(at != std::string::npos);
    stripped.erase(at, stripped.find('}', at) - at);
    test::write_bytes(m1, std::vector<char>(stripped.begin(), stripped.end()));
  }
  world.barrier();
  const auto stripped = test::read_bytes(m1);
  CHECK_FALSE(test::contains(std::string(stripped.begin(), stripped.end()), "manifest_crc32"));
  CHECK(CheckpointReader(dir / "step-1").read_full<float>("w", kW) == test::reference_block<float>(1, kW, full_slice(kW)));
  skipped.clear();
  CHECK(find_latest_valid(dir.str(), &skipped) == dir / "step-1");
}

TEST_CASE("checkpoint: resume falls back past bad checkpoints; all bad is an error unless told", "[checkpoint]") {
  const auto world = test::world();
  test::SharedTempDir dir(world), empty(world);
  {
    CheckpointWriter ckpt(world, dir.str(), {.keep_last = 0});
    for (std::int64_t step = 1; step <= 3; ++step) {
      stage(ckpt, world);
      ckpt.save(train_info(step));
    }
  }
  world.barrier();
  CHECK(train::resolve_resume(world, "latest", dir.str()) == dir / "step-3");

  // step-3 says it resumes at a negative batch (a consistent manifest, checksum and all), step-2's
  // tensor file is corrupt: step-1, each skip named once by rank 0.
  if (world.rank() == 0) {
    edit_manifest(dir / "step-3/manifest.json", [](Json& m) { member(m, "config").set("train.batch", -1); });
    test::flip_byte(dir / "step-2/rank-0.safetensors", 3);
  }
  world.barrier();
  std::optional<std::string> found;
  const std::string said = cerr_of([&] { found = train::resolve_resume(world, "latest", dir.str()); });
  CHECK(found == dir / "step-1");
  if (world.rank() == 0) {
    CHECK(test::contains(said, "dpml: skipping checkpoint '" + (dir / "step-3") + "': checkpoint manifest '" +
                                   (dir / "step-3/manifest.json") + "': config \"train.batch\" is -1 (negative)\n"));
    CHECK(test::contains(said, "dpml: skipping checkpoint '" + (dir / "step-2") + "': checksum mismatch"));
  } else {
    CHECK(said.empty());
  }
  // Named explicitly, the bad one is an Error (no fallback).
  CHECK(test::contains(test::error_of([&] { train::resolve_resume(world, dir / "step-3", dir.str()); }),
                       "resuming from '" + (dir / "step-3") + "' failed: rank 0: checkpoint manifest"));

  // Every one bad: an Error naming the directory and each skipped checkpoint — starting fresh
  // would silently throw the run away — unless fresh_if_corrupt.
  world.barrier();
  if (world.rank() == 0) fs::remove(dir / "step-1/manifest.json");
  world.barrier();
  const std::string e = test::error_of([&] { train::resolve_resume(world, "latest", dir.str()); });
  CHECK(test::contains(e, "--resume latest failed: rank 0: every checkpoint in --save '" + dir.str() +
                              "' is corrupt or incomplete (3 skipped: skipping checkpoint '" + (dir / "step-3") + "'"));
  CHECK(test::contains(e, "skipping checkpoint '" + (dir / "step-1") + "': checkpoint '" + (dir / "step-1") + "' has no manifest.json"));
  CHECK(test::contains(e, "); --resume-fresh-if-corrupt starts fresh instead"));
  const std::string fresh = cerr_of([&] { found = train::resolve_resume(world, "latest", dir.str(), /*fresh_if_corrupt=*/true); });
  CHECK_FALSE(found.has_value());
  if (world.rank() == 0)
    CHECK(test::contains(fresh, "dpml: every checkpoint in --save '" + dir.str() +
                                    "' is corrupt or incomplete (3 skipped): starting fresh (--resume-fresh-if-corrupt)"));
  // No checkpoint at all: starting fresh is right, without a word.
  CHECK(cerr_of([&] { found = train::resolve_resume(world, "latest", empty.str()); }).empty());
  CHECK_FALSE(found.has_value());
}

TEST_CASE("checkpoint: unfinished saves of an earlier run are removed at start-up", "[checkpoint]") {
  const auto world = test::world();
  test::SharedTempDir dir(world);
  {
    CheckpointWriter ckpt(world, dir.str());
    stage(ckpt, world);
    ckpt.save(info(1));
    stage(ckpt, world);
    ckpt.save_async(info(2));  // dies: the writer goes away without wait()
  }
  world.barrier();
  if (world.rank() == 0) {
    fs::create_directory(dir / "step-9.tmp");
    fs::create_directory(dir / "notes.tmp");  // not a save's: kept
  }
  world.barrier();
  REQUIRE(fs::exists(dir / "step-2.tmp"));
  std::optional<CheckpointWriter> next;
  const std::string said = cerr_of([&] { next.emplace(world, dir.str()); });
  world.barrier();
  CHECK_FALSE(fs::exists(dir / "step-2.tmp"));
  CHECK_FALSE(fs::exists(dir / "step-9.tmp"));
  CHECK(fs::exists(dir / "notes.tmp"));
  CHECK(fs::exists(dir / "step-1/manifest.json"));
  if (world.rank() == 0)
    CHECK(said == "dpml checkpoint: removed unfinished saves of an earlier run in '" + dir.str() + "': step-2.tmp, step-9.tmp\n");
  else
    CHECK(said.empty());
  CHECK(cerr_of([&] { CheckpointWriter again(world, dir.str()); }).empty());  // nothing left: nothing said
}

TEST_CASE("checkpoint: failed saves are reported and training goes on until the K-th in a row", "[checkpoint]") {
  const auto world = test::world();
  test::SharedTempDir dir(world);
  // The last rank's background write fails at these steps, as on a full disk.
  const std::vector<std::int64_t> failing = {2, 3, 5, 6, 7};
  const int last = world.size() - 1;
  WriterOptions options{.keep_last = 0, .max_failures = 3};
  options.before_write = [&](std::int64_t step) {
    if (world.rank() == last && std::find(failing.begin(), failing.end(), step) != failing.end())
      throw std::runtime_error("No space left on device (injected)");
  };
  CheckpointWriter ckpt(world, dir.str(), options);
  std::int64_t reached = 0;
  std::vector<int> in_a_row;
  // A training loop: a save every step, poll() every step; 2 and 3 fail, 4 commits (the count
  // starts again), 5, 6 and 7 fail: the third in a row is raised, on every rank alike.
  const std::string said = cerr_of([&] {
    for (std::int64_t step = 1; step <= 7; ++step) {
      reached = step;
      ckpt.poll();
      stage(ckpt, world);
      ckpt.save_async(info(step));  // the previous save is complete now: its outcome counted
      in_a_row.push_back(ckpt.failures_in_a_row());
    }
    ckpt.wait();
  });
  CHECK(reached == 7);
  CHECK(in_a_row == std::vector<int>{0, 0, 1, 2, 0, 1, 2});
  const std::string failure = "rank " + std::to_string(last) + ": No space left on device (injected)";
  CHECK(test::contains(said, "3 checkpoint saves failed in a row, the last of step 7: saving checkpoint '" + (dir / "step-7") +
                                 "' failed: " + failure));
  if (world.rank() == 0) {
    for (const std::int64_t step : {2, 3, 5, 6}) {
      const std::string line = "dpml checkpoint: step " + std::to_string(step) + " not saved (failure " +
                               std::to_string(step == 2 || step == 5 ? 1 : 2) +
                               " in a row; failure 3 stops the run); training goes on, the next save retries: saving checkpoint '" +
                               (dir / ("step-" + std::to_string(step))) + "' failed: " + failure + "\n";
      CHECK(test::contains(said, line));
      CHECK(said.find(line) == said.rfind(line));  // once
    }
  } else {
    CHECK_FALSE(test::contains(said, "not saved"));
  }
  world.barrier();
  CHECK(latest_of(dir.str()) == "step-4");
  for (const std::int64_t step : {1, 4}) CHECK(fs::exists(dir / ("step-" + std::to_string(step) + "/manifest.json")));
  for (const std::int64_t step : failing) {  // neither committed nor left behind as .tmp
    CHECK_FALSE(fs::exists(dir / ("step-" + std::to_string(step))));
    CHECK_FALSE(fs::exists(dir / ("step-" + std::to_string(step) + ".tmp")));
  }
}

TEST_CASE("checkpoint: a save directory that cannot be made fails each save; a repaired one commits", "[checkpoint]") {
  const auto world = test::world();
  test::SharedTempDir dir(world);
  if (world.rank() == 0) test::write_bytes(dir / "file", {'x'});
  world.barrier();
  const std::string root = dir / "file/sub";  // below a regular file (chmod does not stop root)
  CheckpointWriter ckpt(world, root, {.max_failures = 2});
  stage(ckpt, world);
  const std::string first = cerr_of([&] { ckpt.save(info(1)); });
  CHECK(ckpt.failures_in_a_row() == 1);
  if (world.rank() == 0)
    CHECK(test::contains(first, "dpml checkpoint: step 1 not saved (failure 1 in a row; failure 2 stops the run); training goes "
                                "on, the next save retries: checkpoint step 1 failed: rank 0: cannot create '" + root + "/step-1.tmp'"));
  world.barrier();
  if (world.rank() == 0) {  // repaired
    fs::remove(dir / "file");
    fs::create_directories(root);
  }
  world.barrier();
  stage(ckpt, world);
  ckpt.save(info(2));
  CHECK(ckpt.failures_in_a_row() == 0);
  CHECK(latest_of(root) == "step-2");
  world.barrier();
  if (world.rank() == 0) {  // broken again: two in a row stop
    fs::remove_all(dir / "file");
    test::write_bytes(dir / "file", {'x'});
  }
  world.barrier();
  stage(ckpt, world);
  CHECK(test::error_of([&] { ckpt.save(info(3)); }).empty());
  stage(ckpt, world);
  CHECK(test::contains(test::error_of([&] { ckpt.save(info(4)); }),
                       "2 checkpoint saves failed in a row, the last of step 4: checkpoint step 4 failed: rank 0: cannot create '" +
                           root + "/step-4.tmp'"));
}
