// train_gpt: a GPT trained with data, tensor and pipeline parallelism on the CPU ranks of an MPI
// launch or on GPUs (--device cuda, one rank per GPU), then sampled. Flags follow Megatron-LM's
// names.
//
//   mpiexec -n 8 build/cpu/examples/train_gpt/train_gpt --tp 2 --pp 2 --schedule zb-h1
//   mpiexec -n 2 build/cuda/examples/train_gpt/train_gpt --device cuda --tp 2 --micro-batch 16 --global-batch 32
//
// One model and one trainer on both: models::Gpt (models/gpt.hpp, composed from the layers) and
// train::GptTrainer (train/trainer.hpp). --device cuda (CUDA builds) builds them on CudaSpace in
// bf16 with fp32 master weights and optimizer state, each rank on its own GPU talking NCCL — or,
// where a node has fewer GPUs than ranks (or --gpu-comm staged), its ranks share the GPUs round
// robin and talk through comm::Staged (device buffers staged through the host over MPI: for tests
// and small machines). --tp, --pp, --schedule, --zero as on the CPU; the GELU output is recomputed
// in the backward and the vocabulary padded to 128 rows per tensor rank. Head dim 32, 64 or 128.
// --grad-compression bf16 | fp16 | powersgd | topk (CPU ranks, flat all-reduce; --powersgd-rank,
// --topk-ratio) compresses the data axis' gradient buckets (parallel/compression/policy.hpp); the
// progress line shows the megabytes each rank sent per step.
// --fp16 trains in IEEE fp16 instead (fp32 master weights and state) with dynamic loss scaling
// (optim/loss_scale.hpp; Megatron's --initial-loss-scale, --loss-scale-window, --min-loss-scale):
// an overflowed step is skipped and the scale halved, rank 0 saying so. --loss-scale S is a static
// scale instead (on CPU ranks too, where it multiplies fp32 gradients). The progress line and the
// final line show the scale when there is one; checkpoints keep the dynamic scaler.
//
// Data: a text file or directory (byte-level, vocabulary 256; default: the Debian `fortunes`
// package), or llm.c token shards (--data-path 'dir/*.bin' --vocab-size N: a glob, a *.bin path or
// a file with the llm.c header). Read before anything is built, every rank alike: a glob matching
// nothing, a malformed shard, a token id >= --vocab-size (training or validation part), a text
// file that is binary or a directory holding shards are refused naming the file.
//
// Checkpoints (train/checkpointing.hpp): --save DIR --save-interval N --keep K saves
// asynchronously every N steps and at the end; --resume latest (or DIR/step-N) continues from
// the newest complete checkpoint — on any layout and either device: a GPU run saves its fp32
// master weights and moments in the CPU's format — or starts fresh with a message when DIR has
// none. Corrupt checkpoints are skipped (named); when all are, the run stops unless
// --resume-fresh-if-corrupt. A failed save is reported and retried at the next interval;
// --save-max-failures K in a row stop the run.
//
// Sizes: --model-size 124m|350m|1.3b|2.7b|6.7b names a shape (models/gpt.hpp: kGptPresets); the
// shape flags given beside it override its values. Memory (models/gpt_memory.hpp): --dry-run
// prints each rank kind's estimate — parameters, gradients, optimizer state (sharded by --zero),
// activations per micro-batch in flight, buffers, workspace and NCCL — against the memory a rank
// has (--gpu-memory-gib G plans a GPU run on any machine) and exits 0 without allocating or reading
// the data; without it a layout whose estimate exceeds that memory is refused before anything is
// allocated, naming the flags and the estimate. A resume refuses a --seed or data (--data-path, its token count) other than the
// checkpoint's, which would change the data order, unless --override-resume-config. --export
// FILE.safetensors writes the model with GPT-2's names at the end; --export DIR/ (a path ending
// in '/', or an existing directory) writes a Hugging Face directory instead — model.safetensors
// and config.json, which transformers' GPT2LMHeadModel.from_pretrained(DIR) loads
// (train/hf_gpt2.hpp). --import starts from either, or from a save_pretrained file or directory
// (a config.json there must describe this model: --num-layers, --hidden-size, …); it must hold
// exactly the model's parameters — refused beside a --resume that finds a checkpoint (the import
// would be ignored). --on-nonfinite skip|stop;
// --collective-timeout S (the watchdog, comm/watchdog.hpp). examples/restart/ shows restart loops
// around this program. --metrics FILE.jsonl and --tensorboard DIR (a run directory per launch in
// it): rank 0 records every step's metrics (train/progress.hpp). --profile-steps A:B brackets steps
// A..B for a profiler (train/profile_steps.hpp; NVTX ranges name each micro-batch's F/B/W, bucket
// reductions, the optimizer step, saves); --trace-pipeline FILE writes every rank's F/B/W and waits
// of the last step (train/pipeline_trace.hpp).
//
// --inject-fault is for tests only (tests/resilience): comma-separated
//   kill:R:S      world rank R SIGKILLs itself S seconds (a decimal) after start
//   kill-after:R:N world rank R SIGKILLs itself after its N-th step of this launch (its save
//                 of that step, if any, still in flight)
//   hang:R:N      world rank R stops calling collectives before step N (sleeps)
//   nan:N         step N sees a NaN weight (wpe.weight[0], restored after the step; --device cpu)
//   slow-save:MS  every rank sleeps MS ms after starting each save (a wider window mid-save)
//   save-fail:N   the saves of step N and later fail on every rank as on a full disk: each rank
//                 writes 4 KiB of its file into step-<S>.tmp/, then fails with ENOSPC (where a
//                 test cannot mount a small tmpfs)
#include <dpml/comm/launch.hpp>
#include <dpml/comm/watchdog.hpp>
#include <dpml/data/text.hpp>
#include <dpml/data/token_shards.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/gpt.hpp>
#include <dpml/models/gpt_memory.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/optim/loss_scale.hpp>
#include <dpml/optim/schedule.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/args.hpp>
#include <dpml/train/data_axis_flags.hpp>
#include <dpml/train/checkpointing.hpp>
#include <dpml/train/gpt_trainer.hpp>
#include <dpml/train/flops.hpp>
#include <dpml/train/hf_gpt2.hpp>
#include <dpml/train/memory_fit.hpp>
#include <dpml/train/pipeline_trace.hpp>
#include <dpml/train/profile_steps.hpp>
#include <dpml/train/progress.hpp>
#include <dpml/train/step_meter.hpp>
#include <dpml/train/tensorboard.hpp>
#ifdef DPML_WITH_CUDA
#include <dpml/comm/cuda_placement.hpp>
#include <dpml/core/bf16.hpp>
#include <dpml/core/cuda_space.hpp>
#include <dpml/kernels/cuda/common.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/parallel/device_grid.hpp>
#endif

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

using namespace dpml;

namespace {
struct Flags {
  int tp = 1, pp = 1;
  std::string schedule = "1f1b";
  bool zero = false;
  train::DataAxisFlags axis;  // --dp-allreduce, --ranks-per-node, --grad-compression and its sizes
  std::int64_t micro_batch = 4, global_batch = 32;
  std::int64_t layers = 4, hidden = 128, heads = 4, seq = 64, vocab = 0;
  std::string model_size;        // a named shape (models::kGptPresets); explicit shape flags override it
  bool dry_run = false;          // print the memory estimate per rank kind and exit
  double gpu_memory_gib = 0;     // plan against this much per GPU instead of the device's (0: the device's)
  bool recompute = false;
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
std::function<void(std::int64_t)> failing_save(std::int64_t from_step, const std::string& root, int rank) {
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

// The model as --device cuda builds it: one GELU output for all blocks, recomputed in the backward;
// V padded to a multiple of 128 (for tp | 128). The memory estimate sees the same.
models::GptConfig on_gpu(models::GptConfig c, int tp) {
  c.recompute_gelu = true;
  c.pad_multiple = std::max<std::int64_t>(1, 128 / tp);
  return c;
}

// Token shards: a glob, a *.bin path or a file that starts with the llm.c magic; text otherwise.
bool is_token_shards(const std::string& path) {
  return path.find_first_of("*?[") != std::string::npos || path.ends_with(".bin") || data::is_token_shard_file(path);
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

optim::AdamWOptions adamw_of(const Flags& f) { return {.beta2 = 0.95, .weight_decay = f.weight_decay}; }
// --loss-scale S: static; else --fp16: dynamic (Megatron's rule); else none.
optim::LossScaling loss_scaling_of(const Flags& f) {
  if (f.loss_scale > 0.0) return optim::LossScaling::fixed_at(f.loss_scale);
  if (f.fp16)
    return optim::LossScaling::dynamic_from(
        {.initial = f.initial_loss_scale, .window = f.loss_scale_window, .min = f.min_loss_scale});
  return {};
}
train::GptTrainOptions train_options_of(const Flags& f) {
  return {.micro_batch = f.micro_batch, .global_batch = f.global_batch, .seed = f.seed,
          .on_nonfinite = train::parse_nonfinite(f.on_nonfinite), .loss_scaling = loss_scaling_of(f)};
}

#ifdef DPML_WITH_CUDA
// --device cuda: the model and trainer on this rank's GPU (Comm: comm::Nccl, or comm::Staged
// where ranks share GPUs), T = bf16 (or fp16: --fp16) with fp32 master weights.
template <class T, class Comm>
int train_on_gpu(models::GptConfig config, const parallel::ProcessGrid& grid, const Run& run) {
  const Flags& f = run.f;
  config = on_gpu(config, f.tp);
  kernels::Device<CudaSpace> dev;
  return parallel::with_strategy(parallel::staged_model_schedule(f.schedule), f.zero, f.axis.dp_allreduce, [&]<class Strategy>() {
    const parallel::DeviceGrid<Comm, parallel::data_comm_t<Strategy, Comm>> comms(grid, dev);
    models::Gpt<T, CudaSpace, Comm> model(config, comms);
    layers::initialize_all(model.parameters(), f.seed, &grid);  // the CPU's initial weights, rounded to T
    train::GptTrainer<Strategy, optim::AdamW, T, CudaSpace, Comm> trainer(model, comms, dev, adamw_of(f), {.clip = f.clip},
                                                                          train_options_of(f));
    return train_and_sample(trainer, run);
  });
}

// A GPU per rank (NCCL) where every node has enough of them, unless --gpu-comm staged; else each
// node's ranks share its GPUs round robin and talk through comm::Staged, said once. Collective.
comm::GpuPlacement place_ranks_on_gpus(const comm::Mpi& world, const std::string& choice) {
  const comm::GpuPlacement gpus = comm::place_on_gpus(world, choice);
  if (gpus.comm == comm::GpuComm::staged && world.rank() == 0)
    std::printf("dpml train_gpt: %d ranks per node on %d GPU(s): device buffers travel through the host (comm::Staged)\n",
                gpus.node_ranks, gpus.devices);
  return gpus;
}
#endif
}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const comm::Mpi& world) {
    Flags f;
    train::Args args("train_gpt", "Trains a GPT with data (rest of the world), tensor (--tp) and pipeline (--pp)\n"
                                  "parallelism on CPU ranks or on GPUs (--device cuda), then samples text from it.");
    args.flag("--device", f.device, "cpu (the ranks' cores) | cuda (a GPU per rank, bf16)")
        .flag("--gpu-comm", f.gpu_comm, "--device cuda: auto | nccl (a GPU per rank) | staged (ranks sharing GPUs, through the host)")
        .flag("--fp16", f.fp16, "--device cuda: IEEE fp16 instead of bf16 (fp32 master weights), with dynamic loss scaling")
        .flag("--loss-scale", f.loss_scale, "static loss scale S (0: none; with --fp16 the scale is dynamic); on CPU ranks it scales fp32 gradients",
              train::at_least(0.0))
        .flag("--initial-loss-scale", f.initial_loss_scale, "--fp16's dynamic loss scale at the start", train::positive<double>())
        .flag("--loss-scale-window", f.loss_scale_window, "--fp16: clean steps after which the dynamic loss scale doubles", train::at_least(1))
        .flag("--min-loss-scale", f.min_loss_scale, "--fp16: the dynamic loss scale's floor", train::positive<double>())
        .flag("--tp", f.tp, "tensor-parallel degree", train::at_least(1))
        .flag("--pp", f.pp, "pipeline-parallel degree (stages)", train::at_least(1))
        .flag("--schedule", f.schedule, "pipeline schedule: gpipe | 1f1b | zb-h1")
        .flag("--zero", f.zero, "ZeRO-1: shard the optimizer state over the data-parallel ranks")
        .flag("--micro-batch", f.micro_batch, "sequences per micro-batch", train::at_least(1))
        .flag("--global-batch", f.global_batch, "sequences per step over all data-parallel ranks", train::at_least(1))
        .flag("--model-size", f.model_size,
              "a named shape: 124m | 350m (GPT-2, T 1024) | 1.3b | 2.7b | 6.7b (GPT-3, T 2048); --num-layers, --hidden-size, "
              "--num-attention-heads, --seq-length given beside it override its values",
              [](const std::string& v) { (void)models::gpt_preset(v); })
        .flag("--dry-run", f.dry_run,
              "print each rank kind's estimated memory (parameters, gradients, optimizer state, activations, buffers, "
              "workspace) against the memory a rank has, then exit 0 without allocating or reading the data")
        .flag("--gpu-memory-gib", f.gpu_memory_gib,
              "--device cuda: plan against this many GiB per GPU instead of the device's free memory (0: the device's; "
              "with --dry-run no GPU is needed)", train::at_least(0.0))
        .flag("--num-layers", f.layers, "transformer blocks", train::at_least(1))
        .flag("--hidden-size", f.hidden, "model width C", train::at_least(1))
        .flag("--num-attention-heads", f.heads, "attention heads", train::at_least(1))
        .flag("--seq-length", f.seq, "tokens per sequence T", train::at_least(1))
        .flag("--vocab-size", f.vocab, "vocabulary (0: 256 bytes for text, 65536 for token shards)", train::at_least(0))
        .flag("--recompute-activations", f.recompute, "recompute each block's activations in backward");
    train::lm_schedule_flags(args, f.iters, f.lr, f.min_lr, f.warmup, f.weight_decay, f.clip)
        .flag("--seed", f.seed, "seed of initialisation, data order and sampling")
        .flag("--data-path", f.data, "text file or directory (bytes), or llm.c token shards (*.bin, globs, llm.c header)");
    train::lm_reporting_flags(args, f.eval_interval, f.log_interval, f.metrics, f.tensorboard)
        .flag("--trace-pipeline", f.trace_pipeline, "JSON of every rank's F/B/W and waits in the last step (scripts/plot-metrics.py --trace)")
        .flag("--profile-steps", f.profile_steps, "A:B: a profiler records steps A to B (cudaProfilerStart/Stop; nsys --capture-range=cudaProfilerApi)",
              [](const std::string& v) { (void)train::ProfileSteps::parse("--profile-steps", v); })
        .flag("--sample-tokens", f.sample_tokens, "tokens to sample at the end (0: none)", train::at_least(0))
        .flag("--temperature", f.temperature, "sampling temperature (0: always the most likely token)", train::at_least(0.0))
        .flag("--top-k", f.top_k, "sample among the k most likely tokens (0: all)", train::at_least(0))
        .flag("--prompt", f.prompt, "text the sample continues")
        .flag("--save", f.save, "checkpoint directory (empty: no checkpoints)")
        .flag("--save-interval", f.save_interval, "steps between checkpoints (0: only at the end)", train::at_least(0))
        .flag("--exit-interval", f.exit_interval, "stop (saving a checkpoint) after a step divisible by this (0: never)", train::at_least(0))
        .flag("--keep", f.keep, "complete checkpoints kept (0: all)", train::at_least(0))
        .flag("--save-max-failures", f.save_max_failures,
              "failed saves in a row that stop the run (the ones before are reported; training goes on)", train::at_least(1))
        .flag("--resume-fresh-if-corrupt", f.resume_fresh_if_corrupt,
              "--resume latest starts fresh when every checkpoint in --save is corrupt (else the run stops)")
        .flag("--resume", f.resume, "latest (newest complete checkpoint in --save) or DIR/step-N")
        .flag("--override-resume-config", f.override_resume,
              "resume even if --seed or the data differ from the checkpoint's (the data order then changes)")
        .flag("--export", f.export_path,
              "write the trained model: FILE.safetensors (GPT-2's names) or DIR/ (Hugging Face: model.safetensors, config.json)")
        .flag("--import", f.import_path,
              "start from GPT-2 weights: a safetensors file or a Hugging Face directory (exactly the model's parameters)")
        .flag("--on-nonfinite", f.on_nonfinite, "non-finite loss or gradient: stop | skip (no update) | ignore (no check)")
        .flag("--collective-timeout", f.collective_timeout, "seconds a collective may wait before the job is ended (0: off)", train::at_least(0.0))
        .flag("--loss-log", f.loss_log, "rank 0 writes 'step loss(hex) loss' per step to this file")
        .flag("--inject-fault", f.faults, "tests only: kill:R:S, kill-after:R:N, hang:R:N, nan:N, slow-save:MS, save-fail:N");
    train::data_axis_flags(args, f.axis);
    if (!args.parse(argc, argv, world.rank())) return 0;
    const char* shape_flags[] = {"--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length"};
    models::apply_gpt_preset(f.model_size, [&](int i) { return args.given(shape_flags[i]); }, f.layers, f.hidden, f.heads, f.seq);

    DPML_REQUIRE_EVERYWHERE(f.device == "cpu" || f.device == "cuda", "--device " << f.device << " is not one of cpu, cuda");
    f.axis.require_device(f.device);
    DPML_REQUIRE_EVERYWHERE(!f.fp16 || f.device == "cuda", "--fp16 trains IEEE fp16 on GPUs (--device cuda); CPU ranks train fp32 "
                                                           "(--loss-scale S still scales their gradients)");
    DPML_REQUIRE_EVERYWHERE(f.initial_loss_scale >= f.min_loss_scale, "--initial-loss-scale " << f.initial_loss_scale
                                                                      << " is below --min-loss-scale " << f.min_loss_scale);
    DPML_REQUIRE_EVERYWHERE(f.device == "cpu" || f.faults.find("nan:") == std::string::npos,
                            "--inject-fault nan:N poisons a host weight: --device cpu only");
    train::require_writable_output("--metrics", f.metrics);
    train::require_writable_directory("--tensorboard", f.tensorboard);
    train::require_writable_output("--loss-log", f.loss_log);
    train::require_writable_export("--export", f.export_path);
    train::require_writable_output("--trace-pipeline", f.trace_pipeline);
    train::resolve_lr_warmup(f.warmup, f.iters);
    const Faults faults = Faults::parse(f.faults);
    (void)train::parse_nonfinite(f.on_nonfinite);  // refused on every rank before anything is built
    comm::watchdog::set_timeout(f.collective_timeout);
    if (faults.kill_rank == world.rank())
      std::thread([s = faults.kill_after] {
        std::this_thread::sleep_for(std::chrono::duration<double>(s));
        std::raise(SIGKILL);
      }).detach();
#ifdef DPML_WITH_CUDA
    std::optional<comm::GpuPlacement> gpus;  // --device cuda (not for a dry run against --gpu-memory-gib: no GPU needed)
    if (f.device == "cuda" && !(f.dry_run && f.gpu_memory_gib > 0))
      gpus = place_ranks_on_gpus(world, f.gpu_comm);  // before any CUDA allocation
    const bool staged = gpus && gpus->comm == comm::GpuComm::staged;
#else
    DPML_REQUIRE_EVERYWHERE(f.device == "cpu" || (f.dry_run && f.gpu_memory_gib > 0),
                            "--device cuda: this train_gpt was built without CUDA (build it with the cuda preset; "
                            "--dry-run --gpu-memory-gib G plans a GPU run without one)");
#endif
    auto grid = ProcessGrid::create(world, {.tp = f.tp, .pp = f.pp, .ranks_per_node = f.axis.ranks_per_node});
    const int dp_rank = grid.coord(Axis::data);

    // Data: train / validation windows, this data rank's share of each global batch.
    const data::WindowOptions wo{.seq_len = f.seq, .global_batch = f.global_batch, .seed = f.seed};
    data::TokenSplit split;
    const bool shards = is_token_shards(f.data);
    if (f.vocab == 0) f.vocab = shards ? data::kTokenShardVocab : data::kByteVocab;
    const models::GptConfig config{.vocab = f.vocab, .max_seq = f.seq, .layers = f.layers, .heads = f.heads,
                                   .dim = f.hidden, .recompute = f.recompute};
    {  // the estimate per rank kind: printed (--dry-run), or a size that cannot fit refused now, not by
       // std::bad_alloc or cudaErrorMemoryAllocation later
      const bool gpu = f.device == "cuda";
      const models::GptLayout layout{.tp = f.tp, .pp = f.pp, .dp = grid.dp(), .micro_batch = f.micro_batch,
                                     .micro_batches = static_cast<int>(std::max<std::int64_t>(1, f.global_batch / (f.micro_batch * grid.dp()))),
                                     .schedule = f.schedule, .zero = f.zero};
      const auto estimate = models::estimate_gpt_memory(gpu ? on_gpu(config, f.tp) : config, layout,
                                                        gpu ? models::GptMemoryTerms::gpu() : models::GptMemoryTerms::host());
      double have = gpu ? f.gpu_memory_gib * (1 << 30) : train::host_bytes_per_rank(world);
      const char* memory = gpu ? train::kPlannedMemory : train::kHostMemory;
#ifdef DPML_WITH_CUDA
      if (gpu && f.gpu_memory_gib == 0) have = train::device_bytes_per_rank(world, *gpus), memory = train::kDeviceMemory;
#endif
      if (f.dry_run) {
        if (world.rank() == 0) std::fputs(models::memory_table(estimate, have, gpu ? "GPU" : "host").c_str(), stdout);
        return 0;
      }
      const models::GptStageMemory& big = estimate.largest();
      std::ostringstream what;
      what.precision(3);
      constexpr double GiB = 1 << 30;
      what << "the GPT of --num-layers " << f.layers << ", --hidden-size " << f.hidden << ", --num-attention-heads " << f.heads
           << ", --vocab-size " << f.vocab << ", --seq-length " << f.seq << ", --micro-batch " << f.micro_batch << " on --tp "
           << f.tp << " --pp " << f.pp << " (dp " << grid.dp() << ", --schedule " << f.schedule << (f.zero ? ", --zero" : "")
           << ") — on pipeline stage " << big.stage << ": parameters " << big.parameters / GiB << ", gradients " << big.gradients / GiB
           << ", optimizer state " << big.optimizer / GiB << ", activations " << big.activations / GiB << " (micro-batches in flight: "
           << big.in_flight << "), buffers " << big.buffers / GiB << ", workspace " << big.workspace / GiB
           << " GiB, --dry-run shows every rank kind —";
      train::require_fits(world, big.total(), have, what.str(), memory);
    }
    if (shards) {  // memory-mapped: each rank reads only its windows (every id checked once, validation part included)
      const auto all = data::TokenStore::map_shards({f.data}, f.vocab);
      const auto cut = all.size() - all.size() / 20;
      split = {all.slice(0, cut), all.slice(cut, all.size())};
    } else {
      const std::string text = data::read_text(f.data);
      data::require_tokens_below(data::byte_tokens(text), f.vocab, "text '" + f.data + "'");  // --vocab-size below 256
      split = data::split_text(text, 0.05);
    }
    auto lm = data::lm_windows(std::move(split), static_cast<int>(f.vocab), wo, dp_rank, grid.dp(), f.data);
    auto& train_data = lm.train;
    const double unigram = lm.unigram_entropy;

    if (world.rank() == 0)
      std::printf("dpml train_gpt: %s%s | schedule %s%s%s | %lld parameters | %lld train tokens | unigram entropy %.3f nats\n",
                  f.device == "cpu" ? "" : f.fp16 ? "GPUs (fp16) " : "GPUs (bf16) ", grid.describe().c_str(), f.schedule.c_str(), f.zero ? " + ZeRO-1" : "",
                  f.axis.describe(" | ").c_str(),
                  static_cast<long long>(config.parameter_count()), static_cast<long long>(train_data.tokens()), unigram);
    bool own_gpus = false;  // MFU and power need a GPU per rank
#ifdef DPML_WITH_CUDA
    own_gpus = f.device == "cuda" && !staged;
#endif
    const Run run{f, faults, world, train_data, lm.validation, unigram, own_gpus};
#ifdef DPML_WITH_CUDA
    if (f.device == "cuda") {
      if (f.fp16)
        return staged ? train_on_gpu<kernels::cuda::f16, comm::Staged>(config, grid, run)
                      : train_on_gpu<kernels::cuda::f16, comm::Nccl>(config, grid, run);
      return staged ? train_on_gpu<bf16, comm::Staged>(config, grid, run) : train_on_gpu<bf16, comm::Nccl>(config, grid, run);
    }
#endif
    models::Gpt<float> model(config, grid);
    layers::initialize_all(model.parameters(), f.seed, &grid);
    const parallel::DistributedOptimizerOptions dist{
        .clip = f.clip, .compression = f.axis.compression(f.seed)};
    return parallel::with_strategy(parallel::staged_model_schedule(f.schedule), f.zero, f.axis.dp_allreduce, f.axis.grad_compression, [&]<class Strategy>() {
      train::GptTrainer<Strategy, optim::AdamW> trainer(model, grid, adamw_of(f), dist, train_options_of(f));
      return train_and_sample(trainer, run);
    });
  });
}
