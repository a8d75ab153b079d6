// Resharding: a checkpoint saved by 4 ranks laid out as tp=2 × dp=2 (tensor-parallel shards
// replicated along data, replicated biases, ZeRO-style flat shards over all four, a scalar, an
// empty tensor) is read back whole on 1 rank and in a different sharding on 2 ranks, element by
// element. Three CTest tests share the directory $DPML_CHECKPOINT_DIR: save (np4) → load (np1, np2).
#include "common.hpp"

#include <dpml/checkpoint/checkpoint.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

using namespace dpml;
using namespace dpml::checkpoint;

namespace {

struct TensorSpec {
  std::string name;
  int id;
  std::vector<std::int64_t> shape;
};
const TensorSpec kW{"w", 1, {6, 10}};       // F32, tp split on dim 0, replicated over dp
const TensorSpec kV{"v", 2, {4, 5, 6}};     // F64, tp split on dim 2, replicated over dp
const TensorSpec kB{"b", 3, {7}};           // F32, replicated everywhere
const TensorSpec kM{"m", 4, {10}};          // F32, ZeRO-style: 3, 3, 2, 2 over all 4 ranks
const TensorSpec kS{"s", 5, {}};            // I64 scalar, replicated
const TensorSpec kE{"e", 6, {0, 3}};        // I32, empty, replicated

std::string checkpoint_root() {
  const char* d = std::getenv("DPML_CHECKPOINT_DIR");
  REQUIRE(d != nullptr);
  return d;
}

// Element-by-element comparison of block `block` of `t` read from `r` with the reference.
template <class T>
void check_block(const CheckpointReader& r, const TensorSpec& t, const Slice& block) {
  CAPTURE(t.name, slice_string(block));
  std::vector<T> got(static_cast<std::size_t>(volume(block)));
  r.read<T>(t.name, t.shape, block, got);
  const auto want = test::reference_block<T>(t.id, t.shape, block);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    REQUIRE(got[i] == want[i]);
  }
}

// [begin, end) of part `i` of `n` of `size` elements (the first size % n parts one larger).
Range part(std::int64_t size, int n, int i) {
  std::int64_t begin = 0;
  for (int k = 0; k < i; ++k) begin += size / n + (k < size % n ? 1 : 0);
  return {begin, begin + size / n + (i < size % n ? 1 : 0)};
}

}  // namespace

TEST_CASE("reshard: save on 4 ranks as tp=2 x dp=2", "[save]") {
  const auto world = test::world();
  REQUIRE(world.size() == 4);
  const int tp = world.rank() % 2;
  const std::string root = checkpoint_root();
  if (world.rank() == 0) std::filesystem::remove_all(root);
  world.barrier();

  CheckpointWriter ckpt(world, root);
  auto add = [&]<class T>(const TensorSpec& t, Slice block, T) {
    ckpt.add<T>(t.name, t.shape, block, test::reference_block<T>(t.id, t.shape, block));
  };
  add(kW, slice_along(kW.shape, 0, 3 * tp, 3), float{});
  add(kV, slice_along(kV.shape, 2, 3 * tp, 3), double{});
  add(kB, full_slice(kB.shape), float{});
  const Range m = part(10, 4, world.rank());
  add(kM, slice_along(kM.shape, 0, m.begin, m.size()), float{});
  add(kS, full_slice(kS.shape), std::int64_t{});
  add(kE, full_slice(kE.shape), std::int32_t{});
  ckpt.save({.step = 100, .config = Json(Json::Object{{"tp", 2}}), .layout = {.tp = 2, .pp = 1, .dp = 2, .zero = 1}});

  const CheckpointReader r(root + "/step-100");
  CHECK(r.tensor("w").pieces.size() == 2);  // the dp replicas wrote nothing
  CHECK(r.tensor("w").pieces[1].file == "rank-1.safetensors");
  CHECK(r.tensor("v").pieces.size() == 2);
  CHECK(r.tensor("b").pieces.size() == 1);
  CHECK(r.tensor("m").pieces.size() == 4);
  CHECK(r.tensor("s").pieces.size() == 1);
  CHECK(r.tensor("e").pieces.size() == 1);
  for (int k = 0; k < 4; ++k) CHECK(std::filesystem::exists(root + "/step-100/rank-" + std::to_string(k) + ".safetensors"));
}

TEST_CASE("reshard: load whole tensors on 1 rank", "[load]") {
  const auto world = test::world();
  const auto dir = find_latest_valid(checkpoint_root());
  REQUIRE(dir.has_value());
  const CheckpointReader r(*dir);
  CHECK(r.step() == 100);
  CHECK(r.manifest().layout == SavedLayout{2, 1, 2, 1});
  check_block<float>(r, kW, full_slice(kW.shape));
  check_block<double>(r, kV, full_slice(kV.shape));
  check_block<float>(r, kB, full_slice(kB.shape));
  check_block<float>(r, kM, full_slice(kM.shape));
  check_block<std::int64_t>(r, kS, full_slice(kS.shape));
  check_block<std::int32_t>(r, kE, full_slice(kE.shape));
}

TEST_CASE("reshard: load another sharding on this launch's ranks", "[load]") {
  const auto world = test::world();
  const int n = world.size(), me = world.rank();
  const CheckpointReader r(*find_latest_valid(checkpoint_root()));
  // w and v split along other dimensions than they were saved, m and b in n uneven parts.
  const Range w = part(10, n, me), v = part(4, n, me), m = part(10, n, me), b = part(7, n, me);
  check_block<float>(r, kW, slice_along(kW.shape, 1, w.begin, w.size()));
  check_block<double>(r, kV, slice_along(kV.shape, 0, v.begin, v.size()));
  check_block<float>(r, kM, slice_along(kM.shape, 0, m.begin, m.size()));
  check_block<float>(r, kB, slice_along(kB.shape, 0, b.begin, b.size()));
  // tp=4-style shards of v's last dimension (6 = 2+2+1+1) and an arbitrary inner block.
  for (int k = 0; k < 4; ++k) {
    const Range s = part(6, 4, k);
    check_block<double>(r, kV, slice_along(kV.shape, 2, s.begin, s.size()));
  }
  check_block<double>(r, kV, {{1, 3}, {2, 5}, {2, 5}});
  check_block<float>(r, kW, {{2, 5}, {me, 9 - me}});
}
