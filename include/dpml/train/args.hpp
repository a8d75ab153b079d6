#pragma once
// Command-line flags for dpml programs: each flag is bound to a variable with a help line and,
// for numbers, the values it allows (a Range: at_least(1), between(0, 1), half_open(0.0, 1.0),
// positive<double>());
// --help prints them all with their defaults and ranges. A value that does not parse, is not
// finite, or is outside its range is refused naming the flag, the value and the range. Every rank
// parses the same argv, so a bad flag is an Error with Scope::everywhere: dpml::run prints it once
// and every rank exits 1, before any MPI work of the program's own. --help shows each flag's kind
// (<int>, <number>, <text>; switches take none); --check-flags checks every flag's value and
// exits, doing nothing (the program's checks across flags — a layout that does not divide — come
// later): tests/train/flag_corpus.py drives every program's flags through it. given(name) tells
// whether the command line named a flag (a preset such as --model-size fills only the others).
//
// Output paths a flag names are checked the same way, before any work is done, on every rank
// alike: a file (require_writable_output) or a directory the program makes
// (require_writable_directory: with its missing parents, or only its last part).
//
//   int tp = 1; std::string schedule = "1f1b";
//   dpml::train::Args args("train_gpt", "Train a GPT with 3D parallelism.");
//   args.flag("--tp", tp, "tensor-parallel degree", train::at_least(1))
//       .flag("--schedule", schedule, "gpipe | 1f1b | zb-h1");
//   if (!args.parse(argc, argv, world.rank())) return 0;   // --help was shown

#include "dpml/core/error.hpp"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace dpml::train {

// The values a numeric flag allows: [min, max] with either end open to infinity; `above`: min
// itself excluded (a positive rate, temperature, timeout); `below`: max itself excluded (a
// fraction of the data, a momentum: [0, 1)).
template <class T>
struct Range {
  std::optional<T> min, max;
  bool above = false, below = false;
  Range() = default;
  Range(std::optional<T> lo, std::optional<T> hi, bool above_min, bool below_max = false)
      : min(lo), max(hi), above(above_min), below(below_max) {}
  template <class U>  // at_least(1) for an int64 flag, between(0, 1) for a double one
  Range(const Range<U>& o)
      : min(o.min ? std::optional<T>(static_cast<T>(*o.min)) : std::nullopt),
        max(o.max ? std::optional<T>(static_cast<T>(*o.max)) : std::nullopt), above(o.above), below(o.below) {}
  bool allows(T v) const {
    return (!min || (above ? v > *min : v >= *min)) && (!max || (below ? v < *max : v <= *max));
  }
  std::string text() const {
    std::ostringstream os;
    if (min && max) os << (above ? "(" : "[") << *min << ", " << *max << (below ? ")" : "]");
    else if (min) os << (above ? "> " : ">= ") << *min;
    else if (max) os << (below ? "< " : "<= ") << *max;
    return os.str();
  }
};
template <class T>
Range<T> at_least(T v) { return {v, {}, false}; }
template <class T>
Range<T> between(T lo, T hi) { return {lo, hi, false}; }
template <class T>
Range<T> positive() { return {T(0), {}, true}; }
template <class T>
Range<T> half_open(T lo, T hi) { return {lo, hi, false, true}; }  // [lo, hi)

class Args {
 public:
  Args(std::string program, std::string description) : program_(std::move(program)), description_(std::move(description)) {}

  // Bind `--name` to `target`. bool flags take no value (`--zero`) and also accept `--no-zero`.
  // Floating-point values must be finite; `range` (numbers only) bounds what is accepted.
  template <class T>
  Args& flag(std::string name, T& target, std::string help, std::type_identity_t<Range<T>> range = {}) {
    Flag f{std::move(name), std::move(help), to_text(target), std::is_same_v<T, bool>, kind_of<T>(), {}, {}};
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) f.range_text = range.text();
    f.set = [&target, n = f.name, range](std::string_view v) {
      parse_value(n, v, target);
      if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
        DPML_REQUIRE_EVERYWHERE(range.allows(target), "flag " << n << " " << v << " is outside its range " << range.text());
    };
    flags_.push_back(std::move(f));
    return *this;
  }

  // A text flag whose value, when given, `check` validates (throwing an Error that names the flag,
  // Scope::everywhere) as a range does a number's, so --check-flags refuses it too: a list of sizes.
  Args& flag(std::string name, std::string& target, std::string help, std::function<void(const std::string&)> check) {
    flag(std::move(name), target, std::move(help));
    flags_.back().set = [set = std::move(flags_.back().set), &target, check = std::move(check)](std::string_view v) {
      set(v);
      check(target);
    };
    return *this;
  }

  // Returns false when --help or --check-flags was asked for (the program then exits 0; rank 0
  // printed the help, or "flags accepted"); throws on a bad flag.
  bool parse(int argc, char** argv, int rank = 0) {
    bool check_only = false;
    for (int i = 1; i < argc; ++i) {
      std::string_view a = argv[i];
      if (a == "--help" || a == "-h") {
        if (rank == 0) std::fputs(help().c_str(), stdout);
        return false;
      }
      if (a == "--check-flags") {
        check_only = true;
        continue;
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
          given_.push_back(b->name);
          continue;
        }
      }
      DPML_REQUIRE_EVERYWHERE(f != nullptr, "unknown flag '" << a << "' (see " << program_ << " --help)");
      given_.push_back(f->name);
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
    if (check_only && rank == 0) std::printf("%s: flags accepted\n", program_.c_str());
    return !check_only;
  }

  // Whether the last parse saw `name` (or its --no- form) on the command line.
  bool given(std::string_view name) const {
    for (const auto& g : given_)
      if (g == name) return true;
    return false;
  }

  std::string help() const {
    std::ostringstream os;
    os << "usage: " << program_ << " [flags]\n\n" << description_ << "\n\nflags:\n";
    for (const auto& f : flags_) {
      std::string left = "  " + f.name + (f.is_bool ? " | --no-" + f.name.substr(2) : " <" + f.kind + ">");
      if (left.size() < 26) left.resize(26, ' ');
      os << left << ' ' << f.help << " (default: " << (f.default_text.empty() ? "\"\"" : f.default_text)
         << (f.range_text.empty() ? "" : "; " + f.range_text) << ")\n";
    }
    os << "  --check-flags            check every flag's value, then exit without doing anything\n";
    os << "  --help                   show this help and exit\n";
    return os.str();
  }

 private:
  struct Flag {
    std::string name, help, default_text;
    bool is_bool;
    std::string kind;  // what the value is: int, number, text (switches: none)
    std::function<void(std::string_view)> set;
    std::string range_text;  // numbers: the allowed values ("" : any)
  };
  Flag* find(std::string_view name) {
    for (auto& f : flags_)
      if (f.name == name) return &f;
    return nullptr;
  }
  template <class T>
  static std::string kind_of() {
    if constexpr (std::is_same_v<T, bool>) return "";
    else if constexpr (std::is_floating_point_v<T>) return "number";
    else if constexpr (std::is_arithmetic_v<T>) return "int";
    else return "text";
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
      DPML_REQUIRE_EVERYWHERE(std::isfinite(d), "flag " << name << " needs a finite number, got '" << v << "'");
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
  std::vector<std::string> given_;  // the flags named by the last parse
};

// An output file a flag names ("" : none) must be creatable before any work is done, so that a
// long run does not end writing nowhere: its directory exists and is writable, and the path is
// not a directory. Every rank checks alike (Scope::everywhere).
inline void require_writable_output(std::string_view flag, const std::string& path) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  DPML_REQUIRE_EVERYWHERE(!fs::is_directory(p, ec), "flag " << flag << " '" << path << "' is a directory, not a file");
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  DPML_REQUIRE_EVERYWHERE(fs::is_directory(dir, ec), "flag " << flag << " '" << path << "': directory '" << dir.string()
                                                              << "' does not exist");
  DPML_REQUIRE_EVERYWHERE(::access(dir.c_str(), W_OK) == 0, "flag " << flag << " '" << path << "': directory '" << dir.string()
                                                                     << "' is not writable");
  DPML_REQUIRE_EVERYWHERE(!fs::exists(p, ec) || ::access(p.c_str(), W_OK) == 0,
                          "flag " << flag << " '" << path << "' exists and is not writable");
}

// How much of a directory's path (require_writable_directory) the program makes: every part that
// is missing (its parents too: --tensorboard DIR, under which each run makes its own), or only the
// last, in a directory that exists (--export DIR/).
enum class Missing { any, last };

// A directory a flag names ("" : none) must be creatable before any work is done: it is a writable
// directory, or the nearest part of its path that exists is one (Missing::any), or its parent is
// (Missing::last). Nothing is created here. Every rank checks alike (Scope::everywhere).
inline void require_writable_directory(std::string_view flag, const std::string& path, Missing missing = Missing::any) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto parent_of = [](const fs::path& p) { return p.has_parent_path() ? p.parent_path() : fs::path("."); };
  fs::path dir = fs::path(path).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // "out/" → "out"
  fs::path p = dir;                                  // → the nearest part of the path that exists
  if (missing == Missing::any) {
    for (fs::path up; !fs::exists(p, ec) && (up = parent_of(p)) != p;) p = up;
  } else if (!fs::exists(dir, ec)) {
    p = parent_of(dir);
    DPML_REQUIRE_EVERYWHERE(fs::is_directory(p, ec) && ::access(p.c_str(), W_OK) == 0,
                            "flag " << flag << " '" << path << "': cannot make directory '" << dir.string() << "': '"
                                    << p.string() << "' is not a writable directory");
    return;
  }
  DPML_REQUIRE_EVERYWHERE(fs::is_directory(p, ec), "flag " << flag << " '" << path << "': '" << p.string() << "' is not a directory");
  DPML_REQUIRE_EVERYWHERE(::access(p.c_str(), W_OK) == 0, "flag " << flag << " '" << path << "': directory '" << p.string()
                                                                   << "' is not writable");
}

// The AdamW schedule flags of the language-model examples (train_gpt, train_lstm, train_bert):
// one definition of their names, ranges and help, bound to the caller's fields (each program keeps
// its defaults). After parse(), resolve_lr_schedule turns --lr-warmup-iters -1 into a tenth of the
// run and refuses a warm-up as long as the run or a --min-lr above --lr, on every rank (before a
// large model is built, not when its optimizer is).
inline Args& lm_schedule_flags(Args& args, std::int64_t& iters, double& lr, double& min_lr, std::int64_t& warmup,
                               double& weight_decay, double& clip) {
  return args.flag("--train-iters", iters, "optimizer steps", at_least<std::int64_t>(1))
      .flag("--lr", lr, "peak learning rate (AdamW)", at_least(0.0))
      .flag("--min-lr", min_lr, "learning rate at the end of the cosine decay", at_least(0.0))
      .flag("--lr-warmup-iters", warmup, "linear warm-up steps (-1: a tenth of --train-iters)", at_least<std::int64_t>(-1))
      .flag("--weight-decay", weight_decay, "AdamW decoupled weight decay", at_least(0.0))
      .flag("--clip-grad", clip, "global gradient-norm clipping (0: off)", at_least(0.0));
}
// Their reporting flags: validation and progress cadence, the metrics file and the TensorBoard
// directory (the programs check both writable after parse(): require_writable_output, _directory).
inline Args& lm_reporting_flags(Args& args, std::int64_t& eval_interval, std::int64_t& log_interval, std::string& metrics,
                                std::string& tensorboard) {
  return args.flag("--eval-interval", eval_interval, "steps between validations", at_least<std::int64_t>(1))
      .flag("--log-interval", log_interval, "steps between progress lines", at_least<std::int64_t>(1))
      .flag("--metrics", metrics, "JSON-lines metrics file (rank 0)")
      .flag("--tensorboard", tensorboard, "TensorBoard log directory: rank 0 writes this launch's scalars to a run directory in it");
}
inline void resolve_lr_schedule(std::int64_t& warmup, std::int64_t iters, double lr, double min_lr) {
  if (warmup == -1) warmup = iters / 10;  // the default follows the run's length
  DPML_REQUIRE_EVERYWHERE(warmup >= 0 && warmup < iters, "--lr-warmup-iters " << warmup << " must be below --train-iters " << iters);
  DPML_REQUIRE_EVERYWHERE(min_lr <= lr, "--min-lr " << min_lr << " exceeds --lr " << lr << " (the cosine decays from --lr to --min-lr)");
}

}  // namespace dpml::train
