#pragma once
// What a user watches: a progress line on rank 0 (step, epoch, loss, accuracy, throughput, ETA),
// and the metrics of every step in a JSON-lines file (for plots and comparisons) and TensorBoard
// event files (`tensorboard --logdir DIR`), written by one MetricsLog.
//
//   step  120/1000 | epoch 1 | loss 0.4123 | acc 88.10% | 5123 img/s | 0:42 elapsed | ETA 5:08

#include "dpml/core/error.hpp"
#include "dpml/train/tensorboard.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <span>
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

// Whether a record's JSON line names its step: every per-step line does; fashion_mnist's
// end-of-epoch line never has (scripts read it so), though TensorBoard needs a step for it.
enum class JsonStep { written, omitted };

// The metrics sinks of a run, written by rank 0 only: a JSON-lines file (one object per record)
// and TensorBoard event files (train/tensorboard.hpp: one event per record, a scalar per metric
// under its name, in a run directory of this launch inside `tensorboard_dir`, named on stdout).
// An empty path or directory disables that sink. Non-finite values are null in JSON and left out
// of TensorBoard.
//
//   {"step": 120, "loss": 0.4123, "val_loss": null, "lr": 0.0003}
class MetricsLog {
 public:
  MetricsLog(const std::string& jsonl_path, const std::string& tensorboard_dir, int rank) {
    if (rank != 0) return;
    if (!jsonl_path.empty()) {
      json_path_ = jsonl_path;
      json_.open(jsonl_path, std::ios::out | std::ios::trunc);
      DPML_REQUIRE(json_.good(), "cannot open metrics file '" << jsonl_path << "' for writing");
    }
    if (!tensorboard_dir.empty()) {
      tensorboard_.emplace(tensorboard_dir);
      std::printf("metrics: TensorBoard run '%s' (tensorboard --logdir %s)\n", tensorboard_->run_dir().c_str(),
                  tensorboard_dir.c_str());
      std::fflush(stdout);
    }
  }

  // One record of `step` to every sink.
  void write(std::int64_t step, std::initializer_list<Metric> metrics, JsonStep json_step = JsonStep::written) {
    write(step, metrics, std::span<const Metric>(), json_step);
  }
  // The same with `more` fields after `metrics` (e.g. a StepMeter reading's: train/step_meter.hpp).
  void write(std::int64_t step, std::initializer_list<Metric> metrics, std::span<const Metric> more,
             JsonStep json_step = JsonStep::written) {
    const std::span<const Metric> parts[] = {std::span<const Metric>(metrics.begin(), metrics.size()), more};
    if (json_.is_open() && json_.good()) {
      json_ << '{';
      const char* separator = "";
      if (json_step == JsonStep::written) {
        json_ << "\"step\": " << step;  // an integer, exact at any step
        separator = ", ";
      }
      for (const auto& part : parts)
        for (const auto& m : part) {
          json_ << separator << '"' << m.name << "\": ";
          if (std::isfinite(m.value)) json_ << m.value;  // 6 significant digits, as ever
          else json_ << "null";
          separator = ", ";
        }
      json_ << "}\n";
      json_.flush();
      if (!json_.good()) warn_write_failed(json_path_);
    }
    if (tensorboard_ && tensorboard_->good()) {
      std::vector<Scalar> scalars;
      for (const auto& part : parts)
        for (const auto& m : part)
          if (std::isfinite(m.value)) scalars.push_back({m.name, m.value});
      if (!scalars.empty()) tensorboard_->write(step, scalars);
      if (!tensorboard_->good()) warn_write_failed(tensorboard_->file());
    }
  }

 private:
  // A sink that cannot be written (a full disk) stops, with one message; training goes on.
  static void warn_write_failed(const std::string& path) {
    std::fprintf(stderr, "dpml: writing '%s' failed: no more metrics go there\n", path.c_str());
  }

  std::string json_path_;
  std::ofstream json_;
  std::optional<TensorBoardWriter> tensorboard_;
};

// The progress line. ETA from the mean time per step since the first line printed: that line's
// own time holds start-up, first touches and kernel loading (a first step of a GPU run can take a
// second where the others take milliseconds), so it shows "ETA ?" and later lines leave it out.
class Progress {
 public:
  Progress(std::int64_t total_steps, int rank, std::string unit = "samples/s", std::FILE* out = stdout)
      : total_(total_steps), rank_(rank), unit_(std::move(unit)), out_(out), start_(clock::now()) {}

  double elapsed() const { return std::chrono::duration<double>(clock::now() - start_).count(); }

  // `throughput` in the unit given at construction; `extra` printed as "name value" pairs (4
  // significant digits), a NaN one left out (a validation loss before the first evaluation, MFU
  // where no peak is known).
  void print(std::int64_t step, double loss, double throughput, std::initializer_list<Metric> extra = {}) {
    print(step, loss, throughput, std::span<const Metric>(extra.begin(), extra.size()));
  }
  void print(std::int64_t step, double loss, double throughput, std::span<const Metric> extra) {
    if (rank_ != 0) return;
    const double t = elapsed();
    if (first_step_ < 0) first_step_ = step, first_t_ = t;
    const double eta = step >= total_          ? 0.0
                       : step > first_step_ ? (t - first_t_) / static_cast<double>(step - first_step_) * static_cast<double>(total_ - step)
                                            : NAN;
    std::ostringstream os;
    os << "step " << step << '/' << total_;
    os.precision(4);
    for (const auto& m : extra)
      if (!std::isnan(m.value)) os << " | " << m.name << ' ' << m.value;
    char buf[160];
    std::snprintf(buf, sizeof buf, " | loss %.4f | %.0f %s | %s elapsed | ETA %s", loss, throughput, unit_.c_str(),
                  format_duration(t).c_str(), format_duration(eta).c_str());
    os << buf << '\n';
    std::fputs(os.str().c_str(), out_);
    std::fflush(out_);
  }

 private:
  using clock = std::chrono::steady_clock;
  std::int64_t total_;
  int rank_;
  std::string unit_;
  std::FILE* out_;
  clock::time_point start_;
  std::int64_t first_step_ = -1;  // the step of the first line printed, and its time
  double first_t_ = 0.0;
};

}  // namespace dpml::train
