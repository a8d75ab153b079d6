// train_lstm: a character-level (byte) language model — Embedding → LSTM × --num-layers → Linear
// head, cross-entropy over every next byte (models/lstm_lm.hpp) — trained with data parallelism
// (the rest of the world) and pipeline parallelism (--pp: the library cuts the model between its
// layers, train/layer_stage.hpp) on the CPU ranks of an MPI launch or on GPUs. Flags follow train_gpt's (and
// Megatron-LM's) names where they mean the same.
//
//   mpiexec -n 2 build/cpu/examples/train_lstm/train_lstm                  # dp 2
//   mpiexec -n 2 build/cpu/examples/train_lstm/train_lstm --pp 2           # an LSTM layer per stage
//   mpiexec -n 2 build/cpu/examples/train_lstm/train_lstm --pp 2 --schedule interleaved \
//       --num-virtual-stages-per-pipeline-rank 2                          # Megatron's interleaved 1F1B
//
// Data as train_gpt reads text (data/text.hpp): a file or a directory of them (default: the Debian
// `fortunes` package), its bytes the tokens, the last 5 % for validation. Every --eval-interval
// steps (and at the end) the validation loss is the mean over --eval-iters global batches of the
// validation windows, in nats and bits per character (byte). AdamW with a warm-up and cosine decay,
// gradient clipping; the progress line and --metrics / --tensorboard records as train_gpt's.
// --device cuda (CUDA builds; gpu.cu) trains the same model on GPUs in bf16 with fp32 master weights
// and AdamW state — a GPU per rank over NCCL, or ranks sharing GPUs over comm::Staged (--gpu-comm):
// the cell's kernels are kernels/cuda/lstm.hpp, the GEMMs cuBLASLt's; no cuDNN.
#include "train_lstm.hpp"

#include <dpml/comm/launch.hpp>
#include <dpml/layers/cross_entropy.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/args.hpp>
#include <dpml/train/trainer.hpp>

#include <cstdio>
#include <string>

using namespace dpml;
using namespace train_lstm;

namespace {
using Model = models::LstmLm<float>::Network;
using Loss = layers::SoftmaxCrossEntropy<float>;
}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const comm::Mpi& world) {
    Flags f;
    train::Args args("train_lstm", "Trains a character-level LSTM language model on a text with data parallelism\n"
                                   "(rest of the world) and pipeline parallelism (--pp) on CPU ranks or GPUs (--device cuda).");
    args.flag("--device", f.device, "cpu (the ranks' cores, float) | cuda (a GPU per rank, bf16 with fp32 master weights)")
        .flag("--gpu-comm", f.gpu_comm, "--device cuda: auto | nccl (a GPU per rank) | staged (ranks sharing GPUs, through the host)")
        .flag("--pp", f.pp, "pipeline-parallel degree (stages; the model is cut between its layers)", train::at_least(1))
        .flag("--schedule", f.schedule, "pipeline schedule: gpipe | 1f1b | zb-h1 | interleaved")
        .flag("--num-virtual-stages-per-pipeline-rank", f.virtual_stages,
              "--schedule interleaved: model chunks per pipeline rank (the model is cut into pp × v stages)", train::at_least(1))
        .flag("--zero", f.zero, "ZeRO-1: shard the optimizer state over the data-parallel ranks")
        .flag("--micro-batch", f.micro_batch, "sequences per micro-batch", train::at_least(1))
        .flag("--global-batch", f.global_batch, "sequences per step over all data-parallel ranks", train::at_least(1))
        .flag("--num-layers", f.layers, "LSTM layers", train::at_least(1))
        .flag("--hidden-size", f.hidden, "LSTM width H (and the embedding's)", train::at_least(1))
        .flag("--seq-length", f.seq, "bytes per sequence T (backpropagation through time over T steps)", train::at_least(1))
        .flag("--forget-bias", f.forget_bias, "each LSTM's forget-gate bias at the start");
    train::lm_schedule_flags(args, f.iters, f.lr, f.min_lr, f.warmup, f.weight_decay, f.clip)
        .flag("--seed", f.seed, "seed of initialisation and data order")
        .flag("--data-path", f.data, "text file or directory (its bytes are the tokens)");
    train::lm_reporting_flags(args, f.eval_interval, f.log_interval, f.metrics, f.tensorboard)
        .flag("--eval-iters", f.eval_iters, "global batches of validation windows per validation loss", train::at_least(1));
    if (!args.parse(argc, argv, world.rank())) return 0;

    DPML_REQUIRE_EVERYWHERE(f.device == "cpu" || f.device == "cuda", "--device " << f.device << " is not one of cpu, cuda");
#ifndef DPML_WITH_CUDA
    DPML_REQUIRE_EVERYWHERE(f.device == "cpu", "--device cuda: this train_lstm was built without CUDA (build it with the cuda preset)");
#endif
    train::resolve_lr_schedule(f.warmup, f.iters, f.lr, f.min_lr);
    train::require_writable_output("--metrics", f.metrics);
    train::require_writable_directory("--tensorboard", f.tensorboard);
    auto grid = ProcessGrid::create(world, {.pp = f.pp});
    const int micro_batches = train::micro_batches_of(f.micro_batch, f.global_batch, grid.dp());

    const std::string text = data::read_text(f.data);
    auto lm = data::lm_windows(data::split_text(text, 0.05), data::kByteVocab,
                               {.seq_len = f.seq, .global_batch = f.global_batch, .seed = f.seed}, grid.coord(Axis::data),
                               grid.dp(), f.data);
    const models::LstmLmConfig config{.vocab = data::kByteVocab, .hidden = f.hidden, .layers = f.layers,
                                      .forget_bias = f.forget_bias};
    if (world.rank() == 0)
      std::printf("dpml train_lstm: %s%s | schedule %s%s | %lld parameters | %lld train bytes | unigram entropy %.3f nats\n",
                  f.device == "cuda" ? "GPUs (bf16) " : "", grid.describe().c_str(),
                  (f.schedule + (f.virtual_stages > 1 ? " × " + std::to_string(f.virtual_stages) + " chunks per rank" : "")).c_str(),
                  f.zero ? " + ZeRO-1" : "",
                  static_cast<long long>(config.parameter_count()), static_cast<long long>(lm.train.tokens()),
                  lm.unigram_entropy);
#ifdef DPML_WITH_CUDA
    if (f.device == "cuda") return train_on_gpus(world, grid, config, f, lm, micro_batches);
#endif
    Model model = models::LstmLm<float>::make(config);
    layers::initialize_all(model.parameters(), f.seed, &grid);
    return parallel::with_strategy(f.schedule, f.zero, [&]<class Strategy>() {
      train::Trainer<Model, Loss, Strategy, optim::AdamW> trainer(
          model, grid, {.beta2 = 0.95, .weight_decay = f.weight_decay}, {.clip = f.clip},
          {.micro_batches = micro_batches, .global_batch = f.global_batch, .seed = f.seed, .virtual_stages = f.virtual_stages});
      return train_and_validate(trainer, f, world, lm);
    });
  });
}
