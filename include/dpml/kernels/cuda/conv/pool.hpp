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
//   global avg, forward  y (N, C) = mean over the S = H·W pixels: a block of 32 channels × 8 pixel
//                        lanes sums one image, the lanes are added in a fixed order in shared memory
//   global avg, backward dx (N, S, C) = dy (N, C) / S
//
// Windows follow host::PoolGeometry (kernel kh × kw, stride, zero padding that never wins); a
// padding of at most half the kernel keeps every window partly inside the image (checked).
// ResNet's stem pool is kernel 3, stride 2, padding 1. Launchers take the stream and never
// synchronise.

#include "dpml/core/cuda_error.hpp"
#include "dpml/core/error.hpp"
#include "dpml/kernels/cuda/common.hpp"
#include "dpml/kernels/host/pool.hpp"

#include <cuda_runtime.h>

#include <cstdint>

namespace dpml::kernels::cuda {

namespace detail::pool {

inline constexpr int kThreads = 256;

struct Geo {  // 32-bit copy of the geometry (checked by check_max)
  int H, W, C, Ho, Wo, kh, kw, s, p;
};

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
    // Outputs whose window [o·s − p, o·s − p + k) contains h (and w).
    const int lo_h = h + g.p - g.kh + 1, lo_w = w + g.p - g.kw + 1;
    const int ho0 = lo_h <= 0 ? 0 : (lo_h + g.s - 1) / g.s, ho1 = min((h + g.p) / g.s, g.Ho - 1);
    const int wo0 = lo_w <= 0 ? 0 : (lo_w + g.s - 1) / g.s, wo1 = min((w + g.p) / g.s, g.Wo - 1);
    const int me = h * g.W + w;
    float acc = 0.f;
    for (int ho = ho0; ho <= ho1; ++ho)
      for (int wo = wo0; wo <= wo1; ++wo) {
        const std::int64_t o = ((img * g.Ho + ho) * g.Wo + wo) * g.C + c;
        if (argmax[o] == me) acc += load_f(dy[o]);
      }
    dx[u] = from_f<T>(acc);
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

inline Geo check_max(std::int64_t N, std::int64_t C, const host::PoolGeometry& g, const char* pass) {
  DPML_REQUIRE(N >= 0 && C > 0 && g.H > 0 && g.W > 0 && g.kh > 0 && g.kw > 0 && g.stride > 0 && g.pad >= 0 &&
                   2 * g.pad <= g.kh && 2 * g.pad <= g.kw && g.H + 2 * g.pad >= g.kh && g.W + 2 * g.pad >= g.kw,
               "max_pool " << pass << ": N=" << N << " C=" << C << " input " << g.H << "x" << g.W << " kernel " << g.kh
                           << "x" << g.kw << " stride " << g.stride << " padding " << g.pad
                           << " (at most half the kernel; the padded input at least the kernel)");
  DPML_REQUIRE(g.H * g.W < (std::int64_t{1} << 31) && C < (std::int64_t{1} << 31),
               "max_pool " << pass << ": planes of " << g.H << "x" << g.W << " or C=" << C
                           << " exceed the 32-bit argmax");
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
  const Geo g = check_max(N, C, geo, "forward");
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
  const Geo g = check_max(N, C, geo, "backward");
  const std::int64_t n = N * geo.H * geo.W * C;
  if (n == 0) return;
  max_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dy, argmax, dx, g, n);
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

}  // namespace dpml::kernels::cuda
