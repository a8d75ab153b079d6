// Byte-level text: reading a directory the way the fortunes package needs (skip *.dat, *.u8 and
// sub-directories; '%' separator lines blanked), binary files and token shards refused, the
// train/validation split, the windowed dataset and the unigram entropy.
#include "test.hpp"

#include <dpml/data/text.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("dpml-text-test-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path / name, std::ios::binary) << text; }
};

}  // namespace

TEST_CASE("text: a fortunes-style directory is read without index files, separators blanked", "[data]") {
  TempDir dir;
  dir.write("b_quotes", "Second file.\n%\nLast entry.\n");
  dir.write("a_jokes", "First joke,\ntwo lines.\n%\nSecond joke.\n%\n");
  dir.write("a_jokes.dat", std::string("\x00\x01\x02\x03 binary index", 18));
  dir.write("a_jokes.u8", "utf-8 copy that must not appear\n");
  fs::create_directories(dir.path / "off");
  dir.write("off/nested", "nested file that must not appear\n");
  const std::string text = dpml::data::read_text(dir.path.string());
  CHECK(text == "First joke,\ntwo lines.\n\nSecond joke.\n\n\nSecond file.\n\nLast entry.\n");
  CHECK(dpml::data::read_text((dir.path / "b_quotes").string()) == "Second file.\n\nLast entry.\n");
  CHECK_THROWS_AS(dpml::data::read_text((dir.path / "missing").string()), dpml::Error);
}

TEST_CASE("text: a binary file or a token shard is refused, naming the file", "[data]") {
  TempDir dir;
  const std::string binary = (dir.path / "image").string();
  dir.write("image", std::string("GIF\0\1\2 pixels", 13));
  CHECK(dpml::test::message_of([&] { dpml::data::read_text(binary); }) ==
        "text file '" + binary + "' is binary, not text (a NUL byte at offset 3)");
  const std::string shard = (dir.path / "shards" / "train_000.bin").string();
  fs::create_directories(dir.path / "shards");
  dpml::data::write_token_shard(shard, std::vector<std::uint16_t>(10, 65));
  CHECK(dpml::test::message_of([&] { dpml::data::read_text(shard); }) == "text file '" + shard + "' is an llm.c token shard, not text");
  const std::string shards = (dir.path / "shards").string();
  CHECK(dpml::test::message_of([&] { dpml::data::read_text(shards); }) ==
        "text directory '" + shards + "' holds the llm.c token shard '" + shard + "'; give token shards as a file or a glob ('" +
            shards + "/*.bin')");
  dir.write("text", "plain text\n" + std::string(2000, 'x') + std::string("\0", 1));  // a NUL past the first KiB is kept
  CHECK(dpml::data::read_text((dir.path / "text").string()).size() == 2012);
}

TEST_CASE("text: bytes are tokens, the last 5% validate, windows as for token shards", "[data]") {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "line " + std::to_string(i) + " \xc3\xa9\n";  // é: bytes ≥ 128 too
  const auto split = dpml::data::split_text(text, 0.05);
  const std::size_t n_val = static_cast<std::size_t>(std::floor(0.05 * static_cast<double>(text.size())));
  REQUIRE(split.validation.size() == n_val);
  REQUIRE(split.train.size() + split.validation.size() == text.size());
  CHECK(split.train[0] == 'l');
  CHECK(split.validation.back() == '\n');
  CHECK(split.train[7] == 0xc3);  // "line 0 é": é starts at byte 7
  const dpml::data::TokenWindows train(split.train, {.seq_len = 32, .global_batch = 4, .seed = 1, .shuffle = false});
  const auto b = train.batch(0);
  const std::span<const std::int32_t> row(b.inputs.data(), 32);
  CHECK(dpml::data::bytes_to_text(row) == text.substr(0, 32));
  CHECK(b.targets(0, 31) == static_cast<unsigned char>(text[32]));
}

TEST_CASE("text: unigram entropy in nats and bits", "[data]") {
  const auto uniform = dpml::data::byte_tokens("abcdabcdabcdabcd");
  CHECK(dpml::data::unigram_entropy(uniform) == dpml::test::Approx(std::log(4.0)));
  CHECK(dpml::data::unigram_entropy_bits(uniform) == dpml::test::Approx(2.0));
  const auto skewed = dpml::data::byte_tokens("aaab");
  CHECK(dpml::data::unigram_entropy(skewed) == dpml::test::Approx(-(0.75 * std::log(0.75) + 0.25 * std::log(0.25))));
  CHECK(dpml::data::unigram_entropy(dpml::data::byte_tokens("zzzz")) == dpml::test::Approx(0.0).margin(1e-15));
}
