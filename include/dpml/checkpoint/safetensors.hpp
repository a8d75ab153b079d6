#pragma once
// safetensors files: the published format (https://github.com/huggingface/safetensors), written
// and read without any library beyond json.hpp.
//
//   [8 bytes: N, little-endian u64] [N bytes: JSON header, padded with spaces to a multiple of 8]
//   [data: each tensor's raw little-endian bytes, back to back]
//
//   header = {"__metadata__": {"k": "v", ...},
//             "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//
// Offsets are relative to the start of the data and cover it without gaps, in the order written.
// SafetensorsWriter collects entries (taking their bytes over) and writes a file, fsync'ed before
// it returns, so a checkpoint can rely on it being on disk. SafetensorsFile opens a file, checks the
// header against the format and the file's size (a truncated file names the first tensor whose
// bytes are missing) and reads one entry's bytes on demand (opening the file again: no descriptor
// is held between reads).
//
// Host element types map to dtypes at compile time (dtype_of<T>); dpml assumes a little-endian
// host, as every machine it targets is.

#include "dpml/checkpoint/json.hpp"
#include "dpml/core/bf16.hpp"
#include "dpml/core/error.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dpml::checkpoint {

static_assert(std::endian::native == std::endian::little, "dpml checkpoints assume a little-endian host");

enum class Dtype { F64, F32, BF16, I64, U64, I32, U16, U8 };

inline constexpr Dtype kDtypes[] = {Dtype::F64, Dtype::F32, Dtype::BF16, Dtype::I64,
                                    Dtype::U64, Dtype::I32, Dtype::U16,  Dtype::U8};

inline const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::F64: return "F64";
    case Dtype::F32: return "F32";
    case Dtype::BF16: return "BF16";
    case Dtype::I64: return "I64";
    case Dtype::U64: return "U64";
    case Dtype::I32: return "I32";
    case Dtype::U16: return "U16";
    case Dtype::U8: return "U8";
  }
  return "?";
}

inline std::size_t dtype_size(Dtype d) {
  switch (d) {
    case Dtype::F64:
    case Dtype::I64:
    case Dtype::U64: return 8;
    case Dtype::F32:
    case Dtype::I32: return 4;
    case Dtype::BF16:
    case Dtype::U16: return 2;
    case Dtype::U8: return 1;
  }
  return 0;
}

// The dtype named `name` ("F32"...); an Error for any other (what says where it was found).
inline Dtype parse_dtype(std::string_view name, std::string_view what) {
  for (Dtype d : kDtypes)
    if (name == dtype_name(d)) return d;
  throw Error("unsupported dtype \"" + std::string(name) + "\" for " + std::string(what) +
              " (dpml reads F64, F32, BF16, I64, U64, I32, U16, U8)");
}

template <class T>
struct DtypeOf {
  static_assert(sizeof(T) == 0, "dpml: this element type has no safetensors dtype (see DtypeOf in checkpoint/safetensors.hpp)");
};
#define DPML_SAFETENSORS_DTYPE(T, D) \
  template <>                        \
  struct DtypeOf<T> {                \
    static constexpr Dtype value = D; \
  };
DPML_SAFETENSORS_DTYPE(double, Dtype::F64)
DPML_SAFETENSORS_DTYPE(float, Dtype::F32)
DPML_SAFETENSORS_DTYPE(bf16, Dtype::BF16)
DPML_SAFETENSORS_DTYPE(std::int64_t, Dtype::I64)
DPML_SAFETENSORS_DTYPE(std::uint64_t, Dtype::U64)
DPML_SAFETENSORS_DTYPE(std::int32_t, Dtype::I32)
DPML_SAFETENSORS_DTYPE(std::uint16_t, Dtype::U16)
DPML_SAFETENSORS_DTYPE(std::uint8_t, Dtype::U8)
#undef DPML_SAFETENSORS_DTYPE
template <class T>
inline constexpr Dtype dtype_of = DtypeOf<std::remove_cv_t<T>>::value;

inline std::string shape_string(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace detail {

inline std::string errno_text() { return std::strerror(errno); }

// Writes all of `bytes` to fd (retrying short writes).
inline void write_all(int fd, const void* bytes, std::size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(bytes);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    DPML_REQUIRE(w > 0, "cannot write '" << path << "': " << errno_text());
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

// Reads exactly n bytes at `offset`; false if the file ends first.
inline bool read_at(int fd, void* bytes, std::size_t n, std::uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(bytes);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    DPML_REQUIRE(r >= 0, "cannot read '" << path << "': " << errno_text());
    if (r == 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
  return true;
}

// A file descriptor closed on scope exit.
class Fd {
 public:
  Fd(const std::string& path, int flags, mode_t mode = 0644) : fd_(::open(path.c_str(), flags | O_CLOEXEC, mode)) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const noexcept { return fd_; }
  bool ok() const noexcept { return fd_ >= 0; }

 private:
  int fd_;
};

inline void fsync_or_throw(int fd, const std::string& path) {
  DPML_REQUIRE(::fsync(fd) == 0, "cannot fsync '" << path << "': " << errno_text());
}

}  // namespace detail

// Flushes a directory's entries (new files, renames) to disk.
inline void fsync_directory(const std::string& dir) {
  detail::Fd fd(dir, O_RDONLY | O_DIRECTORY);
  DPML_REQUIRE(fd.ok(), "cannot open directory '" << dir << "': " << detail::errno_text());
  detail::fsync_or_throw(fd.get(), dir);
}

// Writes `text` to `path` (created or truncated) and fsyncs it.
inline void write_file_synced(const std::string& path, std::string_view text) {
  detail::Fd fd(path, O_WRONLY | O_CREAT | O_TRUNC);
  DPML_REQUIRE(fd.ok(), "cannot create '" << path << "': " << detail::errno_text());
  detail::write_all(fd.get(), text.data(), text.size(), path);
  detail::fsync_or_throw(fd.get(), path);
}

struct SafetensorsEntry {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets into the data section
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

class SafetensorsWriter {
 public:
  // Adds entry `name`: numel(shape) · dtype_size(dtype) bytes, taken over (no copy).
  void add(std::string name, Dtype dtype, std::vector<std::int64_t> shape, std::vector<std::byte> bytes) {
    const std::span<const std::byte> view(bytes);
    owned_.push_back(std::move(bytes));  // the heap block, and so `view`, stays where it is
    add_borrowed(std::move(name), dtype, std::move(shape), view);
  }
  // Adds entry `name` whose bytes are read in place by write(): they must stay alive and
  // unchanged until the file is written.
  void add_borrowed(std::string name, Dtype dtype, std::vector<std::int64_t> shape, std::span<const std::byte> bytes) {
    DPML_REQUIRE(!name.empty() && name != "__metadata__", "invalid safetensors tensor name \"" << name << '"');
    for (const auto& e : entries_) DPML_REQUIRE(e.name != name, "tensor '" << name << "' added twice to a safetensors file");
    SafetensorsEntry e{std::move(name), dtype, std::move(shape), size_, 0};
    DPML_REQUIRE(static_cast<std::uint64_t>(e.numel()) * dtype_size(dtype) == bytes.size(),
                 "tensor '" << e.name << "' of shape " << shape_string(e.shape) << " and dtype " << dtype_name(dtype)
                            << " needs " << e.numel() * static_cast<std::int64_t>(dtype_size(dtype)) << " bytes, got "
                            << bytes.size());
    size_ += bytes.size();
    e.end = size_;
    entries_.push_back(std::move(e));
    bytes_.push_back(bytes);
  }
  template <class T>
  void add(std::string name, std::vector<std::int64_t> shape, std::span<const T> values) {
    const auto b = std::as_bytes(values);
    add(std::move(name), dtype_of<T>, std::move(shape), std::vector<std::byte>(b.begin(), b.end()));
  }
  void set_metadata(std::string key, std::string value) { metadata_.set(std::move(key), Json(std::move(value))); }

  const std::vector<SafetensorsEntry>& entries() const noexcept { return entries_; }
  // The bytes of entry i.
  std::span<const std::byte> bytes(std::size_t i) const { return bytes_[i]; }

  // The JSON header, padded with spaces to a multiple of 8 bytes.
  std::string header() const {
    Json h = Json::object();
    if (!metadata_.as_object().empty()) h.set("__metadata__", metadata_);
    for (const auto& e : entries_) {
      Json shape = Json::array(), offsets = Json::array();
      for (auto d : e.shape) shape.push_back(d);
      offsets.push_back(e.begin).push_back(e.end);
      h.set(e.name, Json(Json::Object{{"dtype", dtype_name(e.dtype)}, {"shape", shape}, {"data_offsets", offsets}}));
    }
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    return text;
  }

  // Writes the file (length, header, data), created or truncated, and fsyncs it.
  void write(const std::string& path) const {
    const std::string text = header();
    const std::uint64_t n = text.size();
    detail::Fd fd(path, O_WRONLY | O_CREAT | O_TRUNC);
    DPML_REQUIRE(fd.ok(), "cannot create '" << path << "': " << detail::errno_text());
    detail::write_all(fd.get(), &n, 8, path);
    detail::write_all(fd.get(), text.data(), text.size(), path);
    for (const auto& b : bytes_) detail::write_all(fd.get(), b.data(), b.size(), path);
    detail::fsync_or_throw(fd.get(), path);
  }

 private:
  Json metadata_ = Json::object();
  std::vector<SafetensorsEntry> entries_;
  std::vector<std::span<const std::byte>> bytes_;  // one per entry: into owned_, or borrowed
  std::vector<std::vector<std::byte>> owned_;      // the entries added by value
  std::uint64_t size_ = 0;                     // of the data section
};

class SafetensorsFile {
 public:
  // Opens and checks `path`: header well-formed, offsets contiguous, the data all present.
  explicit SafetensorsFile(std::string path) : path_(std::move(path)) {
    const detail::Fd fd = open();
    struct stat st {};
    DPML_REQUIRE(::fstat(fd.get(), &st) == 0, "cannot stat '" << path_ << "': " << detail::errno_text());
    const auto size = static_cast<std::uint64_t>(st.st_size);
    std::uint64_t n = 0;
    DPML_REQUIRE(size >= 8 && detail::read_at(fd.get(), &n, 8, 0, path_),
                 "safetensors file '" << path_ << "' is truncated: " << size << " bytes, not even the header length");
    DPML_REQUIRE(n <= size - 8 && n <= (std::uint64_t{100} << 20),
                 "safetensors file '" << path_ << "' declares a header of " << n << " bytes but holds " << size
                                      << " bytes (truncated or not a safetensors file)");
    std::string text(n, '\0');
    DPML_REQUIRE(detail::read_at(fd.get(), text.data(), n, 8, path_), "safetensors file '" << path_ << "' is truncated");
    data_start_ = 8 + n;
    parse_header(Json::parse(text, "header of " + path_), size - data_start_);
  }

  const std::string& path() const noexcept { return path_; }
  const Json& metadata() const noexcept { return metadata_; }
  const std::vector<SafetensorsEntry>& entries() const noexcept { return entries_; }
  const SafetensorsEntry* find(std::string_view name) const {
    for (const auto& e : entries_)
      if (e.name == name) return &e;
    return nullptr;
  }
  const SafetensorsEntry& entry(std::string_view name) const {
    const SafetensorsEntry* e = find(name);
    DPML_REQUIRE(e != nullptr, "no tensor '" << name << "' in safetensors file '" << path_ << "'");
    return *e;
  }
  // The raw bytes of one entry.
  std::vector<std::byte> read_bytes(const SafetensorsEntry& e) const {
    std::vector<std::byte> out(e.end - e.begin);
    DPML_REQUIRE(detail::read_at(open().get(), out.data(), out.size(), data_start_ + e.begin, path_),
                 "safetensors file '" << path_ << "' is truncated inside tensor '" << e.name << "'");
    return out;
  }
  // One entry as host values of type T (dtype must match).
  template <class T>
  std::vector<T> read(std::string_view name) const {
    const SafetensorsEntry& e = entry(name);
    DPML_REQUIRE(e.dtype == dtype_of<T>, "tensor '" << name << "' in '" << path_ << "' is " << dtype_name(e.dtype)
                                                    << ", read as " << dtype_name(dtype_of<T>));
    const auto bytes = read_bytes(e);
    std::vector<T> out(bytes.size() / sizeof(T));
    if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }

 private:
  void parse_header(const Json& header, std::uint64_t data_size) {
    DPML_REQUIRE(header.is_object(), "safetensors header of '" << path_ << "' is not a JSON object");
    for (const auto& [name, value] : header.as_object()) {
      if (name == "__metadata__") {
        DPML_REQUIRE(value.is_object(), "__metadata__ of '" << path_ << "' is not an object");
        for (const auto& kv : value.as_object())
          DPML_REQUIRE(kv.second.is_string(), "__metadata__ of '" << path_ << "': value of \"" << kv.first << "\" is not a string");
        metadata_ = value;
        continue;
      }
      entries_.push_back(parse_entry(name, value));
    }
    // Offsets must tile the data section without gaps or overlaps (in offset order).
    std::vector<const SafetensorsEntry*> order;
    for (const auto& e : entries_) order.push_back(&e);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    std::uint64_t at = 0;
    for (const auto* e : order) {
      DPML_REQUIRE(e->begin == at, "safetensors file '" << path_ << "': tensor '" << e->name << "' starts at byte " << e->begin
                                                        << " of the data, expected " << at << " (gap or overlap)");
      DPML_REQUIRE(e->end <= data_size, "safetensors file '" << path_ << "' is truncated: tensor '" << e->name << "' needs data bytes ["
                                                             << e->begin << ", " << e->end << ") but the file holds "
                                                             << data_size << " bytes of data");
      at = e->end;
    }
    DPML_REQUIRE(at == data_size, "safetensors file '" << path_ << "' has " << data_size - at
                                                       << " bytes after its last tensor");
  }

  SafetensorsEntry parse_entry(const std::string& name, const Json& v) const {
    const std::string what = "tensor '" + name + "' in '" + path_ + "'";
    try {
      SafetensorsEntry e;
      e.name = name;
      e.dtype = parse_dtype(v.at("dtype").as_string(), what);
      for (const auto& d : v.at("shape").as_array()) {
        DPML_REQUIRE(d.as_int() >= 0, "negative dimension");
        e.shape.push_back(d.as_int());
      }
      const auto& off = v.at("data_offsets").as_array();
      DPML_REQUIRE(off.size() == 2 && off[0].as_int() >= 0 && off[1].as_int() >= off[0].as_int(), "bad data_offsets");
      e.begin = static_cast<std::uint64_t>(off[0].as_int());
      e.end = static_cast<std::uint64_t>(off[1].as_int());
      DPML_REQUIRE(e.end - e.begin == static_cast<std::uint64_t>(e.numel()) * dtype_size(e.dtype),
                   "data_offsets [" << e.begin << ", " << e.end << ") do not hold shape " << shape_string(e.shape) << " of "
                                    << dtype_name(e.dtype));
      return e;
    } catch (const Error& err) {
      throw Error("bad header entry for " + what + ": " + err.message());
    }
  }

  // The file is opened for each read, not held: a reader of a checkpoint written by thousands of
  // ranks keeps no descriptor per file.
  detail::Fd open() const {
    detail::Fd fd(path_, O_RDONLY);
    DPML_REQUIRE(fd.ok(), "cannot open safetensors file '" << path_ << "': " << detail::errno_text());
    return fd;
  }

  std::string path_;
  std::uint64_t data_start_ = 0;
  Json metadata_ = Json::object();
  std::vector<SafetensorsEntry> entries_;
};

}  // namespace dpml::checkpoint
