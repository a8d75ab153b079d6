// train_gpt: a GPT trained with data, tensor and pipeline parallelism on the CPU ranks of an MPI
// launch or on GPUs (--device cuda, one rank per GPU), then sampled. Flags follow Megatron-LM's
// names.
//
//   mpiexec -n 8 build/cpu/examples/train_gpt/train_gpt --tp 2 --pp 2 --schedule zb-h1
//   mpiexec -n 2 build/cpu/examples/train_gpt/train_gpt --pp 2 --schedule interleaved --num-virtual-stages-per-pipeline-rank 2
//   mpiexec -n 2 build/cuda/examples/train_gpt/train_gpt --device cuda --tp 2 --micro-batch 16 --global-batch 32
//
// One model and one trainer on both: models::Gpt (models/gpt.hpp, composed from the layers) and
// train::GptTrainer (train/trainer.hpp). --device cuda (CUDA builds) builds them on CudaSpace in
// bf16 with fp32 master weights and optimizer state, each rank on its own GPU talking NCCL — or,
// where a node has fewer GPUs than ranks (or --gpu-comm staged), its ranks share the GPUs round
// robin and talk through comm::Staged (device buffers staged through the host over MPI: for tests
// and small machines). --tp, --pp, --schedule, --zero as on the CPU; the GELU output is recomputed
// in the backward (--recompute-granularity selective, the GPU's default; full recomputes whole
// blocks) and the vocabulary padded to 128 rows per tensor rank. Head dim 32, 64 or 128.
// --grad-compression bf16 | fp16 | powersgd | topk (flat all-reduce; --powersgd-rank, --topk-ratio)
// compresses the data axis' gradient buckets (parallel/compression/policy.hpp): all four on CPU
// ranks, PowerSGD and top-k on GPUs (under 1F1B; their buckets hold 16-bit gradients already); the
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
#include "train_gpt.hpp"

#include <dpml/comm/launch.hpp>
#include <dpml/comm/watchdog.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/gpt_memory.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/args.hpp>
#include <dpml/train/memory_fit.hpp>

using namespace dpml;
using namespace train_gpt;

namespace {
// Token shards: a glob, a *.bin path or a file that starts with the llm.c magic; text otherwise.
bool is_token_shards(const std::string& path) {
  return path.find_first_of("*?[") != std::string::npos || path.ends_with(".bin") || data::is_token_shard_file(path);
}

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
        .flag("--schedule", f.schedule, "pipeline schedule: gpipe | 1f1b | zb-h1 | interleaved")
        .flag("--num-virtual-stages-per-pipeline-rank", f.virtual_stages,
              "--schedule interleaved: model chunks per pipeline rank (chunk c of rank r is virtual stage c·pp + r)",
              train::at_least(1))
        .flag("--decoder-first-pipeline-num-layers", f.first_stage_layers,
              "blocks of the first pipeline stage (0: an even cut)", train::at_least<std::int64_t>(0))
        .flag("--decoder-last-pipeline-num-layers", f.last_stage_layers,
              "blocks of the last pipeline stage, which also runs the LM head (0: an even cut)", train::at_least<std::int64_t>(0))
        .flag("--zero", f.zero, "ZeRO-1: shard the optimizer state over the data-parallel ranks (--zero-stage 1)")
        .flag("--zero-stage", f.zero_stage,
              "0 | 1 (the optimizer state sharded over the data-parallel ranks) | 2 (the gradients too: no whole "
              "gradient buffer, each bucket reduce-scattered from a small pool of slots) | 3 (the weights too: each bucket "
              "all-gathered when its layers run)",
              train::between(0, 3))
        .flag("--zero3-prefetch", f.zero3_prefetch,
              "--zero-stage 3: all-gather the next bucket of weights while the current one is used (the order of the "
              "last step's gathers); off: each bucket is gathered when it is first read")
        .flag("--optimizer-cpu-offload", f.optimizer_offload,
              "ZeRO-Offload: the optimizer's fp32 master weights and moments in host memory and its update on the "
              "host's cores, the gradients and weights copied over each step (any --zero-stage)")
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
        .flag("--recompute-granularity", f.recompute_granularity,
              "activation recomputation: none | selective (the GELU output recomputed; attention keeps no (T, T) scores "
              "on GPUs anyway) | full (each block keeps only its input and runs its forward again in backward); "
              "default: selective with --device cuda, none on CPU ranks",
              [](const std::string& v) {
                models::GptConfig c;
                models::apply_recompute_granularity(v, c);
              })
        .flag("--recompute-activations", f.recompute_activations, "Megatron's switch for --recompute-granularity selective");
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
    f.axis.require_device(f.device, /*gpu_low_rank_and_topk*/ true);
    DPML_REQUIRE_EVERYWHERE(!f.fp16 || f.device == "cuda", "--fp16 trains IEEE fp16 on GPUs (--device cuda); CPU ranks train fp32 "
                                                           "(--loss-scale S still scales their gradients)");
    DPML_REQUIRE_EVERYWHERE(f.initial_loss_scale >= f.min_loss_scale, "--initial-loss-scale " << f.initial_loss_scale
                                                                      << " is below --min-loss-scale " << f.min_loss_scale);
    const bool interleaved = f.schedule == "interleaved";
    if (f.zero && f.zero_stage == 0) f.zero_stage = 1;
    f.zero = f.zero_stage >= 1;
    DPML_REQUIRE_EVERYWHERE(f.zero_stage < 2 || f.axis.grad_compression == "none",
                            "--grad-compression " << f.axis.grad_compression << " reduces whole buckets: not with --zero-stage "
                                                  << f.zero_stage);
    DPML_REQUIRE_EVERYWHERE(f.device == "cpu" || f.axis.grad_compression == "none" || f.schedule == "1f1b",
                            "--grad-compression " << f.axis.grad_compression << " on GPUs runs under --schedule 1f1b, not "
                                                  << f.schedule);
    DPML_REQUIRE_EVERYWHERE(f.virtual_stages == 1 || interleaved, "--num-virtual-stages-per-pipeline-rank " << f.virtual_stages
                                                                                                        << " needs --schedule interleaved");
    DPML_REQUIRE_EVERYWHERE(f.device == "cpu" || f.faults.find("nan:") == std::string::npos,
                            "--inject-fault nan:N poisons a host weight: --device cpu only");
    train::require_writable_output("--metrics", f.metrics);
    train::require_writable_directory("--tensorboard", f.tensorboard);
    train::require_writable_output("--loss-log", f.loss_log);
    train::require_writable_export("--export", f.export_path);
    train::require_writable_output("--trace-pipeline", f.trace_pipeline);
    train::resolve_lr_schedule(f.warmup, f.iters, f.lr, f.min_lr);
    const Faults faults = Faults::parse(f.faults);
    (void)train::parse_nonfinite(f.on_nonfinite);  // refused on every rank before anything is built
    comm::watchdog::set_timeout(f.collective_timeout);
    if (faults.kill_rank == world.rank())
      std::thread([s = faults.kill_after] {
        std::this_thread::sleep_for(std::chrono::duration<double>(s));
        std::raise(SIGKILL);
      }).detach();
#ifdef DPML_WITH_CUDA
    std::optional<GpuRanks> gpus;  // --device cuda (not for a dry run against --gpu-memory-gib: no GPU needed)
    if (f.device == "cuda" && !(f.dry_run && f.gpu_memory_gib > 0))
      gpus = place_ranks_on_gpus(world, f.gpu_comm);  // before any CUDA allocation
    const bool staged = gpus && gpus->staged;
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
    DPML_REQUIRE_EVERYWHERE(!f.recompute_activations || f.recompute_granularity.empty() || f.recompute_granularity == "selective",
                            "--recompute-activations means --recompute-granularity selective, not "
                                << f.recompute_granularity << ": give one of the two");
    const models::GptConfig config = with_recompute({.vocab = f.vocab, .max_seq = f.seq, .layers = f.layers, .heads = f.heads,
                                                     .dim = f.hidden, .first_stage_layers = f.first_stage_layers,
                                                     .last_stage_layers = f.last_stage_layers}, f, f.device == "cuda");
    {  // the estimate per rank kind: printed (--dry-run), or a size that cannot fit refused now, not by
       // std::bad_alloc or cudaErrorMemoryAllocation later
      const bool gpu = f.device == "cuda";
      const models::GptLayout layout{.tp = f.tp, .pp = f.pp, .dp = grid.dp(), .micro_batch = f.micro_batch,
                                     .micro_batches = static_cast<int>(std::max<std::int64_t>(1, f.global_batch / (f.micro_batch * grid.dp()))),
                                     .schedule = f.schedule, .zero = f.zero, .shard_gradients = f.zero_stage >= 2,
                                     .shard_values = f.zero_stage == 3, .prefetch_values = f.zero3_prefetch,
                                     .offload_optimizer = f.optimizer_offload,
                                     .virtual_stages = f.virtual_stages, .compression = f.axis.grad_compression,
                                     .powersgd_rank = f.axis.powersgd_rank, .topk_ratio = f.axis.topk_ratio};
      const auto estimate = models::estimate_gpt_memory(gpu ? on_gpu(config, f.tp) : config, layout,
                                                        gpu ? models::GptMemoryTerms::gpu() : models::GptMemoryTerms::host());
      double have = gpu ? f.gpu_memory_gib * (1 << 30) : train::host_bytes_per_rank(world);
      const char* memory = gpu ? train::kPlannedMemory : train::kHostMemory;
#ifdef DPML_WITH_CUDA
      if (gpu && f.gpu_memory_gib == 0) have = gpus->bytes_per_rank, memory = train::kDeviceMemory;
#endif
      // An optimizer offloaded from the GPUs lives in the node's memory: its ranks share it.
      const double host_have = gpu && f.optimizer_offload ? train::host_bytes_per_rank(world) : 0.0;
      if (f.dry_run) {
        if (world.rank() == 0) std::fputs(models::memory_table(estimate, have, gpu ? "GPU" : "host", host_have).c_str(), stdout);
        return 0;
      }
      const models::GptStageMemory& big = estimate.largest();
      std::ostringstream what;
      what.precision(3);
      constexpr double GiB = 1 << 30;
      what << "the GPT of --num-layers " << f.layers << ", --hidden-size " << f.hidden << ", --num-attention-heads " << f.heads
           << ", --vocab-size " << f.vocab << ", --seq-length " << f.seq << ", --micro-batch " << f.micro_batch << " on --tp "
           << f.tp << " --pp " << f.pp << " (dp " << grid.dp() << ", --schedule " << f.schedule << (f.zero ? ", --zero-stage " + std::to_string(f.zero_stage) : std::string())
           << ") — on pipeline stage " << big.stage << ": parameters " << big.parameters / GiB << ", gradients " << big.gradients / GiB
           << ", optimizer state " << big.optimizer / GiB << ", activations " << big.activations / GiB << " (micro-batches in flight: "
           << big.in_flight << "), buffers " << big.buffers / GiB << ", workspace " << big.workspace / GiB
           << " GiB, --dry-run shows every rank kind —";
      train::require_fits(world, big.total(), have, what.str(), memory);
      if (host_have > 0)
        train::require_fits(world, estimate.largest_host_optimizer(), host_have,
                            "--optimizer-cpu-offload's fp32 master weights, moments and mirrors of the values and gradients of "
                            "the same GPT (--zero-stage " + std::to_string(f.zero_stage) + ", dp " + std::to_string(grid.dp()) +
                                ": ZeRO shards them over dp; --dry-run shows them) —");
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
      std::printf("dpml train_gpt: %s%s | schedule %s%s%s%s | %lld parameters | %lld train tokens | unigram entropy %.3f nats\n",
                  f.device == "cpu" ? "" : f.fp16 ? "GPUs (fp16) " : "GPUs (bf16) ", grid.describe().c_str(), f.schedule.c_str(), !f.zero ? "" : f.zero_stage == 3 ? " + ZeRO-3" : f.zero_stage == 2 ? " + ZeRO-2" : " + ZeRO-1",
                  f.optimizer_offload ? " + optimizer on the host" : "", f.axis.describe(" | ").c_str(),
                  static_cast<long long>(config.parameter_count()), static_cast<long long>(train_data.tokens()), unigram);
    bool own_gpus = false;  // MFU and power need a GPU per rank
#ifdef DPML_WITH_CUDA
    own_gpus = f.device == "cuda" && !staged;
#endif
    const Run run{f, faults, world, train_data, lm.validation, unigram, own_gpus};
#ifdef DPML_WITH_CUDA
    if (f.device == "cuda") {
      if (f.fp16)
        return train_on_gpus_fp16(config, grid, run, staged);
      return train_on_gpus_bf16(config, grid, run, staged);
    }
#endif
    const parallel::DistributedOptimizerOptions dist = dist_of(f);
    // CPU ranks: one models::Gpt stage per pipeline rank, or v chunks per rank (models::GptChunks)
    // under the interleaved schedule.
    const auto train_on_cpus = [&](auto& model, const auto& schedule) {
      using Model = std::remove_reference_t<decltype(model)>;
      layers::initialize_all(model.parameters(), f.seed, &grid);
      return parallel::with_strategy(schedule, f.zero, f.axis.dp_allreduce, f.axis.grad_compression, [&]<class Strategy>() {
        train::GptTrainer<Strategy, optim::AdamW, float, HostSpace, comm::Mpi, parallel::data_comm_t<Strategy, comm::Mpi>, Model> trainer(
            model, grid, adamw_of(f), dist, train_options_of(f));
        return train_and_sample(trainer, run);
      });
    };
    if (interleaved) {
      models::GptChunks<float> model(config, grid, f.virtual_stages);
      return train_on_cpus(model, parallel::schedule_among<parallel::pipeline::Interleaved1F1B>(f.schedule));
    }
    models::Gpt<float> model(config, grid);
    return train_on_cpus(model, parallel::staged_model_schedule(f.schedule));
  });
}
