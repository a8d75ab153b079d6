// What a user does with dpml on GPUs, from a project of their own: a layer written here with its
// own CUDA kernels (consumer::Swish: swish.hpp, cuda_swish.hpp) goes into a layers::Sequential
// between dpml's Linear layers and is trained by dpml's train::Trainer on CudaSpace in bf16, data
// parallel over the ranks of the launch. Both consumer projects build it when dpml has CUDA;
// tests/cmake/CMakeLists.txt runs it under mpiexec -n 2 where a GPU exists (exit 77 without one).
//
//   1. Swish<T, CudaSpace> (bf16 and float) against Swish<double> on the host at (37, 45):
//      forward, backward_input and dβ from the same random x, β, dy (rounded to T), relative L2
//      error ≤ 1e-2 in bf16, ≤ 1e-4 in float (dpml's own layer tolerances).
//   2. Sequential<Linear 32→64, Swish 64, Linear 64→8> trained kSteps steps with AdamW (two
//      micro-batches per step) on a synthetic 8-class task: x ~ N(0, 1) (32 features), label =
//      the class k whose features k, k + 8, k + 16, k + 24 sum highest, a fresh global batch of 64
//      each step, split over the data ranks. Passes when the mean loss of the last 5 steps is below
//      half the first step's (ln 8 ≈ 2.08 at the start) and, after training, every parameter holds
//      the same bits on every rank (the gradients were reduced over the data axis).
//
// GPUs as examples/train_gpt does (--gpu-comm auto): a GPU per rank and comm::Nccl where every
// node has enough of them, else the node's ranks share its GPUs round robin and talk through
// comm::Staged (device buffers through the host over MPI).
#include "swish.hpp"

#include <dpml/comm/cuda_placement.hpp>
#include <dpml/comm/launch.hpp>
#include <dpml/comm/local_rank.hpp>
#include <dpml/comm/nccl.hpp>
#include <dpml/comm/staged.hpp>
#include <dpml/core/bf16.hpp>
#include <dpml/core/cuda_space.hpp>
#include <dpml/core/philox.hpp>
#include <dpml/kernels/cuda/device.hpp>
#include <dpml/layers/cross_entropy.hpp>
#include <dpml/layers/init.hpp>
#include <dpml/layers/linear.hpp>
#include <dpml/layers/sequential.hpp>
#include <dpml/optim/adamw.hpp>
#include <dpml/parallel/device_grid.hpp>
#include <dpml/parallel/grid.hpp>
#include <dpml/parallel/strategy.hpp>
#include <dpml/train/trainer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

// dpml::cuda hands its consumers C++20 for .cu files (the shim of cmake/dpmlCuda.cmake) and its
// definitions.
static_assert(__cplusplus >= 202002L, "dpml::cuda consumers must compile .cu files as C++20");
static_assert(DPML_WITH_CUDA && DPML_WITH_NCCL, "dpml::cuda defines DPML_WITH_CUDA and DPML_WITH_NCCL");

using namespace dpml;

namespace consumer {

constexpr std::int64_t kFeatures = 32, kHidden = 64, kClasses = 8, kGlobalBatch = 64;
constexpr int kSteps = 40;
constexpr double kLr = 1e-2;

// Rows [lo, hi) of step `step`'s global batch, in the model's element type (the trainer uploads a
// batch as it is).
struct Batch {
  Tensor<bf16> x;               // (n, kFeatures)
  Tensor<std::int32_t> labels;  // (n)
};

Batch batch_rows(int step, std::int64_t lo, std::int64_t hi) {
  Batch b{Tensor<bf16>(Shape{hi - lo, kFeatures}), Tensor<std::int32_t>(Shape{hi - lo})};
  const PhiloxStream rng(3, static_cast<std::uint64_t>(step));
  for (std::int64_t n = lo; n < hi; ++n) {
    float score[kClasses] = {};
    for (std::int64_t i = 0; i < kFeatures; ++i) {
      const bf16 v(rng.normal(static_cast<std::uint64_t>(n * kFeatures + i)));
      b.x[(n - lo) * kFeatures + i] = v;
      score[i % kClasses] += to_float(v);
    }
    b.labels[n - lo] = static_cast<std::int32_t>(std::max_element(score, score + kClasses) - score);
  }
  return b;
}

}  // namespace consumer

// The trainer reads a batch type of the user's through its BatchTraits (train/batch.hpp).
template <>
struct dpml::train::BatchTraits<consumer::Batch> {
  static TensorView<const bf16> inputs(const consumer::Batch& b) { return b.x.cview(); }                // (n, kFeatures)
  static TensorView<const std::int32_t> targets(const consumer::Batch& b) { return b.labels.cview(); }  // (n)
  static std::int64_t global_rows(const consumer::Batch&) { return consumer::kGlobalBatch; }
};

namespace consumer {

double rel_l2(const std::vector<double>& got, const std::vector<double>& want) {
  double d = 0, w = 0;
  for (std::size_t i = 0; i < want.size(); ++i) d += (got[i] - want[i]) * (got[i] - want[i]), w += want[i] * want[i];
  return std::sqrt(d / w);
}

// A host float64 tensor of `shape` drawn from N(0, 1) (Philox stream `stream`), rounded to T.
template <class T>
Tensor<double> random_as(Shape shape, std::uint64_t stream) {
  Tensor<double> t(shape);
  const PhiloxStream rng(5, stream);
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = to_float(T(rng.normal(static_cast<std::uint64_t>(i))));
  return t;
}
template <class T>
Tensor<T, CudaSpace> upload(const Tensor<double>& h) {
  Tensor<T> cast(h.shape());
  for (std::int64_t i = 0; i < h.numel(); ++i) cast[i] = T(static_cast<float>(h[i]));
  return to_space<CudaSpace>(cast.cview());
}
template <class T>
std::vector<double> download(TensorView<const T, CudaSpace> v) {  // copies synchronise the device
  const Tensor<T> h = to_space<HostSpace>(v);
  std::vector<double> out;
  for (std::int64_t i = 0; i < h.numel(); ++i) out.push_back(to_float(h[i]));
  return out;
}
template <class T>
std::vector<double> values(TensorView<const T> v) {
  return std::vector<double>(v.begin(), v.end());
}

// Check 1 (see the top): true when the GPU layer in T matches the float64 host layer.
template <class T>
bool check_swish(kernels::Device<CudaSpace>& dev, double tol, const char* type, bool print) {
  constexpr std::int64_t rows = 37, cols = 45;  // not multiples of the kernels' 32 columns or 256 threads
  Swish<double> host(cols);
  Swish<T, CudaSpace> gpu(cols);
  layers::Context<HostSpace> hctx;
  layers::Context<CudaSpace> dctx;
  dctx.device = &dev;

  const Tensor<double> x = random_as<T>(Shape{rows, cols}, 0), beta = random_as<T>(Shape{cols}, 1),
                       dy = random_as<T>(Shape{rows, cols}, 2);
  Param<double>& hb = *host.parameters()[0];
  Param<T, CudaSpace>& gb = *gpu.parameters()[0];
  copy(hb.value(), beta.cview());
  copy(gb.value(), upload<T>(beta).cview());
  layers::zero_grad(hb);
  layers::zero_grad(gb);

  const auto x_dev = upload<T>(x), dy_dev = upload<T>(dy);
  const double e_y = rel_l2(download(gpu.forward(dctx, x_dev.cview())), values(host.forward(hctx, x.cview())));
  const double e_dx =
      rel_l2(download(gpu.backward_input(dctx, dy_dev.cview())), values(host.backward_input(hctx, dy.cview())));
  gpu.backward_weight(dctx, dy_dev.cview());
  host.backward_weight(hctx, dy.cview());
  const double e_db = rel_l2(download(TensorView<const T, CudaSpace>(gb.grad())), values(TensorView<const double>(hb.grad())));
  const bool ok = e_y <= tol && e_dx <= tol && e_db <= tol;
  if (print || !ok)
    std::printf("consumer_gpu: Swish<%s, CudaSpace> against float64: y %.2e, dx %.2e, dbeta %.2e (tolerance %.0e) %s\n", type,
              e_y, e_dx, e_db, tol, ok ? "ok" : "WRONG");
  return ok;
}

static_assert(layers::Layer<Swish<double>> && layers::Layer<Swish<bf16, CudaSpace>>, "Swish is a dpml Layer on both spaces");

template <class T, class Space>
using Net = layers::Sequential<layers::Linear<T, Space>, Swish<T, Space>, layers::Linear<T, Space>>;

// Check 2 (see the top) over Comm; true when it passes on this rank.
template <class Comm>
bool train_on_gpus(const ProcessGrid& grid, kernels::Device<CudaSpace>& dev) {
  const parallel::DeviceGrid<Comm> comms(grid, dev);
  Net<bf16, CudaSpace> model(layers::Linear<bf16, CudaSpace>(kFeatures, kHidden, {.name = "fc1"}), Swish<bf16, CudaSpace>(kHidden),
                             layers::Linear<bf16, CudaSpace>(kHidden, kClasses, {.name = "fc2"}));
  layers::initialize_all(model.parameters(), 7, &grid);
  using Strategy = Parallel<TensorParallel, PipelineParallel<GPipe>, DataParallel<Replicated>>;
  train::Trainer<decltype(model), layers::SoftmaxCrossEntropy<bf16, CudaSpace>, Strategy, optim::AdamW, CudaSpace, Comm> trainer(
      model, comms, dev, {.weight_decay = 0.0}, {.clip = 1.0}, {.micro_batches = 2});

  const int r = grid.coord(Axis::data), k = grid.dp();
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s)  // a non-finite loss or gradient stops every rank (TrainOptions::on_nonfinite)
    losses.push_back(trainer.train_step(batch_rows(s, kGlobalBatch * r / k, kGlobalBatch * (r + 1) / k), kLr).loss);
  double last = 0;
  for (int s = kSteps - 5; s < kSteps; ++s) last += losses[static_cast<std::size_t>(s)] / 5;
  const bool fell = last < 0.5 * losses[0];

  // Every parameter the same on every data rank: its bits' max and min over the world agree.
  std::vector<int> hi;
  for (auto* p : trainer.parameters())
    for (const bf16 v : to_space<HostSpace>(p->value())) hi.push_back(v.bits);
  std::vector<int> lo = hi;
  grid.world().allreduce(hi.data(), hi.size(), comm::ReduceOp::max);
  grid.world().allreduce(lo.data(), lo.size(), comm::ReduceOp::min);
  const bool same = hi == lo;
  if (grid.world_rank() == 0)
    std::printf("consumer_gpu: %s, %d steps: loss %.4f -> %.4f (mean of the last 5) %s; parameters %s on every rank\n",
                grid.describe().c_str(), kSteps, losses[0], last, fell ? "ok" : "DID NOT FALL BY HALF",
                same ? "equal" : "DIFFER");
  return fell && same;
}

}  // namespace consumer

int main(int argc, char** argv) {
  return dpml::run(argc, argv, [&](const comm::Mpi& world) {
    if (world.allreduce(cuda_device_count() == 0 ? 1 : 0, comm::ReduceOp::max) != 0) {
      if (world.rank() == 0) std::printf("consumer_gpu: a rank sees no CUDA device: skipped\n");
      return 77;
    }
    // A GPU per rank (NCCL) where every node has enough of them; else the node's ranks share its
    // GPUs round robin (comm::Staged). Collective; before any CUDA allocation.
    const comm::GpuPlacement gpus = comm::place_on_gpus(world, "auto", "consumer_gpu");
    const auto grid = ProcessGrid::create(world, {.tp = 1, .pp = 1});  // data parallel over the whole launch
    kernels::Device<CudaSpace> dev;
    bool ok = consumer::check_swish<bf16>(dev, 1e-2, "bf16", world.rank() == 0);
    ok = consumer::check_swish<float>(dev, 1e-4, "float", world.rank() == 0) && ok;
    ok = comm::with_gpu_comm(gpus.comm, [&]<class Comm>() { return consumer::train_on_gpus<Comm>(grid, dev); }) && ok;
    return world.allreduce(ok ? 1 : 0, comm::ReduceOp::min) == 1 ? 0 : 1;
  });
}
