#pragma once
// Byte-level text for language models: tokens are the bytes of the text (vocabulary 256), so any
// file works without a tokenizer.
//
// read_text(path) takes a file, or a directory whose regular files are read in name order —
// skipping `*.dat` and `*.u8` (the index and UTF-8 copies of the Debian `fortunes` package) and
// any sub-directory. Lines holding only `%` (the fortune separators) become blank lines, so the
// entries stay apart by a blank line; files are joined by a newline. A file that is not text is
// refused naming it: an llm.c token shard (by its magic; in a directory, the directory is named
// too), or any file with a NUL byte in its first KiB.
//
// split_text keeps the first (1 − f) of the bytes for training and the last f for validation;
// lm_windows makes each side a TokenWindows (data/token_shards.hpp) — the same windowing and
// data-parallel split as the token shards, the validation windows in order — and measures the
// unigram entropy of the training tokens: the loss of a model that ignores context, the bar a
// language model must go well below. examples/train_gpt and examples/train_lstm read their text
// so (default: kFortunesPath, the Debian `fortunes` package).

#include "dpml/core/error.hpp"
#include "dpml/data/token_shards.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace dpml::data {

inline constexpr int kByteVocab = 256;
inline constexpr const char* kFortunesPath = "/usr/share/games/fortunes";

namespace detail {
inline std::string read_file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  DPML_REQUIRE_EVERYWHERE(in.good(), "text file '" << p.string() << "' cannot be opened");
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  DPML_REQUIRE_EVERYWHERE(!is_token_shard_file(p.string()), "text file '" << p.string() << "' is an llm.c token shard, not text");
  const auto nul = std::string_view(bytes).substr(0, 1024).find('\0');
  DPML_REQUIRE_EVERYWHERE(nul == std::string_view::npos, "text file '" << p.string() << "' is binary, not text (a NUL byte at offset "
                                                                       << nul << ")");
  return bytes;
}
// Lines holding only '%' become empty lines.
inline std::string blank_percent_lines(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    const bool has_newline = end != std::string::npos;
    if (!has_newline) end = text.size();
    const std::string_view line(text.data() + pos, end - pos);
    if (line != "%" && line != "%\r") out.append(line);
    if (has_newline) out.push_back('\n');
    pos = end + 1;
  }
  return out;
}
inline bool skipped_in_directory(const std::filesystem::directory_entry& e) {
  const auto ext = e.path().extension();
  return !e.is_regular_file() || ext == ".dat" || ext == ".u8";
}
}  // namespace detail

// The text of a file, or of a directory's files (see the top of this file).
inline std::string read_text(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  DPML_REQUIRE_EVERYWHERE(!ec && fs::exists(status), "text path '" << path << "' does not exist");
  if (!fs::is_directory(status)) return detail::blank_percent_lines(detail::read_file_bytes(path));
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path))
    if (!detail::skipped_in_directory(e)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  DPML_REQUIRE_EVERYWHERE(!files.empty(), "text directory '" << path << "' holds no text file (*.dat, *.u8 are skipped)");
  std::string all;
  for (const auto& f : files) {
    DPML_REQUIRE_EVERYWHERE(!is_token_shard_file(f.string()), "text directory '" << path << "' holds the llm.c token shard '"
                                                              << f.string() << "'; give token shards as a file or a glob ('"
                                                              << (fs::path(path) / "*.bin").string() << "')");
    if (!all.empty() && all.back() != '\n') all.push_back('\n');
    if (!all.empty()) all.push_back('\n');  // a blank line between files, like between entries
    all += detail::blank_percent_lines(detail::read_file_bytes(f));
  }
  return all;
}

inline std::vector<std::uint16_t> byte_tokens(std::string_view text) {
  std::vector<std::uint16_t> t(text.size());
  std::transform(text.begin(), text.end(), t.begin(), [](char c) { return static_cast<std::uint16_t>(static_cast<unsigned char>(c)); });
  return t;
}

inline std::string bytes_to_text(std::span<const std::int32_t> tokens) {
  std::string s(tokens.size(), '\0');
  for (std::size_t i = 0; i < tokens.size(); ++i) s[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
  return s;
}

struct TextSplit {
  std::vector<std::uint16_t> train, validation;  // byte tokens
};

// The first ⌈(1 − f)·n⌉ bytes train, the last ⌊f·n⌋ validate.
inline TextSplit split_text(std::string_view text, double validation_fraction = 0.05) {
  DPML_REQUIRE_EVERYWHERE(validation_fraction >= 0 && validation_fraction < 1,
                          "validation fraction " << validation_fraction << " must be in [0, 1)");
  const auto all = byte_tokens(text);
  const auto n_val = static_cast<std::size_t>(std::floor(validation_fraction * static_cast<double>(all.size())));
  const auto cut = all.begin() + static_cast<std::ptrdiff_t>(all.size() - n_val);
  return {std::vector<std::uint16_t>(all.begin(), cut), std::vector<std::uint16_t>(cut, all.end())};
}

// The training and validation tokens of a language model: in memory (a text's split) or slices of
// memory-mapped token shards.
struct TokenSplit {
  TokenStore train, validation;
  TokenSplit() = default;
  TokenSplit(TokenStore t, TokenStore v) : train(std::move(t)), validation(std::move(v)) {}
  TokenSplit(TextSplit s) : train(TokenStore::own(std::move(s.train))), validation(TokenStore::own(std::move(s.validation))) {}
};

namespace detail {
inline void count_tokens(std::span<const std::uint16_t> tokens, std::vector<std::int64_t>& count) {
  const auto vocab = static_cast<std::int64_t>(count.size());
  for (auto t : tokens) {
    DPML_REQUIRE(t < vocab, "token " << t << " outside the vocabulary of " << vocab);
    ++count[t];
  }
}
inline double entropy_of_counts(const std::vector<std::int64_t>& count) {
  double n = 0, h = 0;
  for (auto c : count) n += static_cast<double>(c);
  for (auto c : count)
    if (c > 0) h -= (static_cast<double>(c) / n) * std::log(static_cast<double>(c) / n);
  return h;
}
}  // namespace detail

// Entropy of the token frequencies, in nats (divide by ln 2 for bits). Tokens < vocab.
inline double unigram_entropy(std::span<const std::uint16_t> tokens, int vocab = kByteVocab) {
  std::vector<std::int64_t> count(static_cast<std::size_t>(vocab), 0);
  detail::count_tokens(tokens, count);
  return detail::entropy_of_counts(count);
}
// The same over a store's pieces (memory-mapped shards: one pass, nothing copied).
inline double unigram_entropy(const TokenStore& tokens, int vocab = kByteVocab) {
  std::vector<std::int64_t> count(static_cast<std::size_t>(vocab), 0);
  tokens.for_each_piece([&](std::span<const std::uint16_t> piece) { detail::count_tokens(piece, count); });
  return detail::entropy_of_counts(count);
}
inline double unigram_entropy_bits(std::span<const std::uint16_t> tokens, int vocab = kByteVocab) {
  return unigram_entropy(tokens, vocab) / std::log(2.0);
}

// A language model's data: this data rank's share of the training windows (shuffled by
// options.seed) and of the validation windows (in order), and the training tokens' unigram entropy
// in nats. `source` names the data in messages. Tokens < vocab.
struct LmWindows {
  TokenWindows train, validation;
  double unigram_entropy;
};
inline LmWindows lm_windows(TokenSplit split, int vocab, WindowOptions options, int rank, int ranks, const std::string& source) {
  const double unigram = unigram_entropy(split.train, vocab);
  WindowOptions in_order = options;
  in_order.shuffle = false;
  return {TokenWindows(std::move(split.train), options, rank, ranks, source),
          TokenWindows(std::move(split.validation), in_order, rank, ranks, source + " (validation)"), unigram};
}

}  // namespace dpml::data
