#pragma once
// What a user watches: a progress line on rank 0 (step, epoch, loss, accuracy, throughput, ETA)
// and a JSON-lines metrics file (one object per logged step, for plots and comparisons).
//
//   step  120/1000 | epoch 1 | loss 0.4123 | acc 88.10% | 5123 img/s | 0:42 elapsed | ETA 5:08

#include "dpml/core/error.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dpml::train {

inline std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<long long>(seconds + 0.5);
  std::ostringstream os;
  if (s >= 3600) os << s / 3600 << ':' << (s / 60 % 60 < 10 ? "0" : "") << s / 60 % 60;
  else os << s / 60;
  os << ':' << (s % 60 < 10 ? "0" : "") << s % 60;
  return os.str();
}

// A metric: name and value. Written in JSON as a number, in the progress line by `format`.
struct Metric {
  std::string_view name;
  double value;
};

// One JSON object per line; only rank 0 writes. An empty path disables the file.
class MetricsLog {
 public:
  MetricsLog(const std::string& path, int rank) {
    if (rank != 0 || path.empty()) return;
    out_.open(path, std::ios::out | std::ios::trunc);
    DPML_REQUIRE(out_.good(), "cannot open metrics file '" << path << "' for writing");
  }
  void write(std::initializer_list<Metric> metrics) {
    if (!out_.is_open()) return;
    out_ << '{';
    bool first = true;
    for (const auto& m : metrics) {
      out_ << (first ? "" : ", ") << '"' << m.name << "\": ";
      if (std::isfinite(m.value)) out_ << m.value;
      else out_ << "null";
      first = false;
    }
    out_ << "}\n";
    out_.flush();
  }

 private:
  std::ofstream out_;
};

// The progress line. ETA from the mean time per step so far.
class Progress {
 public:
  Progress(std::int64_t total_steps, int rank, std::string unit = "samples/s")
      : total_(total_steps), rank_(rank), unit_(std::move(unit)), start_(clock::now()) {}

  double elapsed() const { return std::chrono::duration<double>(clock::now() - start_).count(); }

  // `throughput` in the unit given at construction; `extra` printed as "name value" pairs.
  void print(std::int64_t step, double loss, double throughput, std::initializer_list<Metric> extra = {}) const {
    if (rank_ != 0) return;
    const double t = elapsed();
    const double eta = step > 0 ? t / static_cast<double>(step) * static_cast<double>(total_ - step) : NAN;
    std::ostringstream os;
    os << "step " << step << '/' << total_;
    for (const auto& m : extra) os << " | " << m.name << ' ' << m.value;
    char buf[160];
    std::snprintf(buf, sizeof buf, " | loss %.4f | %.0f %s | %s elapsed | ETA %s", loss, throughput, unit_.c_str(),
                  format_duration(t).c_str(), format_duration(eta).c_str());
    os << buf << '\n';
    std::fputs(os.str().c_str(), stdout);
    std::fflush(stdout);
  }

 private:
  using clock = std::chrono::steady_clock;
  std::int64_t total_;
  int rank_;
  std::string unit_;
  clock::time_point start_;
};

}  // namespace dpml::train
