#pragma once
// IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed.
//
//   bytes 0-3   magic: 0x00, 0x00, type (0x08 = uint8), number of dimensions d
//   then d      big-endian uint32 sizes, then the elements, row-major
//
// read_idx(path) reads the whole file (gzip is recognised by its magic bytes 0x1f 0x8b and read
// with zlib), checks the magic (0x00000801 for labels, 0x00000803 for images when a rank is
// asked for) and that the declared sizes match the bytes present, and returns sizes and bytes.
// Every failure is a dpml::Error naming the file: missing, unreadable, bad gzip data, wrong
// magic, truncated (or longer than declared). When every rank reads the same file, pass
// Scope::everywhere: each rank then fails alike and dpml::run reports it once.

#include "dpml/core/error.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <source_location>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

namespace dpml::data {

struct IdxArray {
  std::string path;
  std::vector<std::int64_t> dims;   // e.g. (N, 28, 28) for images, (N) for labels
  std::vector<std::uint8_t> bytes;  // product(dims) elements, row-major
  std::int64_t count() const noexcept { return dims.empty() ? 0 : dims[0]; }
};

namespace detail {

[[noreturn]] inline void idx_fail(Scope scope, const std::string& message,
                                  std::source_location where = std::source_location::current()) {
  throw Error(message, scope, where);
}

inline std::vector<std::uint8_t> read_gzip(const std::string& path, Scope scope) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) idx_fail(scope, "cannot open gzip file '" + path + "': " + std::strerror(errno));
  std::vector<std::uint8_t> out;
  constexpr unsigned kChunk = 1u << 20;
  int n = 0;
  do {
    const std::size_t old = out.size();
    out.resize(old + kChunk);
    n = gzread(f, out.data() + old, kChunk);
    out.resize(old + static_cast<std::size_t>(n > 0 ? n : 0));
  } while (n > 0);
  int code = Z_OK;
  const std::string text = gzerror(f, &code);
  gzclose_r(f);
  // A stream cut short reads as Z_BUF_ERROR ("unexpected end of file").
  if (n < 0 || (code != Z_OK && code != Z_STREAM_END))
    idx_fail(scope, "IDX file '" + path + "' is truncated or corrupt gzip data (zlib: " + text + ")");
  return out;
}

inline std::vector<std::uint8_t> read_plain(const std::string& path, Scope scope) {
  std::ifstream in(path, std::ios::binary);
  if (!in) idx_fail(scope, "cannot open IDX file '" + path + "': " + std::strerror(errno));
  return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::string hex32(std::uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(8) << std::setfill('0') << v;
  return os.str();
}

}  // namespace detail

// Reads an IDX file of uint8 elements. expected_rank: 1 (labels), 3 (images) or 0 (any).
inline IdxArray read_idx(const std::string& path, int expected_rank = 0, Scope scope = Scope::local) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) detail::idx_fail(scope, "IDX file '" + path + "' does not exist (or is not a file)");
  bool gzip = false;
  {
    std::ifstream in(path, std::ios::binary);
    unsigned char head[2] = {0, 0};
    in.read(reinterpret_cast<char*>(head), 2);
    gzip = in.gcount() == 2 && head[0] == 0x1f && head[1] == 0x8b;
  }
  IdxArray a;
  a.path = path;
  std::vector<std::uint8_t> file = gzip ? detail::read_gzip(path, scope) : detail::read_plain(path, scope);

  auto be32 = [&](std::size_t at) {
    return std::uint32_t{file[at]} << 24 | std::uint32_t{file[at + 1]} << 16 | std::uint32_t{file[at + 2]} << 8 | file[at + 3];
  };
  if (file.size() < 4) detail::idx_fail(scope, "IDX file '" + path + "' is truncated: " + std::to_string(file.size()) + " bytes, no header");
  const std::uint32_t magic = be32(0);
  const int rank = file[3];
  const bool magic_ok = (magic & 0xffffff00u) == 0x00000800u && rank >= 1 && (expected_rank == 0 || rank == expected_rank);
  if (!magic_ok) {
    std::ostringstream os;
    os << "IDX file '" << path << "' has a wrong magic number " << detail::hex32(magic) << " (expected ";
    if (expected_rank == 0) os << "0x000008nn: uint8 elements, nn >= 1 dimensions)";
    else os << detail::hex32(0x00000800u | static_cast<std::uint32_t>(expected_rank))
            << (expected_rank == 1 ? ": uint8 labels)" : expected_rank == 3 ? ": uint8 images)" : ": uint8)");
    detail::idx_fail(scope, os.str());
  }
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(rank);
  if (file.size() < header)
    detail::idx_fail(scope, "IDX file '" + path + "' is truncated: " + std::to_string(file.size()) + " bytes, shorter than its " +
                                std::to_string(header) + "-byte header");
  const auto payload = static_cast<std::int64_t>(file.size() - header);
  std::int64_t numel = 1;
  bool beyond = false;  // the dimensions need more bytes than the file has (and may overflow int64)
  for (int d = 0; d < rank; ++d) {
    a.dims.push_back(be32(4 + 4 * static_cast<std::size_t>(d)));
    beyond = beyond || (a.dims.back() > 0 && numel > (payload + 1) / a.dims.back() + 1);
    if (!beyond) numel *= a.dims.back();
  }
  const auto dims_text = [&] {
    std::ostringstream os;
    for (std::size_t d = 0; d < a.dims.size(); ++d) os << (d ? ", " : "") << a.dims[d];
    return os.str();
  };
  if (std::find(a.dims.begin(), a.dims.end(), 0) != a.dims.end())
    detail::idx_fail(scope, "IDX file '" + path + "' has a zero dimension (" + dims_text() + "): it holds no data");
  if (beyond)
    detail::idx_fail(scope, "IDX file '" + path + "' is truncated: its dimensions (" + dims_text() + ") need more bytes than the " +
                                std::to_string(payload) + " it has");
  if (payload != numel) {
    std::ostringstream os;
    os << "IDX file '" << path << "' is " << (payload < numel ? "truncated" : "longer than declared") << ": its dimensions ("
       << dims_text() << ") need " << numel << " bytes of data, the file has " << payload;
    detail::idx_fail(scope, os.str());
  }
  file.erase(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(header));
  a.bytes = std::move(file);
  return a;
}

}  // namespace dpml::data
