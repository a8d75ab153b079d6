// TensorBoard event files (train/tensorboard.hpp) read back by a reader of this test's own: the
// TFRecord framing with both CRCs checked against a CRC-32C computed bit by bit (not the
// library's table), the Event protobuf decoded field by field, then tags, steps and values
// compared with what was written. MetricsLog writes one record to both sinks: the JSON line as
// before and an event without the non-finite values. tests/train/check_tensorboard.py reads a
// run of train_gpt with TensorBoard's own reader. --tensorboard DIR is checked before a run
// (train::require_writable_directory, train/args.hpp).
#include "test.hpp"

#include <dpml/train/args.hpp>
#include <dpml/train/progress.hpp>
#include <dpml/train/tensorboard.hpp>

#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

using namespace dpml;
namespace fs = std::filesystem;

namespace {

// CRC-32C one bit at a time: reflected Castagnoli polynomial 0x82F63B78, initial value and final
// xor all ones.
std::uint32_t crc32c_bitwise(const std::string& bytes) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}
std::uint32_t masked(std::uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

std::uint64_t read_le(const std::string& s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(s.at(at + static_cast<std::size_t>(i)));
  return v;
}

// The records of a TFRecord file, each CRC checked.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  std::size_t at = 0;
  while (at < file.size()) {
    REQUIRE(at + 12 <= file.size());
    const std::uint64_t n = read_le(file, at, 8);
    CHECK(read_le(file, at + 8, 4) == masked(crc32c_bitwise(file.substr(at, 8))));
    REQUIRE(at + 12 + n + 4 <= file.size());
    std::string data = file.substr(at + 12, n);
    CHECK(read_le(file, at + 12 + n, 4) == masked(crc32c_bitwise(data)));
    records.push_back(std::move(data));
    at += 12 + n + 4;
  }
  return records;
}

// One protobuf field: its number and wire type, the integer (varint, fixed32, fixed64) or bytes.
struct Field {
  int number, wire;
  std::uint64_t integer = 0;
  std::string bytes;
};

std::vector<Field> decode(const std::string& s) {
  std::vector<Field> fields;
  std::size_t at = 0;
  const auto varint = [&] {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      REQUIRE(at < s.size());
      REQUIRE(shift < 64);
      const auto b = static_cast<unsigned char>(s[at++]);
      v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (at < s.size()) {
    const std::uint64_t key = varint();
    Field f{static_cast<int>(key >> 3), static_cast<int>(key & 7)};
    if (f.wire == 0) {
      f.integer = varint();
    } else if (f.wire == 1 || f.wire == 5) {
      const int n = f.wire == 1 ? 8 : 4;
      REQUIRE(at + static_cast<std::size_t>(n) <= s.size());
      f.integer = read_le(s, at, n);
      at += static_cast<std::size_t>(n);
    } else {
      REQUIRE(f.wire == 2);
      const std::uint64_t n = varint();
      REQUIRE(at + n <= s.size());
      f.bytes = s.substr(at, n);
      at += n;
    }
    fields.push_back(std::move(f));
  }
  return fields;
}

// A decoded Event: what this writer may put in one.
struct Event {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> scalars;
};

Event decode_event(const std::string& data) {
  Event e;
  for (const auto& f : decode(data)) {
    CAPTURE(f.number, f.wire);
    if (f.number == 1 && f.wire == 1) e.wall_time = std::bit_cast<double>(f.integer);
    else if (f.number == 2 && f.wire == 0) e.step = static_cast<std::int64_t>(f.integer);
    else if (f.number == 3 && f.wire == 2) e.file_version = f.bytes;
    else if (f.number == 5 && f.wire == 2)
      for (const auto& value : decode(f.bytes)) {
        REQUIRE((value.number == 1 && value.wire == 2));
        std::string tag;
        float simple = NAN;
        int seen = 0;
        for (const auto& v : decode(value.bytes)) {
          if (v.number == 1 && v.wire == 2) tag = v.bytes, seen |= 1;
          else if (v.number == 2 && v.wire == 5) simple = std::bit_cast<float>(static_cast<std::uint32_t>(v.integer)), seen |= 2;
          else FAIL("unexpected field " << v.number << " in Summary.Value");
        }
        CHECK(seen == 3);
        e.scalars.emplace_back(tag, simple);
      }
    else FAIL("unexpected field " << f.number << " (wire type " << f.wire << ") in Event");
  }
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A fresh directory for one test case, removed at the end.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / ("dpml-test-tensorboard-" + name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string host() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// The single event file of the single run directory inside `dir`, whose names are checked.
std::string only_event_file(const fs::path& dir) {
  std::vector<fs::path> runs(fs::directory_iterator(dir), fs::directory_iterator{});
  REQUIRE(runs.size() == 1);
  const std::string run = runs[0].filename().string();
  CAPTURE(run);
  CHECK(std::regex_match(run, std::regex("[0-9]{8}-[0-9]{6}-" + host() + "-" + std::to_string(::getpid()))));
  std::vector<fs::path> files(fs::directory_iterator(runs[0]), fs::directory_iterator{});
  REQUIRE(files.size() == 1);
  const std::string name = files[0].filename().string();
  CAPTURE(name);
  CHECK(std::regex_match(name, std::regex("events\\.out\\.tfevents\\.[0-9]{10}\\." + host())));
  return files[0].string();
}

}  // namespace

TEST_CASE("crc32c: the check value and the bitwise computation on random bytes", "[train][tensorboard]") {
  CHECK(crc32c_bitwise("123456789") == 0xE3069283u);  // the test's own CRC against the published check value
  CHECK(train::detail::crc32c("123456789", 9) == 0xE3069283u);
  CHECK(train::detail::crc32c("", 0) == 0u);
  auto gen = test::rng(11);
  for (std::size_t n : {1u, 7u, 64u, 1000u}) {
    std::string bytes(n, '\0');
    for (auto& c : bytes) c = static_cast<char>(gen() & 0xFF);
    CAPTURE(n);
    CHECK(train::detail::crc32c(bytes.data(), bytes.size()) == crc32c_bitwise(bytes));
    // Continuing a CRC over a split equals the CRC of the whole.
    CHECK(train::detail::crc32c(bytes.data() + n / 2, n - n / 2, train::detail::crc32c(bytes.data(), n / 2)) ==
          crc32c_bitwise(bytes));
  }
}

TEST_CASE("TensorBoardWriter: records, framing and Event fields read back", "[train][tensorboard]") {
  TempDir tmp("writer");
  const fs::path dir = tmp.path / "nested" / "runs";  // parents created
  const double before = now_seconds();
  std::string file;
  struct Written {
    std::int64_t step;
    std::vector<std::pair<std::string, double>> scalars;
  };
  // Steps of one, two and six varint bytes; values exact in float, rounded to float, tiny and huge.
  const std::vector<Written> written = {
      {1, {{"loss", 5.5}, {"lr", 3e-4}}},
      {300, {{"loss", 2.25}, {"grad_norm", 0.1}, {"a/b tag", -1e-30}}},
      {std::int64_t(1) << 40, {{"tokens_per_s", 123456789.0}}},
  };
  {
    train::TensorBoardWriter w(dir.string());
    for (const auto& r : written) {
      std::vector<train::Scalar> s;
      for (const auto& [tag, value] : r.scalars) s.push_back({tag, value});
      w.write(r.step, s);
    }
    file = w.file();
    CHECK(fs::path(w.run_dir()).parent_path() == dir);
    // Flushed: the records are in the file while the writer is open.
    CHECK(read_records(file).size() == written.size() + 1);
  }
  const double after = now_seconds();
  CHECK(only_event_file(dir) == file);
  const auto records = read_records(file);
  REQUIRE(records.size() == written.size() + 1);
  const Event first = decode_event(records[0]);
  CHECK(first.file_version == "brain.Event:2");
  CHECK(first.scalars.empty());
  double last_time = first.wall_time;
  CHECK(first.wall_time >= before - 1);
  for (std::size_t i = 0; i < written.size(); ++i) {
    CAPTURE(i);
    const Event e = decode_event(records[i + 1]);
    CHECK(e.file_version.empty());
    CHECK(e.step == written[i].step);
    CHECK(e.wall_time >= last_time);
    CHECK(e.wall_time <= after + 1);
    last_time = e.wall_time;
    REQUIRE(e.scalars.size() == written[i].scalars.size());
    for (std::size_t k = 0; k < e.scalars.size(); ++k) {
      CHECK(e.scalars[k].first == written[i].scalars[k].first);
      CHECK(e.scalars[k].second == static_cast<float>(written[i].scalars[k].second));
    }
  }
}

TEST_CASE("MetricsLog: one record to the JSON line and to TensorBoard", "[train][tensorboard]") {
  TempDir tmp("metrics");
  fs::create_directories(tmp.path);
  const std::string jsonl = (tmp.path / "m.jsonl").string();
  const fs::path tb = tmp.path / "tb";
  {
    train::MetricsLog log(jsonl, tb.string(), /*rank=*/0);
    log.write(7, {{"loss", 1.5}, {"val_loss", NAN}, {"lr", 0.000123456789}});
    log.write(8, {{"val_loss", INFINITY}});  // nothing finite: no event
    log.write(8, {{"epoch", 2}, {"test_accuracy", 0.875}}, train::JsonStep::omitted);
  }
  std::ifstream in(jsonl);
  std::stringstream text;
  text << in.rdbuf();
  // The lines the JSON sink has always written (step first, six significant digits, null).
  CHECK(text.str() == "{\"step\": 7, \"loss\": 1.5, \"val_loss\": null, \"lr\": 0.000123457}\n"
                      "{\"step\": 8, \"val_loss\": null}\n"
                      "{\"epoch\": 2, \"test_accuracy\": 0.875}\n");
  const auto records = read_records(only_event_file(tb));
  REQUIRE(records.size() == 3);
  const Event a = decode_event(records[1]), b = decode_event(records[2]);
  CHECK(a.step == 7);
  REQUIRE(a.scalars.size() == 2);
  CHECK(a.scalars[0] == std::pair<std::string, float>("loss", 1.5f));
  CHECK(a.scalars[1] == std::pair<std::string, float>("lr", static_cast<float>(0.000123456789)));
  CHECK(b.step == 8);
  REQUIRE(b.scalars.size() == 2);
  CHECK(b.scalars[0] == std::pair<std::string, float>("epoch", 2.0f));
  CHECK(b.scalars[1] == std::pair<std::string, float>("test_accuracy", 0.875f));
}

TEST_CASE("MetricsLog: only rank 0 writes; empty paths write nothing", "[train][tensorboard]") {
  TempDir tmp("ranks");
  const fs::path tb = tmp.path / "tb";
  {
    train::MetricsLog other((tmp.path / "m.jsonl").string(), tb.string(), /*rank=*/1);
    other.write(1, {{"loss", 1.0}});
    train::MetricsLog none("", "", /*rank=*/0);
    none.write(1, {{"loss", 1.0}});
  }
  CHECK(!fs::exists(tmp.path));
}

TEST_CASE("require_writable_directory: a path that cannot become a directory is refused naming the flag",
          "[train][tensorboard]") {
  TempDir tmp("refuse");
  fs::create_directories(tmp.path);
  const std::string file = (tmp.path / "a-file").string();
  std::ofstream(file) << "x";
  CHECK(test::message_of([&] { train::require_writable_directory("--tensorboard", file); }) ==
        "flag --tensorboard '" + file + "': '" + file + "' is not a directory");
  CHECK(test::message_of([&] { train::require_writable_directory("--tensorboard", file + "/runs/x"); }) ==
        "flag --tensorboard '" + file + "/runs/x': '" + file + "' is not a directory");
  CHECK(test::message_of([&] { train::require_writable_directory("--tensorboard", (tmp.path / "new" / "runs").string()); }).empty());
  CHECK(test::message_of([&] { train::require_writable_directory("--tensorboard", tmp.path.string()); }).empty());
  CHECK(test::message_of([&] { train::require_writable_directory("--tensorboard", ""); }).empty());
  CHECK(!fs::exists(tmp.path / "new"));  // checked, not created
}
