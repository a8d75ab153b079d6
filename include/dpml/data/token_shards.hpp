#pragma once
// Token data for language models: llm.c token shards, TokenStore (the tokens, in memory or
// memory-mapped), and TokenWindows, the one windowed, data-parallel dataset over any TokenStore
// (shards here, byte-level text in data/text.hpp).
//
// Shard format (llm.c, dev/data/data_common.py): a header of 256 little-endian int32 — [0] magic
// 20240520, [1] version 1, [2] token count N, the rest zero — then N uint16 tokens. The reader
// checks all three against the file and names the file, what was expected and what was found,
// refuses a directory, and, given the model's vocabulary, refuses the first token id outside it
// (naming the file, the id and its position in the file: one linear scan at load time, so no
// batch ever indexes past the embedding). Its errors have Scope::everywhere, as every rank reads
// the same shards and fails alike. is_token_shard_file tells a shard by its magic, whatever its name.
//
// Windows: sample i of a token array of n tokens is tokens[i·T, i·T + T + 1) — T+1 tokens, the
// inputs being the first T and the targets the last T (next-token prediction), so consecutive
// windows share one token and there are ⌊(n − 1) / T⌋ of them. Several shards are concatenated in
// the order given (globs are sorted), so a window may straddle two shards. Which windows form
// each step's batch is the DistributedSampler's convention (data/sampler.hpp): global batch b is
// a contiguous block of the epoch's order (a Philox shuffle of the windows for `seed`, or the
// identity), and data-parallel rank r of K takes its contiguous slice. The union of the ranks'
// batches of a step is therefore the sequential run's global batch, for any K.
//
// Streaming: TokenStore::map_shards memory-maps the shards instead of reading them (POSIX mmap,
// read-only), so a dataset larger than RAM works and no rank holds a private copy: what a rank
// reads stays in the page cache, shared by a node's ranks and reclaimable. The
// load-time vocabulary check still reads every token once, in 16 MiB chunks whose pages are
// released after the check (madvise(MADV_DONTNEED)); then the mapping is marked random-access
// (MADV_RANDOM), so reading a window does not read ahead megabytes around it. The batches are the
// same as read_token_shards'.

#include "dpml/core/error.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/data/sampler.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dpml::data {

inline constexpr std::int32_t kTokenShardMagic = 20240520;
inline constexpr std::int32_t kTokenShardVersion = 1;
inline constexpr std::size_t kTokenShardHeaderInts = 256;
inline constexpr std::size_t kTokenShardHeaderBytes = kTokenShardHeaderInts * sizeof(std::int32_t);
inline constexpr std::int64_t kTokenShardVocab = 65536;  // every uint16 id

// Refuses the first token id >= vocab, naming `source` (e.g. "token shard 'x.bin'"), the id and
// its position (`first_position` + its index in `tokens`: a chunk of a longer sequence).
inline void require_tokens_below(std::span<const std::uint16_t> tokens, std::int64_t vocab, const std::string& source,
                                 std::int64_t first_position = 0) {
  const auto bad = std::find_if(tokens.begin(), tokens.end(), [vocab](std::uint16_t t) { return t >= vocab; });
  DPML_REQUIRE_EVERYWHERE(bad == tokens.end(), source << ": token " << *bad << " at position "
                                                      << first_position + (bad - tokens.begin())
                                                      << " is >= the vocabulary size " << vocab);
}

// Whether `path` is a regular file that starts with the llm.c magic.
inline bool is_token_shard_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  std::int32_t magic = 0;
  in.read(reinterpret_cast<char*>(&magic), sizeof(magic));
  return in.gcount() == sizeof(magic) && magic == kTokenShardMagic;
}

inline void write_token_shard(const std::string& path, std::span<const std::uint16_t> tokens) {
  DPML_REQUIRE(tokens.size() <= 0x7fffffffu, "token shard '" << path << "': " << tokens.size()
                                                              << " tokens do not fit the int32 count of the header");
  std::int32_t header[kTokenShardHeaderInts] = {};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = static_cast<std::int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  DPML_REQUIRE(out.good(), "token shard '" << path << "' cannot be created");
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size_bytes()));
  out.close();
  DPML_REQUIRE(!out.fail(), "token shard '" << path << "': write failed (disk full?)");
}

// Checks a shard's size and 256-int32 header against each other, naming the file; returns the
// token count.
inline std::uint64_t checked_shard_tokens(const std::string& path, std::uint64_t bytes, const std::int32_t* header) {
  DPML_REQUIRE_EVERYWHERE(header[0] == kTokenShardMagic, "token shard '" << path << "' has magic " << header[0] << ", expected "
                                                              << kTokenShardMagic << " (not an llm.c token shard)");
  DPML_REQUIRE_EVERYWHERE(header[1] == kTokenShardVersion, "token shard '" << path << "' has version " << header[1] << ", expected "
                                                                << kTokenShardVersion << " (uint16 tokens)");
  DPML_REQUIRE_EVERYWHERE(header[2] >= 0, "token shard '" << path << "' has a negative token count " << header[2]);
  const std::uint64_t count = static_cast<std::uint64_t>(header[2]), body = bytes - kTokenShardHeaderBytes;
  DPML_REQUIRE_EVERYWHERE(body == count * sizeof(std::uint16_t), "token shard '" << path << "': the header says " << count << " tokens ("
                                                                      << count * sizeof(std::uint16_t) << " bytes) but the file holds "
                                                                      << body << " bytes after the header");
  return count;
}

inline void require_shard_size(const std::string& path, std::uint64_t bytes) {
  DPML_REQUIRE_EVERYWHERE(bytes >= kTokenShardHeaderBytes, "token shard '" << path << "' is " << bytes << " bytes, shorter than the "
                                                                << kTokenShardHeaderBytes << "-byte header");
}

// The tokens of one shard, each checked to be below `vocab`.
inline std::vector<std::uint16_t> read_token_shard(const std::string& path, std::int64_t vocab = kTokenShardVocab) {
  std::error_code ec;
  DPML_REQUIRE_EVERYWHERE(!std::filesystem::is_directory(path, ec), "token shard '" << path << "' is a directory, not a file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  DPML_REQUIRE_EVERYWHERE(in.good(), "token shard '" << path << "' cannot be opened (missing or unreadable)");
  const auto bytes = static_cast<std::uint64_t>(in.tellg());
  require_shard_size(path, bytes);
  in.seekg(0);
  std::int32_t header[kTokenShardHeaderInts];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  const std::uint64_t count = checked_shard_tokens(path, bytes, header);
  std::vector<std::uint16_t> tokens(count);
  in.read(reinterpret_cast<char*>(tokens.data()), static_cast<std::streamsize>(count * sizeof(std::uint16_t)));
  DPML_REQUIRE_EVERYWHERE(in.good(), "token shard '" << path << "': read failed");
  require_tokens_below(tokens, vocab, "token shard '" + path + "'");
  return tokens;
}

// The files a pattern names, sorted: a glob (`data/train_*.bin`) or a plain path. None is an error.
inline std::vector<std::string> expand_pattern(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  const bool is_glob = pattern.find_first_of("*?[") != std::string::npos;
  DPML_REQUIRE_EVERYWHERE(!files.empty(), (is_glob ? "no file matches '" : "token shard '")
                                              << pattern << (is_glob ? "'" : "' does not exist"));
  return files;
}

// A read-only sequence of token ids in pieces: one vector it owns (own), or the bodies of
// memory-mapped shards in order (map_shards). Positions run over the pieces as one sequence; a
// slice is a view sharing the pieces (the train / validation split of one set of shards).
class TokenStore {
 public:
  TokenStore() = default;
  static TokenStore own(std::vector<std::uint16_t> tokens) {
    auto v = std::make_shared<const std::vector<std::uint16_t>>(std::move(tokens));
    TokenStore s;
    s.add({v, v->data(), static_cast<std::int64_t>(v->size())});
    return s;
  }
  // The shards `patterns` name (files or globs, each sorted), mapped in order; every id checked to
  // be below `vocab` (the file, the id and its position named).
  static TokenStore map_shards(const std::vector<std::string>& patterns, std::int64_t vocab = kTokenShardVocab);

  std::int64_t size() const noexcept { return size_; }
  // Tokens [pos, pos + n) into out (n), across pieces.
  void copy(std::int64_t pos, std::int64_t n, std::uint16_t* out) const {
    DPML_REQUIRE(pos >= 0 && n >= 0 && pos + n <= size_, "tokens [" << pos << ", " << pos + n << ") outside a store of " << size_);
    auto i = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin()) - 1;
    while (n > 0) {
      const Piece& p = pieces_[i];
      const std::int64_t at = pos - starts_[i], take = std::min(n, p.count - at);
      std::copy_n(p.data + at, take, out);
      out += take, pos += take, n -= take, ++i;
    }
  }
  // Tokens [begin, end) as a store of their own (no copy).
  TokenStore slice(std::int64_t begin, std::int64_t end) const {
    DPML_REQUIRE(0 <= begin && begin <= end && end <= size_, "slice [" << begin << ", " << end << ") of a store of " << size_);
    TokenStore s;
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      const std::int64_t lo = std::max(begin, starts_[i]), hi = std::min(end, starts_[i] + pieces_[i].count);
      if (lo < hi) s.add({pieces_[i].owner, pieces_[i].data + (lo - starts_[i]), hi - lo});
    }
    return s;
  }
  // f(std::span<const std::uint16_t>) on each contiguous piece, in order.
  template <class F>
  void for_each_piece(F&& f) const {
    for (const auto& p : pieces_) f(std::span<const std::uint16_t>(p.data, static_cast<std::size_t>(p.count)));
  }

 private:
  struct Piece {
    std::shared_ptr<const void> owner;  // the vector or the mapping
    const std::uint16_t* data;
    std::int64_t count;
  };
  void add(Piece p) {
    if (p.count == 0) return;
    starts_.push_back(size_);
    size_ += p.count;
    pieces_.push_back(std::move(p));
  }

  std::vector<Piece> pieces_;
  std::vector<std::int64_t> starts_;  // position of each piece's first token
  std::int64_t size_ = 0;
};

namespace detail {
// One read-only mapping of a whole file, unmapped with its last owner.
struct FileMapping {
  void* base = MAP_FAILED;
  std::size_t bytes = 0;
  FileMapping() = default;
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;
  ~FileMapping() {
    if (base != MAP_FAILED) ::munmap(base, bytes);
  }
};
}  // namespace detail

struct WindowOptions {
  std::int64_t seq_len = 64;       // T
  std::int64_t global_batch = 8;   // windows per step over all data-parallel ranks
  std::uint64_t seed = 0;
  bool shuffle = true;
};

struct TokenBatch {
  Tensor<std::int32_t> inputs;   // (B, T)
  Tensor<std::int32_t> targets;  // (B, T) inputs shifted by one token
};

class TokenWindows {
 public:
  // `source` names the data in errors (a pattern, a file). Every data-parallel rank passes the
  // same tokens and options and its own rank of `ranks`.
  TokenWindows(TokenStore tokens, WindowOptions options, int rank = 0, int ranks = 1, std::string source = "token array")
      : tokens_(std::move(tokens)),
        options_(options),
        source_(std::move(source)),
        sampler_(windows_checked(), SamplerOptions{options.global_batch, options.seed, options.shuffle, true}, rank, ranks) {}
  TokenWindows(std::vector<std::uint16_t> tokens, WindowOptions options, int rank = 0, int ranks = 1,
               std::string source = "token array")
      : TokenWindows(TokenStore::own(std::move(tokens)), options, rank, ranks, std::move(source)) {}

  std::int64_t seq_len() const noexcept { return options_.seq_len; }
  std::int64_t windows() const noexcept { return sampler_.dataset_size(); }
  std::int64_t tokens() const noexcept { return tokens_.size(); }
  std::int64_t batches_per_epoch() const noexcept { return sampler_.batches_per_epoch(); }
  void set_epoch(std::int64_t epoch) { sampler_.set_epoch(epoch); }
  const DistributedSampler& sampler() const noexcept { return sampler_; }

  // This rank's windows of step b of the current epoch.
  TokenBatch batch(std::int64_t b) const { return gather(sampler_.local_batch(b)); }
  // All ranks' windows of step b (what one process would train on).
  TokenBatch global_batch(std::int64_t b) const { return gather(sampler_.global_batch(b)); }

 private:
  std::int64_t windows_checked() const {
    const std::int64_t n = tokens_.size(), t = options_.seq_len;
    DPML_REQUIRE_EVERYWHERE(t >= 1, "sequence length " << t << " must be at least 1");
    const std::int64_t w = n > 0 ? (n - 1) / t : 0;
    DPML_REQUIRE_EVERYWHERE(w >= options_.global_batch, source_ << ": " << n << " tokens make " << w << " windows of "
                                                                 << t << "+1 tokens, fewer than the global batch of "
                                                                 << options_.global_batch);
    return w;
  }
  TokenBatch gather(std::span<const std::int64_t> samples) const {
    const std::int64_t B = static_cast<std::int64_t>(samples.size()), T = options_.seq_len;
    TokenBatch out{Tensor<std::int32_t>({B, T}), Tensor<std::int32_t>({B, T})};
    std::vector<std::uint16_t> w(static_cast<std::size_t>(T + 1));  // one window
    for (std::int64_t i = 0; i < B; ++i) {
      tokens_.copy(samples[static_cast<std::size_t>(i)] * T, T + 1, w.data());
      for (std::int64_t j = 0; j < T; ++j) {
        out.inputs(i, j) = w[j];
        out.targets(i, j) = w[j + 1];
      }
    }
    return out;
  }

  TokenStore tokens_;  // (n)
  WindowOptions options_;
  std::string source_;
  DistributedSampler sampler_;
};

// The tokens of several shards (files or globs), concatenated in order, each checked to be below `vocab`.
inline std::vector<std::uint16_t> read_token_shards(const std::vector<std::string>& patterns,
                                                    std::int64_t vocab = kTokenShardVocab) {
  std::vector<std::uint16_t> all;
  for (const auto& p : patterns)
    for (const auto& f : expand_pattern(p)) {
      const auto t = read_token_shard(f, vocab);
      all.insert(all.end(), t.begin(), t.end());
    }
  return all;
}

inline TokenStore TokenStore::map_shards(const std::vector<std::string>& patterns, std::int64_t vocab) {
  constexpr std::int64_t kChunk = 8 << 20;  // tokens (16 MiB) checked before their pages are released
  TokenStore store;
  for (const auto& pattern : patterns)
    for (const auto& path : expand_pattern(pattern)) {
      struct stat st {};
      const int fd = ::open(path.c_str(), O_RDONLY);
      DPML_REQUIRE_EVERYWHERE(fd >= 0 && ::fstat(fd, &st) == 0, "token shard '" << path << "' cannot be opened (missing or unreadable)");
      if (S_ISDIR(st.st_mode)) ::close(fd);
      DPML_REQUIRE_EVERYWHERE(!S_ISDIR(st.st_mode), "token shard '" << path << "' is a directory, not a file");
      auto map = std::make_shared<detail::FileMapping>();
      map->bytes = static_cast<std::size_t>(st.st_size);
      if (map->bytes >= kTokenShardHeaderBytes) map->base = ::mmap(nullptr, map->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
      ::close(fd);
      require_shard_size(path, map->bytes);
      DPML_REQUIRE_EVERYWHERE(map->base != MAP_FAILED, "token shard '" << path << "' cannot be memory-mapped");
      const auto* bytes = static_cast<const char*>(map->base);
      const auto count = static_cast<std::int64_t>(
          checked_shard_tokens(path, map->bytes, reinterpret_cast<const std::int32_t*>(bytes)));
      const auto* tokens = reinterpret_cast<const std::uint16_t*>(bytes + kTokenShardHeaderBytes);
      for (std::int64_t at = 0; at < count; at += kChunk) {
        const std::int64_t n = std::min(kChunk, count - at);
        require_tokens_below({tokens + at, static_cast<std::size_t>(n)}, vocab, "token shard '" + path + "'", at);
        // Release the checked pages from this process (whole pages inside the chunk only).
        const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
        const auto lo = (reinterpret_cast<std::uintptr_t>(tokens + at) + page - 1) / page * page;
        const auto hi = reinterpret_cast<std::uintptr_t>(tokens + at + n) / page * page;
        if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
      }
      ::madvise(map->base, map->bytes, MADV_RANDOM);  // windows are read at random: no read-ahead around them
      store.add({map, tokens, count});
    }
  return store;
}

// TokenWindows over llm.c shards, memory-mapped (TokenStore::map_shards).
class TokenShardDataset : public TokenWindows {
 public:
  TokenShardDataset(const std::vector<std::string>& patterns, WindowOptions options, int rank = 0, int ranks = 1)
      : TokenWindows(TokenStore::map_shards(patterns), options, rank, ranks, "token shards '" + join(patterns) + "'") {}

 private:
  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  }
};

}  // namespace dpml::data
