#pragma once
// CudnnConv: the three Conv2d passes of conv2d.hpp run by cuDNN, as a convolution policy beside
// ImplicitGemmConv — the same member functions, arguments and NHWC bf16 layouts:
//
//   x (N, H, W, Cin), w (Cout, kh, kw, Cin), y and dy (N, Ho, Wo, Cout), bf16; dw fp32
//   forward          y  = conv(x, w)                        (no bias: ResNet's convolutions have none)
//   backward_input   dx = ∂(Σ y·dy)/∂x                      (overwritten)
//   backward_weight  dw = ∂(Σ y·dy)/∂w + beta·dw            (beta = 0 does not read dw)
//
// It speaks cuDNN 9's graph backend API (cudnn_graph.h), not the deprecated cudnnConvolution*
// calls. Each pass is a graph of one operation (CONVOLUTION_FORWARD, _BACKWARD_DATA or
// _BACKWARD_FILTER; cross-correlation, as conv2d.hpp and PyTorch; compute type float). The NHWC
// tensors are given to cuDNN as dims (N, C, H, W) with strides (H·W·C, 1, W·C, C), w as
// (Cout, Cin, kh, kw) with strides (kh·kw·Cin, 1, kw·Cin, Cin): the same bytes, no transposes.
//
// Which engine runs is cuDNN's choice: its heuristics (mode A, then the fallback list) rank the
// engine configurations for the graph, and the first one that finalizes into an execution plan is
// kept. Plans are built once per (pass, N, Cin, H, W, Cout, kh, kw, stride, pad, alignment of
// the pointers) and cached; a call looks its plan up, builds a variant pack (the tensors'
// addresses and the workspace) and runs it on the caller's stream (cudnnSetStream per call). The
// graph and the plan take the handle (CUDNN_ATTR_OPERATIONGRAPH_HANDLE, _EXECUTION_PLAN_HANDLE),
// which cuDNN 9.19's headers mark deprecated in favour of device-property descriptors (for
// building plans without a GPU); the handle form runs on 9.14 (the GPU machines).
//
// dw in fp32 (our optimizers read fp32 gradients): the backward-filter graph asks for a bf16 dw,
// as PyTorch's autocast does, which cuDNN writes into a scratch and accumulate_kernel below widens
// into dw (one more rounding, up to 2⁻⁸ relative: a relative L2 error near 2e-3); a float dw is
// the fallback where no engine takes bf16. Measured on an H100 (cuDNN 9.14, ResNet-50 at B=256):
// the heuristics' engines for a float dw beside bf16 x and dy ran the network's weight gradients
// in 98.7 ms per step, the bf16 ones in 6.3 ms (bench/conv, through PyTorch). Either way beta is
// applied by accumulate_kernel (cuDNN writes with beta = 0 into the scratch, or straight into dw
// when beta = 0 and dw is float), so a plan does not depend on beta and prepare(shape) builds all
// that a training step needs. backward_weight_rounds_to_bf16() says which a shape gets.
//
// Memory: one device buffer holds cuDNN's workspace (engines needing more than a cap, 64 MiB by
// default, are passed over) and that scratch. It grows (cudaFree +
// cudaMalloc, which synchronise the device) when a plan is built that needs more — at
// prepare(shape), or at the first call of a shape — and never on later calls with seen shapes.
//
// cuDNN is optional: include this header only where DPML_HAS_CUDNN is defined (CMake found cuDNN
// and links dpml::cudnn into dpml::cuda); dpml.hpp includes it under that condition.

#include "dpml/core/bf16.hpp"
#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/conv/conv2d.hpp"

#include <cuda_runtime.h>
#include <cudnn_graph.h>

#include <algorithm>
#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace dpml::kernels::cuda {

namespace detail::cudnn {

// One cuDNN backend descriptor (or none, default-constructed), destroyed with this object.
class Descriptor {
 public:
  Descriptor() = default;
  explicit Descriptor(cudnnBackendDescriptorType_t type) { DPML_CHECK_CUDNN(cudnnBackendCreateDescriptor(type, &d_)); }
  Descriptor(Descriptor&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Descriptor& operator=(Descriptor&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  cudnnBackendDescriptor_t get() const noexcept { return d_; }

  // An attribute of `count` values of cuDNN type `type` at `values`.
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, std::int64_t count, const void* values) {
    DPML_CHECK_CUDNN(cudnnBackendSetAttribute(d_, name, type, count, values));
  }
  // Typed forms of set() for the attribute types used here.
  void set(cudnnBackendAttributeName_t name, const std::vector<std::int64_t>& v) {
    set(name, CUDNN_TYPE_INT64, static_cast<std::int64_t>(v.size()), v.data());
  }
  void set(cudnnBackendAttributeName_t name, std::int64_t v) { set(name, CUDNN_TYPE_INT64, 1, &v); }
  void set(cudnnBackendAttributeName_t name, float v) { set(name, CUDNN_TYPE_FLOAT, 1, &v); }
  void set(cudnnBackendAttributeName_t name, cudnnDataType_t v) { set(name, CUDNN_TYPE_DATA_TYPE, 1, &v); }
  void set(cudnnBackendAttributeName_t name, cudnnConvolutionMode_t v) {
    set(name, CUDNN_TYPE_CONVOLUTION_MODE, 1, &v);
  }
  void set(cudnnBackendAttributeName_t name, cudnnBackendHeurMode_t v) { set(name, CUDNN_TYPE_HEUR_MODE, 1, &v); }
  void set(cudnnBackendAttributeName_t name, cudnnHandle_t v) { set(name, CUDNN_TYPE_HANDLE, 1, &v); }
  void set(cudnnBackendAttributeName_t name, const Descriptor& v) {
    const cudnnBackendDescriptor_t raw = v.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
  }

  void finalize() { DPML_CHECK_CUDNN(cudnnBackendFinalize(d_)); }
  // For what cuDNN may refuse (an unsupported graph or engine): the status, not an exception.
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(d_); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

enum class Pass { forward, backward_input, backward_weight };

// What differs between the passes: the operation, and its attributes for the three tensors —
// x (x or dx), w (w or dw), y (y or dy) — the convolution, alpha and beta.
struct PassInfo {
  const char* name;
  cudnnBackendDescriptorType_t op;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};
inline constexpr std::array<PassInfo, 3> kPasses = {{
    {"forward", CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
    {"backward_input", CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
    {"backward_weight", CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA},
}};
inline const PassInfo& info(Pass p) { return kPasses[static_cast<std::size_t>(p)]; }

// The tensors' unique ids in a graph and its variant pack.
inline constexpr std::int64_t kUidX = 1, kUidW = 2, kUidY = 3;

// A plan's cache key: the pass, the shape and the byte alignment promised for each tensor.
struct PlanKey {
  Pass pass;
  std::int64_t N, Cin, H, W, Cout, kh, kw, stride, pad;
  std::int64_t align_x, align_w, align_y;  // x or dx, w or dw, y or dy
  auto operator<=>(const PlanKey&) const = default;
};

// An execution plan and everything it was built from (kept alive with it).
struct Plan {
  std::vector<Descriptor> parts;  // tensors, convolution, operation, graph, engine configuration
  Descriptor plan;
  std::int64_t workspace_bytes = 0;  // cuDNN's workspace for this plan
  bool dw_bf16 = false;              // backward_weight: cuDNN writes dw in bf16 (into the scratch)
};

// "N=2 Cin=64 H=56 W=56 Cout=64 kernel 3x3 stride 1 pad 1", for messages.
inline std::string describe(const Conv2dShape& s) {
  std::ostringstream os;
  os << "N=" << s.N << " Cin=" << s.in.C << " H=" << s.in.H << " W=" << s.in.W << " Cout=" << s.Cout << " kernel "
     << s.in.kh << "x" << s.in.kw << " stride " << s.in.stride << " pad " << s.in.pad;
  return os.str();
}

// The alignment a plan may assume for a tensor at p: the largest power of two ≤ 16 dividing it.
inline std::int64_t alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  return static_cast<std::int64_t>(std::min<std::uintptr_t>(16, a & (~a + 1)));  // its lowest set bit
}

// A 4-d tensor (d0, C, d2, d3) stored channels-last, i.e. as (d0, d2, d3, C).
inline Descriptor nhwc_tensor(std::int64_t uid, cudnnDataType_t type, std::int64_t d0, std::int64_t C, std::int64_t d2,
                              std::int64_t d3, std::int64_t align) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, type);
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, std::vector<std::int64_t>{d0, C, d2, d3});
  t.set(CUDNN_ATTR_TENSOR_STRIDES, std::vector<std::int64_t>{d2 * d3 * C, 1, d3 * C, C});
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
  t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, align);
  t.finalize();
  return t;
}

// The first engine configuration of cuDNN's heuristics (mode A, then FALLBACK) that finalizes
// into an execution plan for `graph` with a workspace of at most max_workspace bytes: moved into
// p.plan, its configuration appended to p.parts. False when none does; `why` then says what cuDNN
// answered last.
inline bool first_working_engine(cudnnHandle_t handle, const Descriptor& graph, std::int64_t max_workspace, Plan& p,
                                 std::string& why) {
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, mode);
    if (const cudnnStatus_t st = heur.try_finalize(); st != CUDNN_STATUS_SUCCESS) {
      why = std::string("heuristics: ") + cudnnGetErrorString(st);
      continue;
    }
    std::int64_t count = 0;
    DPML_CHECK_CUDNN(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    std::vector<Descriptor> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (std::int64_t i = 0; i < count; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(configs.back().get());
    }
    DPML_CHECK_CUDNN(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, raw.data()));
    if (count == 0) why = "the heuristics listed no engine";
    for (std::int64_t i = 0; i < count; ++i) {
      Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle);
      plan.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[static_cast<std::size_t>(i)]);
      if (const cudnnStatus_t st = plan.try_finalize(); st != CUDNN_STATUS_SUCCESS) {
        why = std::string("execution plan: ") + cudnnGetErrorString(st);
        continue;
      }
      std::int64_t n = 0;
      DPML_CHECK_CUDNN(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                CUDNN_TYPE_INT64, 1, &n, &p.workspace_bytes));
      if (p.workspace_bytes > max_workspace) {
        why = "every engine that finalizes needs more than " + std::to_string(max_workspace) + " bytes of workspace";
        continue;
      }
      p.plan = std::move(plan);
      p.parts.push_back(std::move(configs[static_cast<std::size_t>(i)]));
      return true;
    }
  }
  return false;
}

// The plan for key.pass on shape s with dw (or w) of type w_type, or nothing where cuDNN refuses
// the graph or has no engine for it (`why` says what it answered).
inline std::optional<Plan> build_plan(cudnnHandle_t handle, const PlanKey& key, const Conv2dShape& s,
                                      cudnnDataType_t w_type, std::int64_t max_workspace, std::string& why) {
  const PassInfo& pi = info(key.pass);
  Plan p;
  p.parts.push_back(nhwc_tensor(kUidX, CUDNN_DATA_BFLOAT16, s.N, s.in.C, s.in.H, s.in.W, key.align_x));
  p.parts.push_back(nhwc_tensor(kUidW, w_type, s.Cout, s.in.C, s.in.kh, s.in.kw, key.align_w));
  p.parts.push_back(nhwc_tensor(kUidY, CUDNN_DATA_BFLOAT16, s.N, s.Cout, s.out_h(), s.out_w(), key.align_y));

  Descriptor conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, std::int64_t{2});
  conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_DATA_FLOAT);
  conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_CROSS_CORRELATION);
  conv.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, std::vector<std::int64_t>{1, 1});
  conv.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, std::vector<std::int64_t>{s.in.stride, s.in.stride});
  conv.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, std::vector<std::int64_t>{s.in.pad, s.in.pad});
  conv.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, std::vector<std::int64_t>{s.in.pad, s.in.pad});
  conv.finalize();

  Descriptor op(pi.op);
  op.set(pi.x, p.parts[0]);
  op.set(pi.w, p.parts[1]);
  op.set(pi.y, p.parts[2]);
  op.set(pi.conv, conv);
  op.set(pi.alpha, 1.f);
  op.set(pi.beta, 0.f);  // beta is ours to apply (accumulate_kernel): a plan serves every beta
  if (const cudnnStatus_t st = op.try_finalize(); st != CUDNN_STATUS_SUCCESS) {
    why = std::string("operation: ") + cudnnGetErrorString(st);
    return std::nullopt;
  }

  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, op);
  if (const cudnnStatus_t st = graph.try_finalize(); st != CUDNN_STATUS_SUCCESS) {
    why = std::string("operation graph: ") + cudnnGetErrorString(st);
    return std::nullopt;
  }
  if (!first_working_engine(handle, graph, max_workspace, p, why)) return std::nullopt;
  p.dw_bf16 = key.pass == Pass::backward_weight && w_type == CUDNN_DATA_BFLOAT16;
  p.parts.push_back(std::move(conv));
  p.parts.push_back(std::move(op));
  p.parts.push_back(std::move(graph));
  return p;
}

// dw (n) = beta·dw + src, src being what cuDNN wrote (fp32 or bf16); beta = 0 does not read dw.
template <class T>
__global__ void accumulate_kernel(const T* __restrict__ src, float* __restrict__ dw, float beta, std::int64_t n) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v = load_f(src[i]);
    dw[i] = beta != 0.f ? v + beta * dw[i] : v;
  }
}

}  // namespace detail::cudnn

// One per device and host thread, used by one stream at a time (the stream is set per call); not
// copyable. It holds the cuDNN handle (of the device current at construction), the plans and the
// workspace/scratch buffer.
class CudnnConv {
 public:
  // max_workspace_bytes: engines that need more workspace are passed over (the heuristics' next
  // choice is taken). Uncapped, cuDNN 9.14 picked engines for ResNet-50 at B=256 whose largest
  // workspace took 0.57 GiB, more than PyTorch's whole margin; 64 MiB costs no measurable speed.
  explicit CudnnConv(std::size_t max_workspace_bytes = std::size_t{64} << 20)
      : max_workspace_(static_cast<std::int64_t>(max_workspace_bytes)) {
    DPML_CHECK_CUDNN(cudnnCreate(&handle_));
  }
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;
  ~CudnnConv() {
    plans_.clear();  // the plans' descriptors before the handle they were built with
    cudaFree(buffer_);
    cudnnDestroy(handle_);
  }

  // Builds the three passes' plans for a shape (16-byte aligned tensors) and grows the buffer:
  // call it for every shape at model construction, so that no step allocates.
  void prepare(const Conv2dShape& s) {
    using detail::cudnn::Pass;
    for (const Pass p : {Pass::forward, Pass::backward_input, Pass::backward_weight}) plan(p, s, 16, 16, 16);
  }

  // y (N, Ho, Wo, Cout) = conv(x (N, H, W, Cin), w (Cout, kh, kw, Cin)).
  void forward(const bf16* x, const bf16* w, bf16* y, const Conv2dShape& s, cudaStream_t stream) {
    using namespace detail::cudnn;
    execute(plan(Pass::forward, s, alignment(x), alignment(w), alignment(y)), x, w, y, stream);
  }

  // dx (N, H, W, Cin) = ∂(Σ y·dy)/∂x for dy (N, Ho, Wo, Cout), w (Cout, kh, kw, Cin); overwritten.
  void backward_input(const bf16* dy, const bf16* w, bf16* dx, const Conv2dShape& s, cudaStream_t stream) {
    using namespace detail::cudnn;
    execute(plan(Pass::backward_input, s, alignment(dx), alignment(w), alignment(dy)), dx, w, dy, stream);
  }

  // dw (Cout, kh·kw·Cin) fp32 = Σ over pixels of dy (N, Ho, Wo, Cout) ⊗ im2col(x) + beta·dw.
  void backward_weight(const bf16* dy, const bf16* x, float* dw, float beta, const Conv2dShape& s,
                       cudaStream_t stream) {
    using namespace detail::cudnn;
    const Plan& p = plan(Pass::backward_weight, s, alignment(x), alignment(dw), alignment(dy));
    const std::int64_t n = s.Cout * s.taps();
    if (!p.dw_bf16 && beta == 0.f) {  // cuDNN writes dw itself
      execute(p, x, dw, dy, stream);
      return;
    }
    void* scratch = static_cast<char*>(buffer_) + scratch_offset(p);
    execute(p, x, scratch, dy, stream);
    constexpr int threads = 256;
    if (p.dw_bf16)
      accumulate_kernel<<<grid_for(n, threads), threads, 0, stream>>>(static_cast<const bf16*>(scratch), dw, beta, n);
    else
      accumulate_kernel<<<grid_for(n, threads), threads, 0, stream>>>(static_cast<const float*>(scratch), dw, beta, n);
    DPML_CHECK_LAUNCH();
  }

  // Whether backward_weight with these tensors has cuDNN write dw in bf16 (then widened to fp32)
  // rather than in fp32; builds the plan if it is not built yet.
  bool backward_weight_rounds_to_bf16(const bf16* dy, const bf16* x, const float* dw, const Conv2dShape& s) {
    using namespace detail::cudnn;
    return plan(Pass::backward_weight, s, alignment(x), alignment(dw), alignment(dy)).dw_bf16;
  }

  std::size_t workspace_bytes() const noexcept { return buffer_bytes_; }  // the buffer, workspace and scratch
  std::size_t plan_count() const noexcept { return plans_.size(); }

 private:
  using Plan = detail::cudnn::Plan;

  // The dw scratch sits after cuDNN's workspace, 256-byte aligned; the weight pass keeps room for
  // it whatever beta it is called with.
  static std::size_t scratch_offset(const Plan& p) {
    return (static_cast<std::size_t>(p.workspace_bytes) + 255) / 256 * 256;
  }
  static std::size_t bytes_needed(const Plan& p, detail::cudnn::Pass pass, const Conv2dShape& s) {
    if (pass != detail::cudnn::Pass::backward_weight) return static_cast<std::size_t>(p.workspace_bytes);
    const std::size_t elem = p.dw_bf16 ? sizeof(bf16) : sizeof(float);
    return scratch_offset(p) + static_cast<std::size_t>(s.Cout * s.taps()) * elem;
  }

  // The cached plan of a pass for a shape and the alignments of x (or dx), w (or dw) and y (or
  // dy); built, and the buffer grown, on a miss.
  const Plan& plan(detail::cudnn::Pass pass, const Conv2dShape& s, std::int64_t align_x, std::int64_t align_w,
                   std::int64_t align_y) {
    using namespace detail::cudnn;
    const auto& c = s.in;
    const PlanKey key{pass, s.N, c.C, c.H, c.W, s.Cout, c.kh, c.kw, c.stride, c.pad, align_x, align_w, align_y};
    if (const auto it = plans_.find(key); it != plans_.end()) return it->second;

    const char* name = info(pass).name;
    DPML_REQUIRE(s.N > 0 && s.Cout > 0 && c.C > 0 && c.kh > 0 && c.kw > 0 && c.stride > 0 && c.pad >= 0 &&
                     c.H + 2 * c.pad >= c.kh && c.W + 2 * c.pad >= c.kw,
                 "CudnnConv " << name << ": " << describe(s)
                              << ": sizes must be positive (pad ≥ 0) and the padded input at least the kernel");
    std::optional<Plan> p;
    std::string why;
    try {
      p = build_plan(handle_, key, s, CUDNN_DATA_BFLOAT16, max_workspace_, why);
      if (!p && pass == Pass::backward_weight)
        p = build_plan(handle_, key, s, CUDNN_DATA_FLOAT, max_workspace_, why);  // fp32 dw
    } catch (const Error& e) {
      throw Error(std::string("CudnnConv ") + name + ": building the plan for " + describe(s) + ": " + e.message());
    }
    DPML_REQUIRE(p.has_value(), "CudnnConv " << name << ": cuDNN " << cudnnGetVersion() << " has no engine for "
                                             << describe(s) << " (bf16 NHWC; x, w, y aligned to " << align_x << ", "
                                             << align_w << ", " << align_y << " bytes): " << why);
    reserve(bytes_needed(*p, pass, s));
    return plans_.emplace(key, std::move(*p)).first->second;
  }

  void reserve(std::size_t bytes) {
    if (bytes <= buffer_bytes_) return;
    DPML_CHECK_CUDA(cudaFree(buffer_));
    buffer_ = nullptr;
    buffer_bytes_ = 0;
    DPML_CHECK_CUDA(cudaMalloc(&buffer_, bytes));
    buffer_bytes_ = bytes;
  }

  // Runs a plan on the tensors x (x or dx), w (w or dw), y (y or dy), on `stream`.
  void execute(const Plan& p, const void* x, const void* w, const void* y, cudaStream_t stream) {
    using namespace detail::cudnn;
    DPML_CHECK_CUDNN(cudnnSetStream(handle_, stream));
    const std::array<std::int64_t, 3> uids = {kUidX, kUidW, kUidY};
    const std::array<const void*, 3> ptrs = {x, w, y};
    void* workspace = buffer_;
    Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids.data());
    pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs.data());
    pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    pack.finalize();
    DPML_CHECK_CUDNN(cudnnBackendExecute(handle_, p.plan.get(), pack.get()));
  }

  cudnnHandle_t handle_ = nullptr;
  std::int64_t max_workspace_;
  void* buffer_ = nullptr;  // cuDNN's workspace, then (backward_weight) the dw scratch
  std::size_t buffer_bytes_ = 0;
  std::map<detail::cudnn::PlanKey, Plan> plans_;
};

}  // namespace dpml::kernels::cuda
