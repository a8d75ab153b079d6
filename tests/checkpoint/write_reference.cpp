// Writes the files that read_safetensors.py checks with an independent reader:
//   <dir>/reference.safetensors  one tensor of every dtype, values given by a formula the script
//                                also knows (value(i) below), plus __metadata__;
//   <dir>/ckpt/step-3/           a checkpoint written by 2 ranks: "w" (4, 6) in two column pieces,
//                                "b" (3) replicated (the script checks manifest, slices, values
//                                and CRC-32s with zlib).
//   mpiexec -n 2 write_reference <dir>
#include <dpml/checkpoint/checkpoint.hpp>
#include <dpml/comm/mpi.hpp>
#include <dpml/core/bf16.hpp>

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <vector>

using namespace dpml;
using namespace dpml::checkpoint;

namespace {
// Element i of every reference tensor, before conversion to its dtype (read_safetensors.py: value).
template <class T>
std::vector<T> values(std::int64_t n, double scale, double shift) {
  std::vector<T> v;
  for (std::int64_t i = 0; i < n; ++i) v.push_back(static_cast<T>(static_cast<double>(i) * scale + shift));
  return v;
}
}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession mpi(argc, argv);
  if (argc != 2) {
    std::cerr << "usage: write_reference <dir>\n";
    return 2;
  }
  try {
    const comm::Mpi world = mpi.world();
    const std::filesystem::path dir = argv[1];
    if (world.rank() == 0) {
      std::filesystem::remove_all(dir);
      std::filesystem::create_directories(dir);
      SafetensorsWriter w;
      w.set_metadata("written_by", "dpml write_reference");
      w.add<double>("f64", {2, 3}, values<double>(6, 0.5, -3));
      w.add<float>("f32", {2, 3, 4}, values<float>(24, 0.25, -1));
      std::vector<bf16> b16;
      for (float f : values<float>(8, 1.5, -4)) b16.push_back(bf16(f));  // exact in bf16
      w.add<bf16>("bf16", {8}, b16);
      w.add<std::int64_t>("i64", {3}, values<std::int64_t>(3, 1000000000007.0, -2000000000000.0));
      w.add<std::uint64_t>("u64", {2, 2}, values<std::uint64_t>(4, 1.0, 9007199254740000.0));
      w.add<std::int32_t>("i32", {5}, values<std::int32_t>(5, -7, 100));
      w.add<std::uint16_t>("u16", {4}, values<std::uint16_t>(4, -1, 65535));
      w.add<std::uint8_t>("u8", {3, 3}, values<std::uint8_t>(9, -1, 255));
      w.add<float>("scalar", {}, std::vector<float>{42.5f});
      w.write((dir / "reference.safetensors").string());
    }
    world.barrier();

    // Rank r holds columns [3r, 3r + 3) of w (value: its flat index) and all of b.
    DPML_REQUIRE(world.size() == 2, "write_reference runs on 2 ranks, not " << world.size());
    CheckpointWriter ckpt(world, (dir / "ckpt").string());
    const std::vector<std::int64_t> ws = {4, 6}, bs = {3};
    const Slice cols = slice_along(ws, 1, 3 * world.rank(), 3);
    std::vector<float> mine;  // (4, 3)
    for (std::int64_t r = 0; r < 4; ++r)
      for (std::int64_t c = cols[1].begin; c < cols[1].end; ++c) mine.push_back(static_cast<float>(r * 6 + c));
    ckpt.add<float>("w", ws, cols, mine);
    ckpt.add_full<double>("b", bs, values<double>(3, 0.5, 1));
    ckpt.save({.step = 3, .config = Json(Json::Object{{"note", "reference"}}), .layout = {.tp = 2, .pp = 1, .dp = 1, .zero = 0}});
  } catch (const Error& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
  return 0;
}
