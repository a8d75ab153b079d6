// fashion_mnist: trains a ResNet-style CNN (or an MLP) on Fashion-MNIST with data parallelism over
// the CPU ranks of an MPI launch, evaluating on the full 10k test set after every epoch.
//
//   mpiexec -n 4 build/cpu/examples/fashion_mnist/fashion_mnist --epochs 3
//
// Every rank reads its shard of each global batch; gradients are reduced in buckets while
// backward runs; the result equals one process training on the same global batches. The trainer
// is train::ClassifierTrainer (train::Trainer with softmax cross-entropy and accuracy); --zero picks
// the strategy type DataParallel<Zero1>.
#include <dpml/comm/launch.hpp>
#include <dpml/data/image.hpp>
#include <dpml/data/loader.hpp>
#include <dpml/data/sampler.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/models/mlp.hpp>
#include <dpml/models/resnet.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/optim/schedule.hpp>
#include <dpml/optim/sgd.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/args.hpp>
#include <dpml/train/classifier.hpp>
#include <dpml/train/progress.hpp>

#include <cstdio>
#include <string>

using namespace dpml;

namespace {
struct Flags {
  std::string model = "resnet";
  std::int64_t width = 16, blocks = 1, hidden = 256, depth = 2;
  std::int64_t epochs = 6, global_batch = 128;
  int micro_batches = 1;
  std::string optimizer = "sgd";
  double lr = 0.1, min_lr = 0.0, momentum = 0.9, weight_decay = 5e-4, clip = 0.0;
  std::int64_t warmup = 100;
  bool nesterov = true, sync_bn = false, zero = false, augment = true;
  std::string data_dir = data::kFashionMnistDir;
  std::string metrics = "";
  std::int64_t log_interval = 50;
  std::uint64_t seed = 1;
};

template <class Rule, class Strategy, class Model>
int train(const Flags& f, const ProcessGrid& grid, Model& model, typename Rule::Options rule) {
  const int rank = grid.world_rank(), dp = grid.dp(), dp_rank = grid.coord(Axis::data);
  const auto train_set = data::fashion_mnist(data::Split::train, f.data_dir);
  const auto test_set = data::fashion_mnist(data::Split::test, f.data_dir);
  data::Loader train_loader(train_set, data::DistributedSampler(train_set.size(), {.global_batch = f.global_batch, .seed = f.seed}, dp_rank, dp),
                            {.mean = data::kFashionMnistMean, .std = data::kFashionMnistStd, .pad = f.augment ? 2 : 0,
                             .flip = f.augment, .seed = f.seed});
  data::Loader test_loader(test_set, data::DistributedSampler(test_set.size(), {.global_batch = 1000, .shuffle = false, .drop_last = false}, dp_rank, dp),
                           {.mean = data::kFashionMnistMean, .std = data::kFashionMnistStd});

  train::ClassifierTrainer<Model, Rule, Strategy> trainer(model, grid, rule, {.clip = f.clip},
                                                          {.micro_batches = f.micro_batches, .seed = f.seed});
  const std::int64_t steps_per_epoch = train_loader.batches_per_epoch(), total = steps_per_epoch * f.epochs;
  const optim::WarmupCosineLR schedule{.max_lr = f.lr, .min_lr = f.min_lr, .warmup_steps = std::min(f.warmup, total - 1),
                                       .decay_steps = total};
  train::Progress progress(total, rank, "img/s");
  train::MetricsLog metrics(f.metrics, rank);
  std::int64_t step = 0;
  double accuracy = 0;
  for (std::int64_t epoch = 0; epoch < f.epochs; ++epoch) {
    train_loader.start_epoch(epoch);
    double loss_sum = 0;
    std::int64_t seen = 0;
    while (const data::Batch* batch = train_loader.next()) {
      ++step;
      const double lr = schedule(step);
      const auto r = trainer.train_step(*batch, lr);
      loss_sum += r.loss;
      ++seen;
      const double ips = static_cast<double>(batch->global_size) / r.seconds;
      metrics.write({{"step", double(step)}, {"epoch", double(epoch)}, {"loss", r.loss}, {"train_acc", r.accuracy},
                     {"lr", lr}, {"img_per_s", ips}, {"grad_norm", r.grad_norm}, {"exposed_comm_s", r.exposed_comm_seconds}});
      if (step % f.log_interval == 0 || step == 1)
        progress.print(step, loss_sum / static_cast<double>(seen), ips,
                       {{"epoch", double(epoch + 1)}, {"train-acc", r.accuracy}, {"lr", lr}});
    }
    accuracy = trainer.evaluate(test_loader);
    metrics.write({{"epoch", double(epoch + 1)}, {"test_accuracy", accuracy}, {"elapsed_s", progress.elapsed()}});
    if (rank == 0)
      std::printf("epoch %lld/%lld: train loss %.4f | test accuracy %.2f%% (10000 images) | %s elapsed\n",
                  static_cast<long long>(epoch + 1), static_cast<long long>(f.epochs), loss_sum / static_cast<double>(seen),
                  100.0 * accuracy, train::format_duration(progress.elapsed()).c_str());
  }
  if (rank == 0)
    std::printf("final test accuracy %.2f%% after %lld epochs, %s on %d ranks\n", 100.0 * accuracy,
                static_cast<long long>(f.epochs), train::format_duration(progress.elapsed()).c_str(), grid.world_size());
  return 0;
}

template <class Model>
int with_optimizer(const Flags& f, const ProcessGrid& grid, Model& model) {
  return parallel::with_strategy("1f1b", f.zero, [&]<class Strategy>() {
    if (f.optimizer == "sgd")
      return train<optim::Sgd, Strategy>(f, grid, model,
                                         {.momentum = f.momentum, .weight_decay = f.weight_decay, .nesterov = f.nesterov});
    DPML_REQUIRE_EVERYWHERE(f.optimizer == "adamw", "--optimizer " << f.optimizer << " is not one of sgd, adamw");
    return train<optim::AdamW, Strategy>(f, grid, model, {.weight_decay = f.weight_decay});
  });
}
}  // namespace

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const comm::Mpi& world) {
    Flags f;
    train::Args args("fashion_mnist", "Trains a ResNet-style CNN (or an MLP) on Fashion-MNIST with data parallelism over\n"
                                      "all ranks of the launch; prints test accuracy after every epoch.");
    args.flag("--model", f.model, "resnet | mlp")
        .flag("--width", f.width, "ResNet: channels of the first stage (then 2w, 4w)")
        .flag("--blocks", f.blocks, "ResNet: basic blocks per stage")
        .flag("--hidden", f.hidden, "MLP: hidden width")
        .flag("--depth", f.depth, "MLP: hidden layers")
        .flag("--epochs", f.epochs, "passes over the 60k training images")
        .flag("--global-batch", f.global_batch, "images per step over all ranks")
        .flag("--micro-batches", f.micro_batches, "gradient-accumulation chunks of each rank's batch")
        .flag("--optimizer", f.optimizer, "sgd | adamw")
        .flag("--lr", f.lr, "peak learning rate (linear warm-up, then cosine decay to --min-lr)")
        .flag("--min-lr", f.min_lr, "final learning rate")
        .flag("--lr-warmup-iters", f.warmup, "warm-up steps")
        .flag("--momentum", f.momentum, "SGD momentum")
        .flag("--nesterov", f.nesterov, "SGD Nesterov momentum")
        .flag("--weight-decay", f.weight_decay, "weight decay (L2 for SGD, decoupled for AdamW)")
        .flag("--clip-grad", f.clip, "global gradient-norm clipping (0: off)")
        .flag("--sync-bn", f.sync_bn, "batch-norm statistics over the whole data-parallel batch")
        .flag("--zero", f.zero, "ZeRO-1: shard optimizer state over the ranks")
        .flag("--augment", f.augment, "random crop (pad 2) and horizontal flip")
        .flag("--data-dir", f.data_dir, "directory of the four Fashion-MNIST IDX files (gzipped or not)")
        .flag("--metrics", f.metrics, "JSON-lines metrics file (rank 0)")
        .flag("--log-interval", f.log_interval, "steps between progress lines")
        .flag("--seed", f.seed, "seed of initialisation, data order and augmentation");
    if (!args.parse(argc, argv, world.rank())) return 0;
    auto grid = ProcessGrid::create(world, {});
    if (world.rank() == 0)
      std::printf("dpml fashion_mnist: %d data-parallel ranks | model %s | global batch %lld | %s\n", grid.dp(),
                  f.model.c_str(), static_cast<long long>(f.global_batch), f.optimizer.c_str());
    if (f.model == "mlp") {
      auto model = models::Mlp<float>::make({.hidden = f.hidden, .depth = f.depth});
      layers::initialize_all(model.parameters(), f.seed, &grid);
      return with_optimizer(f, grid, model);
    }
    DPML_REQUIRE_EVERYWHERE(f.model == "resnet", "--model " << f.model << " is not one of resnet, mlp");
    auto model = models::ResNet<float>::make({.width = f.width, .blocks_per_stage = f.blocks, .sync_batch_norm = f.sync_bn});
    layers::initialize_all(model.parameters(), f.seed, &grid);
    return with_optimizer(f, grid, model);
  });
}
