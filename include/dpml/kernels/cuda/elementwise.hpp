#pragma once
// Element-wise device kernels: ReLU and GELU (tanh) forward/backward, the residual add (and a
// scaled one), the product (dropout's y = x · mask), and the bias gradient of a Linear (the maths
// of kernels/host/{activation,elementwise}.hpp). ElementwiseOps adds the copies (on the copy path:
// cudaMemcpyAsync, cudaMemcpy2DAsync for a block of columns into or out of a wider matrix) and
// upload: a step's input from pageable host memory, staged through pinned memory the Device keeps
// (detail::UploadStaging), so that the copy is one asynchronous DMA on the stream and the host
// does not wait for it; copy_to_host / copy_from_host to and from page-locked memory (an
// offloaded optimizer's mirrors) with a Mark the host can wait for.
//
// The element-wise kernels are memory-bound: they move 4–6 bytes per element in bf16 and do a few
// flops, so the floor is bytes / bandwidth. Each thread handles 8 consecutive elements through
// 16-byte vector loads and stores when the pointers are 16-byte aligned (the common case: whole
// tensors from the allocator), in a grid-stride loop; a scalar loop takes the tail and misaligned
// inputs. Arithmetic is in fp32, rounding once on the store.
//
// bias_grad_rows: dbias (cols) += Σ_rows dy (rows, cols), deterministic (reduce.hpp); scratch holds
// column_sums_scratch(rows, cols, 1) floats.

#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/device.hpp"
#include "dpml/kernels/cuda/reduce.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dpml::kernels::cuda {

namespace detail::ew {

inline constexpr int kThreads = 256;

// y[i] = op(i, a[i], b[i]) over n elements; b may be null when op ignores it.
template <class T, class Op>
__global__ void map2_kernel(const T* a, const T* b, T* y, std::int64_t n,  // y may alias a or b
                            Op op, bool vec) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  std::int64_t i0 = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::int64_t tail = 0;
  if (vec) {
    const std::int64_t packs = n / 8;
    for (std::int64_t p = i0; p < packs; p += stride) {
      const Pack8<T> pa = reinterpret_cast<const Pack8<T>*>(a)[p];
      Pack8<T> pb{};
      if (b) pb = reinterpret_cast<const Pack8<T>*>(b)[p];
      Pack8<T> py;
#pragma unroll
      for (int e = 0; e < 8; ++e) py.v[e] = from_f<T>(op(load_f(pa.v[e]), load_f(pb.v[e])));
      reinterpret_cast<Pack8<T>*>(y)[p] = py;
    }
    tail = packs * 8;
  }
  for (std::int64_t i = tail + i0; i < n; i += stride) y[i] = from_f<T>(op(load_f(a[i]), b ? load_f(b[i]) : 0.f));
}

struct GeluOp {
  __device__ float operator()(float x, float) const { return gelu(x); }
};
struct GeluGradOp {  // a = x, b = dy
  __device__ float operator()(float x, float dy) const { return dy * gelu_grad(x); }
};
struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct ScaledAddOp {
  float scale;
  __device__ float operator()(float a, float b) const { return (a + b) * scale; }
};
struct MulOp {
  __device__ float operator()(float a, float b) const { return a * b; }
};
struct ReluOp {
  __device__ float operator()(float x, float) const { return x > 0.f ? x : 0.f; }
};
struct ReluGradOp {  // a = y (the ReLU's output), b = dy
  __device__ float operator()(float y, float dy) const { return y > 0.f ? dy : 0.f; }
};

template <class T, class Op>
void map2(const T* a, const T* b, T* y, std::int64_t n, Op op, cudaStream_t stream) {
  static_assert(is_storage_v<T>);
  if (n == 0) return;
  const bool vec = detail::aligned16(a) && (b == nullptr || detail::aligned16(b)) && detail::aligned16(y);
  map2_kernel<<<grid_for(ceil_div(n, 8), kThreads, 132 * 16), kThreads, 0, stream>>>(a, b, y, n, op, vec);
  DPML_CHECK_LAUNCH();
}

// y (rows, cols) += bias (cols), a grid-stride loop (the row-parallel Linear's bias after its
// reduction where no GEMM epilogue can take it).
template <class T>
__global__ void bias_add_rows_kernel(T* y, const T* bias, std::int64_t n, std::int64_t cols) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = from_f<T>(load_f(y[i]) + load_f(bias[i % cols]));
}

template <int V, class T>
struct ColumnOf {  // row r's dy at the V columns c0 … c0 + V − 1
  const T* dy;
  int cols;
  __device__ int setup(int c0) const { return c0; }
  __device__ void add(int c0, std::int64_t r, Sums<1> (&acc)[V]) const {
    float v[V];
    load_v<V>(dy + r * cols + c0, v);
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e].v[0] += v[e];
  }
};
template <class T>
struct AddIntoBias {
  T* db;
  __device__ void operator()(int c, const Sums<1>& s) const { db[c] = from_f<T>(load_f(db[c]) + s.v[0]); }
};

}  // namespace detail::ew

// y = max(x, 0), n elements; y may alias x.
template <class T>
void relu_forward(const T* x, T* y, std::int64_t n, cudaStream_t stream) {
  detail::ew::map2(x, static_cast<const T*>(nullptr), y, n, detail::ew::ReluOp{}, stream);
}

// y (rows, cols) += bias (cols).
template <class T>
void bias_add_rows(T* y, const T* bias, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  if (rows * cols == 0) return;
  detail::ew::bias_add_rows_kernel<<<grid_for(rows * cols, detail::ew::kThreads), detail::ew::kThreads, 0, stream>>>(
      y, bias, rows * cols, cols);
  DPML_CHECK_LAUNCH();
}

// y = gelu(x), n elements; y may alias x.
template <class T>
void gelu_forward(const T* x, T* y, std::int64_t n, cudaStream_t stream) {
  detail::ew::map2(x, static_cast<const T*>(nullptr), y, n, detail::ew::GeluOp{}, stream);
}

// dx = dy · gelu'(x), from the forward input x; dx may alias dy.
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, std::int64_t n, cudaStream_t stream) {
  detail::ew::map2(x, dy, dx, n, detail::ew::GeluGradOp{}, stream);
}

// dx = dy · [y > 0], from the ReLU's output y; dx may alias dy.
template <class T>
void relu_backward(const T* y, const T* dy, T* dx, std::int64_t n, cudaStream_t stream) {
  detail::ew::map2(y, dy, dx, n, detail::ew::ReluGradOp{}, stream);
}

// y = a + b, n elements (the residual connection); y may alias a or b.
template <class T>
void add(const T* a, const T* b, T* y, std::int64_t n, cudaStream_t stream) {
  detail::ew::map2(a, b, y, n, detail::ew::AddOp{}, stream);
}

// y = a · b, n elements (dropout: y = x · mask); y may alias a or b.
template <class T>
void mul(const T* a, const T* b, T* y, std::int64_t n, cudaStream_t stream) {
  detail::ew::map2(a, b, y, n, detail::ew::MulOp{}, stream);
}

// y = (a + b) · scale, n elements (an average of two contributions: comm/nccl_copy_engine.hpp);
// y may alias a or b.
template <class T>
void add_scaled(const T* a, const T* b, T* y, std::int64_t n, float scale, cudaStream_t stream) {
  detail::ew::map2(a, b, y, n, detail::ew::ScaledAddOp{scale}, stream);
}

// dbias (cols) += Σ_rows dy (rows, cols), summed in fp32 and rounded once into dbias's type B (the
// activations' type, or float for fp32 gradients); scratch: column_sums_scratch(rows, cols, 1) floats.
template <class T, class B = T>
void bias_grad_rows(const T* dy, B* dbias, float* scratch, std::int64_t rows, std::int64_t cols,
                    cudaStream_t stream) {
  static_assert(detail::is_storage_v<T> && detail::is_storage_v<B>);
  const int c = static_cast<int>(cols);
  if (detail::whole_packs(cols, 8, {dy}))
    column_sums_v<1, 8>(detail::ew::ColumnOf<8, T>{dy, c}, detail::ew::AddIntoBias<B>{dbias}, scratch, rows, cols, stream);
  else
    column_sums_v<1, 1>(detail::ew::ColumnOf<1, T>{dy, c}, detail::ew::AddIntoBias<B>{dbias}, scratch, rows, cols, stream);
}

namespace detail {
// Pinned host memory a Device stages its uploads through (Device::resource): each upload takes the
// next region; once the buffer is used up, the host waits for the last upload's copy (every
// earlier one has landed too: one stream) and starts again at the front. A training step uploads
// its batch once, after the previous step's end synchronised: that wait finds the copies done.
class UploadStaging {
 public:
  UploadStaging() = default;
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;
  ~UploadStaging() {
    if (data_) cudaFreeHost(data_);
  }
  // `bytes` of pinned memory for the next copy queued on `stream`; copied(stream) after queueing it.
  void* take(std::size_t bytes) {
    bytes = (bytes + 255) / 256 * 256;  // each region 256-byte aligned
    if (used_ + bytes > capacity_) {
      landed_.synchronize();
      used_ = 0;
      if (bytes > capacity_) {
        if (data_) DPML_CHECK_CUDA(cudaFreeHost(data_));
        data_ = nullptr;
        capacity_ = std::max(bytes, 2 * capacity_);
        DPML_CHECK_CUDA(cudaMallocHost(&data_, capacity_));
      }
    }
    void* p = data_ + used_;
    used_ += bytes;
    return p;
  }
  void copied(cudaStream_t stream) { landed_.record(stream); }

 private:
  char* data_ = nullptr;
  std::size_t capacity_ = 0, used_ = 0;
  Event landed_;  // the last upload's copy
};
}  // namespace detail

// Ops<CudaSpace>'s memory and element-wise family (kernels/host/elementwise.hpp's twin), on the
// Device's stream.
struct ElementwiseOps {
  using Dev = Device<CudaSpace>;
  template <class T>
  static void zero(Dev& dev, T* p, std::int64_t n) {
    if (n) DPML_CHECK_CUDA(cudaMemsetAsync(p, 0, static_cast<std::size_t>(n) * sizeof(T), dev.stream()));
  }
  template <class T>
  static void copy(Dev& dev, const T* src, T* dst, std::int64_t n) {
    if (n)
      DPML_CHECK_CUDA(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyDeviceToDevice,
                                      dev.stream()));
  }
  // dst (n, device) = host (n, pageable host memory): copied into the Device's pinned staging now,
  // then one asynchronous copy on the stream; `host` may be reused as soon as this returns
  template <class T>
  static void upload(Dev& dev, const T* host, T* dst, std::int64_t n) {
    if (!n) return;
    const auto bytes = static_cast<std::size_t>(n) * sizeof(T);
    auto& staging = dev.resource<detail::UploadStaging>();
    void* pinned = staging.take(bytes);
    std::memcpy(pinned, host, bytes);
    DPML_CHECK_CUDA(cudaMemcpyAsync(dst, pinned, bytes, cudaMemcpyHostToDevice, dev.stream()));
    staging.copied(dev.stream());
  }
  // host (n, page-locked) = src (n, device) and dst (n, device) = host (n, page-locked): one
  // asynchronous copy each on the stream (DMA at the link's speed). A Mark is an event recorded
  // on the stream (mark); wait_for holds the host until the stream passed it.
  template <class T>
  static void copy_to_host(Dev& dev, const T* src, T* host, std::int64_t n) {
    if (n)
      DPML_CHECK_CUDA(cudaMemcpyAsync(host, src, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyDeviceToHost,
                                      dev.stream()));
  }
  template <class T>
  static void copy_from_host(Dev& dev, const T* host, T* dst, std::int64_t n) {
    if (n)
      DPML_CHECK_CUDA(cudaMemcpyAsync(dst, host, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyHostToDevice,
                                      dev.stream()));
  }
  using Mark = Event;
  static void mark(Dev& dev, Mark& m) { m.record(dev.stream()); }
  static void wait_for(const Mark& m) { m.synchronize(); }
  template <class T>
  static void add(Dev& dev, const T* a, const T* b, T* y, std::int64_t n) {
    cuda::add(a, b, y, n, dev.stream());
  }
  // dst (rows, cols; row stride dst_ld) = src (rows, cols; row stride src_ld): one strided copy
  // on the copy path (cudaMemcpy2DAsync), no kernel
  template <class T>
  static void copy_columns(Dev& dev, const T* src, std::int64_t src_ld, T* dst, std::int64_t dst_ld, std::int64_t rows,
                           std::int64_t cols) {
    if (rows * cols == 0) return;
    DPML_CHECK_CUDA(cudaMemcpy2DAsync(dst, static_cast<std::size_t>(dst_ld) * sizeof(T), src,
                                      static_cast<std::size_t>(src_ld) * sizeof(T), static_cast<std::size_t>(cols) * sizeof(T),
                                      static_cast<std::size_t>(rows), cudaMemcpyDeviceToDevice, dev.stream()));
  }
  template <class T>
  static void bias_add_rows(Dev& dev, T* y, const T* bias, std::int64_t rows, std::int64_t cols) {
    cuda::bias_add_rows(y, bias, rows, cols, dev.stream());
  }
  template <class T>
  static void bias_grad_rows(Dev& dev, const T* dy, T* dbias, std::int64_t rows, std::int64_t cols) {
    cuda::bias_grad_rows(dy, dbias, dev.scratch<float>(column_sums_scratch(rows, cols, 1)), rows, cols, dev.stream());
  }
};

// Ops<CudaSpace>'s activation family. Backward halves take the forward input x (for ReLU,
// x > 0 exactly where y > 0).
struct ActivationOps {
  using Dev = Device<CudaSpace>;
  template <class T>
  static void relu_forward(Dev& dev, const T* x, T* y, std::int64_t n) {
    cuda::relu_forward(x, y, n, dev.stream());
  }
  template <class T>
  static void relu_backward(Dev& dev, const T* x, const T* dy, T* dx, std::int64_t n) {
    cuda::relu_backward(x, dy, dx, n, dev.stream());
  }
  template <class T>
  static void gelu_forward(Dev& dev, const T* x, T* y, std::int64_t n) {
    cuda::gelu_forward(x, y, n, dev.stream());
  }
  template <class T>
  static void gelu_backward(Dev& dev, const T* x, const T* dy, T* dx, std::int64_t n) {
    cuda::gelu_backward(x, dy, dx, n, dev.stream());
  }
};

}  // namespace dpml::kernels::cuda
