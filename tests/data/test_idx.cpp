// IDX reading: small plain and gzipped files written here and read back; each bad input (missing,
// wrong magic, truncated, longer than declared, corrupt gzip, label/image count mismatch) is an
// Error whose message names the file; the real Fashion-MNIST test split when it is installed.
#include "test.hpp"

#include <dpml/data/idx.hpp>
#include <dpml/data/image.hpp>

#include <zlib.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

using namespace dpml;
namespace fs = std::filesystem;

namespace {

// A fresh directory per process, removed at the end of the test.
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("dpml-test-idx-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// The bytes of an IDX file: magic 0x0000_08_<rank>, big-endian sizes, then `data`.
std::vector<std::uint8_t> idx_bytes(const std::vector<std::uint32_t>& dims, const std::vector<std::uint8_t>& data,
                                    std::uint8_t type = 0x08) {
  std::vector<std::uint8_t> out{0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(d >> s));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_file(const std::string& path, const std::vector<std::uint8_t>& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
    REQUIRE(gzclose(f) == Z_OK);
  } else {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
}

// The message of the dpml::Error that f() throws ("" if none).
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("idx: plain and gzipped files read back", "[data][idx]") {
  TempDir dir;
  auto gen = test::rng(21);
  std::vector<std::uint8_t> pixels(5 * 3 * 4), labels(5);
  for (auto& p : pixels) p = static_cast<std::uint8_t>(gen() % 256);
  for (auto& l : labels) l = static_cast<std::uint8_t>(gen() % 10);
  for (bool gzip : {false, true}) {
    CAPTURE(gzip);
    const std::string images_path = dir / (gzip ? "img.gz" : "img"), labels_path = dir / (gzip ? "lab.gz" : "lab");
    write_file(images_path, idx_bytes({5, 3, 4}, pixels), gzip);
    write_file(labels_path, idx_bytes({5}, labels), gzip);
    const auto a = data::read_idx(images_path, 3);
    CHECK(a.path == images_path);
    CHECK(a.dims == std::vector<std::int64_t>{5, 3, 4});
    CHECK(a.bytes == pixels);
    CHECK(data::read_idx(labels_path).bytes == labels);  // any rank accepted by default

    const auto ds = data::ImageDataset::from_idx(images_path, labels_path);
    CHECK(ds.size() == 5);
    CHECK(ds.height() == 3);
    CHECK(ds.width() == 4);
    CHECK(ds.label(4) == labels[4]);
    CHECK(ds.image(2)[5] == pixels[2 * 12 + 5]);
  }
}

TEST_CASE("idx: every bad input is an Error naming the file", "[data][idx]") {
  TempDir dir;
  const std::vector<std::uint8_t> pixels(2 * 3 * 3, 7), labels{1, 2};
  const auto good = idx_bytes({2, 3, 3}, pixels);
  for (bool gzip : {false, true}) {
    CAPTURE(gzip);
    const std::string sfx = gzip ? ".gz" : "";

    const std::string missing = dir / ("missing" + sfx);
    CHECK(contains(test::error_of([&] { data::read_idx(missing); }), "'" + missing + "' does not exist"));

    const std::string magic = dir / ("magic" + sfx);
    auto bad_magic = good;
    bad_magic[2] = 0x0d;  // float elements: not supported
    write_file(magic, bad_magic, gzip);
    CHECK(contains(test::error_of([&] { data::read_idx(magic, 3); }), "'" + magic + "' has a wrong magic number 0x00000d03"));
    write_file(magic, idx_bytes({2}, labels), gzip);  // labels where images are expected
    CHECK(contains(test::error_of([&] { data::read_idx(magic, 3); }), "'" + magic + "' has a wrong magic number 0x00000801 (expected 0x00000803"));

    const std::string truncated = dir / ("truncated" + sfx);
    write_file(truncated, std::vector<std::uint8_t>(good.begin(), good.end() - 1), gzip);
    CHECK(contains(test::error_of([&] { data::read_idx(truncated, 3); }),
                   "'" + truncated + "' is truncated: its dimensions (2, 3, 3) need 18 bytes of data, the file has 17"));
    write_file(truncated, std::vector<std::uint8_t>(good.begin(), good.begin() + 9), gzip);  // inside the header
    CHECK(contains(test::error_of([&] { data::read_idx(truncated); }), "'" + truncated + "' is truncated: 9 bytes, shorter than its 16-byte header"));
    write_file(truncated, {0, 0}, gzip);
    CHECK(contains(test::error_of([&] { data::read_idx(truncated); }), "'" + truncated + "' is truncated: 2 bytes, no header"));

    const std::string zero = dir / ("zero" + sfx);  // 5 images of 0 × 0 pixels: no data to train on
    write_file(zero, idx_bytes({5, 0, 0}, {}), gzip);
    CHECK(contains(test::error_of([&] { data::read_idx(zero, 3); }), "'" + zero + "' has a zero dimension (5, 0, 0): it holds no data"));
    const std::string huge = dir / ("huge" + sfx);  // sizes whose product overflows int64
    write_file(huge, idx_bytes({0xffffffffu, 0xffffffffu, 0xffffffffu}, pixels), gzip);
    CHECK(contains(test::error_of([&] { data::read_idx(huge, 3); }),
                   "'" + huge + "' is truncated: its dimensions (4294967295, 4294967295, 4294967295) need more bytes than the 18"));

    const std::string longer = dir / ("longer" + sfx);
    auto extra = good;
    extra.push_back(0);
    write_file(longer, extra, gzip);
    CHECK(contains(test::error_of([&] { data::read_idx(longer); }), "'" + longer + "' is longer than declared"));
  }
  // A gzip stream cut short (the compressed bytes, not the content).
  const std::string whole = dir / "whole.gz", cut = dir / "cut.gz";
  std::vector<std::uint8_t> big(4000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::uint8_t>(i * 7919 % 251);
  write_file(whole, idx_bytes({4000}, big), true);
  const auto size = fs::file_size(whole);
  fs::copy_file(whole, cut);
  fs::resize_file(cut, size / 2);
  CHECK(data::read_idx(whole).bytes == big);
  CHECK(contains(test::error_of([&] { data::read_idx(cut); }), "'" + cut + "' is truncated or corrupt gzip data"));

  // Images and labels of different counts name both files.
  const std::string images = dir / "images", labels3 = dir / "labels3";
  write_file(images, good, false);
  write_file(labels3, idx_bytes({3}, {1, 2, 3}), false);
  const auto msg = test::error_of([&] { data::ImageDataset::from_idx(images, labels3); });
  CHECK(contains(msg, "'" + images + "' holds 2 images"));
  CHECK(contains(msg, "'" + labels3 + "' 3 labels"));
  // Read by every rank alike: the error is marked so that dpml::run reports it once.
  try {
    data::ImageDataset::from_idx(images, labels3);
  } catch (const Error& e) {
    CHECK(e.scope() == Scope::everywhere);
  }
  CHECK(contains(test::error_of([&] { data::fashion_mnist(data::Split::test, dir.path.string()); }),
                 "'" + (dir / "t10k-images-idx3-ubyte.gz") + "' does not exist"));
}

TEST_CASE("idx: the real Fashion-MNIST test split", "[data][idx][fashion-mnist]") {
  if (!fs::exists(fs::path(data::kFashionMnistDir) / "t10k-images-idx3-ubyte.gz")) {
    WARN("Fashion-MNIST not installed in " << data::kFashionMnistDir << " (Debian package dataset-fashion-mnist): check skipped");
    return;
  }
  const auto test = data::fashion_mnist(data::Split::test);
  CHECK(test.size() == 10000);
  CHECK(test.height() == 28);
  CHECK(test.width() == 28);
  std::array<int, 10> per_class{};
  bool labels_ok = true;
  for (std::int64_t i = 0; i < test.size(); ++i) {
    labels_ok = labels_ok && test.label(i) >= 0 && test.label(i) < 10;
    if (labels_ok) ++per_class[static_cast<std::size_t>(test.label(i))];
  }
  CHECK(labels_ok);
  for (int c : per_class) CHECK(c == 1000);  // the test split is balanced
  double sum = 0;
  for (std::int64_t i = 0; i < 1000; ++i)
    for (int p = 0; p < 28 * 28; ++p) sum += test.image(i)[p] / 255.0;
  CHECK(sum / (1000.0 * 784) == test::Approx(data::kFashionMnistMean).margin(0.02));  // the published mean, roughly
}
