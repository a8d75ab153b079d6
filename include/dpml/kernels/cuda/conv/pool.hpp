#pragma once
// Pooling over NHWC activations, device kernels (the maths of kernels/host/pool.hpp, with the
// channel innermost):
//
//   max pool, forward    one thread per output element (n, ho, wo, c): the max over the window
//                        clipped to the image, and argmax = h·W + w of the winner in its plane
//                        (the first in row-major order on ties, as the host); consecutive threads
//                        take consecutive channels, so every window read is coalesced
//   max pool, backward   a gather, not a scatter: one thread per input element (n, h, w, c) walks
//                        the outputs whose windows contain (h, w) — ho ∈ [⌈(h + p − k + 1)/s⌉,
//                        ⌊(h + p)/s⌋] — and adds the dy of those whose argmax is (h, w), in a fixed
//                        order; every dx element is written once, no atomics, the same bits every run
//   avg pool, forward    one thread per output element: the window's sum over the part inside the
//                        image, divided by kh·kw (padding counts as zeros: PyTorch's default
//                        count_include_pad, as the host)
//   avg pool, backward   the same gather as max pool's: each input element adds the dy of every
//                        output whose window holds it, divided by kh·kw
//   global avg, forward  y (N, C) = mean over the S = H·W pixels: a block of 32 channels × 8 pixel
//                        lanes sums one image, the lanes are added in a fixed order in shared memory
//   global avg, backward dx (N, S, C) = dy (N, C) / S
//
// Windows follow host::PoolGeometry (kernel kh × kw, stride, zero padding that never wins); a
// padding of at most half the kernel keeps every window partly inside the image (checked).
// ResNet's stem pool is kernel 3, stride 2, padding 1. Launchers take the stream and never
// synchronise. At the end: Ops<CudaSpace>'s pooling family (kernels/host/pool.hpp's twin).

#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/cuda/device.hpp"
#include "dpml/kernels/host/pool.hpp"

#include <cuda_runtime.h>

#include <cstdint>

namespace dpml::kernels::cuda {

namespace detail::pool {

inline constexpr int kThreads = 256;

struct Geo {  // 32-bit copy of the geometry (checked by check_window)
  int H, W, C, Ho, Wo, kh, kw, s, p;
};

// The outputs o ∈ [first, last] (none when first > last) of a dimension of `out` outputs whose
// window [o·s − p, o·s − p + k) holds input position i.
struct Covering {
  int first, last;
};
__device__ __forceinline__ Covering covering(int i, int k, int s, int p, int out) {
  const int lo = i + p - k + 1;
  return {lo <= 0 ? 0 : (lo + s - 1) / s, min((i + p) / s, out - 1)};
}

template <class T>
__global__ void max_forward_kernel(const T* __restrict__ x, T* __restrict__ y, std::int32_t* __restrict__ argmax, Geo g,
                                   std::int64_t n) {
  for (std::int64_t u = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(u % g.C);
    const std::int64_t pix = u / g.C;
    const int wo = static_cast<int>(pix % g.Wo), ho = static_cast<int>(pix / g.Wo % g.Ho);
    const std::int64_t img = pix / g.Wo / g.Ho;
    const int h0 = ho * g.s - g.p, w0 = wo * g.s - g.p;
    const int hb = max(h0, 0), he = min(h0 + g.kh, g.H), wb = max(w0, 0), we = min(w0 + g.kw, g.W);
    const T* plane = x + img * g.H * g.W * g.C + c;  // element (h, w) at plane[(h·W + w)·C]
    int where = hb * g.W + wb;
    float best = load_f(plane[static_cast<std::int64_t>(where) * g.C]);
    for (int h = hb; h < he; ++h)
      for (int w = wb; w < we; ++w) {
        const float v = load_f(plane[(static_cast<std::int64_t>(h) * g.W + w) * g.C]);
        if (v > best) {
          best = v;
          where = h * g.W + w;
        }
      }
    y[u] = from_f<T>(best);
    argmax[u] = where;
  }
}

template <class T>
__global__ void max_backward_kernel(const T* __restrict__ dy, const std::int32_t* __restrict__ argmax,
                                    T* __restrict__ dx, Geo g, std::int64_t n) {
  for (std::int64_t u = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(u % g.C);
    const std::int64_t pix = u / g.C;
    const int w = static_cast<int>(pix % g.W), h = static_cast<int>(pix / g.W % g.H);
    const std::int64_t img = pix / g.W / g.H;
    const Covering rows = covering(h, g.kh, g.s, g.p, g.Ho), cols = covering(w, g.kw, g.s, g.p, g.Wo);
    const int me = h * g.W + w;
    float acc = 0.f;
    for (int ho = rows.first; ho <= rows.last; ++ho)
      for (int wo = cols.first; wo <= cols.last; ++wo) {
        const std::int64_t o = ((img * g.Ho + ho) * g.Wo + wo) * g.C + c;
        if (argmax[o] == me) acc += load_f(dy[o]);
      }
    dx[u] = from_f<T>(acc);
  }
}

template <class T>
__global__ void avg_forward_kernel(const T* __restrict__ x, T* __restrict__ y, Geo g, std::int64_t n) {
  const float inv = 1.f / static_cast<float>(g.kh * g.kw);
  for (std::int64_t u = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(u % g.C);
    const std::int64_t pix = u / g.C;
    const int wo = static_cast<int>(pix % g.Wo), ho = static_cast<int>(pix / g.Wo % g.Ho);
    const std::int64_t img = pix / g.Wo / g.Ho;
    const int h0 = ho * g.s - g.p, w0 = wo * g.s - g.p;
    const int hb = max(h0, 0), he = min(h0 + g.kh, g.H), wb = max(w0, 0), we = min(w0 + g.kw, g.W);
    const T* plane = x + img * g.H * g.W * g.C + c;  // element (h, w) at plane[(h·W + w)·C]
    float sum = 0.f;
    for (int h = hb; h < he; ++h)
      for (int w = wb; w < we; ++w) sum += load_f(plane[(static_cast<std::int64_t>(h) * g.W + w) * g.C]);
    y[u] = from_f<T>(sum * inv);
  }
}

template <class T>
__global__ void avg_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx, Geo g, std::int64_t n) {
  const float inv = 1.f / static_cast<float>(g.kh * g.kw);
  for (std::int64_t u = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(u % g.C);
    const std::int64_t pix = u / g.C;
    const int w = static_cast<int>(pix % g.W), h = static_cast<int>(pix / g.W % g.H);
    const std::int64_t img = pix / g.W / g.H;
    const Covering rows = covering(h, g.kh, g.s, g.p, g.Ho), cols = covering(w, g.kw, g.s, g.p, g.Wo);
    float acc = 0.f;
    for (int ho = rows.first; ho <= rows.last; ++ho)
      for (int wo = cols.first; wo <= cols.last; ++wo) acc += load_f(dy[((img * g.Ho + ho) * g.Wo + wo) * g.C + c]);
    dx[u] = from_f<T>(acc * inv);
  }
}

// Block (32 channels, 8 pixel lanes) per (image, 32-channel group); grid.x = N · ⌈C/32⌉.
template <class T>
__global__ void gap_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int S, int C) {
  __shared__ float part[8][33];
  const int groups = (C + 31) / 32;
  const std::int64_t img = blockIdx.x / groups;
  const int c = static_cast<int>(blockIdx.x % groups) * 32 + static_cast<int>(threadIdx.x);
  float s = 0.f;
  if (c < C)
    for (int i = static_cast<int>(threadIdx.y); i < S; i += 8) s += load_f(x[(img * S + i) * C + c]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float t = part[0][threadIdx.x];
    for (int k = 1; k < 8; ++k) t += part[k][threadIdx.x];
    y[img * C + c] = from_f<T>(t / static_cast<float>(S));
  }
}

template <class T>
__global__ void gap_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx, int S, int C, std::int64_t n) {
  const float inv = 1.f / static_cast<float>(S);
  for (std::int64_t u = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < n;
       u += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t img = u / (static_cast<std::int64_t>(S) * C);
    dx[u] = from_f<T>(load_f(dy[img * C + u % C]) * inv);
  }
}

// op: "max_pool" or "avg_pool", for messages.
inline Geo check_window(std::int64_t N, std::int64_t C, const host::PoolGeometry& g, const char* op,
                        const char* pass) {
  DPML_REQUIRE(N >= 0 && C > 0 && g.H > 0 && g.W > 0 && g.kh > 0 && g.kw > 0 && g.stride > 0 && g.pad >= 0 &&
                   2 * g.pad <= g.kh && 2 * g.pad <= g.kw && g.H + 2 * g.pad >= g.kh && g.W + 2 * g.pad >= g.kw,
               op << " " << pass << ": N=" << N << " C=" << C << " input " << g.H << "x" << g.W << " kernel " << g.kh
                  << "x" << g.kw << " stride " << g.stride << " padding " << g.pad
                  << " (at most half the kernel; the padded input at least the kernel)");
  DPML_REQUIRE(g.H * g.W < (std::int64_t{1} << 31) && C < (std::int64_t{1} << 31),
               op << " " << pass << ": planes of " << g.H << "x" << g.W << " or C=" << C
                  << " exceed the 32-bit indices");
  return {static_cast<int>(g.H),       static_cast<int>(g.W),  static_cast<int>(C),
          static_cast<int>(g.out_h()), static_cast<int>(g.out_w()), static_cast<int>(g.kh),
          static_cast<int>(g.kw),      static_cast<int>(g.stride), static_cast<int>(g.pad)};
}

inline void check_gap(std::int64_t N, std::int64_t S, std::int64_t C, const char* pass) {
  DPML_REQUIRE(N >= 0 && S > 0 && C > 0 && S < (std::int64_t{1} << 31) && C < (std::int64_t{1} << 31) &&
                   N * ceil_div(C, 32) < (std::int64_t{1} << 31),
               "global_avg_pool " << pass << ": N=" << N << " S=H·W=" << S << " C=" << C << " out of range");
}

}  // namespace detail::pool

// x (N, H, W, C) → y, argmax (N, Ho, Wo, C); argmax holds h·W + w of each window's winner.
template <class T>
void max_pool_forward(const T* x, T* y, std::int32_t* argmax, std::int64_t N, std::int64_t C,
                      const host::PoolGeometry& geo, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  using namespace detail::pool;
  const Geo g = check_window(N, C, geo, "max_pool", "forward");
  const std::int64_t n = N * geo.out_h() * geo.out_w() * C;
  if (n == 0) return;
  max_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, argmax, g, n);
  DPML_CHECK_LAUNCH();
}

// dx (N, H, W, C) from dy, argmax (N, Ho, Wo, C) of max_pool_forward; overwritten.
template <class T>
void max_pool_backward(const T* dy, const std::int32_t* argmax, T* dx, std::int64_t N, std::int64_t C,
                       const host::PoolGeometry& geo, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  using namespace detail::pool;
  const Geo g = check_window(N, C, geo, "max_pool", "backward");
  const std::int64_t n = N * geo.H * geo.W * C;
  if (n == 0) return;
  max_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dy, argmax, dx, g, n);
  DPML_CHECK_LAUNCH();
}

// x (N, H, W, C) → y (N, Ho, Wo, C): each window's mean, padding counted as zeros.
template <class T>
void avg_pool_forward(const T* x, T* y, std::int64_t N, std::int64_t C, const host::PoolGeometry& geo,
                      cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  using namespace detail::pool;
  const Geo g = check_window(N, C, geo, "avg_pool", "forward");
  const std::int64_t n = N * geo.out_h() * geo.out_w() * C;
  if (n == 0) return;
  avg_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, y, g, n);
  DPML_CHECK_LAUNCH();
}

// dx (N, H, W, C) from dy (N, Ho, Wo, C) of avg_pool_forward; overwritten.
template <class T>
void avg_pool_backward(const T* dy, T* dx, std::int64_t N, std::int64_t C, const host::PoolGeometry& geo,
                       cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  using namespace detail::pool;
  const Geo g = check_window(N, C, geo, "avg_pool", "backward");
  const std::int64_t n = N * geo.H * geo.W * C;
  if (n == 0) return;
  avg_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dy, dx, g, n);
  DPML_CHECK_LAUNCH();
}

// x (N, S = H·W, C) → y (N, C), the mean over the pixels.
template <class T>
void global_avg_pool_forward(const T* x, T* y, std::int64_t N, std::int64_t S, std::int64_t C, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  detail::pool::check_gap(N, S, C, "forward");
  if (N == 0) return;
  detail::pool::gap_forward_kernel<<<static_cast<unsigned>(N * ceil_div(C, 32)), dim3(32, 8), 0, stream>>>(
      x, y, static_cast<int>(S), static_cast<int>(C));
  DPML_CHECK_LAUNCH();
}

// dx (N, S, C) = dy (N, C) / S at every pixel; overwritten.
template <class T>
void global_avg_pool_backward(const T* dy, T* dx, std::int64_t N, std::int64_t S, std::int64_t C, cudaStream_t stream) {
  static_assert(detail::is_storage_v<T>);
  using namespace detail::pool;
  check_gap(N, S, C, "backward");
  const std::int64_t n = N * S * C;
  if (n == 0) return;
  gap_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dy, dx, static_cast<int>(S), static_cast<int>(C),
                                                                     n);
  DPML_CHECK_LAUNCH();
}

// Ops<CudaSpace>'s pooling family over NHWC images (N, H, W, C) with geometry g, on the Device's
// stream; T is float, bf16 or fp16. dx is overwritten.
struct PoolOps {
  using Dev = Device<CudaSpace>;
  template <class T>
  static void max_pool_forward(Dev& dev, const T* x, T* y, std::int32_t* argmax, std::int64_t N, std::int64_t C,
                               const host::PoolGeometry& g) {
    check_type<T>();
    cuda::max_pool_forward(x, y, argmax, N, C, g, dev.stream());
  }
  template <class T>
  static void max_pool_backward(Dev& dev, const T* dy, const std::int32_t* argmax, T* dx, std::int64_t N,
                                std::int64_t C, const host::PoolGeometry& g) {
    check_type<T>();
    cuda::max_pool_backward(dy, argmax, dx, N, C, g, dev.stream());
  }
  template <class T>
  static void avg_pool_forward(Dev& dev, const T* x, T* y, std::int64_t N, std::int64_t C,
                               const host::PoolGeometry& g) {
    check_type<T>();
    cuda::avg_pool_forward(x, y, N, C, g, dev.stream());
  }
  template <class T>
  static void avg_pool_backward(Dev& dev, const T* dy, T* dx, std::int64_t N, std::int64_t C,
                                const host::PoolGeometry& g) {
    check_type<T>();
    cuda::avg_pool_backward(dy, dx, N, C, g, dev.stream());
  }
  // y (N, C) = the mean of x (N, S, C) over its S = H·W pixels
  template <class T>
  static void global_avg_pool_forward(Dev& dev, const T* x, T* y, std::int64_t N, std::int64_t S, std::int64_t C) {
    check_type<T>();
    cuda::global_avg_pool_forward(x, y, N, S, C, dev.stream());
  }
  template <class T>
  static void global_avg_pool_backward(Dev& dev, const T* dy, T* dx, std::int64_t N, std::int64_t S,
                                       std::int64_t C) {
    check_type<T>();
    cuda::global_avg_pool_backward(dy, dx, N, S, C, dev.stream());
  }

 private:
  template <class T>
  static constexpr void check_type() {
    static_assert(detail::is_storage_v<T>, "dpml: no pooling kernel for this type on CudaSpace (float, bf16, fp16)");
  }
};

}  // namespace dpml::kernels::cuda
