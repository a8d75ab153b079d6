// checkpoint.hpp on the launch's ranks (1 and 2): sharded save and load, atomic commit and
// `latest`, torn and corrupt checkpoints skipped, bad checkpoints as Errors naming file and
// tensor, keep-last-K, asynchronous save equal to the synchronous one byte for byte, in-place staging, and plan
// errors (gaps, ranks that disagree) raised on every rank alike.
#include "common.hpp"

#include <dpml/checkpoint/checkpoint.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
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
