// safetensors.hpp: every dtype written and read back bit for bit; the file follows the published
// layout (u64 header length, space-padded header to a multiple of 8, contiguous offsets); bad
// files (truncated, gaps in the offsets, wrong dtype asked) are Errors naming file and tensor.
#include "common.hpp"

#include <dpml/checkpoint/safetensors.hpp>
#include <dpml/core/bf16.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace dpml;
using namespace dpml::checkpoint;

namespace {

template <class T>
std::vector<T> random_values(std::size_t n, std::mt19937_64& gen) {
  std::vector<T> v(n);
  for (auto& x : v) {
    if constexpr (std::is_same_v<T, bf16>) x = bf16::from_bits(static_cast<std::uint16_t>(gen()));
    else if constexpr (std::is_floating_point_v<T>) x = static_cast<T>(std::uniform_real_distribution<double>(-1e6, 1e6)(gen));
    else x = static_cast<T>(gen());
  }
  return v;
}

template <class T>
void check_same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace

TEST_CASE("safetensors: every dtype round-trips bit for bit", "[checkpoint][safetensors]") {
  test::SharedTempDir dir(comm::Mpi(MPI_COMM_SELF));
  auto gen = test::rng(0x5afe);
  const auto f64 = random_values<double>(6, gen);
  const auto f32 = random_values<float>(24, gen);
  const auto b16 = random_values<bf16>(5, gen);
  const auto i64 = random_values<std::int64_t>(3, gen);
  const auto u64 = random_values<std::uint64_t>(4, gen);
  const auto i32 = random_values<std::int32_t>(7, gen);
  const auto u16 = random_values<std::uint16_t>(9, gen);
  const auto u8 = random_values<std::uint8_t>(13, gen);

  SafetensorsWriter w;
  w.set_metadata("step", "12");
  w.add<double>("f64", {2, 3}, f64);
  w.add<float>("f32", {2, 3, 4}, f32);
  w.add<bf16>("bf16", {5}, b16);
  w.add<std::int64_t>("i64", {3, 1}, i64);
  w.add<std::uint64_t>("u64", {4}, u64);
  w.add<std::int32_t>("i32", {7}, i32);
  w.add<std::uint16_t>("u16", {3, 3}, u16);
  w.add<std::uint8_t>("u8", {13}, u8);
  w.add<float>("scalar", {}, std::vector<float>{2.5f});
  w.add<float>("empty", {0, 4}, std::vector<float>{});
  const std::string path = dir / "all.safetensors";
  w.write(path);

  // The published layout, checked on the raw bytes.
  const auto raw = test::read_bytes(path);
  std::uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  CHECK(n % 8 == 0);
  const std::string header(raw.data() + 8, n);
  CHECK(header.rfind("{\"__metadata__\":{\"step\":\"12\"},\"f64\":{\"dtype\":\"F64\",\"shape\":[2,3],\"data_offsets\":[0,48]}", 0) == 0);
  CHECK(raw.size() == 8 + n + 48 + 96 + 10 + 24 + 32 + 28 + 18 + 13 + 4);

  const SafetensorsFile f(path);
  CHECK(f.metadata().at("step").as_string() == "12");
  CHECK(f.entries().size() == 10);
  check_same_bits(f.read<double>("f64"), f64);
  check_same_bits(f.read<float>("f32"), f32);
  check_same_bits(f.read<bf16>("bf16"), b16);
  check_same_bits(f.read<std::int64_t>("i64"), i64);
  check_same_bits(f.read<std::uint64_t>("u64"), u64);
  check_same_bits(f.read<std::int32_t>("i32"), i32);
  check_same_bits(f.read<std::uint16_t>("u16"), u16);
  check_same_bits(f.read<std::uint8_t>("u8"), u8);
  CHECK(f.read<float>("scalar") == std::vector<float>{2.5f});
  CHECK(f.read<float>("empty").empty());
  CHECK(f.entry("f32").shape == std::vector<std::int64_t>{2, 3, 4});
  CHECK(f.entry("scalar").shape.empty());

  CHECK(test::contains(test::error_of([&] { f.read<float>("f64"); }), "tensor 'f64' in '" + path + "' is F64, read as F32"));
  CHECK(test::contains(test::error_of([&] { f.read<float>("nope"); }), "no tensor 'nope' in safetensors file '" + path + "'"));
}

TEST_CASE("safetensors: bad files are Errors naming the file and the tensor", "[checkpoint][safetensors]") {
  test::SharedTempDir dir(comm::Mpi(MPI_COMM_SELF));
  SafetensorsWriter w;
  w.add<float>("a", {4}, std::vector<float>{1, 2, 3, 4});
  w.add<float>("b", {2}, std::vector<float>{5, 6});
  const std::string path = dir / "x.safetensors";
  w.write(path);

  test::truncate_by(path, 3);
  CHECK(test::contains(test::error_of([&] { SafetensorsFile{path}; }),
                       "safetensors file '" + path + "' is truncated: tensor 'b' needs data bytes [16, 24)"));
  test::truncate_by(path, std::filesystem::file_size(path) - 5);
  CHECK(test::contains(test::error_of([&] { SafetensorsFile{path}; }), "'" + path + "' is truncated"));

  // Hand-made headers: a gap in the offsets, an unknown dtype, too many bytes.
  auto file_with = [&](const std::string& header, std::size_t data) {
    std::vector<char> b(8 + header.size() + data, 0);
    const std::uint64_t n = header.size();
    std::memcpy(b.data(), &n, 8);
    std::memcpy(b.data() + 8, header.data(), header.size());
    test::write_bytes(path, b);
    return test::error_of([&] { SafetensorsFile{path}; });
  };
  CHECK(test::contains(file_with(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                       "tensor 'a' starts at byte 4 of the data, expected 0"));
  CHECK(test::contains(file_with(R"({"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", 1),
                       "unsupported dtype \"F8\" for tensor 'a' in '" + path + "'"));
  CHECK(test::contains(file_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4),
                       "bad header entry for tensor 'a'"));
  CHECK(test::contains(file_with(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 6), "2 bytes after its last tensor"));
  CHECK(test::contains(file_with(R"({"a":)", 0), "malformed JSON in 'header of " + path + "'"));
  CHECK(test::contains(test::error_of([&] { SafetensorsFile{dir / "none"}; }), "cannot open safetensors file"));
}
