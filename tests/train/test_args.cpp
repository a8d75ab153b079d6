// train::Args: values parse into their flags, ranges refuse what they exclude naming the flag,
// the value and the range, floating-point values must be finite, bool flags take --no-…,
// --help lists every flag with its kind, default and range, and --check-flags checks and stops.
#include "test.hpp"

#include <dpml/core/error.hpp>
#include <dpml/train/args.hpp>
#include <dpml/train/profile_steps.hpp>

#include <cstdint>
#include <string>
#include <vector>

using namespace dpml;

namespace {

struct Flags {
  std::int64_t heads = 12;
  int top_k = 40;
  double timeout = 300, temperature = 0.8, fraction = 0.05;
  bool zero = false;
  std::string schedule = "1f1b";
};

// Parses `words` (after the program name) into fresh flags; the message of a refusal, or "".
// `proceed`: what parse() returned (false: --help or --check-flags, the program exits 0).
std::string parse(const std::vector<std::string>& words, Flags& f, bool* proceed = nullptr) {
  train::Args args("prog", "a test program");
  args.flag("--heads", f.heads, "attention heads", train::at_least(1))
      .flag("--top-k", f.top_k, "k", train::between(0, 1000))
      .flag("--timeout", f.timeout, "seconds", train::at_least(0.0))
      .flag("--temperature", f.temperature, "sampling temperature", train::positive<double>())
      .flag("--fraction", f.fraction, "validation fraction", train::half_open(0.0, 1.0))
      .flag("--zero", f.zero, "ZeRO-1")
      .flag("--schedule", f.schedule, "gpipe | 1f1b");
  std::vector<std::string> argv_text{"prog"};
  argv_text.insert(argv_text.end(), words.begin(), words.end());
  std::vector<char*> argv;
  for (auto& w : argv_text) argv.push_back(w.data());
  try {
    const bool go = args.parse(static_cast<int>(argv.size()), argv.data());
    if (proceed) *proceed = go;
  } catch (const Error& e) {
    CHECK(e.scope() == Scope::everywhere);  // every rank refuses alike: printed once
    return e.message();
  }
  return "";
}

}  // namespace

TEST_CASE("Args: values inside their ranges are taken", "[train][args]") {
  Flags f;
  CHECK(parse({"--heads", "4", "--top-k=0", "--timeout", "0", "--temperature", "1e-3", "--fraction", "0", "--zero",
               "--schedule", "gpipe"}, f)
            .empty());
  CHECK(f.fraction == 0.0);
  CHECK(f.heads == 4);
  CHECK(f.top_k == 0);
  CHECK(f.timeout == 0.0);
  CHECK(f.temperature == 1e-3);
  CHECK(f.zero);
  CHECK(f.schedule == "gpipe");
  Flags g;
  g.zero = true;
  CHECK(parse({"--no-zero"}, g).empty());
  CHECK_FALSE(g.zero);
}

TEST_CASE("Args: out of range, non-finite and malformed values are refused naming the flag", "[train][args]") {
  struct Case {
    std::vector<std::string> words;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--heads", "0"}, "flag --heads 0 is outside its range >= 1"},
      {{"--heads", "-3"}, "flag --heads -3 is outside its range >= 1"},
      {{"--top-k", "1001"}, "flag --top-k 1001 is outside its range [0, 1000]"},
      {{"--timeout", "-1"}, "flag --timeout -1 is outside its range >= 0"},
      {{"--timeout", "nan"}, "flag --timeout needs a finite number, got 'nan'"},
      {{"--timeout", "inf"}, "flag --timeout needs a finite number, got 'inf'"},
      {{"--temperature", "0"}, "flag --temperature 0 is outside its range > 0"},
      {{"--fraction", "1"}, "flag --fraction 1 is outside its range [0, 1)"},
      {{"--fraction", "-0.1"}, "flag --fraction -0.1 is outside its range [0, 1)"},
      {{"--heads", "four"}, "flag --heads needs an integer, got 'four'"},
      {{"--heads", "99999999999999999999"}, "flag --heads needs an integer"},
      {{"--heads"}, "flag --heads needs a value"},
      {{"--zero=maybe"}, "flag --zero takes true/false, got 'maybe'"},
      {{"--bogus", "1"}, "unknown flag '--bogus'"},
  };
  for (const auto& c : cases) {
    Flags f;
    CAPTURE(c.words);
    const std::string got = parse(c.words, f);
    CHECK(got.find(c.message) != std::string::npos);
    CAPTURE(got);
  }
}

TEST_CASE("Args: --help lists every flag with its default, range and negation", "[train][args]") {
  Flags f;
  train::Args args("prog", "a test program");
  args.flag("--heads", f.heads, "attention heads", train::at_least(1))
      .flag("--temperature", f.temperature, "sampling temperature", train::positive<double>())
      .flag("--zero", f.zero, "ZeRO-1");
  const std::string h = args.help();
  CHECK(h.find("usage: prog") != std::string::npos);
  CHECK(h.find("--heads <int>") != std::string::npos);
  CHECK(h.find("--temperature <number>") != std::string::npos);
  CHECK(h.find("--check-flags") != std::string::npos);
  CHECK(h.find("attention heads (default: 12; >= 1)") != std::string::npos);
  CHECK(h.find("sampling temperature (default: 0.8; > 0)") != std::string::npos);
  CHECK(h.find("--zero | --no-zero") != std::string::npos);
  CHECK(h.find("ZeRO-1 (default: off)") != std::string::npos);
}

TEST_CASE("Args: --check-flags takes valid values and stops; a bad value is refused all the same", "[train][args]") {
  Flags f;
  bool proceed = true;
  CHECK(parse({"--heads", "4", "--check-flags", "--temperature", "2"}, f, &proceed).empty());
  CHECK_FALSE(proceed);  // the program does nothing more
  CHECK(f.heads == 4);
  CHECK(f.temperature == 2.0);
  Flags g;
  CHECK(parse({"--heads", "4"}, g, &proceed).empty());
  CHECK(proceed);
  Flags h;
  CHECK(parse({"--check-flags", "--heads", "0"}, h, &proceed) == "flag --heads 0 is outside its range >= 1");
}

TEST_CASE("ProfileSteps: A:B with 1 <= A <= B, or nothing", "[train][args]") {
  using dpml::train::ProfileSteps;
  CHECK(ProfileSteps::parse("--profile-steps", "").empty());
  const auto w = ProfileSteps::parse("--profile-steps", "10:12");
  CHECK((w.first == 10 && w.last == 12 && !w.empty()));
  const auto one = ProfileSteps::parse("--profile-steps", "3:3");
  CHECK((one.first == 3 && one.last == 3 && !one.empty()));
  for (const std::string bad : {"12:10", "0:2", "5", "a:b", "1:2x", ":3", "4:", "-1:2"}) {
    CAPTURE(bad);
    const std::string got = dpml::test::message_of([&] { (void)ProfileSteps::parse("--profile-steps", bad); });
    CHECK(got.find("--profile-steps " + bad + " is not A:B with steps 1 <= A <= B") != std::string::npos);
  }
}

TEST_CASE("Args: a text flag with a check refuses what the check refuses, --check-flags too", "[train][args]") {
  auto run = [](std::vector<std::string> words, std::string& mode) {
    train::Args args("prog", "a test program");
    args.flag("--mode", mode, "a or b", [](const std::string& v) {
      DPML_REQUIRE_EVERYWHERE(v == "a" || v == "b", "flag --mode '" << v << "' is not a or b");
    });
    words.insert(words.begin(), "prog");
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    try {
      args.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const Error& e) {
      CHECK(e.scope() == Scope::everywhere);
      return e.message();
    }
    return std::string();
  };
  std::string mode = "unchecked default";
  CHECK(run({}, mode).empty());  // the program's own default is not checked
  CHECK(run({"--mode", "b"}, mode).empty());
  CHECK(mode == "b");
  CHECK(run({"--mode=c"}, mode) == "flag --mode 'c' is not a or b");
  CHECK(run({"--check-flags", "--mode", "x"}, mode) == "flag --mode 'x' is not a or b");
}
