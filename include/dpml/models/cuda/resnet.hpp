#pragma once
// A bottleneck ResNet (ResNet-50 by default) trained on one GPU (or data parallel, one GPU per
// rank) in bf16 over NHWC activations, built from dpml's device kernels: convolutions through a
// Conv policy (ImplicitGemmConv, our own implicit GEMM, by default; conv/cudnn.hpp's CudnnConv
// beside it), BatchNorm with the block's residual add and ReLU fused in, max and global-average
// pooling, the classifier through the GEMM dispatch, the fused softmax cross-entropy, and SGD over
// one flat buffer. The structure and the parameter order are those of the host
// models::BottleneckResNet (bottleneck_resnet.hpp), so the two are compared parameter by parameter
// (copy_from / copy_to / gradient); names are torchvision's ("layer2.0.downsample.0.weight").
//
// Memory, all allocated at construction for one batch size and image size — a step never reaches
// cudaMalloc:
//   master, grads, momentum   fp32 flat buffers, every tensor at a 64-element-aligned offset.
//                             Gradients are fp32 because every one of them is reduced in fp32
//                             anyway (conv backward_weight's split-K, BatchNorm's column sums, the
//                             classifier's GEMM) and written once per step.
//   params                    the bf16 working copy of master that the convolutions and the
//                             classifier read (BatchNorm reads γ, β in fp32 from master)
//   running                   BatchNorm running mean and variance, fp32
//   acts                      one buffer: the input (N, S, S, Cp), Cp = in_channels rounded up to 8
//                             (zero channels, so every convolution load is a 16-byte vector; the
//                             stem's weights on those channels are zero and stay zero), and per
//                             convolution its output before BatchNorm and after it (after the
//                             ReLU, the residual add), the statistics of each BatchNorm, the max
//                             pool's argmax, the pooled features, the logits; the backward's
//                             gradient buffers mostly over activations it no longer needs (carve())
//
// Step: forward_backward() — forward in training mode (batch statistics, running statistics
// updated), the loss (mean over the batch, dlogits in place), backward: per block, BatchNorm
// backward (ReLU mask from the saved output, the residual's gradient split off) then the
// convolution's backward_input and backward_weight — then update(lr): one fused SGD pass. No
// host synchronisation except loss().
//
// Data parallel (parallel/cuda/gradient_sync.hpp): with a GradientListener attached
// (set_gradient_sync), the backward tells it how far the flat gradients are final, so that their
// all-reduce overlaps the layers still to come. The parameters lie in forward order, so the
// backward finishes the buffer from its end: the classifier, then per block bn3, conv3, bn2,
// conv2, bn1, conv1 — except that a projected block's downsample tensors lie after its bn3 but
// are written last, so its body extends the final range only once they are — then the stem's
// BatchNorm; the stem's convolution (offset 0) goes with finish(), before update() or gradient()
// read the buffer. The gradients have an allocation of their own (carve()'s gradient sets lie over
// activations, never over them), so a range once released is not written again in the step.
// Without a listener nothing changes.
//
// BatchNorm statistics are per rank by default (PyTorch DDP's default; running statistics as with
// broadcast_buffers=False: each rank's estimate comes from its own batches). With
// set_batch_norm_sync(comm) they are synchronised over the data axis, PyTorch's SyncBatchNorm:
// every BatchNorm all-reduces its two per-channel sums (2C floats, one collective) through comm on
// the compute stream in the forward (the statistics and the running statistics become the whole
// batch's, equal on every rank) and again in the backward (dx sees the whole batch); dγ, dβ stay
// this rank's, so the listener's average makes them the whole batch's, and K ranks on slices of a
// batch train what one GPU trains on all of it (kernels/cuda/conv/batch_norm.hpp has the maths).
//
// Layout of a tensor (rows, C): rows = N·H·W pixels, channels innermost (NHWC). Weights of a
// convolution (Cout, kh, kw, Cin) on the device, (Cout, Cin, kh, kw) on the host.

#include "dpml/comm/communicator.hpp"
#include "dpml/comm/nccl.hpp"
#include "dpml/core/bf16.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/philox.hpp"
#include "dpml/kernels/cuda/conv/batch_norm.hpp"
#include "dpml/kernels/cuda/conv/conv2d.hpp"
#include "dpml/kernels/cuda/conv/pool.hpp"
#include "dpml/kernels/cuda/cross_entropy.hpp"
#include "dpml/kernels/cuda/elementwise.hpp"
#include "dpml/kernels/cuda/gemm/dispatch.hpp"
#include "dpml/kernels/cuda/sgd.hpp"
#include "dpml/models/cuda/profiler.hpp"
#include "dpml/optim/sgd.hpp"
#include "dpml/parallel/cuda/gradient_sync.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dpml::models::cuda {

struct ResNetCudaConfig {
  std::int64_t in_channels = 3;
  std::int64_t width = 64;                         // stem channels, stage 1's bottleneck width
  std::array<std::int64_t, 4> blocks{3, 4, 6, 3};  // ResNet-50
  std::int64_t classes = 1000;
  float bn_momentum = 0.1f, bn_eps = 1e-5f;
};

// Kernel families of the ResNet step's time breakdown.
enum class CnnFamily { conv_forward, conv_backward_input, conv_backward_weight, batch_norm, pool, classifier,
                       elementwise, optimizer, count };
inline constexpr std::array<std::string_view, static_cast<int>(CnnFamily::count)> kCnnFamilyNames{
    "conv_forward", "conv_backward_input", "conv_backward_weight", "batch_norm", "pool", "classifier",
    "elementwise", "optimizer"};
using CnnProfiler = KernelProfiler<CnnFamily>;

template <class Conv = kernels::cuda::ImplicitGemmConv<>>
class ResNet {
  using Act = bf16;
  static constexpr std::int64_t kChannelAlign = 8;  // 16 bytes of bf16

 public:
  // One parameter tensor of the flat buffers. Convolutions: (Cout, kh, kw, Cin_padded) here and
  // (Cout, Cin, kh, kw) on the host; BatchNorm and biases (C); the classifier (classes_padded, in).
  struct Slot {
    std::string name;
    std::int64_t offset = 0, numel = 0;
    std::int64_t cout = 0, cin = 0, cin_padded = 0, k = 0;  // convolutions (k = 0: not one); the classifier: k = 1
    std::int64_t host_numel = 0;                             // elements of the host tensor
  };

  ResNet(const ResNetCudaConfig& cfg, std::int64_t batch, std::int64_t image)
      : cfg_(cfg), N_(batch), S_(image), Cp_(round_up(cfg.in_channels, kChannelAlign)),
        Vp_(round_up(cfg.classes, kChannelAlign)) {
    DPML_REQUIRE(batch >= 2 && image >= 32 && cfg.width >= 1 && cfg.classes >= 1 && cfg.in_channels >= 1,
                 "ResNet (cuda): batch " << batch << " (≥ 2: BatchNorm's batch statistics), image " << image
                                         << " (≥ 32), width " << cfg.width << ", classes " << cfg.classes
                                         << ", input channels " << cfg.in_channels << " out of range");
    for (auto b : cfg.blocks) DPML_REQUIRE(b >= 1, "ResNet (cuda): every stage needs at least one block, got " << b);
    build();
    DPML_CHECK_CUDA(cudaStreamCreate(&stream_));
    const auto n = static_cast<std::size_t>(n_params_);
    DPML_CHECK_CUDA(cudaMalloc(&master_, n * sizeof(float)));
    DPML_CHECK_CUDA(cudaMalloc(&grads_, n * sizeof(float)));
    DPML_CHECK_CUDA(cudaMalloc(&momentum_, n * sizeof(float)));
    DPML_CHECK_CUDA(cudaMalloc(&params_, n * sizeof(Act)));
    DPML_CHECK_CUDA(cudaMalloc(&running_, static_cast<std::size_t>(n_running_) * sizeof(float)));
    DPML_CHECK_CUDA(cudaMemset(master_, 0, n * sizeof(float)));
    DPML_CHECK_CUDA(cudaMemset(grads_, 0, n * sizeof(float)));
    DPML_CHECK_CUDA(cudaMemset(momentum_, 0, n * sizeof(float)));
    DPML_CHECK_CUDA(cudaMemset(params_, 0, n * sizeof(Act)));
    carve();  // sizes the activation buffer
    DPML_CHECK_CUDA(cudaMalloc(&acts_, carver_.bytes()));
    DPML_CHECK_CUDA(cudaMemset(acts_, 0, carver_.bytes()));  // the input's pad channels stay zero
    carve();
    reset_running_statistics();
    for (const auto* c : convs_) conv_.prepare(c->shape);
  }
  ResNet(const ResNet&) = delete;
  ResNet& operator=(const ResNet&) = delete;
  ~ResNet() {
    cudaStreamDestroy(stream_);
    for (void* p : {static_cast<void*>(master_), static_cast<void*>(grads_), static_cast<void*>(momentum_),
                    static_cast<void*>(params_), static_cast<void*>(running_), static_cast<void*>(acts_)})
      cudaFree(p);
  }

  cudaStream_t stream() const noexcept { return stream_; }
  std::int64_t batch() const noexcept { return N_; }
  std::int64_t image() const noexcept { return S_; }
  std::int64_t parameter_count() const {  // the host model's count (no padding)
    std::int64_t n = 0;
    for (const auto& s : slots_) n += s.host_numel;
    return n;
  }
  const std::vector<Slot>& slots() const noexcept { return slots_; }
  // Multiply-add FLOPs ×2 of one image's forward through the convolutions and the classifier
  // (the stem counted at its real input channels); a training step costs three times this.
  double forward_flops_per_image() const {
    double f = 2.0 * static_cast<double>(32 * cfg_.width * cfg_.classes);
    for (const auto* c : convs_) {
      const auto& s = c->shape;
      const double cin = c == &stem_ ? static_cast<double>(cfg_.in_channels) : static_cast<double>(s.in.C);
      f += 2.0 * static_cast<double>(s.out_h() * s.out_w() * s.Cout * s.in.kh * s.in.kw) * cin;
    }
    return f;
  }
  std::size_t device_bytes() const {
    return static_cast<std::size_t>(n_params_) * (3 * sizeof(float) + sizeof(Act)) +
           static_cast<std::size_t>(n_running_) * sizeof(float) + carver_.bytes();
  }
  void set_profiler(CnnProfiler* p) noexcept { prof_ = p; }
  // Data parallel: the listener sees the gradients as the backward finishes them (nullptr: none).
  void set_gradient_sync(parallel::cuda::GradientListener* sync) noexcept { sync_ = sync; }
  // Synchronised BatchNorm over the ranks of `data_comm` (the data axis; see the top of the file).
  // data_comm enqueues on stream() — comm::Nccl::from(group, model.stream()), or comm::Staged
  // alike — and outlives the steps that use it. Collective over data_comm: checks that every rank
  // has the same batch size (the statistics count rows × ranks) and gives every rank rank 0's
  // running statistics (the forward's sums are shifted by them, so the ranks must agree). A null
  // data_comm: per-rank statistics again.
  template <class Comm = comm::Nccl>
  void set_batch_norm_sync(Comm* data_comm) {
    if (data_comm == nullptr) return set_batch_norm_sync(nullptr);
    DPML_REQUIRE(data_comm->stream() == stream_,
                 "ResNet (cuda): set_batch_norm_sync on rank " << data_comm->rank() << " got a communicator that "
                     "enqueues on another stream than the model's; make it with comm::Nccl::from(group, model.stream())");
    float* extremes = colsum_scratch_;  // (2): this batch and minus it, all-reduced by max
    const float mine[2] = {static_cast<float>(N_), -static_cast<float>(N_)};
    DPML_CHECK_CUDA(cudaMemcpyAsync(extremes, mine, sizeof mine, cudaMemcpyHostToDevice, stream_));
    data_comm->allreduce(extremes, 2, comm::ReduceOp::max);
    data_comm->broadcast(running_, static_cast<std::size_t>(n_running_), 0);
    const auto batches = download(extremes, 2);
    DPML_REQUIRE(batches[0] == -batches[1], "ResNet (cuda): synchronised BatchNorm needs the same batch on every rank; "
                                            "rank " << data_comm->rank() << " has " << N_ << ", the ranks range from "
                                                    << -batches[1] << " to " << batches[0]);
    bn_allreduce_ = [data_comm](float* sums, std::size_t n) { data_comm->allreduce(sums, n, comm::ReduceOp::sum); };
    bn_ranks_ = data_comm->size();
  }
  void set_batch_norm_sync(std::nullptr_t) {
    bn_allreduce_ = nullptr;
    bn_ranks_ = 1;
  }
  // The flat fp32 gradient buffer, flat_size() elements on stream(): every slot at its offset,
  // zeros between slots (alignment) and in the padded channels and classes.
  float* gradients() noexcept { return grads_; }
  std::int64_t flat_size() const noexcept { return n_params_; }

  // ---- state ----

  // Parameters from the host model (models::BottleneckResNet, same order); also the bf16 copy.
  template <class ParamPtr>
  void copy_from(const std::vector<ParamPtr>& host) {
    check_host(host);
    std::vector<float> master(static_cast<std::size_t>(n_params_), 0.f);
    for (std::size_t i = 0; i < slots_.size(); ++i) to_device_layout(slots_[i], host[i]->value().data(), master);
    upload_master(master);
  }
  // Master weights into the host model's tensors.
  template <class ParamPtr>
  void copy_to(const std::vector<ParamPtr>& host) const {
    check_host(host);
    const auto master = download(master_, n_params_);
    for (std::size_t i = 0; i < slots_.size(); ++i) to_host_layout(slots_[i], master, host[i]->value().data());
  }
  // Gradient of slot i of the last forward_backward, in the host layout; synchronises.
  std::vector<float> gradient(std::size_t i) const {
    DPML_REQUIRE(i < slots_.size(), "ResNet (cuda): no parameter " << i << " (there are " << slots_.size() << ")");
    const auto g = download(grads_, n_params_);
    std::vector<float> out(static_cast<std::size_t>(slots_[i].host_numel));
    to_host_layout(slots_[i], g, out.data());
    return out;
  }
  // He (Kaiming normal, fan_out) convolutions as torchvision, unit BatchNorm, U(±1/√in) classifier
  // (weight and bias, as nn.Linear); Philox stream `seed`, one counter per host element.
  void init_random(std::uint64_t seed) {
    std::vector<float> master(static_cast<std::size_t>(n_params_), 0.f);
    const PhiloxStream rng(seed);
    for (const auto& s : slots_) {
      std::vector<float> host(static_cast<std::size_t>(s.host_numel));
      const bool fc = s.name.starts_with("fc."), bn = s.k == 0 && !fc, bias = s.name.ends_with(".bias");
      const float conv_std = std::sqrt(2.f / static_cast<float>(s.cout * s.k * s.k));
      const float fc_bound = 1.f / std::sqrt(static_cast<float>(features_));
      for (std::size_t i = 0; i < host.size(); ++i) {
        const auto at = static_cast<std::uint64_t>(s.offset) + i;
        if (bn) host[i] = bias ? 0.f : 1.f;
        else if (fc) host[i] = fc_bound * (2.f * rng.uniform(at) - 1.f);
        else host[i] = conv_std * rng.normal(at);
      }
      to_device_layout(s, host.data(), master);
    }
    upload_master(master);
  }
  // BatchNorm running statistics, fp32: per BatchNorm in parameter order (bn1, layer1.0.bn1, …,
  // layer1.0.downsample.1, …), its mean (C) then its variance (C); synchronises.
  std::vector<float> running_statistics() const { return download(running_, n_running_); }
  void reset_running_statistics() {
    std::vector<float> r(static_cast<std::size_t>(n_running_), 0.f);
    for (const auto* b : bns_) std::fill_n(r.begin() + b->running + b->C, b->C, 1.f);  // var = 1
    DPML_CHECK_CUDA(cudaMemcpy(running_, r.data(), r.size() * sizeof(float), cudaMemcpyHostToDevice));
  }

  // A batch: images (N, in_channels, S, S) NCHW float as the host model takes them, labels (N) in
  // [0, classes). Converted to NHWC bf16 with the pad channels left zero; synchronises.
  void upload_batch(std::span<const float> images, std::span<const std::int32_t> labels) {
    const std::int64_t C = cfg_.in_channels, P = S_ * S_;
    DPML_REQUIRE(static_cast<std::int64_t>(images.size()) == N_ * C * P && static_cast<std::int64_t>(labels.size()) == N_,
                 "ResNet (cuda): a batch is " << N_ << " images of " << C << "x" << S_ << "x" << S_ << " and " << N_
                                              << " labels, got " << images.size() << " values and " << labels.size()
                                              << " labels");
    for (auto l : labels)
      DPML_REQUIRE(l >= 0 && l < cfg_.classes, "ResNet (cuda): label " << l << " outside [0, " << cfg_.classes << ")");
    std::vector<Act> nhwc(static_cast<std::size_t>(N_ * P * Cp_), Act(0.f));
    for (std::int64_t n = 0; n < N_; ++n)
      for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t p = 0; p < P; ++p)
          nhwc[static_cast<std::size_t>((n * P + p) * Cp_ + c)] = Act(images[static_cast<std::size_t>((n * C + c) * P + p)]);
    DPML_CHECK_CUDA(cudaMemcpy(input_, nhwc.data(), nhwc.size() * sizeof(Act), cudaMemcpyHostToDevice));
    DPML_CHECK_CUDA(cudaMemcpy(labels_, labels.data(), labels.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  }

  // Every activation byte set to 0xFF (NaN in bf16 and fp32), so that a value the step reads
  // before writing it shows up; upload a batch afterwards (it rewrites the input and the labels).
  void poison_activations() { DPML_CHECK_CUDA(cudaMemset(acts_, 0xFF, carver_.bytes())); }

  // ---- the step ----

  void forward_backward() {
    timed(CnnFamily::elementwise,
          [&] { DPML_CHECK_CUDA(cudaMemsetAsync(grads_, 0, static_cast<std::size_t>(n_params_) * sizeof(float), stream_)); });
    forward();
    backward();
  }
  // Mean cross-entropy of the last forward; synchronises.
  double loss() const {
    const auto l = download(losses_, N_);
    double s = 0;
    for (float v : l) s += v;
    return s / static_cast<double>(N_);
  }
  void update(double lr, const optim::SgdOptions& opt) {
    timed(CnnFamily::optimizer, [&] {
      kernels::cuda::sgd_update(master_, params_, grads_, momentum_, n_params_, opt, lr, nullptr, stream_);
    });
  }

 private:
  struct ConvLayer {
    kernels::cuda::Conv2dShape shape;
    std::int64_t w = 0;  // offset of the weights
    std::int64_t rows() const { return shape.pixels(); }
  };
  struct BnLayer {
    std::int64_t C = 0, gamma = 0, beta = 0, running = 0;  // offsets (running: into running_)
    float *mean = nullptr, *rstd = nullptr;
  };
  struct Block {
    ConvLayer c1, c2, c3, proj;
    BnLayer b1, b2, b3, bproj;
    bool projected = false;
    int stage = 0;  // 0..3: layer1..layer4
    // Saved activations: a = conv1(in), ar = relu(bn1(a)), b = conv2(ar), br, c = conv3(br),
    // p = proj(in) (projected blocks), out = relu(bn3(c) + shortcut); `in` is the previous output.
    const Act* in = nullptr;
    Act *a = nullptr, *ar = nullptr, *b = nullptr, *br = nullptr, *c = nullptr, *p = nullptr, *pn = nullptr,
        *out = nullptr;
  };

  static std::int64_t round_up(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }

  // ---- construction ----

  std::int64_t add_slot(Slot s) {
    s.offset = n_params_;
    n_params_ = detail::align_up(n_params_ + s.numel);
    slots_.push_back(std::move(s));
    return slots_.back().offset;
  }
  ConvLayer make_conv(const std::string& name, std::int64_t cin, std::int64_t cin_padded, std::int64_t cout,
                      std::int64_t k, std::int64_t stride, std::int64_t H) {
    ConvLayer c;
    c.shape = {.N = N_, .Cout = cout, .in = {.C = cin_padded, .H = H, .W = H, .kh = k, .kw = k, .stride = stride, .pad = k / 2}};
    c.w = add_slot({.name = name + ".weight", .numel = cout * k * k * cin_padded, .cout = cout, .cin = cin,
                    .cin_padded = cin_padded, .k = k, .host_numel = cout * cin * k * k});
    return c;
  }
  BnLayer make_bn(const std::string& name, std::int64_t C) {
    BnLayer b;
    b.C = C;
    b.gamma = add_slot({.name = name + ".weight", .numel = C, .host_numel = C});
    b.beta = add_slot({.name = name + ".bias", .numel = C, .host_numel = C});
    b.running = n_running_;
    n_running_ += 2 * C;
    return b;
  }
  void build() {
    const std::int64_t w = cfg_.width;
    std::int64_t H = S_;
    stem_ = make_conv("conv1", cfg_.in_channels, Cp_, w, 7, 2, H);
    stem_bn_ = make_bn("bn1", w);
    H = stem_.shape.out_h();
    pool_ = {.H = H, .W = H, .kh = 3, .kw = 3, .stride = 2, .pad = 1};
    H = pool_.out_h();
    std::int64_t in = w;
    for (int st = 0; st < 4; ++st) {
      const std::int64_t m = w << st;
      for (std::int64_t i = 0; i < cfg_.blocks[static_cast<std::size_t>(st)]; ++i) {
        const std::string name = "layer" + std::to_string(st + 1) + "." + std::to_string(i);
        const std::int64_t s = (i == 0 && st > 0) ? 2 : 1;
        Block b;
        b.stage = st;
        b.c1 = make_conv(name + ".conv1", in, in, m, 1, 1, H);
        b.b1 = make_bn(name + ".bn1", m);
        b.c2 = make_conv(name + ".conv2", m, m, m, 3, s, H);
        b.b2 = make_bn(name + ".bn2", m);
        const std::int64_t Ho = b.c2.shape.out_h();
        b.c3 = make_conv(name + ".conv3", m, m, 4 * m, 1, 1, Ho);
        b.b3 = make_bn(name + ".bn3", 4 * m);
        b.projected = i == 0;
        if (b.projected) {
          b.proj = make_conv(name + ".downsample.0", in, in, 4 * m, 1, s, H);
          b.bproj = make_bn(name + ".downsample.1", 4 * m);
        }
        blocks_.push_back(b);
        in = 4 * m;
        H = Ho;
      }
    }
    features_ = in;
    final_hw_ = H;
    fc_w_ = add_slot({.name = "fc.weight", .numel = Vp_ * in, .cout = cfg_.classes, .cin = in, .cin_padded = in, .k = 1,
                      .host_numel = cfg_.classes * in});
    fc_b_ = add_slot({.name = "fc.bias", .numel = Vp_, .host_numel = cfg_.classes});
    // Pointers into blocks_ only now that it stops growing.
    convs_ = {&stem_};
    bns_ = {&stem_bn_};
    for (auto& b : blocks_) {
      for (ConvLayer* c : {&b.c1, &b.c2, &b.c3}) convs_.push_back(c);
      for (BnLayer* n : {&b.b1, &b.b2, &b.b3}) bns_.push_back(n);
      if (b.projected) {
        convs_.push_back(&b.proj);
        bns_.push_back(&b.bproj);
      }
    }
  }

  // Every activation pointer, in one buffer (see the header comment); run twice (size, then place).
  //
  // The backward's gradients live in sets of three equal buffers, one set per group of stages,
  // and most of them in memory the backward no longer needs: the set of stage 1 (layer1 and the
  // stem) lies over the saved activations of stage 2, that of stage 2 over those of stage 3 —
  // dead by the time the backward reaches the earlier stage (a next stage too small for them,
  // as in shallow test networks, leaves a set its own memory) — and stages 3 and 4 share a set of
  // their own at the end. The forward's two temporaries (the stem's ReLU output, read only by
  // the max pool, and a projected block's normalised shortcut, read only by its bn3) use that
  // last set's memory too. This keeps the step's memory at what the forward saves plus one set.
  void carve() {
    carver_.rebase(acts_);
    const std::int64_t w = cfg_.width;
    input_ = carver_.take<Act>(N_ * S_ * S_ * Cp_);
    labels_ = carver_.take<std::int32_t>(N_);
    losses_ = carver_.take<float>(N_);
    stem_out_ = carver_.take<Act>(stem_.rows() * w);
    pooled_rows_ = N_ * pool_.out_h() * pool_.out_w();
    pooled_ = carver_.take<Act>(pooled_rows_ * w);
    argmax_ = carver_.take<std::int32_t>(pooled_rows_ * w);
    auto stats = [&](BnLayer& b) {
      b.mean = carver_.take<float>(b.C);
      b.rstd = carver_.take<float>(b.C);
    };
    stats(stem_bn_);
    const Act* in = pooled_;
    std::int64_t bn_scratch = kernels::cuda::batch_norm_scratch(stem_.rows(), stem_bn_.C);
    std::array<std::int64_t, 4> need{};      // elements of one gradient buffer, per stage
    std::array<std::size_t, 5> region{};    // byte offset where each stage's activations begin (and end)
    need[0] = stem_.rows() * w;              // the stem's gradient (with layer1's set)
    std::int64_t temporaries = stem_.rows() * w;
    for (auto& b : blocks_) {
      if (&b == &blocks_.front() || b.stage != (&b - 1)->stage) region[static_cast<std::size_t>(b.stage)] = carver_.bytes();
      b.in = in;
      const std::int64_t r1 = b.c1.rows(), r2 = b.c2.rows();
      for (Act** p : {&b.a, &b.ar}) *p = carver_.take<Act>(r1 * b.b1.C);
      for (Act** p : {&b.b, &b.br}) *p = carver_.take<Act>(r2 * b.b2.C);
      b.c = carver_.take<Act>(r2 * b.b3.C);
      b.out = carver_.take<Act>(r2 * b.b3.C);
      if (b.projected) b.p = carver_.take<Act>(r2 * b.b3.C);
      for (BnLayer* n : {&b.b1, &b.b2, &b.b3}) stats(*n);
      if (b.projected) stats(b.bproj);
      auto& n = need[static_cast<std::size_t>(b.stage)];
      n = std::max({n, r1 * b.b1.C, r2 * b.b3.C, r1 * b.c1.shape.in.C});  // d ar, d out / d shortcut, d in
      if (b.projected) temporaries = std::max(temporaries, r2 * b.b3.C);
      bn_scratch = std::max({bn_scratch, kernels::cuda::batch_norm_scratch(r1, b.b1.C),
                             kernels::cuda::batch_norm_scratch(r2, b.b3.C)});
      in = b.out;
    }
    region[4] = carver_.bytes();
    features_out_ = carver_.take<Act>(N_ * features_);
    logits_ = carver_.take<Act>(N_ * Vp_);
    colsum_scratch_ = carver_.take<float>(std::max(bn_scratch, kernels::cuda::column_sums_scratch(N_, Vp_, 1)));
    // Stages 3 and 4 (and the classifier's dfeat): a set of their own, also the forward's temporaries.
    const std::int64_t late = std::max({need[2], need[3], N_ * features_, (temporaries + 2) / 3});
    Act* own = carver_.take<Act>(3 * detail::align_up(late));
    stem_relu_ = own;
    for (auto& b : blocks_) b.pn = b.projected ? own : nullptr;
    place_set(sets_[2], own, late);
    sets_[3] = sets_[2];
    // Stages 1 and 2: over the activations of the stage after them.
    for (std::size_t st = 0; st < 2; ++st) {
      const std::int64_t n = need[st];
      const std::size_t begin = (region[st + 1] + 255) / 256 * 256, end = region[st + 2];
      const std::size_t bytes = static_cast<std::size_t>(3 * detail::align_up(n)) * sizeof(Act);
      if (begin < end && bytes <= end - begin) place_set(sets_[st], reinterpret_cast<Act*>(acts_ + begin), n);
      else place_set(sets_[st], carver_.take<Act>(3 * detail::align_up(n)), n);  // a short next stage: own memory
    }
  }
  // Three buffers of n elements from base, each starting on a 128-byte boundary (align_up).
  static void place_set(std::array<Act*, 3>& set, Act* base, std::int64_t n) {
    for (int i = 0; i < 3; ++i) set[static_cast<std::size_t>(i)] = base + i * detail::align_up(n);
  }

  // ---- host ↔ device layouts ----

  template <class ParamPtr>
  void check_host(const std::vector<ParamPtr>& host) const {
    DPML_REQUIRE(host.size() == slots_.size(), "ResNet (cuda): the host model has " << host.size()
                                                                                    << " parameter tensors, this one "
                                                                                    << slots_.size());
    for (std::size_t i = 0; i < slots_.size(); ++i)
      DPML_REQUIRE(host[i]->numel() == slots_[i].host_numel,
                   "ResNet (cuda): host parameter " << i << " (" << host[i]->name() << ") has " << host[i]->numel()
                                                    << " elements, " << slots_[i].name << " has "
                                                    << slots_[i].host_numel);
  }
  // (Cout, Cin, k, k) → (Cout, k, k, Cin_padded); vectors and the classifier as they are.
  static void to_device_layout(const Slot& s, const float* host, std::vector<float>& master) {
    float* dst = master.data() + s.offset;
    if (s.k <= 1) {  // vectors, 1×1 convolutions (never padded) and the classifier's first rows
      std::copy_n(host, s.host_numel, dst);
      return;
    }
    for (std::int64_t o = 0; o < s.cout; ++o)
      for (std::int64_t c = 0; c < s.cin; ++c)
        for (std::int64_t t = 0; t < s.k * s.k; ++t) dst[(o * s.k * s.k + t) * s.cin_padded + c] = host[(o * s.cin + c) * s.k * s.k + t];
  }
  static void to_host_layout(const Slot& s, const std::vector<float>& flat, float* host) {
    const float* src = flat.data() + s.offset;
    if (s.k <= 1) {
      std::copy_n(src, s.host_numel, host);
      return;
    }
    for (std::int64_t o = 0; o < s.cout; ++o)
      for (std::int64_t c = 0; c < s.cin; ++c)
        for (std::int64_t t = 0; t < s.k * s.k; ++t) host[(o * s.cin + c) * s.k * s.k + t] = src[(o * s.k * s.k + t) * s.cin_padded + c];
  }
  void upload_master(const std::vector<float>& master) {
    DPML_CHECK_CUDA(cudaMemcpy(master_, master.data(), master.size() * sizeof(float), cudaMemcpyHostToDevice));
    std::vector<Act> p(master.size());
    std::transform(master.begin(), master.end(), p.begin(), [](float v) { return Act(v); });
    DPML_CHECK_CUDA(cudaMemcpy(params_, p.data(), p.size() * sizeof(Act), cudaMemcpyHostToDevice));
    DPML_CHECK_CUDA(cudaMemset(momentum_, 0, master.size() * sizeof(float)));
  }
  template <class T>
  std::vector<T> download(const T* src, std::int64_t n) const {
    std::vector<T> v(static_cast<std::size_t>(n));
    DPML_CHECK_CUDA(cudaStreamSynchronize(stream_));
    DPML_CHECK_CUDA(cudaMemcpy(v.data(), src, v.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }

  // ---- layers ----

  template <class F>
  void timed(CnnFamily f, F&& run) {
    CnnProfiler::timed(prof_, f, stream_, std::forward<F>(run));
  }
  kernels::cuda::BatchNormConfig bn_config(bool relu) const {
    return {.training = true, .relu = relu, .momentum = cfg_.bn_momentum, .eps = cfg_.bn_eps};
  }
  void conv_forward(const ConvLayer& c, const Act* x, Act* y) {
    timed(CnnFamily::conv_forward, [&] { conv_.forward(x, params_ + c.w, y, c.shape, stream_); });
  }
  // dy → dx (when dx is not null) and the weight gradient.
  void conv_backward(const ConvLayer& c, const Act* dy, const Act* x, Act* dx) {
    if (dx) timed(CnnFamily::conv_backward_input, [&] { conv_.backward_input(dy, params_ + c.w, dx, c.shape, stream_); });
    timed(CnnFamily::conv_backward_weight,
          [&] { conv_.backward_weight(dy, x, grads_ + c.w, 0.f, c.shape, stream_); });
  }
  // run(across) with the BatchNorm kernels' source of statistics: this rank's rows, or with
  // set_batch_norm_sync the sums all-reduced over the data axis (the all-reduce is timed with
  // the BatchNorm that waits for it).
  template <class F>
  void with_statistics(F&& run) {
    if (!bn_allreduce_) return run(kernels::cuda::LocalStatistics{});
    run([this](float* sums, std::int64_t C, std::int64_t rows) {
      bn_allreduce_(sums, static_cast<std::size_t>(2 * C));
      return rows * bn_ranks_;
    });
  }
  void bn_forward(const BnLayer& b, const Act* x, const Act* residual, Act* y, std::int64_t rows, bool relu) {
    timed(CnnFamily::batch_norm, [&] {
      with_statistics([&](const auto& across) {
        kernels::cuda::batch_norm_forward(x, residual, master_ + b.gamma, master_ + b.beta, y, b.mean, b.rstd,
                                          running_ + b.running, running_ + b.running + b.C, rows, b.C,
                                          bn_config(relu), colsum_scratch_, stream_, across);
      });
    });
  }
  // dy → dx (may alias dy), dresidual (nullable); y is the forward's output when it had the ReLU.
  void bn_backward(const BnLayer& b, const Act* dy, const Act* y, const Act* x, Act* dx, Act* dresidual,
                   std::int64_t rows) {
    timed(CnnFamily::batch_norm, [&] {
      with_statistics([&](const auto& across) {
        kernels::cuda::batch_norm_backward(dy, y, x, b.mean, b.rstd, master_ + b.gamma, dx, dresidual,
                                           grads_ + b.gamma, grads_ + b.beta, rows, b.C, bn_config(y != nullptr),
                                           colsum_scratch_, stream_, across);
      });
    });
  }

  void forward() {
    namespace kc = kernels::cuda;
    const std::int64_t w = cfg_.width;
    conv_forward(stem_, input_, stem_out_);
    bn_forward(stem_bn_, stem_out_, nullptr, stem_relu_, stem_.rows(), true);
    timed(CnnFamily::pool, [&] { kc::max_pool_forward(stem_relu_, pooled_, argmax_, N_, w, pool_, stream_); });
    for (auto& b : blocks_) {
      conv_forward(b.c1, b.in, b.a);
      bn_forward(b.b1, b.a, nullptr, b.ar, b.c1.rows(), true);
      conv_forward(b.c2, b.ar, b.b);
      bn_forward(b.b2, b.b, nullptr, b.br, b.c2.rows(), true);
      conv_forward(b.c3, b.br, b.c);
      const Act* shortcut = b.in;
      if (b.projected) {
        conv_forward(b.proj, b.in, b.p);
        bn_forward(b.bproj, b.p, nullptr, b.pn, b.proj.rows(), false);
        shortcut = b.pn;
      }
      bn_forward(b.b3, b.c, shortcut, b.out, b.c3.rows(), true);
    }
    const Act* last = blocks_.back().out;
    timed(CnnFamily::pool, [&] {
      kc::global_avg_pool_forward(last, features_out_, N_, final_hw_ * final_hw_, features_, stream_);
    });
    timed(CnnFamily::classifier, [&] {
      kc::GemmArgs<Act> g{.ta = kc::Trans::no, .tb = kc::Trans::yes, .M = N_, .N = Vp_, .K = features_,
                          .A = features_out_, .lda = features_, .B = params_ + fc_w_, .ldb = features_,
                          .C = logits_, .ldc = Vp_, .bias = params_ + fc_b_};
      kc::gemm<kc::epilogue::Bias>(gemm_, g, stream_);
      kc::softmax_cross_entropy(logits_, labels_, losses_, 1.f / static_cast<float>(N_), N_, Vp_, cfg_.classes,
                                stream_);  // logits_ now holds dlogits
    });
  }

  void backward() {
    namespace kc = kernels::cuda;
    const std::int64_t w = cfg_.width;
    Act* g = sets_[3][0];  // the gradient of the current block's output
    timed(CnnFamily::classifier, [&] {
      kc::GemmArgs<float> dw{.ta = kc::Trans::yes, .tb = kc::Trans::no, .M = Vp_, .N = features_, .K = N_,
                             .A = logits_, .lda = Vp_, .B = features_out_, .ldb = features_, .C = grads_ + fc_w_,
                             .ldc = features_};
      kc::gemm<kc::epilogue::None>(gemm_, dw, stream_);
      kc::bias_grad_rows(logits_, grads_ + fc_b_, colsum_scratch_, N_, Vp_, stream_);
      kc::GemmArgs<Act> dx{.ta = kc::Trans::no, .tb = kc::Trans::no, .M = N_, .N = features_, .K = Vp_,
                           .A = logits_, .lda = Vp_, .B = params_ + fc_w_, .ldb = features_, .C = sets_[3][1],
                           .ldc = features_};
      kc::gemm<kc::epilogue::None>(gemm_, dx, stream_);
    });
    gradients_final_from(fc_w_);  // fc.weight, fc.bias
    timed(CnnFamily::pool, [&] {
      kc::global_avg_pool_backward(sets_[3][1], g, N_, final_hw_ * final_hw_, features_, stream_);
    });
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) g = block_backward(*it, g);
    // The stem. Its ReLU output is not kept (its memory holds gradients now): the max pool passes
    // each window's gradient to the window's maximum, which is positive exactly when the pooled
    // value is, so masking the pooled gradient by [pooled > 0] is the ReLU's backward.
    const auto& set = sets_[0];
    Act* d_relu = g == set[0] ? set[1] : set[0];
    timed(CnnFamily::pool, [&] {
      kc::relu_backward(pooled_, g, g, pooled_rows_ * w, stream_);
      kc::max_pool_backward(g, argmax_, d_relu, N_, w, pool_, stream_);
    });
    bn_backward(stem_bn_, d_relu, nullptr, stem_out_, d_relu, nullptr, stem_.rows());
    gradients_final_from(stem_bn_.gamma);
    conv_backward(stem_, d_relu, input_, nullptr);  // the input needs no gradient
    if (sync_) sync_->finish();
  }
  // Data parallel: the flat gradients [offset, flat_size()) are final on the stream.
  void gradients_final_from(std::int64_t offset) {
    if (sync_) sync_->ready(static_cast<std::size_t>(offset));
  }

  // gout (the gradient of b.out) → the gradient of b.in, in a buffer of the block's set. gout is
  // one of that set's buffers, or (the last block of a stage) one of the next stage's set.
  Act* block_backward(const Block& b, Act* gout) {
    const auto& set = sets_[static_cast<std::size_t>(b.stage)];
    std::array<Act*, 3> spare{};  // the set's buffers other than gout, in order
    std::size_t k = 0;
    for (Act* p : set)
      if (p != gout) spare[k++] = p;
    Act* x = gout;
    Act* y = spare[0];
    Act* z = spare[1];
    Act* f = k == 3 ? spare[2] : gout;  // gout in the set: reused once dc has been consumed
    const std::int64_t r1 = b.c1.rows(), r2 = b.c2.rows();
    // The body's gradients lie before the projection's: in a projected block they extend the
    // final range only once the projection's are written too.
    auto body_final_from = [&](std::int64_t offset) {
      if (!b.projected) gradients_final_from(offset);
    };
    bn_backward(b.b3, x, b.out, b.c, x, y, r2);  // x: dc, y: the shortcut's gradient
    body_final_from(b.b3.gamma);
    conv_backward(b.c3, x, b.br, z);             // z: d br
    body_final_from(b.c3.w);
    bn_backward(b.b2, z, b.br, b.b, z, nullptr, r2);
    body_final_from(b.b2.gamma);
    conv_backward(b.c2, z, b.ar, f);             // f: d ar
    body_final_from(b.c2.w);
    bn_backward(b.b1, f, b.ar, b.a, f, nullptr, r1);
    body_final_from(b.b1.gamma);
    conv_backward(b.c1, f, b.in, z);             // z: d in through the body
    body_final_from(b.c1.w);
    const std::int64_t n_in = r1 * b.c1.shape.in.C;
    if (!b.projected) {
      timed(CnnFamily::elementwise, [&] { kernels::cuda::add(y, z, y, n_in, stream_); });
      return y;
    }
    bn_backward(b.bproj, y, nullptr, b.p, y, nullptr, b.proj.rows());
    gradients_final_from(b.bproj.gamma);
    conv_backward(b.proj, y, b.in, f);           // f: d in through the projection
    gradients_final_from(b.c1.w);                // the whole block
    timed(CnnFamily::elementwise, [&] { kernels::cuda::add(f, z, f, n_in, stream_); });
    return f;
  }

  ResNetCudaConfig cfg_;
  std::int64_t N_, S_, Cp_, Vp_;
  std::vector<Slot> slots_;
  std::int64_t n_params_ = 0, n_running_ = 0;
  ConvLayer stem_;
  BnLayer stem_bn_;
  kernels::host::PoolGeometry pool_{};
  std::vector<Block> blocks_;
  std::vector<ConvLayer*> convs_;
  std::vector<BnLayer*> bns_;
  std::int64_t features_ = 0, final_hw_ = 0, fc_w_ = 0, fc_b_ = 0, pooled_rows_ = 0;

  float *master_ = nullptr, *grads_ = nullptr, *momentum_ = nullptr, *running_ = nullptr;
  Act* params_ = nullptr;
  char* acts_ = nullptr;
  detail::Carver carver_;
  Act *input_ = nullptr, *stem_out_ = nullptr, *stem_relu_ = nullptr, *pooled_ = nullptr, *features_out_ = nullptr,
      *logits_ = nullptr;
  std::int32_t *labels_ = nullptr, *argmax_ = nullptr;
  float *losses_ = nullptr, *colsum_scratch_ = nullptr;
  std::array<std::array<Act*, 3>, 4> sets_{};  // gradient buffers per stage (see carve())

  cudaStream_t stream_ = nullptr;
  Conv conv_;
  kernels::cuda::GemmContext gemm_;
  CnnProfiler* prof_ = nullptr;
  parallel::cuda::GradientListener* sync_ = nullptr;
  std::function<void(float*, std::size_t)> bn_allreduce_;  // in-place sum over the data axis; empty: per-rank statistics
  int bn_ranks_ = 1;
};

}  // namespace dpml::models::cuda
