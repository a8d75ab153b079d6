// What train_gpt's translation units share: its flags, the faults it can inject, and
// train_and_sample — resume or import, the training loop with checkpoints, progress line and
// metrics, then export and sample — written once for the CPU trainer (main.cpp) and the GPU ones
// (gpu.cuh). The GPU trainers live in their own CUDA translation units, one per precision, so that
// the host program compiles as plain C++ and nvcc's two halves run in parallel beside it.
#pragma once

#include <dpml/comm/mpi.hpp>
#include <dpml/core/error.hpp>
#include <dpml/data/text.hpp>
#include <dpml/data/token_shards.hpp>
#include <dpml/models/gpt.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/optim/loss_scale.hpp>
#include <dpml/optim/schedule.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/train/checkpointing.hpp>
#include <dpml/train/data_axis_flags.hpp>
#include <dpml/train/flops.hpp>
#include <dpml/train/gpt_trainer.hpp>
#include <dpml/train/hf_gpt2.hpp>
#include <dpml/train/pipeline_trace.hpp>
#include <dpml/train/profile_steps.hpp>
#include <dpml/train/progress.hpp>
#include <dpml/train/step_meter.hpp>
#include <dpml/train/tensorboard.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>

namespace train_gpt {
using namespace dpml;

struct Flags {
  int tp = 1, pp = 1;
  std::string schedule = "1f1b";
  int virtual_stages = 1;  // --num-virtual-stages-per-pipeline-rank: the interleaved schedule's chunks
  std::int64_t first_stage_layers = 0, last_stage_layers = 0;  // --decoder-first/last-pipeline-num-layers (0: even)
  bool zero = false;   // --zero: ZeRO-1 (after parsing: zero_stage >= 1)
  int zero_stage = 0;  // --zero-stage: 0 none, 1 optimizer state sharded, 2 gradients too, 3 weights too
  bool zero3_prefetch = true;  // --zero3-prefetch: ZeRO-3 gathers the next bucket ahead of its read
  bool optimizer_offload = false;  // --optimizer-cpu-offload: the optimizer's state and update on the host
  train::DataAxisFlags axis;  // --dp-allreduce, --ranks-per-node, --grad-compression and its sizes
  std::int64_t micro_batch = 4, global_batch = 32;
  std::int64_t layers = 4, hidden = 128, heads = 4, seq = 64, vocab = 0;
  std::string model_size;        // a named shape (models::kGptPresets); explicit shape flags override it
  bool dry_run = false;          // print the memory estimate per rank kind and exit
  double gpu_memory_gib = 0;     // plan against this much per GPU instead of the device's (0: the device's)
  // --recompute-granularity (Megatron's name): none | selective (the MLP's GELU output recomputed;
  // attention keeps no (T, T) scores on GPUs anyway) | full (each block keeps its input only and
  // runs its forward again in backward); "" the device's default: selective on GPUs, none on CPU ranks.
  std::string recompute_granularity;
  bool recompute_activations = false;  // Megatron's switch for --recompute-granularity selective
  std::int64_t iters = 600, warmup = -1, eval_interval = 100, log_interval = 20;  // warmup -1: iters / 10
  double lr = 3e-3, min_lr = 3e-4, weight_decay = 0.1, clip = 1.0;
  std::uint64_t seed = 1234;
  std::string data = data::kFortunesPath;
  std::string metrics = "", tensorboard = "";
  std::string profile_steps = "";
  std::string trace_pipeline = "";
  std::int64_t sample_tokens = 300;
  double temperature = 0.8;
  int top_k = 40;
  std::string prompt = "The ";
  std::string save, resume, export_path, import_path, loss_log, faults;
  bool override_resume = false;
  std::int64_t save_interval = 0, exit_interval = 0;
  int keep = 3;
  int save_max_failures = 3;
  bool resume_fresh_if_corrupt = false;
  std::string on_nonfinite = "stop";
  std::string device = "cpu";
  std::string gpu_comm = "auto";
  bool fp16 = false;
  double loss_scale = 0.0, initial_loss_scale = 65536.0, min_loss_scale = 1.0;  // --loss-scale 0: none (--fp16: dynamic)
  std::int64_t loss_scale_window = 1000;
  double collective_timeout = 300.0;
};

// --inject-fault: see the top of the file.
struct Faults {
  int kill_rank = -1;
  double kill_after = 0.0;
  int hang_rank = -1, kill_steps_rank = -1;
  std::int64_t kill_steps = 0;
  std::int64_t hang_step = -1, nan_step = -1, slow_save_ms = 0, save_fail_step = -1;

  static Faults parse(const std::string& spec) {
    Faults f;
    std::stringstream all(spec);
    for (std::string item; std::getline(all, item, ',');) {
      std::stringstream one(item);
      std::string kind, a, b;
      std::getline(one, kind, ':');
      std::getline(one, a, ':');
      std::getline(one, b, ':');
      try {
        if (kind == "kill") f.kill_rank = std::stoi(a), f.kill_after = std::stod(b);
        else if (kind == "kill-after") f.kill_steps_rank = std::stoi(a), f.kill_steps = std::stoll(b);
        else if (kind == "hang") f.hang_rank = std::stoi(a), f.hang_step = std::stoll(b);
        else if (kind == "nan") f.nan_step = std::stoll(a);
        else if (kind == "slow-save") f.slow_save_ms = std::stoll(a);
        else if (kind == "save-fail") f.save_fail_step = std::stoll(a);
        else throw std::invalid_argument(kind);
      } catch (const std::exception&) {
        DPML_REQUIRE_EVERYWHERE(false, "--inject-fault: cannot parse '" << item << "'");
      }
    }
    return f;
  }
};

template <class Model>
auto* find_parameter(Model& model, const std::string& name) {
  for (auto* p : model.parameters())
    if (p->name() == name) return p;
  return static_cast<std::remove_reference_t<decltype(*model.parameters().front())>*>(nullptr);
}

// --inject-fault save-fail:N, on each rank's background writer thread (CheckpointWriter's
// before_write): from step N on, part of the rank's file lands in step-<S>.tmp/, then the write
// fails with ENOSPC — the error a full disk gives.
inline std::function<void(std::int64_t)> failing_save(std::int64_t from_step, const std::string& root, int rank) {
  if (from_step < 0) return {};
  return [from_step, root, rank](std::int64_t step) {
    if (step < from_step) return;
    const std::string path =
        (std::filesystem::path(root) / (checkpoint::step_dir_name(step) + ".tmp") / ("rank-" + std::to_string(rank) + ".safetensors"))
            .string();
    std::ofstream(path, std::ios::binary) << std::string(4096, '\0');
    throw std::system_error(ENOSPC, std::generic_category(), "cannot write '" + path + "' (--inject-fault save-fail:" +
                                                                 std::to_string(from_step) + ")");
  };
}

// What --recompute-granularity (or --recompute-activations) asks of the model, on a GPU or not.
inline models::GptConfig with_recompute(models::GptConfig c, const Flags& f, bool gpu) {
  models::apply_recompute_granularity(f.recompute_activations        ? "selective"
                                      : !f.recompute_granularity.empty() ? f.recompute_granularity
                                      : gpu                              ? "selective"
                                                                         : "none",
                                      c);
  return c;
}

// The model as --device cuda builds it: V padded to a multiple of 128 (for tp | 128). The memory
// estimate sees the same.
inline models::GptConfig on_gpu(models::GptConfig c, int tp) {
  c.pad_multiple = std::max<std::int64_t>(1, 128 / tp);
  return c;
}


// What every run shares: the flags, the faults to inject, the data, the launch.
struct Run {
  const Flags& f;
  const Faults& faults;
  const comm::Mpi& world;
  data::TokenWindows& train_data;
  data::TokenWindows& val_data;
  double unigram;
  bool own_gpus;  // a GPU per rank: MFU against their peak, their power and energy (train/step_meter.hpp)
};

// Resume or import, the training loop with its checkpoints, progress line and metrics, then the
// export and the sample — the same for a CPU and a GPU trainer.
template <class Trainer>
int train_and_sample(Trainer& trainer, const Run& run) {
  const Flags& f = run.f;
  const Faults& faults = run.faults;
  const comm::Mpi& world = run.world;
  auto& model = trainer.model();
  constexpr bool on_host = std::is_same_v<typename std::remove_reference_t<decltype(model)>::space, HostSpace>;
  const optim::WarmupCosineLR lr{.max_lr = f.lr, .min_lr = f.min_lr, .warmup_steps = f.warmup, .decay_steps = f.iters};
  // The data's identity: recorded in checkpoints, checked with the seed on resume.
  const std::vector<train::ConfigField> data_fields = {
      {"data.path", "--data-path", std::filesystem::absolute(f.data).lexically_normal().string()},
      {"data.tokens", "--data-path tokens", run.train_data.tokens()}};
  // Where to start: a checkpoint, a GPT-2 file, or the initialisation.
  train::TrainPosition start;
  std::optional<std::string> resume_dir;
  if (!f.resume.empty()) {
    resume_dir = train::resolve_resume(world, f.resume, f.save, f.resume_fresh_if_corrupt);
    if (!resume_dir && world.rank() == 0) std::printf("no usable checkpoint in '%s': starting fresh\n", f.save.c_str());
  }
  DPML_REQUIRE_EVERYWHERE(!resume_dir || f.import_path.empty(),
                          "--import " << f.import_path << " and --resume " << f.resume << ": the checkpoint '" << *resume_dir
                                      << "' would be resumed and the import ignored: drop one of them");
  if (resume_dir) {
    start = train::load_checkpoint(trainer, *resume_dir, f.seq, {.data = data_fields, .override_config = f.override_resume});
    if (world.rank() == 0)
      std::printf("resumed from '%s' at step %lld (epoch %lld, batch %lld)\n", resume_dir->c_str(),
                  static_cast<long long>(start.step), static_cast<long long>(start.epoch), static_cast<long long>(start.batch));
  } else if (!f.import_path.empty()) {
    train::import_gpt2(trainer, f.import_path);
    if (world.rank() == 0) std::printf("imported '%s'\n", f.import_path.c_str());
  }
  std::optional<train::Checkpointer<Trainer>> ckpt;
  if (!f.save.empty())
    ckpt.emplace(trainer, f.save, train::CheckpointerOptions{.keep_last = f.keep, .max_failures = f.save_max_failures, .seq_len = f.seq,
                                                             .extra_config = [&](checkpoint::Json& c) {
                                                               for (const auto& d : data_fields) c.set(d.key, d.value);
                                                             },
                                                             .before_write = failing_save(faults.save_fail_step, f.save, world.rank())});
  std::ofstream loss_log;
  if (!f.loss_log.empty() && world.rank() == 0) loss_log.open(f.loss_log, std::ios::trunc);
  train::Progress progress(f.iters, world.rank(), "tok/s");
  train::MetricsLog metrics(f.metrics, f.tensorboard, world.rank());
  const double tokens_per_step = static_cast<double>(f.global_batch * f.seq);
  const double flops_per_step =  // model FLOPs (train/flops.hpp: 6·N + 12·L·T·C per token, bench/gpt_train's count)
      train::training_flops(train::gpt_forward_flops_per_token(model.config(), f.seq)) * tokens_per_step;
  const auto profile = train::ProfileSteps::parse("--profile-steps", f.profile_steps);
  const bool scaled = trainer.train_options().loss_scaling.mode != optim::LossScaling::Mode::off;
  auto& train_data = run.train_data;
  std::int64_t epoch = start.epoch, b = start.batch;
  train_data.set_epoch(epoch);
  double val = NAN;
  bool finished = true;  // false: stopped by --exit-interval (no export, no sample)
  train::StepMeter<typename std::remove_reference_t<decltype(model)>::space> meter(world, run.own_gpus);  // collective
  const auto loop_start = std::chrono::steady_clock::now();
  for (std::int64_t step = start.step + 1; step <= f.iters; ++step) {
    if (b == train_data.batches_per_epoch()) train_data.set_epoch(++epoch), b = 0;
    if (step == faults.hang_step && world.rank() == faults.hang_rank)
      std::this_thread::sleep_for(std::chrono::hours(1));  // stops calling collectives: the watchdog reports it
    const double rate = lr(step);
    profile.before(step);
    const bool traced = !f.trace_pipeline.empty() && step == f.iters;
    if (traced) trainer.trace_next_step();
    train::StepResult r;
    if constexpr (on_host) {
      auto* poisoned = step == faults.nan_step ? find_parameter(model, "wpe.weight") : nullptr;
      const float kept = poisoned ? poisoned->value()[0] : 0.0f;
      if (poisoned) poisoned->value()[0] = std::numeric_limits<float>::quiet_NaN();
      r = trainer.train_step(train_data.batch(b++), rate);
      if (poisoned) poisoned->value()[0] = kept;
    } else {
      r = trainer.train_step(train_data.batch(b++), rate);
    }
    profile.after(step);
    if (traced) train::write_pipeline_trace(f.trace_pipeline, trainer.grid(), step, f.schedule, trainer.micro_batches(), r.pipeline);
    if (loss_log.is_open()) loss_log << step << ' ' << std::hexfloat << r.loss << std::defaultfloat << ' ' << r.loss << std::endl;
    if (ckpt) {
      ckpt->poll();
      if ((f.save_interval > 0 && step % f.save_interval == 0) || step == f.iters ||
          (f.exit_interval > 0 && step % f.exit_interval == 0)) {
        ckpt->save_async({.step = step, .epoch = epoch, .batch = b});
        if (faults.slow_save_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(faults.slow_save_ms));
      }
    }
    if (world.rank() == faults.kill_steps_rank && step - start.step == faults.kill_steps) std::raise(SIGKILL);
    if (step % f.eval_interval == 0 || step == f.iters) val = trainer.evaluate(run.val_data.batch(0));
    const auto hw = meter.lap(flops_per_step, r.seconds);  // collective: every rank, every step
    metrics.write(step, {{"loss", r.loss}, {"val_loss", val}, {"lr", rate},
                         {"grad_norm", r.grad_norm}, {"tokens_per_s", tokens_per_step / r.seconds},
                         {"exposed_comm_s", r.exposed_comm_seconds}, {"pipeline_wait_s", r.pipeline.wait},
                         {"wire_bytes", double(r.wire_bytes)}, {"dense_bytes", double(r.dense_bytes)},
                         {"tensor_bytes", double(r.tensor_bytes)}, {"pipeline_bytes", double(r.pipeline.sent_bytes)},
                         {"elapsed_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count()}},
                  hw.metrics("energy_j_per_token", tokens_per_step));
    if (step % f.log_interval == 0 || step == 1 || step == f.iters) {
      // A named list: nvcc's front end mangles a braced list written in the call. NaNs are left
      // out: "val" before the first evaluation, "mfu%" without a known peak.
      const std::initializer_list<train::Metric> extra = {{"val", val}, {"lr", rate}, {"gnorm", r.grad_norm},
                                                          {"loss scale", scaled ? trainer.loss_scale() : NAN},
                                                          {"mfu%", 100 * hw.mfu}, {"mem GiB", hw.peak_memory_gib},
                                                          {"W", hw.power.watts},
                                                          {"wire MB", r.dense_bytes > 0 ? double(r.wire_bytes) / 1e6 : NAN}};
      progress.print(step, r.loss, tokens_per_step / r.seconds, extra);
    }
    if (f.exit_interval > 0 && step % f.exit_interval == 0 && step < f.iters) {
      if (world.rank() == 0) std::printf("exiting after step %lld (--exit-interval %lld)\n", static_cast<long long>(step),
                                         static_cast<long long>(f.exit_interval));
      finished = false;
      break;
    }
  }
  if (ckpt) {
    const double blocked = ckpt->blocking_seconds();  // inside the training loop
    const auto t0 = std::chrono::steady_clock::now();
    ckpt->wait();
    const double last = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (world.rank() == 0 && ckpt->saves() > 0) {
      const double n = ckpt->saves();
      std::printf("checkpoints: %d saved in '%s'; training blocked %.1f ms per save, %.1f ms from save to commit; "
                  "the last committed %.1f ms after training\n",
                  ckpt->saves(), f.save.c_str(), 1e3 * blocked / n, 1e3 * ckpt->total_seconds() / n, 1e3 * last);
    }
  }
  if (!finished) return 0;
  if (!f.export_path.empty()) {
    train::export_gpt2(trainer, f.export_path);
    if (world.rank() == 0)
      std::printf("exported '%s'%s\n", f.export_path.c_str(),
                  train::is_hf_directory(f.export_path) ? " (model.safetensors, config.json: transformers' GPT2LMHeadModel)" : "");
  }
  if (world.rank() == 0) {
    std::printf("final validation loss %.3f nats (%.3f bits/%s) vs unigram entropy %.3f nats", val, val / std::log(2.0),
                f.vocab == data::kByteVocab ? "byte" : "token", run.unigram);
    if (scaled) std::printf(" | loss scale %g", trainer.loss_scale());
    std::printf("\n");
    if (f.optimizer_offload) {
      const auto t = trainer.optimizer().optimizer().offload_seconds();
      std::printf("offloaded optimizer, last step on rank 0: %.3f s waiting for the gradients' copies, %.3f s updating on the host\n",
                  t.waiting, t.updating);
    }
  }
  if (f.sample_tokens > 0) {
    std::vector<std::int32_t> prompt;
    for (unsigned char c : f.prompt) prompt.push_back(c);
    const auto out = trainer.generate(prompt, static_cast<int>(f.sample_tokens), f.temperature, f.top_k, f.seed);
    if (world.rank() == 0 && f.vocab == data::kByteVocab)
      std::printf("---- sample (temperature %.2f, top-k %d) ----\n%s\n----\n", f.temperature, f.top_k,
                  data::bytes_to_text(out).c_str());
  }
  return 0;
}

inline optim::AdamWOptions adamw_of(const Flags& f) { return {.beta2 = 0.95, .weight_decay = f.weight_decay}; }
// --loss-scale S: static; else --fp16: dynamic (Megatron's rule); else none.
inline optim::LossScaling loss_scaling_of(const Flags& f) {
  if (f.loss_scale > 0.0) return optim::LossScaling::fixed_at(f.loss_scale);
  if (f.fp16)
    return optim::LossScaling::dynamic_from(
        {.initial = f.initial_loss_scale, .window = f.loss_scale_window, .min = f.min_loss_scale});
  return {};
}
// The parallel runtime's options: ZeRO-2 and 3, clipping, the compression's sizes (both spaces).
inline parallel::DistributedOptimizerOptions dist_of(const Flags& f) {
  return {.shard_gradients = f.zero_stage >= 2, .shard_values = f.zero_stage == 3, .prefetch_values = f.zero3_prefetch,
          .offload_optimizer = f.optimizer_offload, .clip = f.clip,
          .compression = f.axis.compression(f.seed)};
}
inline train::GptTrainOptions train_options_of(const Flags& f) {
  return {.micro_batch = f.micro_batch, .global_batch = f.global_batch, .seed = f.seed,
          .on_nonfinite = train::parse_nonfinite(f.on_nonfinite), .loss_scaling = loss_scaling_of(f)};
}

#ifdef DPML_WITH_CUDA
// Where --device cuda put this rank (gpu_placement.cu).
struct GpuRanks {
  bool staged = false;          // ranks share GPUs and talk through comm::Staged (else NCCL, a GPU each)
  double bytes_per_rank = 0.0;  // free device memory per rank on its GPU, the smallest over the world
};
// comm::place_on_gpus (--gpu-comm), and the free memory each rank may plan with. Call before any
// CUDA allocation. Collective.
GpuRanks place_ranks_on_gpus(const comm::Mpi& world, const std::string& gpu_comm);

// --device cuda (gpu_bf16.cu, gpu_fp16.cu): the model and trainer on this rank's GPU in bf16 or
// fp16, over comm::Staged where ranks share GPUs (staged), else NCCL.
int train_on_gpus_bf16(const models::GptConfig& config, const parallel::ProcessGrid& grid, const Run& run, bool staged);
int train_on_gpus_fp16(const models::GptConfig& config, const parallel::ProcessGrid& grid, const Run& run, bool staged);
#endif
}  // namespace train_gpt
