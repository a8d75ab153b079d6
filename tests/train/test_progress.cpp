// The progress line (train/progress.hpp): its fields, NaN extras left out, only rank 0 printing, and
// an ETA that leaves the first line's time out — a first step holding a second of start-up must not
// make the next line predict minutes.
#include "test.hpp"

#include <dpml/train/progress.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

using namespace dpml;

namespace {
// The lines written to `f` so far.
std::vector<std::string> lines_of(std::FILE* f) {
  std::rewind(f);
  std::vector<std::string> lines;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) {
    std::string line(buf);
    if (!line.empty() && line.back() == '\n') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}
// The seconds of a line's "ETA m:ss" (or h:mm:ss); NaN for "ETA ?".
double eta_seconds(const std::string& line) {
  const auto at = line.rfind("ETA ");
  if (at == std::string::npos || line.substr(at + 4) == "?") return NAN;
  double seconds = 0;
  for (std::size_t i = at + 4; i < line.size();) {
    const std::size_t colon = line.find(':', i);
    seconds = seconds * 60 + std::stod(line.substr(i, colon == std::string::npos ? std::string::npos : colon - i));
    i = colon == std::string::npos ? line.size() : colon + 1;
  }
  return seconds;
}
}  // namespace

TEST_CASE("progress line: ETA ? on the first line, then from the steps after it, 0:00 on the last", "[train][progress]") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  train::Progress progress(100, 0, "tok/s", out);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // a slow first step: start-up
  progress.print(1, 2.5, 1234.0, {{"val", NAN}, {"lr", 0.001}});
  progress.print(2, 2.25, 1500.0);  // the second step took microseconds
  progress.print(100, 1.0, 1500.0);
  const auto lines = lines_of(out);
  std::fclose(out);
  REQUIRE(lines.size() == 3);
  CAPTURE(lines[0], lines[1], lines[2]);
  CHECK(lines[0].starts_with("step 1/100 | lr 0.001 | loss 2.5000 | 1234 tok/s | "));
  CHECK(lines[0].find("val") == std::string::npos);  // NaN: not evaluated yet
  CHECK(std::isnan(eta_seconds(lines[0])));
  CHECK(lines[1].starts_with("step 2/100 | loss 2.2500 | 1500 tok/s | "));
  // From all the time so far it would be 1.2 s / 2 × 98 steps ≈ 59 s; from the second step's own
  // time (microseconds, milliseconds on a loaded machine) well under 10 s.
  CHECK(eta_seconds(lines[1]) < 10.0);
  CHECK(eta_seconds(lines[2]) == 0.0);
}

TEST_CASE("progress line: only rank 0 prints", "[train][progress]") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  train::Progress progress(10, 1, "img/s", out);
  progress.print(1, 1.0, 10.0);
  CHECK(lines_of(out).empty());
  std::fclose(out);
}
