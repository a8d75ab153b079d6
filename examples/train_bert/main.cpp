// train_bert: a BERT-style encoder (models::Bert: token and position embeddings, pre-LN blocks of
// bidirectional attention, the masked-LM head tied to the token embedding) trained as a masked
// language model on the CPU ranks or GPUs of an MPI launch, with data parallelism over what --tp and --pp
// leave of the world, tensor parallelism (attention heads, MLP and vocabulary split) over --tp
// ranks and pipeline parallelism (the blocks cut into --pp stages) — the layouts of train_gpt, with
// its flag names (Megatron-LM's).
//
//   mpiexec -n 2 build/cpu/examples/train_bert/train_bert                    # dp 2
//   mpiexec -n 2 build/cpu/examples/train_bert/train_bert --tp 2             # heads split
//   mpiexec -n 2 build/cpu/examples/train_bert/train_bert --pp 2             # blocks split
//
// Data: a text file or directory (its bytes; default: the Debian `fortunes` package), or llm.c
// token shards (--data-path 'dir/*.bin', --vocab-size N), cut into --seq-length windows, the last
// 5 % for validation. Masking (data/masked_lm.hpp): each position chosen with probability
// --mask-prob (0.15), a chosen one [MASK] 80 %, a random token 10 %, itself 10 %, drawn from Philox
// by (--seed, window, position) so every layout masks alike; training windows draw anew every
// epoch, validation windows keep theirs. Vocabulary: the 256 bytes and [MASK] = 256 (V = 257), or
// the shards' V tokens and [MASK] = V. The loss is the mean cross-entropy over the masked
// positions of the global batch. Every --eval-interval steps (and at the end) --eval-iters global
// batches of validation windows give the masked-LM loss and the masked-token accuracy (the share
// of masked positions whose original token has the largest logit). AdamW, linear warm-up and cosine
// decay, gradient clipping; the progress line and --metrics / --tensorboard records as train_lstm's.
// --device cuda (the cuda preset's build): one GPU per rank over NCCL, or ranks sharing GPUs over
// comm::Staged; bf16 storage with fp32 master weights, the same layouts, data and masking.
//
//   scripts/launch.sh -n 2 build/cuda/examples/train_bert/train_bert --device cuda   # dp 2 on 2 GPUs
#include <dpml/comm/launch.hpp>
#include <dpml/data/masked_lm.hpp>
#include <dpml/data/text.hpp>
#include <dpml/data/token_shards.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/bert.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/optim/schedule.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/args.hpp>
#include <dpml/train/progress.hpp>
#include <dpml/train/trainer.hpp>

#ifdef DPML_WITH_CUDA
#include <dpml/comm/cuda_placement.hpp>
#include <dpml/core/bf16.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/parallel/device_grid.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

using namespace dpml;

namespace {
struct Flags {
  int tp = 1, pp = 1;
  std::string schedule = "1f1b";
  bool zero = false;
  std::int64_t micro_batch = 8, global_batch = 32;
  std::int64_t layers = 4, hidden = 128, heads = 4, seq = 128, vocab = 0;
  double mask_prob = 0.15;
  std::int64_t iters = 300, warmup = -1, eval_interval = 100, eval_iters = 8, log_interval = 20;  // warmup -1: iters / 10
  double lr = 1e-3, min_lr = 1e-4, weight_decay = 0.01, clip = 1.0;
  std::uint64_t seed = 1234;
  std::string data = data::kFortunesPath;
  std::string metrics, tensorboard;
  std::string device = "cpu", gpu_comm = "auto";
};

// Masked-LM loss (mean of the batches' per-masked-token means) and masked-token accuracy over
// `batches` global batches of the validation windows (wrapping around).
struct Validation {
  double loss = NAN, accuracy = NAN;
};
template <class Trainer, class Model>
Validation validate(Trainer& trainer, Model& model, const data::MaskedLmWindows& val, std::int64_t batches) {
  double loss = 0, hits = 0, masked = 0;
  for (std::int64_t i = 0; i < batches; ++i) {
    const auto batch = val.batch(i % val.batches_per_epoch());
    loss += trainer.evaluate(batch);
    hits += trainer.sum_over_last_stage(model.take_hits());
    masked += static_cast<double>(batch.global_masked);
  }
  return {loss / static_cast<double>(batches), masked > 0 ? hits / masked : NAN};
}

template <class Trainer, class Model>
int train_and_validate(Trainer& trainer, Model& model, const Flags& f, const comm::Mpi& world, data::MaskedLmWindows& windows,
                       const data::MaskedLmWindows& val) {
  const optim::WarmupCosineLR lr{.max_lr = f.lr, .min_lr = f.min_lr, .warmup_steps = f.warmup, .decay_steps = f.iters};
  train::Progress progress(f.iters, world.rank(), "tok/s");
  train::MetricsLog metrics(f.metrics, f.tensorboard, world.rank());
  const double tokens_per_step = static_cast<double>(f.global_batch * f.seq);
  const auto start = std::chrono::steady_clock::now();
  const Validation first = validate(trainer, model, val, f.eval_iters);
  if (world.rank() == 0)
    std::printf("step 0: validation masked-LM loss %.3f nats, masked-token accuracy %.1f %%\n", first.loss, 100 * first.accuracy);
  Validation v = first;
  std::int64_t epoch = 0, b = 0;
  windows.set_epoch(epoch);
  for (std::int64_t step = 1; step <= f.iters; ++step) {
    if (b == windows.batches_per_epoch()) windows.set_epoch(++epoch), b = 0;
    const double rate = lr(step);
    const auto r = trainer.train_step(windows.batch(b++), rate);
    if (step % f.eval_interval == 0 || step == f.iters) v = validate(trainer, model, val, f.eval_iters);
    metrics.write(step, {{"loss", r.loss}, {"val_loss", v.loss}, {"val_accuracy", v.accuracy}, {"lr", rate},
                         {"grad_norm", r.grad_norm}, {"tokens_per_s", tokens_per_step / r.seconds},
                         {"elapsed_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}});
    if (step % f.log_interval == 0 || step == 1 || step == f.iters)
      progress.print(step, r.loss, tokens_per_step / r.seconds,
                     {{"val", v.loss}, {"val acc %", 100 * v.accuracy}, {"lr", rate}, {"gnorm", r.grad_norm}});
  }
  if (world.rank() == 0)
    std::printf("final validation masked-LM loss %.3f nats (step 0: %.3f), masked-token accuracy %.1f %% (step 0: %.1f %%) | "
                "trained in %s\n",
                v.loss, first.loss, 100 * v.accuracy, 100 * first.accuracy,
                train::format_duration(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()).c_str());
  return 0;
}

// Token shards: a glob, a *.bin path or a file with the llm.c header; text otherwise.
bool names_token_shards(const std::string& path) {
  return path.find_first_of("*?[") != std::string::npos || path.ends_with(".bin") || data::is_token_shard_file(path);
}
}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const comm::Mpi& world) {
    Flags f;
    train::Args args("train_bert", "Trains a BERT-style encoder as a masked language model on a text (bytes) or token\n"
                                   "shards with data, tensor (--tp) and pipeline (--pp) parallelism on CPU ranks or GPUs;\n"
                                   "prints the validation masked-LM loss and masked-token accuracy.");
    args.flag("--device", f.device, "cpu (the ranks' cores, float) | cuda (a GPU per rank, bf16 with fp32 master weights)")
        .flag("--gpu-comm", f.gpu_comm, "--device cuda: auto | nccl (a GPU per rank) | staged (ranks sharing GPUs, through the host)")
        .flag("--tp", f.tp, "tensor-parallel degree (heads, MLP and vocabulary split)", train::at_least(1))
        .flag("--pp", f.pp, "pipeline-parallel degree (the blocks cut into stages)", train::at_least(1))
        .flag("--schedule", f.schedule, "pipeline schedule: gpipe | 1f1b | zb-h1")
        .flag("--zero", f.zero, "ZeRO-1: shard the optimizer state over the data-parallel ranks")
        .flag("--micro-batch", f.micro_batch, "sequences per micro-batch", train::at_least(1))
        .flag("--global-batch", f.global_batch, "sequences per step over all data-parallel ranks", train::at_least(1))
        .flag("--num-layers", f.layers, "encoder blocks", train::at_least(1))
        .flag("--hidden-size", f.hidden, "model width C", train::at_least(1))
        .flag("--num-attention-heads", f.heads, "attention heads (dividing --hidden-size; divisible by --tp)", train::at_least(1))
        .flag("--seq-length", f.seq, "tokens per sequence T", train::at_least(1))
        .flag("--vocab-size", f.vocab, "tokens of the data (0: 256 bytes for text, 65536 for token shards); [MASK] is one more",
              train::at_least(0))
        .flag("--mask-prob", f.mask_prob, "share of positions chosen for the masked-LM loss (then 80 % [MASK], 10 % random, 10 % kept)",
              train::Range<double>(0.0, 1.0, true));
    train::lm_schedule_flags(args, f.iters, f.lr, f.min_lr, f.warmup, f.weight_decay, f.clip)
        .flag("--seed", f.seed, "seed of initialisation, data order and masking")
        .flag("--data-path", f.data, "text file or directory (bytes), or llm.c token shards (*.bin, globs, llm.c header)");
    train::lm_reporting_flags(args, f.eval_interval, f.log_interval, f.metrics, f.tensorboard)
        .flag("--eval-iters", f.eval_iters, "global batches of validation windows per validation", train::at_least(1));
    if (!args.parse(argc, argv, world.rank())) return 0;

    DPML_REQUIRE_EVERYWHERE(f.device == "cpu" || f.device == "cuda", "--device " << f.device << " is not one of cpu, cuda");
#ifdef DPML_WITH_CUDA
    std::optional<comm::GpuPlacement> gpus;
    if (f.device == "cuda") gpus = comm::place_on_gpus(world, f.gpu_comm, "train_bert");  // before any CUDA allocation
#else
    DPML_REQUIRE_EVERYWHERE(f.device == "cpu", "--device cuda: this train_bert was built without CUDA (build it with the cuda preset)");
#endif
    train::resolve_lr_schedule(f.warmup, f.iters, f.lr, f.min_lr);
    train::require_writable_output("--metrics", f.metrics);
    train::require_writable_directory("--tensorboard", f.tensorboard);
    auto grid = ProcessGrid::create(world, {.tp = f.tp, .pp = f.pp});
    const int micro_batches = train::micro_batches_of(f.micro_batch, f.global_batch, grid.dp());

    // Data: windows of the text's bytes or the shards' tokens, this data rank's share of each batch.
    const bool shards = names_token_shards(f.data);
    if (f.vocab == 0) f.vocab = shards ? data::kTokenShardVocab : data::kByteVocab;
    data::TokenSplit split;
    if (shards) {
      const auto all = data::TokenStore::map_shards({f.data}, f.vocab);
      const auto cut = all.size() - all.size() / 20;
      split = {all.slice(0, cut), all.slice(cut, all.size())};
    } else {
      const std::string text = data::read_text(f.data);
      data::require_tokens_below(data::byte_tokens(text), f.vocab, "text '" + f.data + "'");
      split = data::split_text(text, 0.05);
    }
    auto lm = data::lm_windows(std::move(split), static_cast<int>(f.vocab), {.seq_len = f.seq, .global_batch = f.global_batch, .seed = f.seed},
                               grid.coord(Axis::data), grid.dp(), f.data);
    const data::MaskRule rule{.select = f.mask_prob, .mask_token = static_cast<std::int32_t>(f.vocab), .random_tokens = f.vocab};
    data::MaskedLmWindows masked_train(lm.train, rule, f.seed);
    const data::MaskedLmWindows masked_val(lm.validation, rule, f.seed);

    // On a GPU the vocabulary (and the head's rows) padded to whole 16-byte rows of every shard.
    const models::BertConfig config{.vocab = f.vocab + 1, .max_seq = f.seq, .layers = f.layers, .heads = f.heads, .dim = f.hidden,
                                    .pad_multiple = f.device == "cuda" ? std::max(1, 128 / f.tp) : 1};
    if (world.rank() == 0)
      std::printf("dpml train_bert: %s%s | schedule %s%s | %lld layers, hidden %lld, %lld heads, seq %lld | %lld parameters | "
                  "vocabulary %lld + [MASK] | %lld train tokens | mask %.2f (80/10/10) | global batch %lld\n",
                  f.device == "cuda" ? "GPUs (bf16) " : "", grid.describe().c_str(), f.schedule.c_str(), f.zero ? " + ZeRO-1" : "", static_cast<long long>(f.layers),
                  static_cast<long long>(f.hidden), static_cast<long long>(f.heads), static_cast<long long>(f.seq),
                  static_cast<long long>(config.parameter_count()), static_cast<long long>(f.vocab),
                  static_cast<long long>(lm.train.tokens()), f.mask_prob, static_cast<long long>(f.global_batch));
    const optim::AdamW::Options adamw{.beta2 = 0.98, .weight_decay = f.weight_decay};
    const train::TrainOptions options{.micro_batches = micro_batches, .global_batch = f.global_batch, .seed = f.seed};
#ifdef DPML_WITH_CUDA
    if (gpus) {
      kernels::Device<CudaSpace> dev;
      return comm::with_gpu_comm(gpus->comm, [&]<class Comm>() {
        return parallel::with_strategy(parallel::staged_model_schedule(f.schedule), f.zero, [&]<class Strategy>() {
          using DataComm = parallel::data_comm_t<Strategy, Comm>;
          const parallel::DeviceGrid<Comm, DataComm> comms(grid, dev);
          models::Bert<bf16, CudaSpace, Comm> model(config, comms);
          layers::initialize_all(model.parameters(), f.seed, &grid);  // the CPU's initial weights, rounded to bf16
          train::Trainer<decltype(model), train::ModelLoss, Strategy, optim::AdamW, CudaSpace, Comm, DataComm> trainer(
              model, comms, dev, adamw, {.clip = f.clip}, options);
          return train_and_validate(trainer, model, f, world, masked_train, masked_val);
        });
      });
    }
#endif
    models::Bert<float> model(config, grid);
    layers::initialize_all(model.parameters(), f.seed, &grid);
    return parallel::with_strategy(parallel::staged_model_schedule(f.schedule), f.zero, [&]<class Strategy>() {
      train::Trainer<models::Bert<float>, train::ModelLoss, Strategy, optim::AdamW> trainer(model, grid, adamw, {.clip = f.clip},
                                                                                          options);
      return train_and_validate(trainer, model, f, world, masked_train, masked_val);
    });
  });
}
