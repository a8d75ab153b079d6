// llm.c token shards (round trip, refused bad files naming the file, token ids checked against
// the vocabulary at load time — read or memory-mapped alike), TokenStore (mapped shards equal to
// the read ones, slices, copies across shards, resident memory of a mapped dataset) and
// TokenWindows (windows, data-parallel split whose union is the sequential batch, determinism for
// a seed).
#include "test.hpp"

#include <dpml/data/token_shards.hpp>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using dpml::data::TokenWindows;
using dpml::data::WindowOptions;

namespace {

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("dpml-token-test-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::vector<std::uint16_t> random_tokens(std::size_t n, std::uint64_t salt) {
  auto gen = dpml::test::rng(salt);
  std::vector<std::uint16_t> t(n);
  for (auto& x : t) x = static_cast<std::uint16_t>(gen() % 50257);
  return t;
}

// Overwrites the int32 at `index` of the header.
void poke_header(const std::string& path, int index, std::int32_t value) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(index * 4);
  f.write(reinterpret_cast<const char*>(&value), 4);
}


}  // namespace

TEST_CASE("token shards: write then read gives the same tokens, llm.c header", "[data]") {
  TempDir dir;
  const auto tokens = random_tokens(1001, 1);
  const std::string path = dir / "train_000.bin";
  dpml::data::write_token_shard(path, tokens);
  CHECK(fs::file_size(path) == 1024 + 2 * tokens.size());
  std::ifstream in(path, std::ios::binary);
  std::int32_t h[3];
  in.read(reinterpret_cast<char*>(h), sizeof(h));
  CHECK(h[0] == 20240520);
  CHECK(h[1] == 1);
  CHECK(h[2] == 1001);
  CHECK(dpml::data::read_token_shard(path) == tokens);
  dpml::data::write_token_shard(dir / "empty.bin", {});
  CHECK(dpml::data::read_token_shard(dir / "empty.bin").empty());
}

TEST_CASE("token shards: wrong magic, version or size is refused, naming the file", "[data]") {
  TempDir dir;
  const auto tokens = random_tokens(100, 2);
  auto fresh = [&](const std::string& name) {
    const std::string p = dir / name;
    dpml::data::write_token_shard(p, tokens);
    return p;
  };
  // The read and the memory-mapped path refuse a malformed file with the same message.
  auto error = [](const std::string& p) {
    const auto read = dpml::test::error_of([&] { dpml::data::read_token_shard(p); });
    if (fs::exists(p))
      CHECK(dpml::test::message_of([&] { dpml::data::TokenStore::map_shards({p}); }) ==
            dpml::test::message_of([&] { dpml::data::read_token_shard(p); }));
    return read;
  };
  auto has = [](const std::string& text, const std::string& part) {
    INFO(text);
    CHECK(text.find(part) != std::string::npos);
  };
  const std::string magic = fresh("magic.bin");
  poke_header(magic, 0, 20240521);
  has(error(magic), "token shard '" + magic + "' has magic 20240521, expected 20240520");
  const std::string version = fresh("version.bin");
  poke_header(version, 1, 2);
  has(error(version), "token shard '" + version + "' has version 2, expected 1");
  const std::string count = fresh("count.bin");
  poke_header(count, 2, 101);
  has(error(count), "token shard '" + count + "': the header says 101 tokens (202 bytes) but the file holds 200 bytes");
  const std::string truncated = fresh("truncated.bin");
  fs::resize_file(truncated, 1024 + 199);
  has(error(truncated), "holds 199 bytes after the header");
  const std::string tiny = dir / "tiny.bin";
  std::ofstream(tiny) << "hello";
  has(error(tiny), "token shard '" + tiny + "' is 5 bytes, shorter than the 1024-byte header");
  has(error(dir / "missing.bin"), "missing.bin' cannot be opened");
  has(dpml::test::error_of([&] { dpml::data::expand_pattern(dir / "nothing_*.bin"); }),
      "no file matches '" + (dir / "nothing_*.bin") + "'");
  has(dpml::test::error_of([&] { dpml::data::expand_pattern(dir / "absent.bin"); }),  // a plain path: not "matches"
      "token shard '" + (dir / "absent.bin") + "' does not exist");
  const std::string text = dir / "text.bin";  // another format: long enough for a header, no magic
  std::ofstream(text) << std::string(2000, 'a');
  has(error(text), "token shard '" + text + "' has magic 1633771873, expected 20240520 (not an llm.c token shard)");
  fs::create_directories(dir / "sub.bin");
  has(error(dir / "sub.bin"), "token shard '" + (dir / "sub.bin") + "' is a directory, not a file");
  has(dpml::test::error_of([&] { dpml::data::read_token_shards({dir / "sub*"}); }), "sub.bin' is a directory, not a file");
  CHECK(dpml::data::is_token_shard_file(magic) == false);
  CHECK(dpml::data::is_token_shard_file(truncated));  // the magic is enough to tell a shard
  CHECK(dpml::data::is_token_shard_file(tiny) == false);
  CHECK(dpml::data::is_token_shard_file(dir / "sub.bin") == false);
}

TEST_CASE("token shards: an id >= the vocabulary is refused at load time, naming file, id and position", "[data]") {
  TempDir dir;
  std::vector<std::uint16_t> good(300, 7), bad(200, 7);
  bad[37] = 50257;
  bad[150] = 60000;
  dpml::data::write_token_shard(dir / "train_000.bin", good);
  dpml::data::write_token_shard(dir / "train_001.bin", bad);
  const std::string bad_path = dir / "train_001.bin";
  const std::string expected = "token shard '" + bad_path + "': token 50257 at position 37 is >= the vocabulary size 50257";
  // The first bad id, its position counted in its own file (not in the concatenation).
  CHECK(dpml::test::message_of([&] { dpml::data::read_token_shard(bad_path, 50257); }) == expected);
  CHECK(dpml::test::message_of([&] { dpml::data::read_token_shards({dir / "train_*.bin"}, 50257); }) == expected);
  CHECK(dpml::test::message_of([&] { dpml::data::TokenStore::map_shards({dir / "train_*.bin"}, 50257); }) == expected);
  CHECK(dpml::data::read_token_shards({dir / "train_*.bin"}, 60001).size() == 500);
  CHECK(dpml::data::read_token_shard(bad_path).size() == 200);  // without a vocabulary: every uint16
  CHECK(dpml::test::message_of([&] { dpml::data::require_tokens_below(good, 7, "x"); }) ==
        "x: token 7 at position 0 is >= the vocabulary size 7");
}

TEST_CASE("token windows: inputs and targets are the window shifted by one", "[data]") {
  std::vector<std::uint16_t> tokens(41);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(i);
  TokenWindows w(tokens, WindowOptions{.seq_len = 8, .global_batch = 2, .seed = 3, .shuffle = false});
  CHECK(w.windows() == 5);  // ⌊(41 − 1) / 8⌋
  CHECK(w.batches_per_epoch() == 2);
  const auto b = w.batch(1);  // windows 2 and 3
  REQUIRE(b.inputs.size(0) == 2);
  REQUIRE(b.inputs.size(1) == 8);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 8; ++j) {
      CHECK(b.inputs(i, j) == (2 + i) * 8 + j);
      CHECK(b.targets(i, j) == (2 + i) * 8 + j + 1);
    }
  CHECK_THROWS_AS(TokenWindows(tokens, WindowOptions{.seq_len = 8, .global_batch = 6}), dpml::Error);
}

TEST_CASE("token shards: dp ranks' batches are disjoint and their union is the sequential batch", "[data]") {
  TempDir dir;
  const auto a = random_tokens(700, 3), b = random_tokens(555, 4);
  dpml::data::write_token_shard(dir / "train_000.bin", a);
  dpml::data::write_token_shard(dir / "train_001.bin", b);
  const WindowOptions opt{.seq_len = 16, .global_batch = 7, .seed = 11, .shuffle = true};
  const dpml::data::TokenShardDataset seq({dir / "train_*.bin"}, opt);
  CHECK(seq.tokens() == 1255);
  CHECK(seq.windows() == (1255 - 1) / 16);
  for (int ranks : {2, 3, 4}) {
    std::vector<dpml::data::TokenShardDataset> dp;
    for (int r = 0; r < ranks; ++r) dp.emplace_back(std::vector<std::string>{dir / "train_*.bin"}, opt, r, ranks);
    for (std::int64_t step = 0; step < seq.batches_per_epoch(); ++step) {
      CAPTURE(ranks, step);
      const auto whole = seq.batch(step);
      std::vector<std::int32_t> joined_in, joined_tg;
      std::set<std::int64_t> seen;
      for (int r = 0; r < ranks; ++r) {
        const auto part = dp[static_cast<std::size_t>(r)].batch(step);
        joined_in.insert(joined_in.end(), part.inputs.begin(), part.inputs.end());
        joined_tg.insert(joined_tg.end(), part.targets.begin(), part.targets.end());
        for (auto i : dp[static_cast<std::size_t>(r)].sampler().local_batch(step)) CHECK(seen.insert(i).second);
      }
      CHECK(joined_in == std::vector<std::int32_t>(whole.inputs.begin(), whole.inputs.end()));
      CHECK(joined_tg == std::vector<std::int32_t>(whole.targets.begin(), whole.targets.end()));
      CHECK(seen.size() == 7);
    }
  }
  // Deterministic for a seed, different for another seed, reshuffled per epoch.
  const dpml::data::TokenShardDataset again({dir / "train_000.bin", dir / "train_001.bin"}, opt);
  auto first_inputs = [](const TokenWindows& w) {
    const auto t = w.batch(0).inputs;
    return std::vector<std::int32_t>(t.begin(), t.end());
  };
  CHECK(first_inputs(again) == first_inputs(seq));
  WindowOptions other = opt;
  other.seed = 12;
  CHECK(first_inputs(dpml::data::TokenShardDataset({dir / "train_*.bin"}, other)) != first_inputs(seq));
  dpml::data::TokenShardDataset epoch1({dir / "train_*.bin"}, opt);
  epoch1.set_epoch(1);
  CHECK(first_inputs(epoch1) != first_inputs(seq));
}

namespace {
std::vector<std::uint16_t> all_of(const dpml::data::TokenStore& s) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(s.size()));
  s.copy(0, s.size(), out.data());
  return out;
}
// This process's own resident memory (RssAnon: what it allocated, not the page cache a mapping
// shows), bytes.
double private_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("RssAnon:", 0) == 0) return std::stod(line.substr(8)) * 1024.0;
  return 0;
}
}  // namespace

TEST_CASE("token store: mapped shards equal the read ones; slices and copies across shards", "[data]") {
  TempDir dir;
  const auto a = random_tokens(700, 5), b = random_tokens(0, 6), c = random_tokens(555, 7);
  dpml::data::write_token_shard(dir / "train_000.bin", a);
  dpml::data::write_token_shard(dir / "train_001.bin", b);  // empty: contributes nothing
  dpml::data::write_token_shard(dir / "train_002.bin", c);
  const auto read = dpml::data::read_token_shards({dir / "train_*.bin"});
  const auto mapped = dpml::data::TokenStore::map_shards({dir / "train_*.bin"});
  REQUIRE(mapped.size() == 1255);
  CHECK(all_of(mapped) == read);
  std::vector<std::uint16_t> across(20);  // 10 tokens of each non-empty shard
  mapped.copy(690, 20, across.data());
  CHECK(across == std::vector<std::uint16_t>(read.begin() + 690, read.begin() + 710));
  const auto tail = mapped.slice(600, 1255), inner = tail.slice(50, 150);  // a slice of a slice
  CHECK(all_of(tail) == std::vector<std::uint16_t>(read.begin() + 600, read.end()));
  CHECK(all_of(inner) == std::vector<std::uint16_t>(read.begin() + 650, read.begin() + 750));
  CHECK(mapped.slice(3, 3).size() == 0);
  std::int64_t pieces = 0;
  mapped.for_each_piece([&](std::span<const std::uint16_t>) { ++pieces; });
  CHECK(pieces == 2);
  CHECK_THROWS_AS(mapped.copy(1250, 6, across.data()), dpml::Error);
  CHECK_THROWS_AS(mapped.slice(10, 1256), dpml::Error);
  // Windows over the mapped shards are the windows over the tokens read into memory.
  const WindowOptions opt{.seq_len = 16, .global_batch = 7, .seed = 11, .shuffle = true};
  const TokenWindows from_map(mapped, opt, 1, 2), from_vector(read, opt, 1, 2);
  for (std::int64_t step = 0; step < from_map.batches_per_epoch(); ++step) {
    const auto x = from_map.batch(step), y = from_vector.batch(step);
    CHECK(std::vector<std::int32_t>(x.inputs.begin(), x.inputs.end()) == std::vector<std::int32_t>(y.inputs.begin(), y.inputs.end()));
    CHECK(std::vector<std::int32_t>(x.targets.begin(), x.targets.end()) ==
          std::vector<std::int32_t>(y.targets.begin(), y.targets.end()));
  }
}

TEST_CASE("token store: a mapped 64 MiB shard is checked and trained on without a private copy", "[data]") {
  TempDir dir;
  const std::string path = dir / "big.bin";
  constexpr std::int64_t kTokens = 32 << 20;  // 64 MiB of tokens, written in 1 Mi-token pieces
  {
    std::int32_t header[256] = {20240520, 1, static_cast<std::int32_t>(kTokens)};
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    std::vector<std::uint16_t> piece(1 << 20);
    for (std::int64_t at = 0; at < kTokens; at += static_cast<std::int64_t>(piece.size())) {
      for (std::size_t i = 0; i < piece.size(); ++i) piece[i] = static_cast<std::uint16_t>((at + static_cast<std::int64_t>(i)) % 50257);
      out.write(reinterpret_cast<const char*>(piece.data()), static_cast<std::streamsize>(piece.size() * 2));
    }
  }
  const double before = private_bytes();
  const TokenWindows w(dpml::data::TokenStore::map_shards({path}, 50257),
                       WindowOptions{.seq_len = 1024, .global_batch = 8, .seed = 1, .shuffle = true});
  for (std::int64_t step = 0; step < 4; ++step) {
    const auto batch = w.batch(step);
    const auto first = w.sampler().local_batch(step)[0];
    CHECK(batch.inputs(0, 0) == (first * 1024) % 50257);
    CHECK(batch.targets(0, 1023) == (first * 1024 + 1024) % 50257);
  }
  const double grown = private_bytes() - before;
  INFO("private memory grew by " << grown / (1 << 20) << " MiB");
  CHECK(grown < 8.0 * (1 << 20));  // read_token_shards would hold all 64 MiB
}
