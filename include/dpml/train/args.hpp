#pragma once
// Command-line flags for dpml programs: each flag is bound to a variable with a help line, and
// --help prints them all with their defaults. Every rank parses the same argv, so a bad flag is
// an Error with Scope::everywhere: dpml::run prints it once and every rank exits 1.
//
//   int tp = 1; std::string schedule = "1f1b";
//   dpml::train::Args args("train_gpt", "Train a GPT with 3D parallelism.");
//   args.flag("--tp", tp, "tensor-parallel degree").flag("--schedule", schedule, "gpipe | 1f1b | zb-h1");
//   if (!args.parse(argc, argv, world.rank())) return 0;   // --help was shown

#include "dpml/core/error.hpp"

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace dpml::train {

class Args {
 public:
  Args(std::string program, std::string description) : program_(std::move(program)), description_(std::move(description)) {}

  // Bind `--name` to `target`. bool flags take no value (`--zero`) and also accept `--no-zero`.
  template <class T>
  Args& flag(std::string name, T& target, std::string help) {
    Flag f{std::move(name), std::move(help), to_text(target), std::is_same_v<T, bool>, {}};
    f.set = [&target, n = f.name](std::string_view v) { parse_value(n, v, target); };
    flags_.push_back(std::move(f));
    return *this;
  }

  // Returns false when --help was asked for (printed by rank 0); throws on a bad flag.
  bool parse(int argc, char** argv, int rank = 0) {
    for (int i = 1; i < argc; ++i) {
      std::string_view a = argv[i];
      if (a == "--help" || a == "-h") {
        if (rank == 0) std::fputs(help().c_str(), stdout);
        return false;
      }
      std::string_view value;
      bool has_value = false;
      if (auto eq = a.find('='); eq != std::string_view::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_value = true;
      }
      Flag* f = find(a);
      if (!f && a.starts_with("--no-")) {
        if (Flag* b = find("--" + std::string(a.substr(5))); b && b->is_bool) {
          b->set("false");
          continue;
        }
      }
      DPML_REQUIRE_EVERYWHERE(f != nullptr, "unknown flag '" << a << "' (see " << program_ << " --help)");
      if (f->is_bool && !has_value) {
        f->set("true");
        continue;
      }
      if (!has_value) {
        DPML_REQUIRE_EVERYWHERE(i + 1 < argc, "flag " << a << " needs a value (see " << program_ << " --help)");
        value = argv[++i];
      }
      f->set(value);
    }
    return true;
  }

  std::string help() const {
    std::ostringstream os;
    os << "usage: " << program_ << " [flags]\n\n" << description_ << "\n\nflags:\n";
    for (const auto& f : flags_) {
      std::string left = "  " + f.name + (f.is_bool ? "" : " <v>");
      if (left.size() < 26) left.resize(26, ' ');
      os << left << ' ' << f.help << " (default: " << (f.default_text.empty() ? "\"\"" : f.default_text) << ")\n";
    }
    os << "  --help                   show this help and exit\n";
    return os.str();
  }

 private:
  struct Flag {
    std::string name, help, default_text;
    bool is_bool;
    std::function<void(std::string_view)> set;
  };
  Flag* find(std::string_view name) {
    for (auto& f : flags_)
      if (f.name == name) return &f;
    return nullptr;
  }
  template <class T>
  static std::string to_text(const T& v) {
    if constexpr (std::is_same_v<T, bool>) return v ? "on" : "off";
    else if constexpr (std::is_same_v<T, std::string>) return v;
    else {
      std::ostringstream os;
      os << v;
      return os.str();
    }
  }
  template <class T>
  static void parse_value(const std::string& name, std::string_view v, T& out) {
    if constexpr (std::is_same_v<T, std::string>) {
      out = std::string(v);
    } else if constexpr (std::is_same_v<T, bool>) {
      DPML_REQUIRE_EVERYWHERE(v == "true" || v == "false" || v == "1" || v == "0" || v == "on" || v == "off",
                              "flag " << name << " takes true/false, got '" << v << "'");
      out = v == "true" || v == "1" || v == "on";
    } else if constexpr (std::is_floating_point_v<T>) {
      std::string s(v);
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      DPML_REQUIRE_EVERYWHERE(!s.empty() && end == s.c_str() + s.size(), "flag " << name << " needs a number, got '" << v << "'");
      out = static_cast<T>(d);
    } else {
      T x{};
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
      DPML_REQUIRE_EVERYWHERE(ec == std::errc() && p == v.data() + v.size(),
                              "flag " << name << " needs an integer, got '" << v << "'");
      out = x;
    }
  }

  std::string program_, description_;
  std::vector<Flag> flags_;
};

}  // namespace dpml::train
