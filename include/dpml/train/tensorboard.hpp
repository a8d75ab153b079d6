#pragma once
// TensorBoard event files, written without TensorFlow or protobuf: `tensorboard --logdir DIR`
// plots the scalars of every run under DIR while it trains.
//
// An event file is a sequence of TFRecords:
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
// with mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, and each record's data a serialized
// `tensorflow.Event` message, encoded here by hand (protobuf wire format: a key varint
// field << 3 | wire type, then a varint, 8 or 4 little-endian bytes, or a length and bytes):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }    Value { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2"; every later one a step and its scalars.
// CRC-32C is Castagnoli's polynomial (reflected 0x82F63B78), not zlib's CRC-32: a table here.
//
// Each launch writes its own run directory, DIR/<YYYYmmdd-HHMMSS>-<host>-<pid> (local time), holding
// events.out.tfevents.<unix seconds>.<host>; TensorBoard shows each run as its own curve. A record
// is flushed as soon as it is written, so a live TensorBoard follows the run.

#include "dpml/core/error.hpp"

#include <unistd.h>

#include <array>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace dpml::train {

namespace detail {

// CRC-32C of `n` bytes, continuing from `crc` (0 to start), one table lookup per byte.
inline std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

// TFRecord's masked CRC (a CRC stored next to the data it covers is masked, so that CRCs of
// CRCs do not collide).
inline std::uint32_t masked_crc32c(const void* data, std::size_t n) {
  const std::uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// The protobuf wire format, as much as Event needs: appends to `bytes`.
struct Proto {
  std::string bytes;
  void varint(std::uint64_t v) {
    for (; v >= 0x80; v >>= 7) bytes.push_back(static_cast<char>((v & 0x7F) | 0x80));
    bytes.push_back(static_cast<char>(v));
  }
  void key(int field, int wire_type) { varint(static_cast<std::uint64_t>(field) << 3 | static_cast<std::uint64_t>(wire_type)); }
  template <class T>
  void little_endian(T v) {  // an unsigned integer, lowest byte first
    for (std::size_t i = 0; i < sizeof(T); ++i) bytes.push_back(static_cast<char>(v >> (8 * i) & 0xFF));
  }
  void int64_field(int field, std::int64_t v) { key(field, 0), varint(static_cast<std::uint64_t>(v)); }  // two's complement
  void double_field(int field, double v) { key(field, 1), little_endian(std::bit_cast<std::uint64_t>(v)); }
  void float_field(int field, float v) { key(field, 5), little_endian(std::bit_cast<std::uint32_t>(v)); }
  void bytes_field(int field, std::string_view v) {
    key(field, 2), varint(v.size());
    bytes.append(v);
  }
};

inline std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace detail

// A scalar of one record: TensorBoard's tag (the curve's name) and its value (stored as float).
struct Scalar {
  std::string_view tag;
  double value;
};

// One run's event file. Creates the run directory inside `dir` (and `dir` itself, parents too)
// and writes the file_version record.
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& dir) {
    namespace fs = std::filesystem;
    const std::string host = detail::host_name();
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
    const fs::path run = fs::path(dir) / (std::string(stamp) + "-" + host + "-" + std::to_string(::getpid()));
    std::error_code ec;
    fs::create_directories(run.parent_path(), ec);
    DPML_REQUIRE(!ec, "cannot create TensorBoard directory '" << dir << "': " << ec.message());
    DPML_REQUIRE(fs::create_directory(run, ec) && !ec, "cannot create TensorBoard run directory '" << run.string() << "'"
                                                           << (ec ? ": " + ec.message() : std::string(": it exists")));
    run_dir_ = run.string();
    file_ = (run / ("events.out.tfevents." + std::to_string(static_cast<long long>(now)) + "." + host)).string();
    out_.open(file_, std::ios::binary | std::ios::out | std::ios::trunc);
    DPML_REQUIRE(out_.good(), "cannot open TensorBoard event file '" << file_ << "' for writing");
    detail::Proto event;
    event.double_field(1, wall_time());
    event.bytes_field(3, "brain.Event:2");
    record(event.bytes);
  }

  const std::string& run_dir() const { return run_dir_; }
  const std::string& file() const { return file_; }
  // False once a write failed (a full disk): nothing more is written then.
  bool good() const { return out_.good(); }

  // One event at `step` holding every scalar, flushed.
  void write(std::int64_t step, const std::vector<Scalar>& scalars) {
    detail::Proto summary;
    for (const auto& s : scalars) {
      detail::Proto value;
      value.bytes_field(1, s.tag);
      value.float_field(2, static_cast<float>(s.value));
      summary.bytes_field(1, value.bytes);
    }
    detail::Proto event;
    event.double_field(1, wall_time());
    event.int64_field(2, step);
    event.bytes_field(5, summary.bytes);
    record(event.bytes);
  }

 private:
  static double wall_time() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  void record(const std::string& data) {
    if (!out_.good()) return;
    detail::Proto head;
    head.little_endian(static_cast<std::uint64_t>(data.size()));
    head.little_endian(detail::masked_crc32c(head.bytes.data(), 8));
    detail::Proto tail;
    tail.little_endian(detail::masked_crc32c(data.data(), data.size()));
    out_ << head.bytes << data << tail.bytes;
    out_.flush();
  }

  std::string run_dir_, file_;
  std::ofstream out_;
};

}  // namespace dpml::train
