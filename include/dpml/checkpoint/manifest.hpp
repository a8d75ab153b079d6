#pragma once
// The manifest of a checkpoint (manifest.json): what a checkpoint holds, independent of the
// layout that wrote it.
//
//   {"format": "dpml-checkpoint", "version": 1, "step": 1200,
//    "config": {"lr": 0.0006, "model": "gpt2"},            // free-form: str → string / number / bool
//    "layout": {"tp": 2, "pp": 2, "dp": 2, "zero": 1},     // how it was written (informative)
//    "tensors": [
//      {"name": "h.0.attn.qkv.weight", "dtype": "F32", "shape": [768, 2304],
//       "pieces": [{"file": "rank-0.safetensors", "slice": [[0, 768], [0, 1152]], "crc32": 305419896},
//                  {"file": "rank-1.safetensors", "slice": [[0, 768], [1152, 2304]], "crc32": ...}]}],
//    "manifest_crc32": 2790853412}
//
// A tensor is described by its *global* shape; each piece is one safetensors entry (keyed by
// the tensor's name inside its file) holding the sub-block `slice` (per dimension [begin, end)),
// and the zlib CRC-32 of that entry's bytes. Loading in another layout means assembling any
// wanted block from the pieces (checkpoint.hpp). validate() checks that the pieces of each
// tensor tile it exactly (inside the shape, no overlap, nothing missing), so a reader never has
// to guess.
//
// The manifest covers itself too: "manifest_crc32" (written last) is the zlib CRC-32 of the
// compact dump (Json::dump) of the manifest's object without that member, so a flipped byte in
// the step, the config or a piece's slice is found, not only in the tensor files. A manifest
// without it (written before it existed, or deliberately stripped) is read as before. The step
// must not be negative.

#include "dpml/checkpoint/json.hpp"
#include "dpml/checkpoint/safetensors.hpp"
#include "dpml/core/error.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace dpml::checkpoint {

inline constexpr int kManifestVersion = 1;
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kManifestChecksum = "manifest_crc32";  // the manifest's own checksum member

inline std::uint32_t crc32_of(std::span<const std::byte> bytes) {
  return static_cast<std::uint32_t>(
      ::crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<z_size_t>(bytes.size())));
}

// The checksum a manifest records of itself: the CRC-32 of the compact dump of object `j`
// without its kManifestChecksum member.
inline std::uint32_t manifest_checksum(const Json& j) {
  Json body = Json::object();
  for (const auto& [k, v] : j.as_object())
    if (k != kManifestChecksum) body.as_object().emplace_back(k, v);
  const std::string text = body.dump();
  return crc32_of(std::as_bytes(std::span(text.data(), text.size())));
}

// [begin, end) along one dimension.
struct Range {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const noexcept { return end - begin; }
  friend bool operator==(const Range&, const Range&) = default;
};
// A block of a global tensor: one Range per dimension.
using Slice = std::vector<Range>;

// The whole of a tensor of this shape.
inline Slice full_slice(std::span<const std::int64_t> shape) {
  Slice s;
  for (auto d : shape) s.push_back({0, d});
  return s;
}
// The whole of `shape` except dimension `dim`, which is [offset, offset + extent).
inline Slice slice_along(std::span<const std::int64_t> shape, int dim, std::int64_t offset, std::int64_t extent) {
  Slice s = full_slice(shape);
  s.at(static_cast<std::size_t>(dim)) = {offset, offset + extent};
  return s;
}
inline std::vector<std::int64_t> extents(const Slice& s) {
  std::vector<std::int64_t> e;
  for (const auto& r : s) e.push_back(r.size());
  return e;
}
inline std::int64_t volume(const Slice& s) {
  std::int64_t n = 1;
  for (const auto& r : s) n *= r.size();
  return n;
}
// The intersection of two blocks of the same tensor (empty ranges when disjoint).
inline Slice intersect(const Slice& a, const Slice& b) {
  Slice out;
  for (std::size_t d = 0; d < a.size(); ++d) {
    const std::int64_t lo = std::max(a[d].begin, b[d].begin), hi = std::min(a[d].end, b[d].end);
    out.push_back({lo, std::max(lo, hi)});
  }
  return out;
}
inline std::string slice_string(const Slice& s) {
  std::string out = "[";
  for (std::size_t d = 0; d < s.size(); ++d)
    out += (d ? ", " : "") + std::to_string(s[d].begin) + ":" + std::to_string(s[d].end);
  return out + "]";
}

struct Piece {
  std::string file;       // relative to the checkpoint directory
  Slice slice;            // the block of the global tensor this piece holds
  std::uint32_t crc32 = 0;
  friend bool operator==(const Piece&, const Piece&) = default;
};

struct TensorRecord {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<std::int64_t> shape;  // global
  std::vector<Piece> pieces;
  friend bool operator==(const TensorRecord&, const TensorRecord&) = default;
};

// The layout that wrote a checkpoint (any layout may read it).
struct SavedLayout {
  int tp = 1, pp = 1, dp = 1, zero = 0;
  friend bool operator==(const SavedLayout&, const SavedLayout&) = default;
};

struct Manifest {
  int version = kManifestVersion;
  std::int64_t step = 0;
  Json config = Json::object();  // str → string / number / bool
  SavedLayout layout;
  std::vector<TensorRecord> tensors;

  const TensorRecord* find(std::string_view name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }

  Json to_json() const {
    Json ts = Json::array();
    for (const auto& t : tensors) {
      Json shape = Json::array(), pieces = Json::array();
      for (auto d : t.shape) shape.push_back(d);
      for (const auto& p : t.pieces) {
        Json slice = Json::array();
        for (const auto& r : p.slice) slice.push_back(Json(Json::Array{r.begin, r.end}));
        pieces.push_back(Json(Json::Object{{"file", p.file}, {"slice", slice}, {"crc32", p.crc32}}));
      }
      ts.push_back(Json(Json::Object{{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", shape}, {"pieces", pieces}}));
    }
    Json j(Json::Object{{"format", "dpml-checkpoint"},
                        {"version", version},
                        {"step", step},
                        {"config", config},
                        {"layout", Json(Json::Object{{"tp", layout.tp}, {"pp", layout.pp}, {"dp", layout.dp},
                                                     {"zero", layout.zero}})},
                        {"tensors", ts}});
    return j.set(kManifestChecksum, manifest_checksum(j));
  }

  // Reads and validates a manifest; every error names `source` (the manifest's path).
  static Manifest from_json(const Json& j, const std::string& source) {
    Manifest m;
    std::string tensor;  // the tensor being read, for messages
    try {
      DPML_REQUIRE(j.at("format").as_string() == "dpml-checkpoint", "not a dpml checkpoint manifest");
      if (const Json* recorded = j.find(kManifestChecksum)) {  // absent: a manifest from before the checksum
        const std::uint32_t crc = manifest_checksum(j);
        DPML_REQUIRE(recorded->is_int() && recorded->as_int() == crc,
                     "manifest checksum mismatch: crc32 " << crc << " of its content, it records "
                                                          << recorded->dump() << " (corrupt or edited manifest)");
      }
      const std::int64_t version = j.at("version").as_int();
      DPML_REQUIRE(version == kManifestVersion, "manifest version " << version << ", this dpml reads version " << kManifestVersion);
      m.step = j.at("step").as_int();
      DPML_REQUIRE(m.step >= 0, "step " << m.step << " is negative");
      m.config = j.at("config");
      for (const auto& [k, v] : m.config.as_object())
        DPML_REQUIRE(v.is_string() || v.is_number() || v.is_bool(), "config \"" << k << "\" is a " << v.type_name()
                                                                               << " (string, number or bool expected)");
      const Json& l = j.at("layout");
      m.layout = {static_cast<int>(l.at("tp").as_int()), static_cast<int>(l.at("pp").as_int()),
                  static_cast<int>(l.at("dp").as_int()), static_cast<int>(l.at("zero").as_int())};
      for (const auto& t : j.at("tensors").as_array()) {
        TensorRecord r;
        r.name = tensor = t.at("name").as_string();
        r.dtype = parse_dtype(t.at("dtype").as_string(), "tensor '" + r.name + "'");
        for (const auto& d : t.at("shape").as_array()) r.shape.push_back(d.as_int());
        for (const auto& p : t.at("pieces").as_array()) {
          Piece piece;
          piece.file = p.at("file").as_string();
          for (const auto& range : p.at("slice").as_array()) {
            const auto& be = range.as_array();
            DPML_REQUIRE(be.size() == 2, "a slice range must be [begin, end]");
            piece.slice.push_back({be[0].as_int(), be[1].as_int()});
          }
          const std::int64_t crc = p.at("crc32").as_int();
          DPML_REQUIRE(crc >= 0 && crc <= 0xFFFFFFFFll, "crc32 " << crc << " out of range");
          piece.crc32 = static_cast<std::uint32_t>(crc);
          r.pieces.push_back(std::move(piece));
        }
        m.tensors.push_back(std::move(r));
      }
      tensor.clear();
      m.validate();
    } catch (const Error& e) {
      throw Error("bad checkpoint manifest '" + source + "'" + (tensor.empty() ? "" : " at tensor '" + tensor + "'") + ": " +
                  e.message());
    }
    return m;
  }

  static Manifest parse(std::string_view text, const std::string& source) {
    return from_json(Json::parse(text, source), source);
  }
  static Manifest load(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    DPML_REQUIRE(in.good(), "checkpoint manifest '" << path << "' does not exist or cannot be read");
    std::stringstream ss;
    ss << in.rdbuf();
    return parse(ss.str(), path);
  }

  // Each tensor's pieces lie inside its shape, do not overlap and cover it; names are unique
  // and files are plain names inside the checkpoint directory.
  void validate() const {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const TensorRecord& t = tensors[i];
      for (std::size_t k = 0; k < i; ++k) DPML_REQUIRE(tensors[k].name != t.name, "tensor '" << t.name << "' listed twice");
      std::int64_t covered = 0;
      for (std::size_t p = 0; p < t.pieces.size(); ++p) {
        const Piece& piece = t.pieces[p];
        DPML_REQUIRE(!piece.file.empty() && piece.file.find('/') == std::string::npos && piece.file != "." && piece.file != "..",
                     "tensor '" << t.name << "': piece file \"" << piece.file << "\" is not a plain file name");
        DPML_REQUIRE(piece.slice.size() == t.shape.size(), "tensor '" << t.name << "': piece in '" << piece.file << "' has "
                                                                      << piece.slice.size() << " dimensions, the tensor "
                                                                      << t.shape.size());
        for (std::size_t d = 0; d < t.shape.size(); ++d)
          DPML_REQUIRE(0 <= piece.slice[d].begin && piece.slice[d].begin <= piece.slice[d].end && piece.slice[d].end <= t.shape[d],
                       "tensor '" << t.name << "': piece " << slice_string(piece.slice) << " in '" << piece.file
                                  << "' lies outside the shape " << shape_string(t.shape));
        for (std::size_t q = 0; q < p; ++q)
          DPML_REQUIRE(volume(intersect(piece.slice, t.pieces[q].slice)) == 0,
                       "tensor '" << t.name << "': pieces " << slice_string(t.pieces[q].slice) << " in '" << t.pieces[q].file
                                  << "' and " << slice_string(piece.slice) << " in '" << piece.file << "' overlap");
        covered += volume(piece.slice);
      }
      std::int64_t numel = 1;
      for (auto d : t.shape) numel *= d;
      DPML_REQUIRE(covered == numel, "tensor '" << t.name << "' of shape " << shape_string(t.shape) << ": its pieces hold "
                                                << covered << " of its " << numel << " elements");
    }
  }
};

}  // namespace dpml::checkpoint
