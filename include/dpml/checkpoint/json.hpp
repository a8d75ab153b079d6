#pragma once
// A small JSON value, writer and parser: enough for safetensors headers and checkpoint manifests,
// with no external library.
//
// Json holds null, a bool, an int64 (exact: integers without a fraction or exponent stay
// integers, so byte offsets and step numbers survive a round trip), a double, a string, an
// array or an object. Objects keep their keys in insertion order, so dump() is deterministic —
// two saves of the same checkpoint produce the same bytes. dump() writes compact JSON (no
// spaces); doubles are written in their shortest round-trip form, and a non-finite double is an
// Error (JSON has no NaN).
//
// parse() is strict (RFC 8259): one value, then only whitespace; no trailing commas, comments,
// leading zeros, raw control characters or duplicate keys; \uXXXX escapes (surrogate pairs
// included) become UTF-8; nesting deeper than 512 is refused. Every error names the source (a
// file name) and the byte offset.

#include "dpml/core/error.hpp"

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace dpml::checkpoint {

class Json {
 public:
  using Array = std::vector<Json>;
  using Object = std::vector<std::pair<std::string, Json>>;  // insertion order

  Json() = default;
  Json(std::nullptr_t) {}
  Json(bool b) : v_(b) {}
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  Json(I i) : v_(to_int64(i)) {}
  Json(double d) : v_(d) {}
  Json(std::string s) : v_(std::move(s)) {}
  Json(const char* s) : v_(std::string(s)) {}
  Json(std::string_view s) : v_(std::string(s)) {}
  Json(Array a) : v_(std::move(a)) {}
  Json(Object o) : v_(std::move(o)) {}
  static Json object() { return Json(Object{}); }
  static Json array() { return Json(Array{}); }

  bool is_null() const noexcept { return std::holds_alternative<std::nullptr_t>(v_); }
  bool is_bool() const noexcept { return std::holds_alternative<bool>(v_); }
  bool is_int() const noexcept { return std::holds_alternative<std::int64_t>(v_); }
  bool is_double() const noexcept { return std::holds_alternative<double>(v_); }
  bool is_number() const noexcept { return is_int() || is_double(); }
  bool is_string() const noexcept { return std::holds_alternative<std::string>(v_); }
  bool is_array() const noexcept { return std::holds_alternative<Array>(v_); }
  bool is_object() const noexcept { return std::holds_alternative<Object>(v_); }

  const char* type_name() const noexcept {
    constexpr const char* names[] = {"null", "bool", "integer", "number", "string", "array", "object"};
    return names[v_.index()];
  }

  bool as_bool() const { return get<bool>("a bool"); }
  std::int64_t as_int() const { return get<std::int64_t>("an integer"); }
  double as_double() const { return is_int() ? static_cast<double>(as_int()) : get<double>("a number"); }
  const std::string& as_string() const { return get<std::string>("a string"); }
  const Array& as_array() const { return get<Array>("an array"); }
  Array& as_array() { return const_cast<Array&>(std::as_const(*this).as_array()); }
  const Object& as_object() const { return get<Object>("an object"); }
  Object& as_object() { return const_cast<Object&>(std::as_const(*this).as_object()); }

  // Object member `key`, or nullptr.
  const Json* find(std::string_view key) const {
    for (const auto& [k, v] : as_object())
      if (k == key) return &v;
    return nullptr;
  }
  const Json& at(std::string_view key) const {
    const Json* v = find(key);
    DPML_REQUIRE(v != nullptr, "missing key \"" << key << "\"");
    return *v;
  }
  // Sets object member `key` (replacing an existing one, else appending). Returns *this.
  Json& set(std::string key, Json value) {
    auto& o = as_object();
    for (auto& [k, v] : o)
      if (k == key) {
        v = std::move(value);
        return *this;
      }
    o.emplace_back(std::move(key), std::move(value));
    return *this;
  }
  Json& push_back(Json value) {
    as_array().push_back(std::move(value));
    return *this;
  }

  // Defined below the class: a defaulted comparison here makes nvcc's front end instantiate
  // std::pair<std::string, Json> while Json is still incomplete (an error under nvcc).
  friend bool operator==(const Json& a, const Json& b);

  std::string dump() const {
    std::string out;
    dump_to(out);
    return out;
  }
  void dump_to(std::string& out) const;

  // Parses `text`; errors name `source` (a file name, or what the text is).
  static Json parse(std::string_view text, std::string_view source = "JSON text");

 private:
  template <class I>
  static std::int64_t to_int64(I i) {
    if constexpr (std::is_unsigned_v<I> && sizeof(I) >= sizeof(std::int64_t))
      DPML_REQUIRE(i <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()),
                   "integer " << i << " does not fit a JSON int64");
    return static_cast<std::int64_t>(i);
  }
  template <class T>
  const T& get(const char* wanted) const {
    const T* p = std::get_if<T>(&v_);
    DPML_REQUIRE(p != nullptr, "expected " << wanted << ", found " << type_name());
    return *p;
  }
  std::variant<std::nullptr_t, bool, std::int64_t, double, std::string, Array, Object> v_;
};

inline bool operator==(const Json& a, const Json& b) { return a.v_ == b.v_; }

namespace detail {

inline void dump_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          constexpr char hex[] = "0123456789abcdef";
          out += "\\u00";
          out += hex[(c >> 4) & 0xF];
          out += hex[c & 0xF];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

class JsonParser {
 public:
  JsonParser(std::string_view text, std::string_view source) : s_(text), source_(source) {}

  Json document() {
    Json v = value(0);
    skip_space();
    if (pos_ != s_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 512;

  [[noreturn]] void fail(const std::string& what) const {
    std::ostringstream os;
    os << "malformed JSON in '" << source_ << "' at byte " << pos_ << ": " << what;
    throw Error(os.str());
  }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  char peek() {
    if (pos_ >= s_.size()) fail("unexpected end of text");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "', found '" + s_[pos_] + "'");
    ++pos_;
  }
  void literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) fail("invalid literal");
    pos_ += word.size();
  }

  Json value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than 512");
    skip_space();
    switch (peek()) {
      case '{': return object(depth);
      case '[': return array(depth);
      case '"': return Json(string());
      case 't': literal("true"); return Json(true);
      case 'f': literal("false"); return Json(false);
      case 'n': literal("null"); return Json(nullptr);
      default: return number();
    }
  }

  Json object(int depth) {
    expect('{');
    Json::Object o;
    skip_space();
    if (peek() == '}') {
      ++pos_;
      return Json(std::move(o));
    }
    for (;;) {
      skip_space();
      if (peek() != '"') fail("expected a string key");
      const std::size_t key_at = pos_;
      std::string key = string();
      for (const auto& kv : o)
        if (kv.first == key) {
          pos_ = key_at;
          fail("duplicate key \"" + key + "\"");
        }
      skip_space();
      expect(':');
      o.emplace_back(std::move(key), value(depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      return Json(std::move(o));
    }
  }

  Json array(int depth) {
    expect('[');
    Json::Array a;
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return Json(std::move(a));
    }
    for (;;) {
      a.push_back(value(depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return Json(std::move(a));
    }
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return v;
  }
  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      const char c = peek();
      ++pos_;
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) {
        --pos_;
        fail("raw control character in a string");
      }
      if (c != '\\') {
        out += c;
        continue;
      }
      const char e = peek();
      ++pos_;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // high surrogate: a low one must follow
            if (s_.substr(pos_, 2) != "\\u") fail("unpaired surrogate in \\u escape");
            pos_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("unpaired surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("unpaired surrogate in \\u escape");
          }
          utf8(out, cp);
          break;
        }
        default: --pos_; fail(std::string("invalid escape '\\") + e + "'");
      }
    }
  }

  Json number() {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t from = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ - from;
    };
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') fail("unexpected character");
    if (s_[pos_] == '0') ++pos_;
    else digits();
    bool integral = true;
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) fail("digits expected after '.'");
      integral = false;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (digits() == 0) fail("digits expected in the exponent");
      integral = false;
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + pos_;
    if (integral) {
      std::int64_t i = 0;
      const auto r = std::from_chars(first, last, i);
      if (r.ec != std::errc() || r.ptr != last) {
        pos_ = start;
        fail("integer out of the int64 range");
      }
      return Json(i);
    }
    double d = 0;
    const auto r = std::from_chars(first, last, d);
    if (r.ec != std::errc() || r.ptr != last || !std::isfinite(d)) {
      pos_ = start;
      fail("number out of range");
    }
    return Json(d);
  }

  std::string_view s_, source_;
  std::size_t pos_ = 0;
};

}  // namespace detail

inline void Json::dump_to(std::string& out) const {
  std::visit(
      [&](const auto& x) {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, std::nullptr_t>) {
          out += "null";
        } else if constexpr (std::is_same_v<X, bool>) {
          out += x ? "true" : "false";
        } else if constexpr (std::is_same_v<X, std::int64_t>) {
          out += std::to_string(x);
        } else if constexpr (std::is_same_v<X, double>) {
          DPML_REQUIRE(std::isfinite(x), "JSON cannot hold the non-finite number " << x);
          char buf[32];
          const auto r = std::to_chars(buf, buf + sizeof buf, x);
          std::string_view text(buf, static_cast<std::size_t>(r.ptr - buf));
          out += text;
          // "1" would read back as an integer: keep doubles doubles.
          if (text.find_first_of(".eE") == std::string_view::npos) out += ".0";
        } else if constexpr (std::is_same_v<X, std::string>) {
          detail::dump_string(out, x);
        } else if constexpr (std::is_same_v<X, Array>) {
          out += '[';
          for (std::size_t i = 0; i < x.size(); ++i) {
            if (i) out += ',';
            x[i].dump_to(out);
          }
          out += ']';
        } else {
          out += '{';
          for (std::size_t i = 0; i < x.size(); ++i) {
            if (i) out += ',';
            detail::dump_string(out, x[i].first);
            out += ':';
            x[i].second.dump_to(out);
          }
          out += '}';
        }
      },
      v_);
}

inline Json Json::parse(std::string_view text, std::string_view source) {
  return detail::JsonParser(text, source).document();
}

}  // namespace dpml::checkpoint
