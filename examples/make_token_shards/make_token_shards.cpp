// make_token_shards: turns a text file, or a directory of them (the Debian `fortunes` package),
// into llm.c token shards of byte-level tokens (vocabulary 256), for train_gpt and the benchmarks.
//
//   make_token_shards --input /usr/share/games/fortunes --output data/fortunes --shard-tokens 1000000
//
// writes data/fortunes_val_000000.bin (the last --validation-fraction of the text) and
// data/fortunes_train_000000.bin, …_000001.bin, … of at most --shard-tokens tokens each, and
// prints one line per shard and the unigram entropy of the text (the loss to beat).
#include <dpml/comm/launch.hpp>
#include <dpml/data/text.hpp>
#include <dpml/data/token_shards.hpp>
#include <dpml/train/args.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>

namespace {

std::string shard_name(const std::string& prefix, const char* split, std::int64_t index) {
  char num[16];
  std::snprintf(num, sizeof(num), "%06lld", static_cast<long long>(index));
  return prefix + "_" + split + "_" + num + ".bin";
}

void write(const std::string& path, std::span<const std::uint16_t> tokens) {
  dpml::data::write_token_shard(path, tokens);
  std::printf("wrote %s: %zu tokens\n", path.c_str(), tokens.size());
}

int run(int argc, char** argv) {
  std::string input = "/usr/share/games/fortunes", output = "fortunes";
  std::int64_t shard_tokens = 1'000'000;
  double validation_fraction = 0.05;
  dpml::train::Args args("make_token_shards",
                         "Byte-level tokens of a text file or directory (*.dat, *.u8 skipped) into llm.c token shards:\n"
                         "<output>_val_000000.bin (the last part of the text) and <output>_train_NNNNNN.bin.");
  args.flag("--input", input, "text file or directory of text files")
      .flag("--output", output, "prefix of the shard files (directories are created)")
      .flag("--shard-tokens", shard_tokens, "most tokens per training shard", dpml::train::at_least(1))
      .flag("--validation-fraction", validation_fraction, "fraction of the text, from its end, for validation",
            dpml::train::half_open(0.0, 1.0));
  if (!args.parse(argc, argv)) return 0;
  DPML_REQUIRE(shard_tokens >= 1, "--shard-tokens " << shard_tokens << " must be at least 1");

  const std::string text = dpml::data::read_text(input);
  const auto split = dpml::data::split_text(text, validation_fraction);
  if (const auto dir = std::filesystem::path(output).parent_path(); !dir.empty()) std::filesystem::create_directories(dir);
  write(shard_name(output, "val", 0), split.validation);
  const std::span<const std::uint16_t> train(split.train);
  for (std::int64_t i = 0, begin = 0; begin < static_cast<std::int64_t>(train.size()); ++i, begin += shard_tokens) {
    const auto n = std::min<std::int64_t>(shard_tokens, static_cast<std::int64_t>(train.size()) - begin);
    write(shard_name(output, "train", i), train.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(n)));
  }
  const auto all = dpml::data::byte_tokens(text);
  std::printf("%zu bytes of text from %s; unigram entropy %.4f nats (%.4f bits) per byte\n", text.size(), input.c_str(),
              dpml::data::unigram_entropy(all), dpml::data::unigram_entropy_bits(all));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dpml::run_local("make_token_shards", [&] { return run(argc, argv); });
}
